"""Where a partition's forward spends host time, on the GPU: for each file, the offline partition with
every kernel (the search's first seed) and eager PyTorch, each forward's host time to issue its work
(the call's return, before any synchronize) and its wall time with the synchronize, the kernels it
launches, and a profile of the Python functions the kernel forward runs (cProfile over several
forwards: calls and microseconds per forward). A forward whose issue time is close to its wall time
is bound by its host code, not by its kernels. The kernels are cuforge's templates run outside the
sandbox: a probe of the launch path, not an evaluation.

    python benchmarks/stage_overhead.py ../shared/kernelbench/level3/9_ResNet18.py --name NAME
    python benchmarks/stage_overhead.py --table NAME,NAME2    # records as docs/benchmarks.md's table
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from _common import ROOT, parser, write_result
from partition_parts import candidate_module, loaded

FORWARDS = 30
PROFILED = 10
TOP = 25


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def issue_and_wall(model: Any, inputs: list[Any]) -> dict[str, float]:
    """Median ms of a forward's issue (host, no synchronize) and of its wall time (synchronized)."""
    issue, wall = [], []
    for _ in range(FORWARDS):
        synchronize()
        t0 = time.perf_counter()
        model(*inputs)
        t1 = time.perf_counter()
        synchronize()
        t2 = time.perf_counter()
        issue.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return {"issue_ms": statistics.median(issue), "wall_ms": statistics.median(wall)}


def profile_rows(model: Any, inputs: list[Any]) -> list[dict[str, Any]]:
    """The functions a forward spends its host time in, most first: calls and microseconds per forward."""
    synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(PROFILED):
        model(*inputs)
    prof.disable()
    synchronize()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, fn), (_, calls, tottime, cumtime, _) in stats.items():
        rows.append({"function": f"{Path(file).name}:{line}:{fn}", "calls": calls / PROFILED,
                     "self_us": tottime / PROFILED * 1e6, "cumulative_us": cumtime / PROFILED * 1e6})
    return sorted(rows, key=lambda r: -r["self_us"])[:TOP]


def launches_per_forward(model: Any, inputs: list[Any]) -> int:
    from cuforge.runtime import LAUNCHED

    before = sum(r.launches for r in LAUNCHED.values())
    model(*inputs)
    return sum(r.launches for r in LAUNCHED.values()) - before


def probe(path: Path) -> dict[str, Any]:
    import torch

    f = loaded(path, "fp32")
    if isinstance(f, dict):
        return f
    eager, inputs = f.eager, f.inputs
    torch.manual_seed(0)
    kernels = candidate_module(f.source, f.Model, "kernels").ModelNew(*f.init).cuda()
    with torch.no_grad():
        for model in (eager, kernels):
            for _ in range(3):
                model(*inputs)
        torch.cuda.synchronize()
        row = {"file": path.name, "outcome": "probed", "eager": issue_and_wall(eager, inputs),
               "kernels": issue_and_wall(kernels, inputs), "launches": launches_per_forward(kernels, inputs),
               "profile": profile_rows(kernels, inputs)}
    row["host_us_per_launch"] = row["kernels"]["issue_ms"] * 1e3 / max(row["launches"], 1)
    return row


def table(names: list[str]) -> None:
    """Records as markdown: per file and record, each forward's issue and wall time, the kernels' host
    time per launch, and the ratio of the two forwards' wall times (measured in the same run)."""
    import json

    print("| file | record | eager issue ms | eager wall ms | kernels issue ms | kernels wall ms | launches | "
          "host us per launch | kernels / eager, wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    gpus = set()
    for name in names:
        record = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        gpus.add(record.get("gpu", "unknown GPU"))
        for f in record["files"]:
            if f.get("outcome") != "probed":
                continue
            e, k = f["eager"], f["kernels"]
            print(f"| {f['file']} | {name} | {e['issue_ms']:.2f} | {e['wall_ms']:.2f} | {k['issue_ms']:.2f} | "
                  f"{k['wall_ms']:.2f} | {f['launches']} | {f['host_us_per_launch']:.1f} | {k['wall_ms'] / e['wall_ms']:.2f} |")
    print(f"\n{', '.join(sorted(gpus))}; medians of {FORWARDS} forwards; issue: the forward's return before any "
          "synchronize.")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--name", default="stage_overhead")
    ap.add_argument("--table", metavar="NAMES", help="print records NAMES (comma-separated) as a markdown table (no GPU)")
    a = ap.parse_args()
    if a.table:
        table([n for n in a.table.split(",") if n])
        return
    if not a.files:
        ap.error("name the problem files to probe (or --table NAMES)")
    out = []
    for path in a.files:
        try:
            row = probe(path)
        except Exception as e:  # noqa: BLE001 - one file's failure is its row, and the others still run
            row = {"file": path.name, "outcome": "error", "why": f"{type(e).__name__}: {str(e)[:500]}"}
        out.append(row)
        if row["outcome"] == "probed":
            print(f"{path.name}: eager {row['eager']}, kernels {row['kernels']}, {row['launches']} launches, "
                  f"{row['host_us_per_launch']:.1f} us of host per launch", flush=True)
            for r in row["profile"][:15]:
                print(f"  {r['self_us']:9.1f} us self {r['cumulative_us']:9.1f} cum {r['calls']:7.1f} calls  {r['function']}")
        else:
            print(f"{path.name}: {row['outcome']} {row.get('why', '')}", flush=True)
        write_result(a.name, {"forwards": FORWARDS, "profiled": PROFILED, "files": out}, echo=False)


if __name__ == "__main__":
    main()
