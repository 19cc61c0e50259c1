"""The sandbox on a real GPU: the fast runtime, honest kernels, every GPU-side cheat, sticky CUDA
errors and hung kernels, fp16-accumulation rejection, compile caching and baselines."""

import os
import textwrap
from pathlib import Path

import pytest

from conftest import relu_problem_source

from cuforge.problems.hgemm import hgemm_problem
from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.supervisor import Supervisor

pytestmark = pytest.mark.gpu
CANDS = Path(__file__).parent / "gpu_candidates"
CFG = EvalConfig(max_timing_s=3.0, timeout_s=240)
# The suite runs under either judge (CUFORGE_JUDGE); the few assertions that differ say so.
SPLIT = os.environ.get("CUFORGE_JUDGE", "").strip().lower() == "split"
JUDGED = "bracket+rotating, judge's events"  # the split judge's clock around a host's batches



@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_problems")
    specs = {
        "relu_custom": (2**22, "custom", "N"), "relu_any": (2**22, "any", "N"),
        "relu_small": (2**14, "custom", "N"), "relu_big": (2**26, "custom", "N"),
        "relu_inflated": (2**22, "custom", "1e15"),
    }
    for name, (n, policy, flops) in specs.items():
        (d / f"{name}.py").write_text(relu_problem_source(n, policy, flops))
    loaded, skipped = load_files(sorted(d.glob("*.py")))
    assert not skipped
    return {p.name: p for p in loaded}


def cand(name: str) -> Candidate:
    return Candidate((CANDS / name).read_text())


def hgemm_candidate(accumulate: str) -> Candidate:
    src = (CANDS / "hgemm_simt.cu").read_text()
    if accumulate == "fp32":
        defs = "#define ACC_T float\n#define ACC_ZERO 0.f\n#define ACC_FMA(a, b, c) fmaf(a, b, c)\n#define ACC_OUT(x) __float2half(x)\n"
    else:
        defs = ("#define ACC_T half\n#define ACC_ZERO __float2half(0.f)\n"
                "#define ACC_FMA(a, b, c) __hfma(__float2half(a), __float2half(b), c)\n#define ACC_OUT(x) (x)\n")
    spec = LaunchSpec(entry="hgemm_simt", grid="(cdiv(N, 16), cdiv(M, 16))", block="(16, 16)",
                      args=("in0", "in1", "out0", "M", "N", "K"), outputs=(("(M, N)", "float16"),),
                      bindings=(("M", "in0.shape[0]"), ("K", "in0.shape[1]"), ("N", "in1.shape[1]")))
    return Candidate(defs + src, "kernel", spec, proposer="test")


def test_worker_starts_warm_and_isolated(sup):
    info = sup.start()
    assert info["self_test"] == "ok" and info["name"] and info["sm_count"] > 0
    assert info["jail"] == "namespaces" and info["isolation"].startswith("jail (namespaces)")


def test_honest_runtime_kernel_with_events_and_profile(sup, problems):
    ev = sup.evaluate(problems["relu_big"], cand("relu_runtime.py"), CFG)
    assert ev.status == "ok", ev.message
    t = ev.timings["candidate"]
    assert t.method == (JUDGED if SPLIT else "events+l2flush") and t.n >= 30 and t.p20_ms <= t.median_ms <= t.p80_ms
    assert "torch" in ev.timings and ev.speedup_vs("torch") > 0
    k = ev.profile.kernels[0]
    assert k["name"] == "relu4" and k["registers"] > 0 and k["launches"] > 0
    assert 0 < ev.profile.roofline_fraction <= 1.2 and ev.profile.bound == "memory" and "GB/s" in ev.profile.summary
    assert ev.correctness["reference"] == "float64" and ev.correctness["trials_passed"] == 5
    # the device memory the worker held before the evaluation is in its record, never more than its peak
    assert 0 <= ev.correctness["held_device_bytes"] <= ev.correctness["peak_device_bytes"]


def test_short_kernels_are_timed_by_graph_replay(sup, problems):
    ev = sup.evaluate(problems["relu_small"], cand("relu_runtime.py"), CFG)
    assert ev.status == "ok", ev.message
    if SPLIT:  # the host replays its batch from one graph, inside the judge's brackets
        assert ev.timings["candidate"].method == JUDGED and ev.correctness["candidate_batch"] == "one CUDA graph"
        assert ev.timings["torch"].method == "bracket+rotating"
    else:
        assert ev.timings["candidate"].method == "graph+rotating", ev.correctness.get("graph_fallback")
        assert ev.timings["torch"].method == "graph+rotating"


@pytest.mark.parametrize("shape", [(128, 128, 128), (1000, 700, 333), (1, 64, 40), (64, 1, 17)])
def test_format_b_gemm_is_correct_on_awkward_shapes(sup, shape):
    ev = sup.evaluate(hgemm_problem(*shape), hgemm_candidate("fp32"), EvalConfig(max_timing_s=2.0, baselines=("torch",)))
    assert ev.status == "ok", ev.message
    assert ev.correctness["rel_norm_err"] < 1e-3


def test_fp16_accumulation_is_rejected(sup):
    ev = sup.evaluate(hgemm_problem(256, 256, 1024), hgemm_candidate("fp16"), CFG)
    assert ev.status == "cheat:precision_downgrade", (ev.status, ev.message)


@pytest.mark.parametrize("name, problem, kind", [
    ("side_stream.py", "relu_custom", "side_stream"),
    ("escaped_work.py", "relu_big", "escaped_work"),
    ("timer_patch.py", "relu_any", "timer_patch"),
    ("uninitialized.py", "relu_custom", "aliasing"),
    ("cached_result.py", "relu_any", "result_caching"),
])
def test_gpu_cheats_are_named(sup, problems, name, problem, kind):
    ev = sup.evaluate(problems[problem], cand(name), CFG)
    assert ev.status == f"cheat:{kind}", (ev.status, ev.message)


def test_cublas_inside_a_custom_candidate_is_a_library_call(sup):
    ev = sup.evaluate(hgemm_problem(512, 512, 512), cand("cublas_call.py"), CFG)
    assert ev.status == "cheat:library_call" and "mm" in ev.message, ev.message


def test_speed_past_the_roofline_is_impossible(sup, problems):
    ev = sup.evaluate(problems["relu_inflated"], cand("relu_runtime.py"), CFG)
    assert ev.status == "cheat:impossible_speedup", (ev.status, ev.message)


def test_sticky_error_and_hung_kernel_restart_the_worker(problems):
    """In-process, each costs the worker; under the split judge, each costs its candidate's process
    and the worker lives on."""
    with Supervisor(gpu=0) as s:
        ev = s.evaluate(problems["relu_custom"], cand("illegal_address.py"), CFG)
        assert ev.status in (("runtime_error", "crash") if SPLIT else ("runtime_error",)), ev.message
        assert "illegal" in ev.message.lower() and s.alive() == SPLIT, ev.message
        ev = s.evaluate(problems["relu_custom"], cand("infinite_loop.py"), EvalConfig(timeout_s=25))
        assert ev.status == "timeout" and s.alive() == SPLIT, ev.message
        ev = s.evaluate(problems["relu_custom"], cand("relu_runtime.py"), CFG)
        assert ev.status == "ok" and ev.worker_restarted != SPLIT and s.spawns == (1 if SPLIT else 3), ev.message


def test_compile_error_diagnostics_and_cache(sup, problems, tmp_path):
    bad = (CANDS / "relu_runtime.py").read_text().replace("fmaxf(v.x, 0.f)", "fmaxf(v.x, undefined_name)")
    ev = sup.evaluate(problems["relu_custom"], Candidate(bad), CFG)
    assert ev.status == "compile_error" and ev.diagnostics[0].line == 6 and "undefined_name" in ev.diagnostics[0].message
    from cuforge.runtime import compile_cuda

    src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.f; }"
    first = compile_cuda(src, arch="sm_90a")
    second = compile_cuda(src, arch="sm_90a")
    assert second.stats.cache == "memory" and second.cubin == first.cubin


def test_cublas_and_cublaslt_baselines(sup):
    ev = sup.evaluate(hgemm_problem(1024, 1024, 1024), hgemm_candidate("fp32"),
                      EvalConfig(baselines=("torch", "cublas", "cublaslt"), max_timing_s=3.0))
    assert ev.status == "ok", ev.message
    assert {"torch", "cublas", "cublaslt"} <= set(ev.timings), ev.correctness.get("baselines_skipped")
    assert ev.correctness["cublaslt"]["algorithms_tried"] >= 1


def test_torch_compile_baseline(sup, problems):
    ev = sup.evaluate(problems["relu_custom"], cand("relu_runtime.py"),
                      EvalConfig(baselines=("torch", "torch.compile"), max_timing_s=2.0))
    assert ev.status == "ok", ev.message
    assert "torch.compile" in ev.timings, ev.correctness.get("baselines_skipped")


def test_runtime_launch_type_checks():
    import torch

    from cuforge.runtime import LaunchError, compile_cuda

    k = compile_cuda(textwrap.dedent("""
        extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] += a * x[i];
        }""")).kernel("axpy")
    x = torch.ones(1000, device="cuda")
    y = torch.zeros(1000, device="cuda")
    k((4,), (256,), 2, x, y, 1000)  # an int for a float parameter is converted, not misread
    torch.cuda.synchronize()
    assert torch.all(y == 2)
    with pytest.raises(LaunchError, match="pointer"):
        k((4,), (256,), 2.0, 3.0, y, 1000)
    with pytest.raises(LaunchError, match="takes 4 arguments"):
        k((4,), (256,), 2.0, x, y)
    with pytest.raises(LaunchError, match="not on a CUDA device"):
        k((4,), (256,), 2.0, x.cpu(), y, 1000)


def test_library_kernels_hidden_from_aten_are_named(sup):
    ev = sup.evaluate(hgemm_problem(512, 512, 512), cand("cublaslt_ctypes.py"), CFG)
    assert ev.status == "cheat:library_call" and "library kernels" in ev.message, (ev.status, ev.message)


def test_load_inline_candidates_are_accepted(sup, problems):
    ev = sup.evaluate(problems["relu_custom"], cand("relu_load_inline.py"), EvalConfig(timeout_s=280, max_timing_s=2.0))
    assert ev.status == "ok", ev.message


def test_poison_reaches_freed_blocks_inside_segments_that_stay_allocated():
    """A block freed inside a segment another tensor still lives in cannot go back to the driver; the
    poison must still overwrite it, or `torch.empty` hands a later candidate the freed result."""
    import torch

    from cuforge.sandbox.protocol import tensors

    dev = torch.device("cuda", 0)
    whole = torch.empty(2 * 2**26, dtype=torch.uint8, device=dev)
    del whole  # one cached 128 MiB segment, split by the next two allocations
    keep = torch.ones(2**24, dtype=torch.float32, device=dev)
    result = torch.full((2**24,), 3.0, dtype=torch.float32, device=dev)
    address = result.data_ptr()
    del result
    tensors.poison_free_memory(dev)
    reused = torch.empty(2**24, dtype=torch.float32, device=dev)
    assert reused.data_ptr() == address  # the same block came back ...
    assert tensors.poison_fraction(reused) == 1.0  # ... holding the poison, not the freed 3.0s
    assert bool((keep == 1).all())


SHARED_GPU_EVALUATOR = """
import json, sys
from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.supervisor import Supervisor
from pathlib import Path
(problem,), _ = load_files([Path(sys.argv[1])])
source = "import torch\\nclass ModelNew(torch.nn.Module):\\n    def forward(self, x):\\n        return torch.relu(x)\\n"
with Supervisor(gpu=0) as sup:
    for _ in range(3):
        ev = sup.evaluate(problem, Candidate(source, "module"), EvalConfig(max_timing_s=1.0, profile=False))
        print(json.dumps([ev.status, ev.message[:200], ev.device.get("gpu_turn_wait_s")]), flush=True)
"""


def test_evaluators_of_other_processes_sharing_the_gpu_accuse_no_one(tmp_path):
    # Several cuforge processes on one GPU (parallel test workers, two runs): each evaluation waits for
    # the GPU's turn, so no judge reads another process's kernels as its candidate's escaped work.
    import json
    import subprocess
    import sys

    f = tmp_path / "relu.py"
    f.write_text(relu_problem_source(2**22, "any", "N"))
    procs = [subprocess.Popen([sys.executable, "-c", SHARED_GPU_EVALUATOR, str(f)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        results += [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert len(results) == 9
    assert all(status == "ok" for status, _, _ in results), results
    assert any(wait for _, _, wait in results)  # someone waited for the turn


@pytest.mark.parametrize("judge", ["inprocess", "split"])
def test_the_landlock_jail_evaluates_on_the_gpu_or_refuses_in_one_line(problems, judge, monkeypatch):
    """The fallback jail where user namespaces are forbidden, as the machine's user (root on the GPU
    image: the worker drops to an unprivileged uid). In-process, candidates are judged inside it. The
    split judge's candidate hosts need their own CUDA start beneath the judge's Landlock layer; where
    the driver refuses it (cuInit: no device, seen on the H100 as root), the worker refuses to start
    with one line naming the cause and the remedy, never evaluation after evaluation of crashes."""
    from cuforge.sandbox.driver.jail import jail_plan
    from cuforge.sandbox.confine.landlock import available
    from cuforge.sandbox.driver.supervisor import WorkerStartError

    if not available()[0]:
        pytest.skip(f"no Landlock here: {available()[1]}")
    monkeypatch.setenv("CUFORGE_JAIL", "landlock")
    jail_plan.cache_clear()
    try:
        with Supervisor(gpu=0, judge=judge) as s:
            try:
                info = s.start()
            except WorkerStartError as e:
                assert judge == "split", e
                assert "candidate hosts cannot start under the landlock jail" in str(e) and "namespaces jail" in str(e)
                return
            assert info["jail"] == "landlock" and info["self_test"] == "ok", info
            ev = s.evaluate(problems["relu_custom"], cand("relu_runtime.py"), CFG)
            assert ev.status == "ok", ev.message
            bad = s.evaluate(problems["relu_custom"], cand("side_stream.py"), CFG)
            assert bad.status == "cheat:side_stream", (bad.status, bad.message)
    finally:
        monkeypatch.delenv("CUFORGE_JAIL")
        jail_plan.cache_clear()
