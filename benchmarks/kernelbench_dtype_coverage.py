"""KernelBench level1 and level2 run in bf16 and fp16 (`--dtype`): per dtype, how many files the
offline search covers once each file is traced as it runs cast, and by which family. CPU only.

    python benchmarks/kernelbench_dtype_coverage.py [KB_DIR]   # default ../shared/kernelbench
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from _common import ROOT, parser, write_result


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT.parent / "shared" / "kernelbench")
    kb = ap.parse_args().folder
    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files, load_in_dtype, shared_inspector
    from cuforge.problems.problem import ProblemError

    files = [f for level in ("level1", "level2") for f in sorted((kb / level).glob("*.py"))]
    out: dict[str, dict] = {}
    with shared_inspector():
        problems, skipped = load_files(files)
        for dtype in ("fp32", "bf16", "fp16"):
            covered, by_family, refused, uncovered = 0, Counter(), [], {}
            for p in problems:
                try:
                    q = p if dtype == "fp32" else load_in_dtype(p, dtype)
                except ProblemError as e:
                    refused.append(f"{p.id}: {e}")
                    continue
                fams, why = families_for(q)
                if fams:
                    covered += 1
                    by_family[fams[0].name] += 1
                else:
                    uncovered[p.id] = why[:300]
            out[dtype] = {"files": len(problems), "covered": covered, "by_family": dict(by_family.most_common()),
                          "not_traced": refused, "not_covered": uncovered}
            print(dtype, covered, "of", len(problems), flush=True)
    write_result("kernelbench_dtype_coverage", {"skipped": [s.path for s in skipped], "dtypes": out})


if __name__ == "__main__":
    main()
