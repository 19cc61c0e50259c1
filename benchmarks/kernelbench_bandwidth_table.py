"""Merge kernelbench_bandwidth.py runs into one per-file table (markdown on stdout, JSON in results/).

Runs are given oldest first; a later run's row for a file replaces an earlier one (each row keeps the
name of the run it came from). Every ratio is against the copy bandwidth measured in its own run, so
rows from different runs compare.

    python benchmarks/kernelbench_bandwidth_table.py kb_bandwidth_level1 kb_bandwidth_s20_rows ... --name kb_bandwidth_s20
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def merged(runs: list[str]) -> list[dict]:
    rows: dict[str, dict] = {}
    for run in runs:
        data = json.loads((RESULTS / f"{run}.json").read_text())
        for r in data["rows"]:
            rows[r["file"]] = {**r, "run": run}
    return sorted(rows.values(), key=lambda r: int(re.match(r"\d+", r["file"]).group()))


def markdown(rows: list[dict]) -> str:
    out = ["| file | family | x copy bandwidth | eager x copy | vs eager | run |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "kernel_vs_copy" not in r:
            out.append(f"| {r['file']} | {r['family']} | {r['status']} | | | {r['run']} |")
            continue
        out.append(f"| {r['file']} | {r['family']} | {r['kernel_vs_copy']:.3f} | {r['eager_vs_copy']:.3f} | "
                   f"{r['eager_ms'] / r['kernel_ms']:.2f}x | {r['run']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="result names under benchmarks/results, oldest first")
    ap.add_argument("--name", default="kb_bandwidth_merged")
    a = ap.parse_args()
    rows = merged(a.runs)
    timed = [r for r in rows if "kernel_vs_copy" in r]
    summary = {"runs": a.runs, "files": len(rows), "timed": len(timed),
               "at_least_90pct": sum(r["kernel_vs_copy"] >= 0.9 for r in timed),
               "slower_than_eager": sum(r["kernel_ms"] > r["eager_ms"] for r in timed)}
    print(markdown(rows))
    print(summary)
    gpus: set[str] = set()
    for run in a.runs:  # a merged table (a run too) names its GPUs in a list
        gpu = json.loads((RESULTS / f"{run}.json").read_text()).get("gpu", "")
        gpus.update(gpu if isinstance(gpu, list) else [gpu])
    gpus = sorted(gpus)
    (RESULTS / f"{a.name}.json").write_text(json.dumps({"benchmark": "kernelbench_bandwidth_table", "gpu": gpus,
                                                       "summary": summary, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
