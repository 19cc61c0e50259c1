"""Which executor a run gets: the local one (a worker per GPU of this machine) or Ray's (a worker per
GPU of a cluster)."""

from __future__ import annotations

from cuforge.sandbox.driver.executor import (
    EXECUTORS,
    Executor,
    ExecutorError,
    LocalExecutor,
    select_gpus,
    visible_gpus,
    worker_count,
)


def make_executor(executor: str, gpus: str, cpu_mode: bool, compile_only: bool, ray_address: str | None = None,
                  ray_resource: str = "GPU", judge: str | None = None) -> Executor:
    """The executor a run asked for. CPU modes take `gpus` as a worker count or list (default 1);
    `judge` is its workers' (protocol/judges.py)."""
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    if executor == "ray":
        from cuforge.sandbox.driver.ray_executor import RayExecutor  # imports ray only when asked for

        return RayExecutor(address=ray_address, resource=ray_resource, cpu_mode=cpu_mode, compile_only=compile_only,
                           workers=worker_count(gpus), judge=judge)
    if cpu_mode or compile_only:
        count = worker_count(gpus) or 1
        return LocalExecutor([str(i) for i in range(count)], cpu_mode=cpu_mode, compile_only=compile_only, judge=judge)
    return LocalExecutor(select_gpus(gpus, visible_gpus()), judge=judge)
