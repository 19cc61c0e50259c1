"""The GPU's turn (sandbox/gpu_turn.py) between real processes: a second evaluator on the same GPU waits
for the first, a killed holder frees the GPU at once, other GPUs do not wait, and a temporary directory
where no lock file can be made runs the evaluation without a turn."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from cuforge.sandbox.driver import gpu_turn as turns
from turn_helpers import CpuWorkerTakingTurns, hold, wait_until

def test_a_second_evaluator_on_the_same_gpu_waits_for_the_first():
    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 1.5)
    t0 = time.monotonic()
    with turns.gpu_turn(gpu) as waited:
        pass
    assert waited is not None and waited >= 1.0 and time.monotonic() - t0 >= 1.0  # the holder's 1.5 s, less its start
    assert holder.wait(timeout=30) == 0


def test_a_killed_holder_frees_the_gpu_at_once():
    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 120)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with turns.gpu_turn(gpu) as waited:
        assert waited is not None and waited < 5


def test_another_gpu_does_not_wait():
    holder = hold(f"test-{uuid.uuid4().hex}", 30)
    try:
        with turns.gpu_turn(f"test-{uuid.uuid4().hex}") as waited:
            assert waited is not None and waited < 1
    finally:
        holder.kill()
        holder.wait()


def test_gpu_ids_become_file_names():
    assert turns.turn_path("GPU-8a1b/../x").name == "gpu-GPU-8a1b_.._x.lock"
    assert turns.turn_path("0").parent.name == turns.LOCK_DIR


def test_where_no_lock_file_can_be_made_the_block_runs_without_a_turn(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "a_file"))  # no directory can be made in a file, even by root
    ran = []
    with turns.gpu_turn("0") as waited:
        ran.append(waited)
    assert ran == [None]


def test_a_waiter_gives_up_when_asked():
    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 120)
    try:
        deadline = time.monotonic() + 0.3
        t0 = time.monotonic()
        try:
            with turns.gpu_turn(gpu, give_up=lambda: time.monotonic() > deadline):
                raise AssertionError("the turn came while another process held it")
        except turns.TurnAbandoned as e:
            assert "gave up waiting" in str(e)
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()


def test_a_supervisor_shut_down_while_waiting_for_the_gpu_returns_at_once(tmp_path):
    # A stopping run closes its evaluators from another thread: one waiting for the turn must not keep the
    # run's thread until another process's evaluation ends.
    import threading

    from conftest import relu_problem_source

    from cuforge.problems.loader import load_files
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    f = tmp_path / "relu.py"
    f.write_text(relu_problem_source(1024, "custom", "N"))
    (problem,), _ = load_files([f])
    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 120)
    try:
        for stage in ("waiting for the turn", "starting up"):
            sup = CpuWorkerTakingTurns(gpu=gpu)
            got = []
            waiter = threading.Thread(target=lambda: got.append(sup.evaluate(problem, Candidate("import torch\n", "module"), EvalConfig())))
            waiter.start()
            if stage == "starting up":  # spawned, before its `ready`
                assert wait_until(lambda: sup.proc is not None, 30)
            else:
                assert wait_until(lambda: sup.ready), sup.log_tail()
                time.sleep(0.3)
            assert not got  # still waiting: the holder has the GPU
            t0 = time.monotonic()
            sup.close()
            waiter.join(timeout=10)
            assert not waiter.is_alive() and time.monotonic() - t0 < 5
            why = "shut down while it waited for the GPU" if stage == "waiting for the turn" else "shut down while it started"
            assert got[0].status == "crash" and why in got[0].message, (stage, got[0].message)
            assert sup.proc is None and not sup.greeted  # its worker ended, never given a candidate
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_tree_is_waited_for_to_its_last_process():
    """The supervisor holds the GPU's turn until a killed worker's processes have all exited, those
    that left its process group (a new session) included."""
    escapee = f"{sys.executable} -c 'import os, time; os.setsid(); time.sleep(60)'"  # no fork: its pid stays
    proc = subprocess.Popen(["sh", "-c", f"{escapee} & sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(turns.process_tree(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the escapee has left the group by now
    tree = turns.process_tree(proc.pid)
    assert len(tree) == 3, tree
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    t = time.monotonic()
    assert not turns.wait_exited(tree, timeout_s=0.3)  # the new session's sleep outlived the group's kill
    assert time.monotonic() - t >= 0.3
    for pid in tree - {proc.pid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert turns.wait_exited(tree, timeout_s=5)


def test_a_gpu_worker_starts_up_outside_the_turn_and_self_tests_in_it():
    # Its imports and CUDA context run no GPU work, so they run while another process evaluates; its
    # self-test times an honest kernel and checks it for escaped work, so that waits for the turn.
    import threading

    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 120)
    sup = CpuWorkerTakingTurns(gpu=gpu)
    done = []
    starter = threading.Thread(target=lambda: done.append(_outcome(sup.start)))
    try:
        starter.start()
        assert wait_until(lambda: sup.ready), sup.log_tail()  # started up while the holder has the turn
        time.sleep(0.5)
        assert sup.alive() and not sup.greeted and not done  # no self-test, no hello: waiting for the turn
        holder.kill()
        holder.wait()
        starter.join(timeout=120)
        assert done and isinstance(done[0], dict), done
        assert sup.greeted and sup.spawns == 1
        start_s = done[0]["start_s"]
        assert start_s["until_ready"] > 0 and set(start_s) == {"until_ready", "self_test", "trusted_artifacts"}
    finally:
        holder.kill()
        holder.wait()
        sup.close()


def test_an_evaluation_that_needs_a_new_worker_starts_it_before_waiting_for_the_turn(tmp_path):
    import threading

    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from template_helpers import problem_from_expr

    problem = problem_from_expr(tmp_path, "torch.relu(a)", "torch.randn(64, 64)", args="a")
    honest = Candidate("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a):\n        return torch.relu(a)\n")
    config = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=60)
    gpu = f"test-{uuid.uuid4().hex}"
    holder = hold(gpu, 120)
    sup = CpuWorkerTakingTurns(gpu=gpu)
    done = []
    evaluator = threading.Thread(target=lambda: done.append(_outcome(lambda: sup.evaluate(problem, honest, config))))
    try:
        evaluator.start()
        assert wait_until(lambda: sup.ready), sup.log_tail()
        time.sleep(0.5)
        assert not sup.greeted and not done
        holder.kill()
        holder.wait()
        evaluator.join(timeout=120)
        ev = done[0]
        assert ev.status == "ok", (ev.status, ev.message)
        assert ev.device.get("gpu_turn_wait_s", 0) > 0.4 and not ev.worker_restarted
        # A worker's restart after a verdict that ends it is started the same way.
        sup.close()
        ev = sup.evaluate(problem, honest, config)
        assert ev.status == "ok" and ev.worker_restarted and sup.spawns == 2
    finally:
        holder.kill()
        holder.wait()
        sup.close()


def _outcome(call):  # noqa: ANN001, ANN202
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - a worker with no GPU behind it may refuse to start
        return e


BACK_TO_BACK = """
import sys, time
from cuforge.sandbox.driver.gpu_turn import gpu_turn
end = time.monotonic() + float(sys.argv[2])
first = True
while time.monotonic() < end:
    with gpu_turn(sys.argv[1]):
        if first:
            print("held", flush=True)
            first = False
        time.sleep(0.05)
"""


def test_a_process_evaluating_back_to_back_does_not_starve_a_waiter():
    # It lets go and asks again at once; the waiter, polling, must still get the GPU within a few turns.
    gpu = f"test-{uuid.uuid4().hex}"
    busy = subprocess.Popen([sys.executable, "-c", BACK_TO_BACK, gpu, "8"], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "held"
        for _ in range(5):
            t0 = time.monotonic()
            with turns.gpu_turn(gpu) as waited:
                assert waited is not None and waited < 1.0, waited  # without the queueing: the whole 8 s
            time.sleep(0.01)
        assert busy.poll() is None and time.monotonic() - t0 < 8  # it was still evaluating all along
    finally:
        busy.kill()
        busy.wait()


class ShutDownDuringStart(CpuWorkerTakingTurns):
    """A supervisor that a stopping run's thread closes at one exact moment of its worker's start."""

    def __init__(self, moment: str, **kw):  # noqa: ANN003
        super().__init__(**kw)
        self.moment = moment
        self.spawned = []

    def _shut_down_from_another_thread(self, moment: str) -> None:
        import threading

        if moment == self.moment:
            t = threading.Thread(target=self.close)
            t.start()
            t.join()

    def _command(self):  # noqa: ANN202
        self._shut_down_from_another_thread("before the process")
        return super()._command()

    def _start_process(self):  # noqa: ANN202
        proc = super()._start_process()
        self.spawned.append(proc)
        self._shut_down_from_another_thread("before it is recorded")
        return proc

    def _read(self, timeout_s, max_rss=None, proc=None):  # noqa: ANN001, ANN202
        if not self.ready:
            self._shut_down_from_another_thread("before its ready is read")
        return super()._read(timeout_s, max_rss, proc)


def test_a_shutdown_at_each_moment_of_a_start_is_named_and_leaves_no_worker(tmp_path):
    # Each window of a start where another thread's close() lands: the evaluation is the named crash, and
    # a worker started meanwhile is ended rather than left running behind the closed supervisor.
    from conftest import relu_problem_source

    from cuforge.problems.loader import load_files
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    f = tmp_path / "relu.py"
    f.write_text(relu_problem_source(1024, "custom", "N"))
    (problem,), _ = load_files([f])
    for moment in ("before the process", "before it is recorded", "before its ready is read"):
        sup = ShutDownDuringStart(moment, gpu=f"test-{uuid.uuid4().hex}")
        ev = sup.evaluate(problem, Candidate("import torch\n", "module"), EvalConfig())
        assert ev.status == "crash" and "shut down while it started" in ev.message, (moment, ev.message)
        assert sup.proc is None and sup.workdir is None, moment
        assert all(p.poll() is not None for p in sup.spawned), moment  # ended and reaped
        assert len(sup.spawned) == (0 if moment == "before the process" else 1), moment
