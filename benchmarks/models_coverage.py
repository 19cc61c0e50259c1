"""The built-in models suite before any run: per problem (each file in each of its dtypes), which
template families the offline search would use, or why none covers it. CPU only.

    python benchmarks/models_coverage.py
"""

from __future__ import annotations

from _common import parser, write_result


def main() -> None:
    parser(__doc__).parse_args()
    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_suite

    suite = load_suite("models")
    rows = []
    for p in suite.problems:
        families, why = families_for(p)
        rows.append({"problem": p.id, "dtype": p.meta.dtype, "families": [f.name for f in families],
                     "covered": bool(families), "why": why[:300],
                     # a partition: which ops its kernels run and which stay PyTorch's
                     "parts": families[0].describe(p) if families and families[0].name == "partition" else None})
    by_dtype = {}
    for r in rows:
        d = by_dtype.setdefault(r["dtype"], {"problems": 0, "covered": 0})
        d["problems"] += 1
        d["covered"] += r["covered"]
    write_result("models_coverage", {"problems": len(rows), "covered": sum(r["covered"] for r in rows),
                                     "skipped": [s.path for s in suite.skipped], "by_dtype": by_dtype, "rows": rows})


if __name__ == "__main__":
    main()
