"""How long deciding the offline search's coverage takes on the CPU, per KernelBench level3 file:
the trace (a fresh inspector, no cache) and the matching over every family (families_for), with
the families found (for a partition, which ops its kernels run and which stay PyTorch's) or why none
covers the file. No GPU is needed.

    python benchmarks/level3_coverage.py [DIR]   # default ../shared/kernelbench/level3
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, write_result


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT.parent / "shared" / "kernelbench" / "level3")
    folder = ap.parse_args().folder
    os.environ["CUFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuforge-l3-")  # every trace made afresh
    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files

    rows = []
    for path in sorted(folder.glob("*.py"), key=lambda p: int(p.name.split("_")[0])):
        t0 = time.perf_counter()
        problems, skipped = load_files([path], timeout_s=600)
        trace_s = time.perf_counter() - t0
        row = {"file": path.name, "trace_s": round(trace_s, 2)}
        if skipped:
            row.update(loaded=False, reason=skipped[0].reason.splitlines()[0])
        else:
            problem = problems[0]
            t0 = time.perf_counter()
            families, why = families_for(problem)
            row.update(loaded=True, nodes=len(problem.graph), coverage_s=round(time.perf_counter() - t0, 3),
                       families=[f.name for f in families], covered=bool(families), why=why[:300])
            if families and families[0].name == "partition":  # kernels and PyTorch's parts
                row["parts"] = families[0].describe(problem)
        print(row, flush=True)
        rows.append(row)
    loaded = [r for r in rows if r["loaded"]]
    write_result("level3_coverage", {
        "files": len(rows), "loaded": len(loaded), "covered": sum(r["covered"] for r in loaded),
        "max_coverage_s": max((r["coverage_s"] for r in loaded), default=None),
        "max_trace_s": max(r["trace_s"] for r in rows), "rows": rows})


if __name__ == "__main__":
    main()
