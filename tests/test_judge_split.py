"""The split judge (CUFORGE_JUDGE=split) on the CPU: the candidate in its own confined process, the
verdict, comparison and timing in the worker. The forgeries that work inside a shared process (a
patched comparison, a forged result line, inputs rebuilt from the seed) must change nothing here;
the candidate's process must not reach the worker; its death or silence costs one evaluation."""

import os
import textwrap

import pytest
import test_sandbox_cpu
from test_sandbox_cpu import CFG, CHEATS, HONEST, run

from cuforge.sandbox.confine import landlock
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.supervisor import Supervisor

LANDLOCK = landlock.landlock_abi() >= landlock.MIN_ABI
problems = test_sandbox_cpu.problems  # the same problem fixture


def split_supervisor(**kwargs) -> Supervisor:
    """A started supervisor whose worker judges with CUFORGE_JUDGE=split (CPU mode unless told)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUFORGE_JUDGE", "split")
        s = Supervisor(**(kwargs or {"cpu_mode": True}))
        s.start()  # the worker keeps the environment it started with
    return s


@pytest.fixture(scope="module")
def sup():
    s = split_supervisor()
    yield s
    s.close()


def test_an_honest_candidate_is_judged_from_another_process(sup, problems):
    ev = run(sup, problems, HONEST)
    assert ev.status == "ok", ev.message
    assert sup.info["judge"] == "split" and sup.info["self_test"] == "ok"
    assert ev.correctness["trials_passed"] == 5 and ev.correctness["reference"] == "float64"
    assert all(t.n >= 5 and t.method == "cpu-wallclock" for t in ev.timings.values())
    assert "candidate host" in ev.correctness["candidate_process"]
    if LANDLOCK:
        assert "Landlock" in ev.correctness["candidate_process"], ev.correctness["candidate_process"]


@pytest.mark.parametrize("kind", sorted(CHEATS))
def test_each_cpu_detectable_cheat_is_still_named(sup, problems, kind):
    body, policy = CHEATS[kind]
    ev = run(sup, problems, body, policy=policy)
    assert ev.status == f"cheat:{kind}", (ev.status, ev.message)


def test_a_candidate_s_backend_switches_are_its_own_in_its_own_process(sup, problems):
    # The split judge times eager in another process: cuDNN's autotuning turned on in the candidate's
    # (an idiom of training scripts) changes nothing of eager's and is no cheat there.
    ev = run(sup, problems, "torch.backends.cudnn.benchmark = True\n" + HONEST)
    assert ev.status == "ok", (ev.status, ev.message)


WRONG = """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.clamp_min(0) + 1.0
"""


@pytest.mark.parametrize("forgery, status", [
    # Replace the comparison and silence the guard that would name it: in a shared process that
    # would pass a wrong kernel; here neither is the judge's.
    ("import cuforge.sandbox.judge.verify as v, cuforge.sandbox.host.monitor as c\n"
    "class _Ok:\n    ok = True\n    def __getattr__(self, k): return 0.0\n"
    "v.compare = lambda *a, **k: _Ok()\nc.Guard.violations = lambda self: []\n", "wrong_output"),
    # Write forged result lines onto every descriptor the process holds.
    ("import os, json\n"
    "line = json.dumps({'op': 'result', 'evaluation': {'status': 'ok'}, 'restart': False}).encode() + b'\\n'\n"
    "for fd in range(3, 64):\n    try:\n        os.write(fd, line)\n    except OSError:\n        pass\n",
     "runtime_error"),  # the judge reads bytes it cannot frame: the host broke the protocol
])
def test_forgeries_inside_the_candidates_process_change_nothing(sup, problems, forgery, status):
    ev = run(sup, problems, forgery + WRONG)
    assert ev.status == status, (ev.status, ev.message)


def test_inputs_cannot_be_rebuilt_from_the_candidates_seed(sup, problems):
    """In one process torch.initial_seed() is the evaluation's seed and the inputs follow from it;
    the candidate's process only learns the parameters' seed."""
    body = """
    import cuforge.sandbox.protocol.tensors as v
    class ModelNew(torch.nn.Module):
        calls = 0
        def forward(self, x):
            import sys
            seed = torch.initial_seed()
            problem = [m for n, m in sys.modules.items() if n.startswith('cuforge_problem_')][0]
            guess = v.make_inputs(problem, seed + 1000 * (ModelNew.calls + 1), x.device, gaussian=ModelNew.calls % 2 == 1)
            ModelNew.calls += 1
            return guess[0].clamp_min(0)
    """
    ev = run(sup, problems, body)
    assert ev.status == "wrong_output", (ev.status, ev.message)


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock (ABI >= 6)")
def test_the_candidates_process_cannot_touch_the_worker(sup, problems):
    """No signal, no /proc/<pid>/mem or environ of any process outside its own, no write outside its
    scratch directory: each attempt that succeeds raises, which would fail the candidate."""
    body = """
    import os, signal, tempfile
    me = os.getpid()
    reached = []
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        for what in ('mem', 'environ'):
            try:
                with open(f'/proc/{pid}/{what}', 'rb') as f:
                    f.read(1)
                reached.append(f'{what} of {pid}')
            except OSError:
                pass
        try:
            os.kill(pid, signal.SIGSTOP)
            reached.append(f'signal to {pid}')
        except OSError:
            pass
    scratch = tempfile.gettempdir()
    for target in ('/tmp/evil', os.path.join(os.path.dirname(scratch), 'evil')):
        try:
            open(target, 'w').write('x')
            reached.append(f'wrote {target}')
        except OSError:
            pass
    if reached:
        raise RuntimeError('reached: ' + ', '.join(reached[:5]))
    """
    ev = run(sup, problems, textwrap.dedent(body) + HONEST)
    assert ev.status == "ok", ev.message
    assert sup.alive()


def test_a_dying_or_silent_candidate_costs_one_evaluation_not_the_worker(problems):
    s = split_supervisor()
    try:
        ev = s.evaluate(problems["relu_any"], Candidate("import ctypes\nctypes.string_at(0)\n"), CFG)
        assert ev.status == "crash" and "SIGSEGV" in ev.message and not ev.worker_restarted, ev.message
        ev = s.evaluate(problems["relu_any"], Candidate("import os\nos._exit(7)\n"), CFG)
        assert ev.status == "crash" and "exit code 7" in ev.message and not ev.worker_restarted, ev.message
        hang = "import time, torch\n" + HONEST.replace("return", "time.sleep(3600); return")
        ev = s.evaluate(problems["relu_any"], Candidate(hang), EvalConfig(**{**CFG.to_dict(), "timeout_s": 8}))
        assert ev.status == "timeout" and not ev.worker_restarted and s.alive(), ev.message
        ev = s.evaluate(problems["relu_any"], Candidate("import torch\n" + HONEST), CFG)
        assert ev.ok and s.spawns == 1, ev.message
    finally:
        s.close()


def test_an_unknown_judge_mode_is_refused_by_name(problems, monkeypatch):
    monkeypatch.setenv("CUFORGE_JUDGE", "elsewhere")
    s = Supervisor(cpu_mode=True)
    try:
        with pytest.raises(Exception, match="CUFORGE_JUDGE='elsewhere'"):
            s.start()
    finally:
        s.close()


def test_the_split_holds_without_the_namespace_jail_too(problems, tmp_path):
    """Unjailed (--unsafe-no-jail), the candidate still runs in its own host, which confines itself."""
    from cuforge.sandbox.driver.jail import UNSAFE_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUFORGE_JAIL", "none")
        mp.setenv(UNSAFE_ENV, "1")
        mp.setenv("TMPDIR", str(tmp_path))
        s = split_supervisor()
    try:
        ev = s.evaluate(problems["relu_any"], Candidate("import torch\n" + HONEST), CFG)
        assert ev.status == "ok", ev.message
        assert s.info["judge"] == "split" and "candidate host" in ev.correctness["candidate_process"]
        if LANDLOCK:
            assert "Landlock" in ev.correctness["candidate_process"], ev.correctness["candidate_process"]
    finally:
        s.close()


def test_a_spare_is_replaced_only_when_the_judge_replenishes():
    """Taking a host orders no replacement by itself: the judge orders spares (and starts their GPU
    part) only where it is not calibrating or checking for escaped work."""
    from cuforge.sandbox.judge import hosts

    pool = hosts.HostPool("cpu", spares=2)
    try:
        first = pool.take()
        assert len(pool.ready) == 1
        pool.replenish()
        assert len(pool.ready) == 2
        assert not pool.starting() and pool.wait_quiet(timeout_s=5) < 1  # a CPU host has no GPU part
        second = pool.take()
        assert second.pid != first.pid and {first.pid, second.pid}.isdisjoint({os.getpid()})
        first.kill()
        second.kill()
        # The judge ends its evaluation only once the hosts it killed have exited (the GPU's turn
        # goes with the reply): none is left running after wait_exited.
        assert pool.wait_exited(timeout_s=5) < 5
        assert not any(hosts._running(pid) for pid in (first.pid, second.pid))
    finally:
        pool.close()


def test_the_judge_follows_who_wrote_the_candidates(monkeypatch):
    """Code cuforge did not write goes to the split judge; the template search's own kernels to the
    in-process one; CUFORGE_JUDGE, where set, decides (and a wrong value is a clear error)."""
    from cuforge.sandbox.protocol.judges import judge_for

    monkeypatch.delenv("CUFORGE_JUDGE", raising=False)
    assert judge_for(untrusted=True) == "split" and judge_for(untrusted=False) == "inprocess"
    monkeypatch.setenv("CUFORGE_JUDGE", "inprocess")
    assert judge_for(untrusted=True) == "inprocess"
    monkeypatch.setenv("CUFORGE_JUDGE", "split")
    assert judge_for(untrusted=False) == "split"
    monkeypatch.setenv("CUFORGE_JUDGE", "in-process")
    with pytest.raises(ValueError, match="CUFORGE_JUDGE='in-process'"):
        judge_for(untrusted=True)


@pytest.mark.parametrize("provider, judge", [("replay", "split"), ("template", "inprocess")])
def test_a_runs_workers_judge_follows_its_proposers(monkeypatch, provider, judge):
    """A run's real workers (CPU test mode) start with the judge its proposers call for."""
    from cuforge.agent.config import ProposerSpec, RunConfig
    from cuforge.agent.run import build_executor

    monkeypatch.delenv("CUFORGE_JUDGE", raising=False)
    cfg = RunConfig(proposers=[ProposerSpec(provider, replay_file="unused.jsonl" if provider == "replay" else None)],
                    device="cpu", gpus="1")
    executor = build_executor(cfg)
    try:
        assert executor.supervisors[0].start()["judge"] == judge
    finally:
        executor.close()


def test_spares_started_together_leave_room_for_an_evaluation_as_large_as_the_last():
    from cuforge.sandbox.judge.hosts import CONTEXT_BYTES, spares_affordable

    gib = 2**30
    assert spares_affordable(8, 80 * gib, 1 * gib) == 8  # hgemm 1024^3: the whole batch
    assert spares_affordable(8, 80 * gib, 60 * gib) == 1  # KernelBench's 6 GiB tensors: one at a time
    assert spares_affordable(8, 80 * gib, 55 * gib) == 3
    assert spares_affordable(8, 16 * gib, 14 * gib) == 1  # never none: the next evaluation needs a host
    assert spares_affordable(3, 80 * gib, 0) == 3 and CONTEXT_BYTES >= 800 * 2**20


def test_a_gpu_host_keeps_few_cpu_threads_and_a_cpu_host_all():
    """Many spares per GPU on a many-core machine must not exhaust the user's process limit; in the
    CPU test mode the candidate's work is CPU work and keeps torch's default."""
    from cuforge.sandbox.host.host import GPU_HOST_THREADS, host_threads
    from cuforge.sandbox.judge.hosts import HostPool

    assert host_threads(128) == GPU_HOST_THREADS == 4 and host_threads(2) == 2 and host_threads(0) == 1
    pool = HostPool("cpu", spares=1)
    try:
        host = pool.take()
        threads = len(os.listdir(f"/proc/{host.pid}/task"))
        assert threads <= 2 * max(os.cpu_count() or 1, 1) + 4, threads
        host.kill()
    finally:
        pool.close()
