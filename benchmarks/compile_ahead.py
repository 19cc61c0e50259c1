"""Benchmark: a template search's evaluation rate on one GPU with its kernels compiled ahead of the
GPU's turn (protocol/prebuilt_cubins.py) and compiled in the turn, side by side in one run.

Each problem's family configs (its seeds, then random valid ones: all distinct, so every one needs
its own NVRTC compile) are evaluated as the search evaluates them: `--inflight` candidates at a time
(the search's --concurrency), one GPU worker, evaluations in the GPU's turn one after another. The two
modes alternate problem by problem (which goes first alternates too), each with its own executor, and
so its own compile cache: neither finds the other's cubins. The first problem's first `--inflight`
configs run once in each mode untimed first: the builders' workers start once a search, as the GPU
worker does.

    python benchmarks/compile_ahead.py models/llama_rmsnorm@bf16 models/lstm_cell models/skinny_gemm --configs 12
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import write_result


def evaluate_all(executor: Any, problem: Any, cands: list[Any], config: Any, inflight: int) -> tuple[float, list[Any]]:
    """(wall seconds, evaluations) for `cands`, `inflight` at a time: each built ahead where the
    executor builds ahead (it says None where not), then queued for the GPU."""
    def one(cand: Any) -> Any:
        packed = executor.build_ahead(problem, cand, config)
        return executor.evaluate(problem, cand, config, packed)

    t0 = time.monotonic()
    with ThreadPoolExecutor(inflight) as pool:
        evs = list(pool.map(one, cands))
    return time.monotonic() - t0, evs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", help="built-in problem refs (suite/name[@dtype])")
    ap.add_argument("--configs", type=int, default=12, help="distinct configs a problem (seeds first)")
    ap.add_argument("--inflight", type=int, default=4, help="candidates in flight (the search's --concurrency)")
    ap.add_argument("--name", default="compile_ahead")
    a = ap.parse_args()
    if a.configs < 1 or a.inflight < 1:
        raise SystemExit("compile_ahead: --configs and --inflight must be at least 1")

    from template_helpers import family_configs  # tests/ is on the path (_common)

    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.driver.executor import LocalExecutor
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    config = EvalConfig(baselines=("torch",), profile=False)
    modes = {"ahead": LocalExecutor(["0"], supervisors=[Supervisor(gpu=0, judge="inprocess")]),
             "in_turn": LocalExecutor(["0"], supervisors=[Supervisor(gpu=0, judge="inprocess")])}
    modes["in_turn"].builder_count = 0  # build_ahead says None: the GPU's supervisor compiles in the turn
    rows = []
    try:
        for ex in modes.values():
            ex.supervisors[0].start()
        warmed = False
        for i, ref in enumerate(a.problems):
            problem = load_problem(ref)
            fams, why = families_for(problem)
            if not fams:
                raise SystemExit(f"compile_ahead: {ref} is not covered ({why})")
            fam = fams[0]
            configs = family_configs(fam, problem, max(0, a.configs - len(fam.seeds(problem))))[:a.configs]
            row: dict[str, Any] = {"problem": ref, "family": fam.name, "configs": len(configs)}
            order = ["ahead", "in_turn"] if i % 2 == 0 else ["in_turn", "ahead"]
            if not warmed:  # untimed: the builders' workers start (once a search) and both workers warm up
                for mode in order:
                    evaluate_all(modes[mode], problem, [fam.render(c, problem) for c in configs[:a.inflight]], config, a.inflight)
                configs = configs[a.inflight:] or configs
                row["configs"], warmed = len(configs), True
            for mode in order:
                cands = [fam.render(c, problem) for c in configs]  # fresh objects: nothing carried over
                wall, evs = evaluate_all(modes[mode], problem, cands, config, a.inflight)
                row[mode] = {"wall_s": round(wall, 3), "evals_per_min": round(60 * len(evs) / wall, 1),
                             "statuses": sorted({e.status for e in evs}),
                             "prebuilt_cubins": sum(int(e.correctness.get("prebuilt_cubins", 0)) for e in evs),
                             "load_s": round(sum(e.correctness.get("judge_phases_s", {}).get("load", 0.0) for e in evs), 3)}
            row["speedup"] = round(row["in_turn"]["wall_s"] / row["ahead"]["wall_s"], 3)
            print(f"{ref:36s} {fam.name:18s} in turn {row['in_turn']['evals_per_min']:7.1f}/min  "
                  f"ahead {row['ahead']['evals_per_min']:7.1f}/min  x{row['speedup']:.2f}  "
                  f"{row['ahead']['statuses']} {row['in_turn']['statuses']}", flush=True)
            rows.append(row)
    finally:
        for ex in modes.values():
            ex.close()
    write_result(a.name, {"inflight": a.inflight, "rows": rows})


if __name__ == "__main__":
    main()
