"""Exporting a run's winning kernels as a torch custom-op package or a CMake C library."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cuforge.export.plan import ExportError, Plan
from cuforge.outputs import OutputError, check_output_dir

FORMATS = ("torch", "cmake")
DEFAULT_NAMES = {"torch": "cuforge_kernels", "cmake": "cuforge"}


@dataclass
class ExportResult:
    out: Path
    format: str
    name: str
    plan: Plan
    files: list[Path] = field(default_factory=list)

    def summary(self) -> dict:
        return {"out": str(self.out), "format": self.format, "name": self.name, "run_id": self.plan.run["run_id"],
                "ops": {op.name: {"tuned_shapes": len(op.entries), "left_to_fallback": len(op.skipped)}
                        for op in self.plan.ops},
                "kernels": sorted(self.plan.kernels), "files": len(self.files)}


def export_run(store_path: Path, run_id: str | None, fmt: str, out: Path, name: str | None = None,
               archs: str = "sm_90a,sm_80", min_speedup: float = 1.0, jobs: int = 2) -> ExportResult:
    """Plan from the store, compile every kernel with nvcc, write the package or library."""
    from cuforge.export.nvcc import compile_all, parse_archs
    from cuforge.export.select import build_plan
    from cuforge.results.store import Store, StoreError

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    arch_list = parse_archs(archs)
    name = name or DEFAULT_NAMES[fmt]
    try:
        check_output_dir(out)  # before any build: refuse a directory with files cuforge did not write
    except OutputError as e:
        raise ExportError(str(e)) from None
    try:
        store = Store(store_path, readonly=True)
        run_id = run_id or store.latest_run().id
        plan = build_plan(store, run_id, min_speedup)
    except StoreError as e:
        raise ExportError(str(e)) from None
    if not plan.kernels:
        reasons = "; ".join(f"{s['problem_id']}: {s['reason']}" for op in plan.ops for s in op.skipped[:3])
        raise ExportError(f"run {run_id} has no exportable kernel ({reasons or 'no problems'})")
    fatbins = compile_all({s: (k.source, k.options) for s, k in plan.kernels.items()}, arch_list, jobs)
    try:
        if fmt == "torch":
            from cuforge.export.torch_pkg import write_torch_package

            files = write_torch_package(plan, fatbins, out, name, arch_list)
        else:
            from cuforge.export.cmake_lib import write_cmake_library

            files = write_cmake_library(plan, fatbins, out, name, arch_list)
    except OutputError as e:
        raise ExportError(str(e)) from None
    return ExportResult(out, fmt, name, plan, files)
