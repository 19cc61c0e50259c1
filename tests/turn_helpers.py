"""Helpers for tests of the GPU's turn on machines without a GPU: a process holding a GPU's turn, and a
GPU supervisor whose worker computes on the CPU."""

import subprocess
import sys
import time

from cuforge.sandbox.driver.supervisor import Supervisor

HOLDER = """
import sys, time
from cuforge.sandbox.driver.gpu_turn import gpu_turn
with gpu_turn(sys.argv[1]) as waited:
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(gpu_id: str, seconds: float) -> subprocess.Popen:
    """A process holding the GPU's turn for `seconds`, once it has said so."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, gpu_id, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


class CpuWorkerTakingTurns(Supervisor):
    """A GPU supervisor (it takes the GPU's turn) whose worker computes on the CPU: how a GPU worker's
    start and evaluations meet the turn, on a machine without a GPU."""

    def _command(self):  # noqa: ANN202
        args, env = super()._command()
        return [*args, "--cpu"], env


def wait_until(cond, seconds: float = 90.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def search_through(cfg, sup: Supervisor, store_path, builder_count: int | None = None):  # noqa: ANN001, ANN201
    """Run the search `cfg` with its evaluations on `sup` (a GPU supervisor whose worker says it runs an
    sm_90 GPU, as a GPU worker's hello does) through a local executor: (the store, the executor).
    builder_count: the executor's compile-only workers (None: its own choice)."""
    import dataclasses

    from cuforge.agent.run import execute, prepare
    from cuforge.results.store import Store
    from cuforge.sandbox.driver.executor import LocalExecutor

    prep = prepare(cfg)
    prep.executor.close()
    sup.info = {**sup.start(), "compute_capability": "9.0"}
    executor = LocalExecutor([sup.gpu], supervisors=[sup])
    if builder_count is not None:
        executor.builder_count = builder_count
    store = Store(store_path)
    try:
        execute(dataclasses.replace(prep, executor=executor), store, None, False)
    finally:
        executor.close()
    return store, executor
