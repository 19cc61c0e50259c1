"""Markdown tables for docs/benchmarks.md from kernelbench.py's sweep results: per level, the
PyTorch-as-candidate status counts and memory, the largest peaks, and the re-checked files.

    python benchmarks/kernelbench_summary.py [--recheck kernelbench_recheck]

A file measured in several result files takes its row from the re-check (the final code).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from typing import Any

from _common import ROOT

RESULTS = ROOT / "benchmarks" / "results"


def rows_of(name: str) -> list[dict[str, Any]]:
    return [r for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"] if r["kind"] == "pytorch_as_candidate"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", default="kernelbench_sweep_shard{}of5", help="result name pattern, {} = 1..5")
    ap.add_argument("--recheck", default="kernelbench_recheck")
    a = ap.parse_args()
    sweep = [r for i in range(1, 6) for r in rows_of(a.shards.format(i))]
    recheck = {(r["level"], r["file"]): r for r in rows_of(a.recheck)} if (RESULTS / f"{a.recheck}.json").exists() else {}
    final = [recheck.get((r["level"], r["file"]), r) for r in sweep]
    print("| level | files | ok | other | out of memory | max peak GiB | median peak / eager |")
    print("|---|---|---|---|---|---|---|")
    for level in sorted({r["level"] for r in final}):
        rs = [r for r in final if r["level"] == level]
        statuses = Counter(r["status"] for r in rs)
        ratios = [r["peak_device_gib"] / r["eager_footprint_gib"] for r in rs if r["eager_footprint_gib"]]
        oom = sum("out of GPU memory" in (r.get("message") or "") for r in rs)
        other = ", ".join(f"{k} {v}" for k, v in statuses.items() if k != "ok") or "-"
        print(f"| {level} | {len(rs)} | {statuses['ok']} | {other} | {oom} | {max(r['peak_device_gib'] for r in rs):.1f} "
              f"| {statistics.median(ratios):.1f} |")
    print("\n| largest peaks | status | peak GiB | eager GiB | eager ms here | KernelBench eager ms |")
    print("|---|---|---|---|---|---|")
    for r in sorted(final, key=lambda r: -r["peak_device_gib"])[:8]:
        kb = r.get("kernelbench_h100_eager_ms")
        print(f"| {r['level']}/{r['file'][:-3][:48]} | {r['status']} | {r['peak_device_gib']:.1f} | "
              f"{r['eager_footprint_gib']:.2f} | {r['eager_ms'] or 0:.3f} | {kb if kb is not None else '-'} |")
    if recheck:
        before = {(r["level"], r["file"]): r for r in sweep}
        print("\n| re-checked file | status before | status now | eager ms |")
        print("|---|---|---|---|")
        for key, r in sorted(recheck.items()):
            print(f"| {key[0]}/{key[1][:-3][:48]} | {before[key]['status']} | {r['status']} | {r['eager_ms'] or 0:.3f} |")


if __name__ == "__main__":
    main()
