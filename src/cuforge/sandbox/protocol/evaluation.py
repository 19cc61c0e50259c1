"""The Evaluation vocabulary: what one candidate's run in the sandbox established.

Plain dataclasses that cross the worker/supervisor boundary as JSON.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from cuforge.diagnostics import Diagnostic

# Every status an evaluation can end in. Cheats are "cheat:<kind>" with a kind from CHEAT_KINDS.
# "compiled": a compile-only run loaded the candidate and built its kernels, and ran nothing.
STATUSES = ("ok", "compiled", "compile_error", "runtime_error", "timeout", "crash", "wrong_output")
CHEAT_KINDS = (
    "side_stream",        # kernels on a stream other than the timed one
    "thread",             # threads or processes left running after forward returned
    "result_caching",     # outputs that do not follow the inputs (reused across calls)
    "library_call",       # library compute (aten ops, cuBLAS/cuDNN/CUTLASS kernels) under policy "custom",
                          # or no kernel of the candidate's own under policy "mixed"
    "precision_downgrade",  # lower-precision output or arithmetic, or global precision flags changed
    "timer_patch",        # timers, events, synchronize or profiler functions replaced
    "monkeypatch",        # torch functions or harness globals replaced
    "lazy_tensor",        # output is a tensor subclass, a meta/fake tensor, or not on the device
    "aliasing",           # output aliases an input or memory of a reference result
    "input_mutation",     # inputs changed by the candidate
    "escaped_work",       # device time not captured by the timed stream's events
    "impossible_speedup",  # faster than the problem's roofline floor allows
)


def cheat(kind: str) -> str:
    if kind not in CHEAT_KINDS:
        raise ValueError(f"unknown cheat kind {kind!r}")
    return f"cheat:{kind}"


def is_valid_status(status: str) -> bool:
    return status in STATUSES or (status.startswith("cheat:") and status[6:] in CHEAT_KINDS)


@dataclass(frozen=True)
class TimingStats:
    """Per-call device time of one contender, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    rse: float  # relative standard error of the mean of the samples
    method: str  # "events+l2flush", "graph+rotating", or "cpu-wallclock" (CPU test mode only)
    # Samples kept although the device reached their start before the host had enqueued the call
    # (the call waits for the device, or its host time outlasted the longest spin): host time may
    # show in them. 0 where every sample is device time.
    late: int = 0

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TimingStats:
        return TimingStats(**d)


@dataclass
class Profile:
    """What the profilers say of a candidate: per-kernel resources, achieved rates against the GPU's
    measured ceilings, optional Nsight Compute metrics, and a short text for prompts."""

    kernels: list[dict[str, Any]] = field(default_factory=list)
    achieved_tflops: float | None = None
    achieved_gbps: float | None = None
    roofline_fraction: float | None = None
    bound: str | None = None  # "compute" or "memory"
    ceilings: dict[str, Any] | None = None
    ncu: dict[str, Any] | None = None
    summary: str = ""


def summarize_profile(prof: Profile) -> str:
    """A few lines of a profile that a prompt (and `cuforge eval`) can use."""
    parts = []
    if prof.achieved_tflops is not None:
        parts.append(f"{prof.achieved_tflops:.1f} TFLOP/s")
    if prof.achieved_gbps is not None:
        parts.append(f"{prof.achieved_gbps:.0f} GB/s")
    if prof.roofline_fraction is not None:
        parts.append(f"{100 * prof.roofline_fraction:.0f}% of the measured {prof.bound or ''} roofline")
    lines = ["; ".join(parts)] if parts else []
    for k in prof.kernels:
        spill = f", {k['local_bytes']} B local (spills)" if k.get("local_bytes") else ""
        lines.append(f"kernel {k['name']}: {k['registers']} regs/thread, {k['shared_static_bytes']} B static smem, "
                     f"{k['last_dynamic_shared']} B dynamic smem, block {tuple(k['last_block'])}, grid {tuple(k['last_grid'])}{spill}")
    if prof.ncu:
        lines.append("ncu: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in prof.ncu.items()))
    return "\n".join(lines)


@dataclass
class Evaluation:
    problem_id: str
    candidate_id: str
    status: str
    message: str = ""
    diagnostics: list[Diagnostic] = field(default_factory=list)
    correctness: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, TimingStats] = field(default_factory=dict)
    profile: Profile | None = None
    device: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    worker_restarted: bool = False

    def __post_init__(self) -> None:
        if not is_valid_status(self.status):
            raise ValueError(f"invalid evaluation status {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_cheat(self) -> bool:
        return self.status.startswith("cheat:")

    def speedup_vs(self, baseline: str) -> float | None:
        """Baseline median over candidate median, both measured interleaved in one worker."""
        cand, base = self.timings.get("candidate"), self.timings.get(baseline)
        if not self.ok or cand is None or base is None or cand.median_ms <= 0:
            return None
        return base.median_ms / cand.median_ms

    @property
    def speedups(self) -> dict[str, float]:
        out = {}
        for name in self.timings:
            if name != "candidate":
                s = self.speedup_vs(name)
                if s is not None:
                    out[name] = s
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedups"] = self.speedups
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Evaluation:
        d = dict(d)
        d.pop("speedups", None)
        d["diagnostics"] = [Diagnostic(**x) for x in d.get("diagnostics") or []]
        d["timings"] = {k: TimingStats.from_dict(v) for k, v in (d.get("timings") or {}).items()}
        d["profile"] = Profile(**d["profile"]) if d.get("profile") else None
        return Evaluation(**d)


def physical_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):  # pragma: no cover - not Linux
        return 16 * 2**30


WORKER_MEMORY_FRACTION = 0.5  # of physical memory, for one worker's host memory
WORKER_MEMORY_CAP_GIB = 64.0


def default_worker_memory_gib() -> float:
    """One worker's host-memory limit: half the machine's memory, at most 64 GiB, so that a runaway
    candidate is stopped by its own limit before the machine runs out."""
    return round(min(WORKER_MEMORY_CAP_GIB, WORKER_MEMORY_FRACTION * physical_memory_bytes() / 2**30), 1)


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate. The defaults are the house rules; tests may relax sample counts only."""

    device: str = "cuda"  # "cpu" runs the harness without a GPU (tests): correctness only, wall-clock times
    trials: int = 5
    seed: int | None = None  # None: fresh random seed per evaluation (recorded in the result)
    baselines: tuple[str, ...] = ("torch",)
    compile_mode: str = "default"  # torch.compile mode for the "torch.compile" baseline
    min_samples: int = 30
    max_samples: int = 300
    target_rse: float = 0.005
    max_timing_s: float = 20.0
    profile: bool = True
    timeout_s: float = 300.0
    max_host_memory_gib: float = field(default_factory=default_worker_memory_gib)  # per worker
    compile_only: bool = False  # load the candidate and compile its kernels (no GPU needed); run nothing
    # With compile_only: hand back the extensions the candidate's import built (protocol/prebuilt.py).
    prebuild: bool = False
    # The precision contract (protocol/precision.py): what correct means, and the flags the reference and
    # the "torch"/"torch.compile" baselines run under. The other contract's eager is timed beside them.
    precision: str = "fp32"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EvalConfig:
        d = dict(d)
        d["baselines"] = tuple(d.get("baselines", ("torch",)))
        return EvalConfig(**d)
