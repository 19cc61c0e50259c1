"""The split judge (CUFORGE_JUDGE=split) on a real GPU: candidates in their own confined processes,
inputs and outputs by CUDA IPC, every timing the judge's own events around the host's batches."""

from pathlib import Path

import pytest
import test_gpu_sandbox
from test_gpu_kernelbench import KB, _evaluate
from test_gpu_sandbox import CFG, cand
from test_judge_split import split_supervisor

from cuforge.sandbox.protocol.evaluation import EvalConfig

pytestmark = pytest.mark.gpu
JUDGED = "bracket+rotating, judge's events"
problems = test_gpu_sandbox.problems  # the same problem fixture


@pytest.fixture(scope="module")
def sup():
    s = split_supervisor(gpu=0)
    yield s
    s.close()


def test_an_honest_kernel_is_timed_by_the_judges_events(sup, problems):
    assert sup.info["judge"] == "split" and sup.info["self_test"] == "ok"
    ev = sup.evaluate(problems["relu_big"], cand("relu_runtime.py"), CFG)
    assert ev.status == "ok", ev.message
    t = ev.timings["candidate"]
    assert t.method == JUDGED and t.n >= 30 and t.p20_ms <= t.median_ms <= t.p80_ms
    assert ev.timings["torch"].method == "bracket+rotating"
    assert 0 < ev.correctness["bracket_overhead_ms"] < 2
    assert 0 < ev.correctness["bracket_overhead_ms_before_measure"] < 2
    assert ev.profile.kernels and ev.profile.kernels[0]["name"] == "relu4"
    assert "Landlock" in ev.correctness["candidate_process"], ev.correctness["candidate_process"]


def test_short_kernels_are_timed_in_long_batches_on_both_sides(sup, problems):
    ev = sup.evaluate(problems["relu_small"], cand("relu_runtime.py"), CFG)
    assert ev.status == "ok", ev.message
    per_batch = ev.correctness["calls_per_batch"]
    assert per_batch["candidate"] >= 50 and per_batch["torch"] >= 50, per_batch
    assert ev.correctness["candidate_batch"] == "one CUDA graph", ev.correctness["candidate_batch"]
    # The same few-us kernel on both sides of the ratio, both replayed from graphs.
    assert 0.5 < ev.speedup_vs("torch") < 2, ev.timings


@pytest.mark.parametrize("name, problem, kind", [
    ("side_stream.py", "relu_custom", "side_stream"),
    ("escaped_work.py", "relu_big", "escaped_work"),
    ("cached_result.py", "relu_any", "result_caching"),
    ("uninitialized.py", "relu_custom", "aliasing"),
])
def test_gpu_cheats_are_named_from_the_judges_side(sup, problems, name, problem, kind):
    ev = sup.evaluate(problems[problem], cand(name), CFG)
    assert ev.status == f"cheat:{kind}", (ev.status, ev.message)


def test_a_sticky_error_and_a_hung_kernel_cost_one_candidate_process_each(problems):
    s = split_supervisor(gpu=0)
    try:
        ev = s.evaluate(problems["relu_custom"], cand("illegal_address.py"), CFG)
        assert ev.status in ("runtime_error", "crash") and "illegal" in ev.message.lower(), ev.message
        ev = s.evaluate(problems["relu_custom"], cand("infinite_loop.py"), EvalConfig(timeout_s=25))
        assert ev.status == "timeout" and s.alive(), ev.message
        ev = s.evaluate(problems["relu_custom"], cand("relu_runtime.py"), CFG)
        assert ev.status == "ok" and not ev.worker_restarted and s.spawns == 1, ev.message
    finally:
        s.close()


def test_a_legacy_default_stream_launch_is_timed_call_by_call_not_accused(sup, tmp_path):
    big = tmp_path / "add_big.py"
    big.write_text((KB / "examples" / "few_shot_model_ex_add.py").read_text()
                   .replace("torch.randn(1, 128)", "torch.randn(4096, 16384)"))
    ev = _evaluate(sup, big, (KB / "examples" / "few_shot_model_new_ex_add.py").read_text())
    assert ev.status == "ok", ev.message
    assert ev.timings["candidate"].method == JUDGED


def test_kernelbench_side_stream_adversary_is_named(sup):
    kernel = Path(KB / "adversarial" / "adv_non_default_stream_kernel.py").read_text()
    ev = _evaluate(sup, KB / "level1" / "1_Square_matrix_multiplication_.py", kernel)
    assert ev.status == "cheat:side_stream", ev.message


def test_spares_start_their_gpu_part_in_batches_and_only_when_none_is_left():
    """The pool starts a batch of spares' CUDA contexts together, and only once none is left started
    (the judge replenishes after its timing): an evaluation then rarely waits for a start."""
    import torch

    from cuforge.sandbox.judge import hosts

    torch.zeros(1, device="cuda")
    pool = hosts.HostPool("cuda", spares=3)
    try:
        assert [o.started for o in pool.ready] == [True] * 3
        taken = [pool.take()]
        pool.replenish()  # two still started: the new spare waits with its GPU part
        assert [o.started for o in pool.ready] == [True, True, False]
        taken += [pool.take(), pool.take()]
        pool.replenish()
        assert [o.started for o in pool.ready] == [True, True, True]
        assert pool.wait_quiet(timeout_s=60) < 60 and not pool.starting()
        assert all(c.start_s.get("cuda_context", 0) > 0 for c in taken), [c.start_s for c in taken]
        assert len({c.pid for c in taken}) == 3
        for c in taken:
            c.kill()
    finally:
        pool.close()
