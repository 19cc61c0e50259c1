"""Benchmark: a template change, A/B. Every config is rendered twice - from the working tree's template
(after) and from another version of it (before, e.g. `git show HEAD:<template> > before.cu.j2`) - and both
kernels are evaluated by the sandbox in one worker, interleaved (before, after, then after, before in the
next round), each against the same baselines. The ratio after / before of their speedups is the change.

    git show HEAD:src/cuforge/kernels/gemm_sm90.cu.j2 > benchmarks/sweeps/gemm_sm90_before.cu.j2
    python benchmarks/template_ab.py --before benchmarks/sweeps/gemm_sm90_before.cu.j2 \\
        --from-suite benchmarks/results/hgemm_suite.json --max-volume 1073741824 --baseline cublas

The configs are each shape's best from a suite result (--from-suite) and/or a sweep file (--configs, as
for family_configs.py). Shared-memory sizes and launches come from the working tree's family code for
both versions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import write_result
from family_configs import load_sweep


def suite_configs(path: str, family: str, max_volume: int | None) -> dict[str, list[dict]]:
    """problem ref -> [its best config] for the shapes of a suite result won by `family`."""
    try:
        shapes = json.loads(Path(path).read_text())["per_shape"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise SystemExit(f"--from-suite {path}: {e}") from None
    out: dict[str, list[dict]] = {}
    for s in shapes:
        config = dict(s.get("best_config") or {})
        if config.pop("family", None) != family:
            continue
        if max_volume is not None and s["M"] * s["N"] * s["K"] > max_volume:
            continue
        out[s["problem_id"]] = [config]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems", nargs="*", help="built-in problem refs (default: every problem the configs name)")
    ap.add_argument("--before", required=True, help="the other version of the family's template (a .cu.j2 file)")
    ap.add_argument("--family", default="gemm_sm90")
    ap.add_argument("--from-suite", help="a suite result (hgemm_suite.json): each shape's best config")
    ap.add_argument("--max-volume", type=int, help="with --from-suite: only shapes with M*N*K at most this")
    ap.add_argument("--configs", help="a sweep file: a list of configs or an object of problem -> list")
    ap.add_argument("--rounds", type=int, default=2, help="before/after pairs per config (order alternates)")
    ap.add_argument("--baseline", action="append", default=[], help="baselines (default cublas)")
    ap.add_argument("--name", default="template_ab")
    a = ap.parse_args()
    try:
        before_text = Path(a.before).read_text()
    except OSError as e:
        raise SystemExit(f"--before {a.before}: {e}") from None
    if not a.from_suite and not a.configs:
        raise SystemExit("give --from-suite and/or --configs: nothing to compare")
    from cuforge.kernels.families import FAMILIES
    from cuforge.problems.suites import load_problem
    from cuforge.rewards import geomean
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    fam = next((f for f in FAMILIES if f.name == a.family), None)
    if fam is None:
        raise SystemExit(f"--family {a.family}: no such family")
    per_problem = suite_configs(a.from_suite, a.family, a.max_volume) if a.from_suite else {}
    swept = load_sweep(a.configs) if a.configs else []
    refs = a.problems or sorted(set(per_problem) | (set(swept) if isinstance(swept, dict) else set()))
    if not refs:
        raise SystemExit("no problems: name some, or give configs that name them")
    baselines = tuple(a.baseline) or ("cublas",)
    cfg = EvalConfig(baselines=baselines, max_timing_s=1.5, profile=False)
    rows = []
    with Supervisor(gpu=0) as sup:
        for ref in refs:
            p = load_problem(ref)
            listed = per_problem.get(ref, []) + (swept.get(ref, []) if isinstance(swept, dict) else list(swept))
            for c in [c for i, c in enumerate(listed) if c not in listed[:i]]:
                if not fam.valid(c, p):
                    rows.append({"problem": ref, "config": c, "status": "invalid"})
                    continue
                versions = {"before": fam.render(c, p, template_text=before_text), "after": fam.render(c, p)}
                speedups: dict[str, list[float]] = {"before": [], "after": []}
                statuses = set()
                for r in range(a.rounds):
                    for which in (("before", "after") if r % 2 == 0 else ("after", "before")):
                        ev = sup.evaluate(p, versions[which], cfg)
                        statuses.add(f"{which}:{ev.status}")
                        if ev.status == "ok" and baselines[0] in ev.speedups:
                            speedups[which].append(ev.speedups[baselines[0]])
                before, after = geomean(speedups["before"]), geomean(speedups["after"])
                rows.append({"problem": ref, "config": c, "status": sorted(statuses),
                             f"before_vs_{baselines[0]}": before, f"after_vs_{baselines[0]}": after,
                             "after_over_before": after / before if before and after else None})
                print(rows[-1], flush=True)
    ratios = [r["after_over_before"] for r in rows if r.get("after_over_before")]
    summary = {"configs": len(rows), "compared": len(ratios), "geomean_after_over_before": geomean(ratios),
               f"geomean_before_vs_{baselines[0]}": geomean([r[f"before_vs_{baselines[0]}"] for r in rows if r.get("after_over_before")]),
               f"geomean_after_vs_{baselines[0]}": geomean([r[f"after_vs_{baselines[0]}"] for r in rows if r.get("after_over_before")])}
    print(summary)
    write_result(a.name, {"before": a.before, "family": a.family, "rounds": a.rounds, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
