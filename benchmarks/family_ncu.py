"""Nsight Compute's compact metrics (DRAM rate, L2 hit rate, warp stall reasons) for configs of a family on
a KernelBench file, each profiled in its own jailed ncu subprocess (`cuforge.sandbox.driver.ncu`): where a
memory-bound kernel's time goes when its timing alone does not say.

    python benchmarks/family_ncu.py .kb/level1/40_LayerNorm.py layer_norm_team \
        --config '{"BLOCK": 512, "UNROLL": 2, "BACK": 1, "PREFETCH": 0, "KEEP_ROW": 1}' --name ln_ncu
    python benchmarks/family_ncu.py src/cuforge/problems/builtin/models/lstm_cell.py gated_cell --dtype bf16 \
        --name lstm_bf16_ncu
    python benchmarks/family_ncu.py .kb/level1/87_conv_pointwise_2D.py conv_pointwise_f32 --precision pytorch \
        --name conv87_ncu

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", help="a KernelBench problem file")
    ap.add_argument("family")
    ap.add_argument("--config", action="append", default=[], help="a config (JSON); default: the family's seeds")
    ap.add_argument("--dtype", default=None, help="run the fp32 problem in bf16 or fp16 (as --dtype does)")
    ap.add_argument("--precision", default=None, help="the contract the family's configs are chosen under "
                    "(fp32, pytorch, kernelbench; default: the problem's own)")
    ap.add_argument("--name", default="family_ncu")
    a = ap.parse_args()
    from cuforge.kernels.families import FAMILIES
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.driver.ncu import ncu_profile

    fam = next((f for f in FAMILIES if f.name == a.family), None)
    if fam is None:
        raise SystemExit(f"no family named {a.family!r}")
    problems, skipped = load_files([Path(a.file)])
    if not problems:
        raise SystemExit(f"{a.file} did not load: {skipped}")
    problem = problems[0]  # a file that names several dtypes loads once per dtype, its own first
    if a.dtype:
        from cuforge.problems.loader import load_in_dtype

        problem = next((p for p in problems if p.id.endswith(f"@{a.dtype}")), None) or load_in_dtype(problem, a.dtype)
    if a.precision:
        from cuforge.sandbox.protocol.precision import CONTRACTS

        if a.precision not in CONTRACTS:
            raise SystemExit(f"--precision {a.precision!r}: one of {', '.join(CONTRACTS)}")
        problem = problem.under(a.precision)
    why = fam.supports(problem)
    if why is not None:
        raise SystemExit(f"{a.family} does not cover {a.file}: {why}")
    configs = [json.loads(c) for c in a.config] or fam.seeds(problem)
    rows = []
    for config in configs:
        summary = ncu_profile(problem, fam.render(config, problem))
        rows.append({"config": config, "ncu": summary})
        print(config, json.dumps(summary), flush=True)
    write_result(a.name, {"file": a.file, "family": a.family, "dtype": a.dtype, "contract": problem.contract(), "rows": rows})


if __name__ == "__main__":
    main()
