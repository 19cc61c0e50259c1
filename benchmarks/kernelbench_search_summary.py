"""Markdown tables for docs/benchmarks.md from kernelbench_search.py's results: coverage per level and
family, then the searched files per family (fast_1 and geomean vs eager and torch.compile) and per file.

    python benchmarks/kernelbench_search_summary.py --level 1
    python benchmarks/kernelbench_search_summary.py --coverage kb_coverage --search kb_search_level2_gemm
    python benchmarks/kernelbench_search_summary.py --level 2 --precision pytorch

A file searched in several result files takes its row from the last one named; without --search, every
kb_search_*.json result, in the order of the dates they were written.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from _common import ROOT

from cuforge.rewards import geomean

RESULTS = ROOT / "benchmarks" / "results"


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def coverage_table(cov: dict[str, Any]) -> None:
    print("| level | files | covered | by preferred family |")
    print("|---|---|---|---|")
    for level, s in cov["summary"].items():
        fams = ", ".join(f"{k} {v}" for k, v in sorted(s["by_family"].items(), key=lambda kv: -kv[1]))
        print(f"| {level} | {s['files']} | {s['covered']} ({100 * s['covered'] / s['files']:.0f}%) | {fams} |")


def search_tables(rows: list[dict[str, Any]]) -> None:
    print("\n| family | files | correct | fast_1 vs eager | fast_1 vs torch.compile | geomean vs eager | geomean vs torch.compile |")
    print("|---|---|---|---|---|---|---|")
    for fam in sorted({r["family"] for r in rows}) + ["all"]:
        rs = [r for r in rows if fam in ("all", r["family"])]
        eager = [r["vs_torch"] for r in rs]
        comp = [r["vs_torch_compile"] for r in rs]
        print(f"| {fam} | {len(rs)} | {sum(bool(r['correct']) for r in rs)} | {sum((v or 0) > 1 for v in eager)} "
              f"| {sum((v or 0) > 1 for v in comp)} | {fmt(geomean(eager))} | {fmt(geomean(comp))} |")
    # Records that re-timed eager under the other contract's flags too (TF32 off under `pytorch`, PyTorch's
    # defaults under `fp32`) show that ratio beside the contract's own.
    other = next((k for k in ("vs_torch.strict", "vs_torch.default_flags") if any(k in r.get("recheck", {}) for r in rows)), None)
    label = {"vs_torch.strict": "vs eager, TF32 off", "vs_torch.default_flags": "vs eager, default flags"}.get(other or "")
    print("\n| file | family | best ms | vs eager | vs torch.compile |" + (f" {label} |" if other else ""))
    print("|---|---|---|---|---|" + ("---|" if other else ""))
    for r in sorted(rows, key=lambda r: (r["problem"].split("_")[0], int(r["problem"].split("_")[1]))):
        level, name = r["problem"].split("/", 1)[1].split("_", 1)  # kernelbench/l1_19_ReLU
        extra = f" {fmt(r.get('recheck', {}).get(other))} |" if other else ""
        print(f"| level{level[1:]}/{name} | {r['family']} | {fmt(r['best_ms'], 3)} | {fmt(r['vs_torch'])} | {fmt(r['vs_torch_compile'])} |{extra}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coverage", default="kb_coverage")
    ap.add_argument("--search", default="", help="comma list of result names (default: every kb_search_* by date)")
    ap.add_argument("--level", default="", help="only this level's files (1 or 2)")
    ap.add_argument("--precision", default="fp32", help="without --search, the records searched under this "
                    "contract (those from before contracts were fp32's)")
    a = ap.parse_args()
    coverage_table(load(a.coverage)["coverage"])
    names = a.search.split(",") if a.search else [n for _, n in sorted(
        (load(p.stem).get("date", ""), p.stem) for p in RESULTS.glob("kb_search_*.json")
        if "search" in load(p.stem) and load(p.stem)["search"].get("precision", "fp32") == a.precision)]
    final: dict[str, dict[str, Any]] = {}
    for name in names:
        for r in load(name)["search"]["rows"]:
            if not a.level or r["problem"].split("/", 1)[1].startswith(f"l{a.level}_"):
                final[r["problem"]] = r
    search_tables(list(final.values()))


if __name__ == "__main__":
    main()
