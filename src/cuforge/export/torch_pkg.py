"""`cuforge export --format torch`: a pip-installable package registering each operator as a
torch.library custom op, with prebuilt fatbins, NVRTC fallback, per-shape dispatch, generated
tests, a benchmark script, and a README with provenance. Same plan in, same bytes out."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cuforge.export.nvcc import FatbinResult
from cuforge.outputs import write_tree
from cuforge.export.plan import Entry, ExportError, Op, Plan

RUNTIME = Path(__file__).resolve().parent / "torch_runtime"
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ExportError(f"package name {name!r} must be a lowercase Python identifier (letters, digits, _)")
    return name


def input_names(op: Op) -> list[str]:
    return ["A", "B"] if op.kind == "gemm" else [f"in{i}" for i in range(len(op.input_dtypes))]


def entry_dict(e: Entry) -> dict[str, Any]:
    return {"shapes": [list(s) for s in e.shapes], "symbol": e.symbol, "grid": list(e.grid), "block": list(e.block),
            "shared_mem": e.shared_mem, "args": [a.to_dict() for a in e.args],
            "outputs": [[list(s), d] for s, d in e.outputs], "problem_id": e.problem_id, "speedups": e.speedups,
            "timings_ms": e.timings_ms}


def manifest(plan: Plan, fatbins: dict[str, FatbinResult], name: str, archs: list[str]) -> dict[str, Any]:
    ops = []
    for op in plan.ops:
        ops.append({"name": op.name, "kind": op.kind, "reference": f"reference/{op.name}.py",
                    "inputs": [{"name": n, "dtype": d, "rank": r}
                               for n, d, r in zip(input_names(op), op.input_dtypes, op.input_ranks)],
                    "outputs": list(op.output_dtypes), "tolerance": op.tolerance,
                    "entries": [entry_dict(e) for e in op.entries], "skipped": op.skipped, "notes": op.notes})
    kernels = {s: {"options": list(k.options), "archs": fatbins[s].archs, "arch_failures": fatbins[s].failures,
                   "candidate_id": k.candidate_id, "config": k.config} for s, k in plan.kernels.items()}
    return {"package": name, "namespace": name, "archs": archs, "provenance": plan.run, "ops": ops, "kernels": kernels}


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _version(run_id: str) -> str:
    local = re.sub(r"[^a-zA-Z0-9]+", ".", run_id).strip(".").lower()
    return f"0.1.0+{local}" if local else "0.1.0"


def pyproject(name: str, run_id: str) -> str:
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name.replace("_", "-")}"
version = "{_version(run_id)}"
description = "CUDA kernels found by cuforge run {run_id}, as torch custom ops"
readme = "README.md"
requires-python = ">=3.9"
dependencies = ["torch>=2.4"]

[project.optional-dependencies]
nvrtc = ["nvidia-cuda-nvrtc"]
test = ["pytest"]

[tool.setuptools]
packages = ["{name}"]

[tool.setuptools.package-data]
{name} = ["manifest.json", "kernels/*", "reference/*.py"]
'''


def speed_table(plan: Plan) -> list[str]:
    lines = []
    for op in plan.ops:
        lines += [f"### `{op.name}`", "", "| input shapes | kernel | vs torch | vs cuBLAS | vs cuBLASLt | kernel ms |",
                  "|---|---|---|---|---|---|"]
        for e in op.entries:
            s = e.speedups
            cells = [f"{s[b]:.3f}x" if b in s else "-" for b in ("torch", "cublas", "cublaslt")]
            lines.append(f"| {' , '.join('x'.join(map(str, sh)) for sh in e.shapes)} | `{e.symbol}` | "
                         + " | ".join(cells) + f" | {e.timings_ms.get('candidate', 0):.4f} |")
        if not op.entries:
            lines.append("| (none) | | | | | |")
        if op.notes:
            lines += ["", *[f"Note: {n}" for n in op.notes]]
        if op.skipped:
            lines += ["", "Left to the fallback:", ""]
            lines += [f"- `{s['problem_id']}`: {s['reason']}" for s in op.skipped]
        lines.append("")
    return lines


def readme(plan: Plan, name: str, archs: list[str], fatbins: dict[str, FatbinResult]) -> str:
    p = plan.run
    failures = [f"- `{s}`: no {a} image ({why}); NVRTC compiles it on such GPUs" for s, r in fatbins.items()
                for a, why in r.failures.items()]
    ops = ", ".join(f"`{op.name}`" for op in plan.ops)
    return "\n".join([
        f"# {name}", "",
        f"CUDA kernels found by a cuforge search, exported as PyTorch custom ops ({ops}).", "",
        "## Provenance", "",
        f"- run `{p['run_id']}` (suite `{p['suite']}`, status {p['status']}), started {p['run_started']}",
        f"- measured on {p['gpu']} with {p['software']}; exported by cuforge {p['cuforge']}",
        "- proposers: " + (", ".join(f"{x['provider']}" + (f" ({x['model']})" if x['model'] else "")
                                     for x in p["proposers"]) or "-"),
        f"- prebuilt for {', '.join(archs)} (plus PTX of the lowest portable arch); other GPUs compile with NVRTC", "",
        "Speedups below are the search's own measurements (median device time, L2 flushed, interleaved with",
        "each baseline on the same GPU). A kernel is used only for the shapes listed, and only where it",
        "measured faster than both torch eager and cuBLAS; every other call runs the reference.", "",
        *speed_table(plan),
        *(["## Arch coverage", "", *failures, ""] if failures else []),
        "## Use", "", "```bash", "pip install .", "```", "", "```python", "import torch",
        f"import {name}", "",
        *[f"y = torch.ops.{name}.{op.name}({', '.join(input_names(op))})   # or {name}.{op.name}(...)" for op in plan.ops],
        f"print({name}.dispatch_info('{plan.ops[0].name if plan.ops else 'op'}', ...))  # kernel or reference, and why",
        "```", "",
        "Forward only (no autograd formula). The kernels need contiguous, 16-byte aligned inputs of the",
        "tuned dtypes on one CUDA device; anything else falls back to the reference. Fake/meta",
        "implementations let torch.compile and torch.export trace the ops.", "",
        "## Check and measure", "", "```bash", "pip install pytest && python -m pytest tests", "python bench.py",
        "```", ""])


def write_torch_package(plan: Plan, fatbins: dict[str, FatbinResult], out: Path, name: str, archs: list[str]) -> list[Path]:
    check_name(name)
    pkg = out / name
    files: dict[Path, str | bytes] = {
        pkg / "__init__.py": (RUNTIME / "package_init.py").read_text(),
        pkg / "_loader.py": (RUNTIME / "_loader.py").read_text(),
        pkg / "_ops.py": (RUNTIME / "_ops.py").read_text(),
        pkg / "manifest.json": _dump(manifest(plan, fatbins, name, archs)),
        out / "pyproject.toml": pyproject(name, plan.run["run_id"]),
        out / "README.md": readme(plan, name, archs, fatbins),
        out / "tests" / "test_ops.py": (RUNTIME / "package_tests.py").read_text().replace("__PACKAGE__", name),
        out / "bench.py": (RUNTIME / "package_bench.py").read_text().replace("__PACKAGE__", name),
    }
    for op in plan.ops:
        files[pkg / "reference" / f"{op.name}.py"] = op.reference_source
    for symbol, k in plan.kernels.items():
        files[pkg / "kernels" / f"{symbol}.cu"] = k.source
        files[pkg / "kernels" / f"{symbol}.fatbin"] = fatbins[symbol].data
    return write_tree(out, files)
