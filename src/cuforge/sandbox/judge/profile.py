"""Profiles: per-kernel resources from the loaded cubins, achieved rates against ceilings measured
once per GPU, the roofline floor used by the impossible-speedup check, and a text summary."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from cuforge.sandbox.protocol.evaluation import Profile, summarize_profile

# Vendor datasheet peaks (dense, no sparsity) for the impossible-speedup check: no honest kernel
# beats these. Keyed by a substring of the device name; checked in order.
DATASHEET_PEAKS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"float16": 989.4e12, "bfloat16": 989.4e12, "float32": 494.7e12, "bytes_per_s": 4.8e12}),
    ("H100 PCIe", {"float16": 756.0e12, "bfloat16": 756.0e12, "float32": 378.0e12, "bytes_per_s": 2.0e12}),
    ("H100 NVL", {"float16": 835.0e12, "bfloat16": 835.0e12, "float32": 417.5e12, "bytes_per_s": 3.9e12}),
    ("H100", {"float16": 989.4e12, "bfloat16": 989.4e12, "float32": 494.7e12, "bytes_per_s": 3.35e12}),
    ("A100", {"float16": 312.0e12, "bfloat16": 312.0e12, "float32": 156.0e12, "bytes_per_s": 2.039e12}),
]


@dataclass
class Ceilings:
    """Measured on this GPU: copy bandwidth (read + write) and matmul rates."""

    device: str
    bytes_per_s: float
    flops_per_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_ceilings(device: torch.device) -> Ceilings:
    from cuforge.sandbox.judge.timing import Event, synchronize

    def best_ms(fn: Any, reps: int = 5) -> float:
        fn()
        synchronize()
        times = []
        for _ in range(reps):
            s, e = Event(enable_timing=True), Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            synchronize()
            times.append(s.elapsed_time(e))
        return min(times)

    bw = 2 * 2**30 / (best_ms(_copy_op(device)) / 1e3)  # 1 GiB read + 1 GiB written per copy
    rates = {}
    for dtype, size in ((torch.float16, 8192), (torch.bfloat16, 8192), (torch.float32, 4096)):
        rates[str(dtype).replace("torch.", "")] = 2 * size**3 / (best_ms(_matmul_op(device, dtype, size)) / 1e3)
    torch.cuda.empty_cache()
    return Ceilings(torch.cuda.get_device_name(device), bw, rates)


def _copy_op(device: torch.device) -> Any:
    src = torch.empty(2**28, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _matmul_op(device: torch.device, dtype: torch.dtype, size: int) -> Any:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return lambda: torch.matmul(a, b)


def ceilings_path(device: torch.device) -> Path:
    """This worker's own cache entry for the ceilings (see trusted_cache for the shared one)."""
    from cuforge.problems.loader import cache_dir

    name = torch.cuda.get_device_name(device)
    return cache_dir() / "ceilings" / f"{name.replace(' ', '_')}-{torch.__version__}.json"


def ceilings_for(device: torch.device) -> Ceilings:
    """Measured once per (GPU model, torch version) and cached on disk."""
    from cuforge.sandbox.protocol import trusted_cache

    path = ceilings_path(device)
    shared = trusted_cache.verified_bytes("ceilings", path.name)
    if shared is not None:
        try:
            return Ceilings(**json.loads(shared))
        except (ValueError, TypeError):
            pass
    if path.exists():
        try:
            return Ceilings(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    c = measure_ceilings(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(c.to_dict()))
    except OSError:
        pass
    return c


def peak_rates(device_name: str, measured: Ceilings | None) -> dict[str, float]:
    """Upper bounds no kernel can beat: datasheet peaks, else 1.5x the measured ceilings."""
    for key, peaks in DATASHEET_PEAKS:
        if key in device_name:
            return peaks
    if measured is None:
        return {}
    out = {k: 1.5 * v for k, v in measured.flops_per_s.items()}
    out["bytes_per_s"] = 1.5 * measured.bytes_per_s
    return out


def roofline_floor_ms(flops: float | None, nbytes: float | None, dtype: str | None, rates: dict[str, float]) -> float | None:
    """The least time the problem can take at the given rates: max(compute time, memory time)."""
    terms = []
    if flops and dtype in rates:
        terms.append(flops / rates[dtype])
    if nbytes and rates.get("bytes_per_s"):
        terms.append(nbytes / rates["bytes_per_s"])
    return max(terms) * 1e3 if terms else None


def build_profile(median_ms: float, flops: float | None, nbytes: float | None, dtype: str | None,
                  ceilings: Ceilings | None, kernels: list[dict[str, Any]] | None = None) -> Profile:
    """`kernels`: the resources of the kernels that ran (this process's, when not given)."""
    if kernels is None:
        from cuforge.runtime import kernel_resources

        kernels = kernel_resources()
    prof = Profile(kernels=kernels)
    secs = median_ms / 1e3
    if flops:
        prof.achieved_tflops = flops / secs / 1e12
    if nbytes:
        prof.achieved_gbps = nbytes / secs / 1e9
    if ceilings is not None:
        rates = dict(ceilings.flops_per_s, bytes_per_s=ceilings.bytes_per_s)
        floor = roofline_floor_ms(flops, nbytes, dtype, rates)
        if floor:
            prof.roofline_fraction = floor / median_ms
            compute_ms = flops / rates[dtype] * 1e3 if flops and dtype in rates else 0.0
            prof.bound = "compute" if compute_ms >= floor * 0.999 else "memory"
        prof.ceilings = ceilings.to_dict()
    prof.summary = summarize_profile(prof)
    return prof


