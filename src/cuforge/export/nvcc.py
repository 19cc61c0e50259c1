"""Ahead-of-time builds of exported kernels with nvcc: one fatbin per kernel holding SASS for each
requested arch (plus PTX of the lowest portable arch, which newer GPUs can JIT)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cuforge.export.plan import ExportError

ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")
# NVRTC options with the same meaning for nvcc; anything else a kernel asks for is refused.
_PASS_THROUGH = ("-D", "-U", "--use_fast_math", "-use_fast_math", "--ftz=", "--prec-div=", "--prec-sqrt=", "--fmad=")


@dataclass
class FatbinResult:
    data: bytes
    archs: list[str]
    failures: dict[str, str] = field(default_factory=dict)  # arch -> first compiler error line


def parse_archs(spec: str) -> list[str]:
    archs = [a.strip() for a in spec.split(",") if a.strip()]
    bad = [a for a in archs if not ARCH_RE.match(a)]
    if bad or not archs:
        raise ExportError(f"--arch takes archs like sm_90a,sm_80, not {spec!r}")
    return sorted(dict.fromkeys(archs), key=lambda a: (-int(ARCH_RE.match(a).group(1)), a))  # type: ignore[union-attr]


def nvcc_path() -> str:
    path = shutil.which("nvcc") or next((str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.exists()), None)
    if path is None:
        raise ExportError("nvcc not found on PATH: exports are compiled ahead of time (install the CUDA toolkit)")
    return path


def gencode(arch: str, with_ptx: bool) -> list[str]:
    num, suffix = ARCH_RE.match(arch).groups()  # type: ignore[union-attr]
    flags = [f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}"]
    if with_ptx:
        flags.append(f"-gencode=arch=compute_{num}{suffix},code=compute_{num}{suffix}")
    return flags


def nvcc_options(options: tuple[str, ...]) -> list[str]:
    out = []
    for o in options:
        if o in ("-std=c++17", "--std=c++17") or o.startswith("-O"):
            continue
        if not o.startswith(_PASS_THROUGH):
            raise ExportError(f"kernel compile option {o!r} has no nvcc equivalent cuforge knows")
        out.append(o)
    return out


def _ptx_arch(archs: list[str]) -> str | None:
    portable = [a for a in archs if not a.endswith(("a", "f"))]
    return portable[-1] if portable else None  # the lowest: PTX JITs forward, never back


def _run(nvcc: str, src: Path, out: Path, flags: list[str]) -> str | None:
    cmd = [nvcc, "-fatbin", "-std=c++17", "-O3", *flags, src.name, "-o", out.name]
    r = subprocess.run(cmd, cwd=src.parent, capture_output=True, text=True, timeout=600)
    if r.returncode == 0:
        return None
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if "error" in ln.lower()] or r.stderr.splitlines()[-1:]
    return (lines[0] if lines else f"nvcc exit {r.returncode}").strip()[:300]


def compile_fatbin(source: str, options: tuple[str, ...], archs: list[str]) -> FatbinResult:
    """All archs at once; if that fails, each arch alone, keeping those that compile."""
    nvcc = nvcc_path()
    extra = nvcc_options(options)
    with tempfile.TemporaryDirectory(prefix="cuforge-nvcc-") as d:
        src = Path(d) / "kernel.cu"  # a fixed name: the fatbin is the same whatever the temp dir
        src.write_text(source)
        out = Path(d) / "kernel.fatbin"
        ptx = _ptx_arch(archs)
        flags = [f for a in archs for f in gencode(a, a == ptx)] + extra
        if _run(nvcc, src, out, flags) is None:
            return FatbinResult(out.read_bytes(), list(archs))
        failures: dict[str, str] = {}
        for a in archs:
            why = _run(nvcc, src, Path(d) / f"probe_{a}.fatbin", gencode(a, False) + extra)
            if why:
                failures[a] = why
        ok = [a for a in archs if a not in failures]
        if not ok:
            first = next(iter(failures.values()))
            raise ExportError(f"kernel does not compile with nvcc for any of {', '.join(archs)}: {first}")
        ptx = _ptx_arch(ok)
        why = _run(nvcc, src, out, [f for a in ok for f in gencode(a, a == ptx)] + extra)
        if why:
            raise ExportError(f"nvcc failed building the fatbin: {why}")
        return FatbinResult(out.read_bytes(), ok, failures)


def compile_all(kernels: dict[str, tuple[str, tuple[str, ...]]], archs: list[str], jobs: int = 2) -> dict[str, FatbinResult]:
    """symbol -> (source, options) compiled in parallel."""
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {s: pool.submit(compile_fatbin, src, opts, archs) for s, (src, opts) in kernels.items()}
        return {s: f.result() for s, f in futures.items()}
