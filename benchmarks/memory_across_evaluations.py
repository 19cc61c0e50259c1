"""What one worker's device memory does over consecutive evaluations of a big problem: the first seeds of
the family that covers it, judged one after another in one worker (eager and torch.compile as the
baselines), each evaluation's status, the steps it reached, the bytes the worker still held from before it
(`held_device_bytes`) and its peak. A second evaluation that starts holding the first's memory runs out
where the first did not.

    python benchmarks/memory_across_evaluations.py .kb/level1/87_conv_pointwise_2D.py --precision pytorch \
        --seeds 3 --name memory_87

Results: benchmarks/results/NAME.json (and $OUT/NAME.json when the device tool runs it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

from _common import write_result

GIB = 2**30


def device_used() -> str:
    """nvidia-smi's memory in use on the GPU, as it prints it (every process's)."""
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True, text=True)
    return r.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", help="a problem file or built-in ref")
    ap.add_argument("--seeds", type=int, default=3, help="the covering family's first N seeds, one evaluation each")
    ap.add_argument("--precision", default="fp32", help="the precision contract (fp32, pytorch, kernelbench)")
    ap.add_argument("--name", default="memory_across_evaluations")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.protocol.precision import CONTRACTS

    if a.precision not in CONTRACTS:
        raise SystemExit(f"--precision {a.precision}: not a contract (one of {', '.join(CONTRACTS)})")
    p = load_problem(a.problem).under(a.precision)
    fams, why = families_for(p)
    if not fams:
        raise SystemExit(f"{a.problem}: not covered ({why})")
    fam = fams[0]
    config = EvalConfig(baselines=("torch", "torch.compile"), max_timing_s=1.5, profile=False, precision=a.precision)
    rows = []
    with Supervisor(gpu=0) as sup:
        for i, c in enumerate(fam.seeds(p)[:a.seeds]):
            ev = sup.evaluate(p, fam.render(c, p), config)
            rows.append({"evaluation": i, "family": fam.name, "config": c, "status": ev.status, "message": ev.message[:300],
                         "phases_s": ev.correctness.get("judge_phases_s"), "timed": sorted(ev.timings),
                         "held_gib": round(ev.correctness.get("held_device_bytes", 0) / GIB, 1),
                         "peak_gib": round(ev.correctness.get("peak_device_bytes", 0) / GIB, 1),
                         "device_used_after": device_used()})
            print(rows[-1], flush=True)
    write_result(a.name, {"problem": a.problem, "precision": a.precision, "rows": rows})


if __name__ == "__main__":
    main()
