"""Executors: where evaluations run. `local` keeps one supervised worker per visible GPU of this host;
`ray` (driver/ray_executor.py) keeps one Ray actor per GPU of a cluster, each owning such a worker.

Both give the same guarantees: one evaluation per GPU at a time (a GPU is a slot, and a slot is
lent to one evaluation until it returns), and every evaluation times its baselines interleaved with
the candidate in the same worker, so a speedup is always a ratio measured on one GPU.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Protocol

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.protocol.prebuilt import builds_ahead
from cuforge.sandbox.protocol.prebuilt_cubins import kernel_sources
from cuforge.sandbox.driver.supervisor import Supervisor

EXECUTORS = ("local", "ray")


class ExecutorError(RuntimeError):
    """The executor cannot be built as asked (no such GPU, Ray missing, cluster unreachable)."""


class Executor(Protocol):
    slots: int

    def evaluate(self, problem: Problem, candidate: Candidate, config: EvalConfig) -> Evaluation: ...

    def close(self) -> None: ...


def visible_gpus() -> list[str]:
    """Physical ids of the GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU
    nvidia-smi lists (no CUDA context is created in the driver process)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _indices(spec: str) -> list[int]:
    """A comma list of GPU indices: whole numbers from 0, each named once."""
    try:
        picks = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ExecutorError(f"--gpus takes 'all', a count, or comma-separated GPU indices, not {spec!r}") from None
    if not picks:
        raise ExecutorError("--gpus names no GPU")
    negative = [i for i in picks if i < 0]
    if negative:
        raise ExecutorError(f"--gpus {spec}: {negative[0]} is not a GPU index (they count from 0)")
    return picks


def select_gpus(spec: str, available: list[str]) -> list[str]:
    """`all`, a count (`2`: the first two) or a comma list of indices into the visible GPUs -> physical ids."""
    spec = spec.strip()
    if spec == "all":
        if not available:
            raise ExecutorError("--gpus: no GPU visible (CUDA_VISIBLE_DEVICES empty or nvidia-smi lists none); "
                                "use --compile-only or --cpu on a machine without GPUs")
        return list(available)
    picks = _indices(spec)
    if len(set(picks)) != len(picks):
        raise ExecutorError(f"--gpus {spec}: a GPU named twice would run two evaluations on it at once")
    missing = [i for i in picks if not 0 <= i < len(available)]
    if missing:
        raise ExecutorError(f"--gpus {spec}: no GPU {missing[0]} here ({len(available)} visible)")
    return [available[i] for i in picks]


class SlotPool:
    """Lends each slot to one evaluation at a time; thread-safe, blocking while every slot is busy."""

    def __init__(self, slots: list[Any]) -> None:
        self.all = list(slots)
        self._free: queue.Queue[Any] = queue.Queue()
        for s in self.all:
            self._free.put(s)

    def run(self, fn: Callable[[Any], Evaluation]) -> Evaluation:
        slot = self._free.get()
        try:
            return fn(slot)
        finally:
            self._free.put(slot)


class LocalExecutor:
    """One supervised worker per GPU of this host (or N CPU workers in compile-only / CPU test mode)."""

    def __init__(self, gpus: list[str], cpu_mode: bool = False, compile_only: bool = False,
                 isolate_network: bool = True, judge: str | None = None,
                 supervisors: list[Supervisor] | None = None) -> None:
        """supervisors: one per GPU of `gpus`, made by the caller (its own jail plan or environment)."""
        if not gpus:
            raise ExecutorError("the local executor needs at least one GPU or worker")
        self.gpus = gpus
        self.supervisors = supervisors or [Supervisor(gpu=g, cpu_mode=cpu_mode, compile_only=compile_only,
                                                      isolate_network=isolate_network, judge=judge) for g in gpus]
        self.pool = SlotPool(self.supervisors)
        self.slots = len(self.supervisors)
        # Compile-only workers where module candidates' extensions (one candidate a worker) and template
        # kernels' cubins build on the CPU while the GPUs time others; the search calls build_ahead
        # before it queues a candidate.
        self.builder_count = 0 if cpu_mode or compile_only else build_ahead_workers()
        self.builders: SlotPool | None = None
        self._builders_lock = threading.Lock()

    def evaluate(self, problem: Problem, candidate: Candidate, config: EvalConfig,
                 prebuilt: dict[str, str] | None = None) -> Evaluation:
        """prebuilt: what build_ahead returned for this candidate (None: its GPU's supervisor builds
        before it takes the GPU's turn, holding this executor's slot meanwhile)."""
        return self.pool.run(lambda sup: tag_device(sup.evaluate(problem, candidate, config, prebuilt), sup.gpu, "local"))

    def build_ahead(self, problem: Problem, candidate: Candidate, config: EvalConfig) -> dict[str, str] | None:
        """What a candidate builds as it is imported, built before it waits for a GPU: a module's
        load_inline extensions, or (for the in-process judge) its template kernels' cubins
        (protocol/prebuilt_cubins.py); {} where nothing was built; None where the GPU's own supervisor
        is left to do it (nothing to build ahead, no GPU worker has said its architecture yet, or the
        GPUs differ in it)."""
        if not self.builder_count:
            return None
        extensions = builds_ahead(candidate)
        kernels = [] if extensions or self.supervisors[0].judge != "inprocess" else kernel_sources(candidate)
        if not extensions and not kernels:
            return None
        archs = {s.arch() for s in self.supervisors}
        if len(archs) != 1 or None in archs:
            return None
        with self._builders_lock:
            if self.builders is None:
                arch = str(next(iter(archs)))
                self.builders = SlotPool([self.supervisors[0].new_builder(arch) for _ in range(self.builder_count)])
        if kernels:  # a builder's worker that ran a module candidate's import has ended: this one ran none
            return self.builders.run(lambda builder: builder.compile_kernels(kernels, config.timeout_s))
        return self.builders.run(lambda builder: builder.build_ahead(problem, candidate, config))

    def close(self) -> None:
        for sup in self.supervisors:
            sup.close()
        for builder in self.builders.all if self.builders is not None else []:
            builder.close()


def build_ahead_workers() -> int:
    """Compile-only workers building candidates' extensions at once: each build runs a compiler per
    source file, so one per four cores, from 1 to 4."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def tag_device(ev: Evaluation, gpu: Any, executor: str, host: str | None = None) -> Evaluation:
    """Which GPU (physical id, host) measured this evaluation: speedups are only ever compared with
    baselines timed on the same one."""
    ev.device = {**ev.device, "gpu": None if gpu is None else str(gpu), "executor": executor,
                 "host": host or os.uname().nodename}
    return ev


def worker_count(spec: str) -> int | None:
    """Where --gpus counts workers (CPU modes, Ray): `all` -> None (as many as there are), `4` -> 4,
    a comma list -> its length."""
    spec = spec.strip()
    if spec == "all":
        return None
    most = max(os.cpu_count() or 1, 1) * 4
    if spec.isdigit():
        count = int(spec)
    else:
        picks = _indices(spec)
        if len(set(picks)) != len(picks):
            raise ExecutorError(f"--gpus {spec}: a worker named twice")
        count = len(picks)
    if not 1 <= count <= most:
        raise ExecutorError(f"--gpus {spec}: {count} workers; it must be from 1 to {most} (4 per CPU core here)")
    return count
