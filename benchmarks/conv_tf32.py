"""Issue #57: the fp32 convolution families with one TF32 product per k-step against what eager PyTorch
runs under its default flags (cuDNN with TF32), side by side in one worker, under the `pytorch`
precision contract. For each file, the first one-product seeds of every fp32 convolution family that
covers it (the implicit GEMM, conv_tf32x3_sm90; for 1x1 convolutions conv_pointwise_f32; for 2-D ones of
stride 1 conv_rows_f32) and the implicit GEMM's first 3xTF32 seed (fp32 accuracy) are judged and timed
beside eager under both flag sets.

    python benchmarks/conv_tf32.py --files 54_,55_,56_,59_,60_,62_,63_,66_,80_,87_ --name conv_tf32_l1

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per file the best PASSES-1 kernel's median,
cuDNN TF32's (eager, default flags) and eager's with TF32 off, the ratios, and their geomean.
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
    ap.add_argument("--seeds", type=int, default=2, help="one-product seeds judged per family and file")
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--name", default="conv_tf32")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.conv import ConvTf32x3Sm90
    from cuforge.kernels.conv_pointwise import ConvPointwiseF32
    from cuforge.kernels.conv_rows import ConvRowsF32
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.protocol.precision import STRICT_EAGER

    fam, others = ConvTf32x3Sm90(), (ConvPointwiseF32(), ConvRowsF32())
    config = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False, precision="pytorch")
    rows = []
    t0 = time.perf_counter()
    with Supervisor(gpu=0) as sup:
        info = sup.start()
        for level, path in files_of([x for x in a.levels.split(",") if x], [x for x in a.files.split(",") if x]):
            problems, skipped = load_files([path])
            row: dict = {"file": f"level{level}/{path.name}"}
            rows.append(row)
            if skipped or fam.supports(problems[0]) is not None:
                row["why"] = skipped[0].reason if skipped else fam.supports(problems[0])
                continue
            p = problems[0].under("pytorch")
            seeds = fam.seeds(p)
            chosen = [(fam, c) for c in seeds if fam.reduced_precision(c)][:a.seeds]
            for other in others:
                if other.supports(p) is None:
                    chosen += [(other, c) for c in other.seeds(p) if other.reduced_precision(c)][:a.seeds]
            chosen.append((fam, next(c for c in seeds if not fam.reduced_precision(c))))
            row["kernels"] = []
            for f, c in chosen:
                ev = sup.evaluate(p, f.render(c, p), config)
                t = {k: v.median_ms for k, v in ev.timings.items()}
                row["kernels"].append({"family": f.name, "config": c, "one_product": f.reduced_precision(c),
                                       "status": ev.status, "message": ev.message[:300],
                                       "ms": t.get("candidate"), "cudnn_tf32_ms": t.get("torch"),
                                       "eager_strict_ms": t.get(STRICT_EAGER)})
                print(path.name, f.name, c, ev.status, t, flush=True)
            ok = [k for k in row["kernels"] if k["status"] == "ok" and k["ms"]]
            ones = [k for k in ok if k["one_product"]]
            if ones:
                best = min(ones, key=lambda k: k["ms"])
                row.update(best_ms=best["ms"], best_family=best["family"], cudnn_tf32_ms=best["cudnn_tf32_ms"],
                           eager_strict_ms=best["eager_strict_ms"],
                           vs_cudnn_tf32=best["cudnn_tf32_ms"] / best["ms"] if best["cudnn_tf32_ms"] else None)
            three = [k for k in ok if not k["one_product"]]
            if three and ones:
                row["one_pass_vs_three"] = three[0]["ms"] / row["best_ms"]
            record(a.name, rows, t0, info)  # after each file, so that a run cut short keeps what it timed
    record(a.name, rows, t0, info)


def record(name: str, rows: list[dict], t0: float, info: dict) -> None:
    from cuforge.rewards import geomean

    ratios = [r["vs_cudnn_tf32"] for r in rows if r.get("vs_cudnn_tf32")]
    write_result(name, {"contract": "pytorch", "baseline": "eager under PyTorch's default flags (cuDNN TF32)",
                        "files": len(rows), "with_a_correct_one_pass_kernel": len(ratios),
                        "geomean_vs_cudnn_tf32": geomean(ratios), "faster_than_cudnn_tf32": sum(r > 1 for r in ratios),
                        "wall_s": round(time.perf_counter() - t0, 1), "rows": rows, "worker": info})


if __name__ == "__main__":
    main()
