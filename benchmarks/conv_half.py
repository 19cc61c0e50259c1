"""Issue #56: the fp16/bf16 implicit-GEMM convolution (conv_half_sm90) against what eager PyTorch runs
for the same convolution in that dtype (cuDNN's half kernels, fp32 sums), side by side in one worker,
under the `pytorch` precision contract. KernelBench's dense convolutions are loaded unchanged and run
cast to the dtype, as its own harness's precision option does; each file's first seeds are judged
and timed beside eager.

    python benchmarks/conv_half.py --files 54_,55_,56_,57_,58_,62_,63_,64_,69_,80_,87_ --dtype bf16 --name conv_half_l1

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per file the best ok kernel's median,
eager's (cuDNN) in the same dtype, their ratio, and the geomean over the files with an ok kernel.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import write_result
from kernelbench_search import files_of


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1")
    ap.add_argument("--files", default="", help="comma list of file-name prefixes (54_,55_)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--seeds", type=int, default=3, help="seeds judged per file")
    ap.add_argument("--max-timing", type=float, default=0.4)
    ap.add_argument("--name", default="conv_half")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.conv_half import ConvHalfSm90
    from cuforge.problems.loader import load_files, load_in_dtype
    from cuforge.rewards import geomean
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    fam = ConvHalfSm90()
    config = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False, precision="pytorch")
    rows = []
    t0 = time.perf_counter()
    with Supervisor(gpu=int(os.environ.get("CUFORGE_BENCH_GPU", "0"))) as sup:
        info = sup.start()
        for level, path in files_of([x for x in a.levels.split(",") if x], [x for x in a.files.split(",") if x]):
            problems, skipped = load_files([path])
            row: dict = {"file": f"level{level}/{path.name}"}
            rows.append(row)
            p = load_in_dtype(problems[0], a.dtype).under("pytorch") if problems else None
            why = skipped[0].reason if skipped else fam.supports(p)
            if why is not None:
                row["why"] = why
                continue
            row["kernels"] = []
            for c in fam.seeds(p)[:a.seeds]:
                ev = sup.evaluate(p, fam.render(c, p), config)
                t = {k: v.median_ms for k, v in ev.timings.items()}
                row["kernels"].append({"config": c, "status": ev.status, "message": ev.message[:300],
                                       "ms": t.get("candidate"), "eager_ms": t.get("torch")})
                print(path.name, c, ev.status, t, flush=True)
            ok = [k for k in row["kernels"] if k["status"] == "ok" and k["ms"] and k["eager_ms"]]
            if ok:
                best = min(ok, key=lambda k: k["ms"])
                row.update(best_ms=best["ms"], eager_ms=best["eager_ms"], vs_eager=best["eager_ms"] / best["ms"])
    ratios = [r["vs_eager"] for r in rows if r.get("vs_eager")]
    write_result(a.name, {"contract": "pytorch", "dtype": a.dtype,
                          "baseline": f"eager in {a.dtype} (cuDNN's half-precision convolution), PyTorch's default flags",
                          "files": len(rows), "with_an_ok_kernel": len(ratios), "geomean_vs_eager": geomean(ratios),
                          "faster_than_eager": sum(r > 1 for r in ratios), "wall_s": round(time.perf_counter() - t0, 1),
                          "rows": rows, "worker": info})


if __name__ == "__main__":
    main()
