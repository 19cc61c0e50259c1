"""Markdown tables for docs/benchmarks.md from kernelbench_search.py's results: coverage per level and
family, then the searched files per family (fast_1 and geomean vs eager and torch.compile) and per file.

    python benchmarks/kernelbench_search_summary.py --level 1
    python benchmarks/kernelbench_search_summary.py --coverage kb_coverage --search kb_search_level2_gemm
    python benchmarks/kernelbench_search_summary.py --level 2 --precision pytorch

A file searched in several result files takes its row from the last one named; without --search, every
kb_search_*.json result, in the order of the dates they were written. Under a contract other than fp32,
a file with no op the flags change (no convolution; KernelBench's level1/level2 files are fp32 and leave
matmul TF32 off) runs the same kernels, baselines and bound under both, so where it was not searched
under that contract it takes its fp32 row, named as such (the coverage record says which files those are).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
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


def search_tables(rows: list[dict[str, Any]], searched_as: dict[str, str] | None = None, own_rows_only: bool = False,
                  flags_change_nothing: set[str] | None = None) -> None:
    """The per-family table, then the per-file one; `searched_as` names the contract a row was searched
    under where that is not the table's own (a column then says which, or with `own_rows_only` the
    per-file table leaves those rows out and the per-family one counts them). `flags_change_nothing`:
    under fp32, the files whose ops PyTorch's default flags leave as they are, whose eager under those
    flags is the eager timed (a column of the ratio to default-flag eager then shows it for them, and
    the re-timed ratio where a record has one)."""
    searched_as = searched_as or {}
    print("\n| family | files | correct | fast_1 vs eager | fast_1 vs torch.compile | geomean vs eager | geomean vs torch.compile |")
    print("|---|---|---|---|---|---|---|")
    for fam in sorted({r["family"] for r in rows}) + ["all"]:
        rs = [r for r in rows if fam in ("all", r["family"])]
        eager = [r["vs_torch"] for r in rs]
        comp = [r["vs_torch_compile"] for r in rs]
        print(f"| {fam} | {len(rs)} | {sum(bool(r['correct']) for r in rs)} | {sum((v or 0) > 1 for v in eager)} "
              f"| {sum((v or 0) > 1 for v in comp)} | {fmt(geomean(eager))} | {fmt(geomean(comp))} |")
    unreached = sum(not reached(r) for r in rows)
    if unreached:
        print(f"\n{unreached} of the {len(rows)} files were not evaluated before their search's wall-clock limit "
              "(counted above as not correct; 'not reached' below).")
    # Records that re-timed eager under the other contract's flags too (TF32 off under `pytorch`, PyTorch's
    # defaults under `fp32`) show that ratio beside the contract's own.
    other = next((k for k in ("vs_torch.strict", "vs_torch.default_flags") if any(k in r.get("recheck", {}) or k in r for r in rows)), None)
    if other is None and flags_change_nothing is not None:
        other = "vs_torch.default_flags"
    label = {"vs_torch.strict": "vs eager, TF32 off", "vs_torch.default_flags": "vs eager, default flags"}.get(other or "")

    def other_ratio(r: dict[str, Any]) -> float | None:
        got = r.get("recheck", {}).get(other, r.get(other))
        if got is None and other == "vs_torch.default_flags" and r["problem"] in (flags_change_nothing or ()):
            return r["vs_torch"]
        return got

    column = bool(searched_as) and not own_rows_only
    if own_rows_only:
        print(f"\n{len(searched_as)} files whose ops the flags cannot change take their fp32 rows (counted above, listed "
              "in the fp32 table); the files searched under this contract:")
        rows = [r for r in rows if r["problem"] not in searched_as]
    print("\n| file | family | best ms | vs eager | vs torch.compile |" + (f" {label} |" if other else "")
          + (" searched under |" if column else ""))
    print("|---|---|---|---|---|" + ("---|" if other else "") + ("---|" if column else ""))
    for r in sorted(rows, key=lambda r: (r["problem"].split("_")[0], int(r["problem"].split("_")[1]))):
        level, name = r["problem"].split("/", 1)[1].split("_", 1)  # kernelbench/l1_19_ReLU
        extra = f" {fmt(other_ratio(r))} |" if other else ""
        extra += f" {searched_as.get(r['problem'], 'this contract')} |" if column else ""
        best = fmt(r["best_ms"], 3) if reached(r) else "not reached"
        if reached(r) and not r["correct"]:
            best = "none correct"
        print(f"| level{level[1:]}/{name} | {r['family']} | {best} | {fmt(r['vs_torch'])} | {fmt(r['vs_torch_compile'])} |{extra}")


def reached(row: dict[str, Any]) -> bool:
    """Whether the search evaluated anything for the row's file (rows from before the count was kept did)."""
    return row.get("evaluations", 1) != 0


def records(precision: str) -> list[str]:
    """Every kb_search_* result searched under `precision` (those from before contracts were fp32's), by date."""
    return [n for _, n in sorted(
        (load(p.stem).get("date", ""), p.stem) for p in RESULTS.glob("kb_search_*.json")
        if "search" in load(p.stem) and load(p.stem)["search"].get("precision", "fp32") == precision)]


def rows_of(names: list[str], level: str) -> dict[str, dict[str, Any]]:
    """Each file's row from the last of `names` that searched it, of `level`'s files (all where empty),
    with the GPU its record was measured on (`gpu`). A row without a side-by-side torch.compile ratio
    (an older search that timed torch.compile only in its recheck, and the recheck deadline passed)
    does not replace an earlier row that has one; nor does a row the search never reached replace one it did."""
    final: dict[str, dict[str, Any]] = {}
    for name in names:
        record = load(name)
        for r in record["search"]["rows"]:
            if level and not r["problem"].split("/", 1)[1].startswith(f"l{level}_"):
                continue
            earlier = final.get(r["problem"])
            if earlier is not None and ((compared(earlier) and not compared(r)) or (reached(earlier) and not reached(r))):
                continue
            final[r["problem"]] = {**r, "gpu": record.get("gpu", "unknown GPU")}
    return final


def compared(row: dict[str, Any]) -> bool:
    """Whether the row's best kernel was timed beside torch.compile: in its search (which times it
    beside every candidate on a GPU) or in the side-by-side recheck after it."""
    return row.get("vs_torch_compile") is not None or row.get("recheck", {}).get("status") == "ok"


def gpus_line(rows: list[dict[str, Any]]) -> str:
    """Which GPUs the rows were measured on (each ratio is side by side on its own)."""
    counts = Counter(r.get("gpu", "unknown GPU") for r in rows)
    return "Measured on " + ", ".join(f"{g} ({n} files)" for g, n in counts.most_common()) + \
        "; each ratio side by side on its GPU."


def flag_free(problem_ids: list[str], cov: dict[str, Any]) -> set[str]:
    """Of these rows' problems (kernelbench/l1_19_ReLU), those whose traced ops the two flag sets cannot
    change, as the coverage record says (kernelbench_search.py --coverage records precision.flags_matter)."""
    matter = {(r["level"], r["file"]): r.get("flags_matter") for r in cov["rows"]}
    out = set()
    for pid in problem_ids:
        level, name = pid.split("/", 1)[1].split("_", 1)
        flag = matter.get((level[1:], f"{name}.py"))
        if flag is None:
            raise SystemExit(f"{pid}: the coverage record does not say whether the precision flags change it "
                             "(python benchmarks/kernelbench_search.py --coverage --levels 1,2 --name kb_coverage)")
        if not flag:
            out.add(pid)
    return out


def coverage_of(record: dict[str, Any]) -> dict[str, Any]:
    """A record's coverage: a search record's own, or level3_coverage.py's rows (each file's families)
    summed the same way."""
    if "coverage" in record:
        return record["coverage"]
    fams = Counter(r["families"][0] for r in record["rows"] if r.get("families"))
    return {"summary": {"level3": {"files": len(record["rows"]), "covered": sum(fams.values()), "by_family": dict(fams)}},
            "rows": [{"level": "3", "file": r["file"]} for r in record["rows"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coverage", default="kb_coverage")
    ap.add_argument("--search", default="", help="comma list of result names (default: every kb_search_* by date)")
    ap.add_argument("--level", default="", help="only this level's files (1 or 2)")
    ap.add_argument("--precision", default="fp32", help="without --search, the records searched under this "
                    "contract (those from before contracts were fp32's)")
    ap.add_argument("--own-rows-only", action="store_true", help="under a contract other than fp32, list per file only "
                    "the files searched under it (the rest are counted, and listed in the fp32 table)")
    a = ap.parse_args()
    cov = coverage_of(load(a.coverage))
    coverage_table(cov)
    final = rows_of(a.search.split(",") if a.search else records(a.precision), a.level)
    searched_as: dict[str, str] = {}
    if not a.search and a.precision != "fp32":
        strict = rows_of(records("fp32"), a.level)
        fill = flag_free(sorted(set(strict) - set(final)), cov)
        final |= {pid: strict[pid] for pid in fill}
        searched_as = {pid: "fp32 (no op the flags change)" for pid in fill}
    same = flag_free(sorted(final), cov) if not a.search and a.precision == "fp32" and a.level in ("1", "2") else None
    search_tables(list(final.values()), searched_as, a.own_rows_only, same)
    if same is not None and len(same) < len(final):
        print(f"\nvs eager, default flags: for the {len(same)} files whose ops PyTorch's default flags leave as they "
              f"are, the ratio to eager itself; the other {len(final) - len(same)} (convolutions, which cuDNN runs in "
              "TF32 under those flags) show '-' where no record re-timed eager under them (their ratios under the "
              "`pytorch` contract are in its own table).")
    print("\n" + gpus_line(list(final.values())))


if __name__ == "__main__":
    main()
