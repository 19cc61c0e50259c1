"""Issue #57: what the fp32 convolution families give under the `pytorch` precision contract against what
eager PyTorch runs under its default flags (cuDNN, TF32 where cuDNN picks it), side by side in one worker.
For each file, every family that covers it (families_for, under `pytorch`) has its first one-product
seeds judged (one TF32 product per k-step: the implicit GEMM conv_tf32x3_sm90, conv_pointwise_f32 for 1x1
convolutions, conv_rows_f32 for 2-D ones of stride 1); a family with no one-product seed for the file (the
direct convolution; any family on a 3-channel convolution, which cuDNN keeps in fp32) has its first seeds
judged instead. The implicit GEMM's first 3xTF32 seed is judged too, for the cost of three products.

    python benchmarks/conv_tf32.py --files 54_,55_,56_,59_,60_,62_,63_,66_,80_,87_ --seeds 3 --name conv_tf32_l1

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per file the fastest correct kernel (any
family, any number of products) and the fastest correct one-product kernel, each with cuDNN's median
(eager, default flags) timed beside it and eager's with TF32 off; the geomean of both ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import write_result
from kernelbench_search import files_of


def chosen_seeds(families: list, problem, n: int) -> list[tuple]:
    """(family, config) pairs to judge: each family's first n one-product seeds, or its first n seeds where
    it has none for this problem; then the implicit GEMM's first 3xTF32 seed, once."""
    out = []
    for fam in families:
        seeds = fam.seeds(problem)
        ones = [c for c in seeds if fam.reduced_precision(c)]
        out += [(fam, c) for c in (ones or seeds)[:n]]
        if fam.name == "conv_tf32x3_sm90" and ones:
            out.append((fam, next(c for c in seeds if not fam.reduced_precision(c))))
    return out


def best_of(kernels: list[dict]) -> dict | None:
    ok = [k for k in kernels if k["status"] == "ok" and k["ms"]]
    return min(ok, key=lambda k: k["ms"]) if ok else None


def summarize(row: dict) -> None:
    """The row's fastest correct kernel and fastest correct one-product kernel, with their ratios."""
    best, one = best_of(row["kernels"]), best_of([k for k in row["kernels"] if k["one_product"]])
    if best:
        row.update(best_ms=best["ms"], best_family=best["family"], best_one_product=best["one_product"],
                   cudnn_tf32_ms=best["cudnn_tf32_ms"], eager_strict_ms=best["eager_strict_ms"],
                   vs_cudnn_tf32=best["cudnn_tf32_ms"] / best["ms"] if best["cudnn_tf32_ms"] else None)
    if one:
        row.update(one_product_ms=one["ms"], one_product_family=one["family"],
                   one_product_vs_cudnn_tf32=one["cudnn_tf32_ms"] / one["ms"] if one["cudnn_tf32_ms"] else None)
        three = [k for k in row["kernels"] if k["status"] == "ok" and k["ms"] and not k["one_product"]
                 and k["family"] == "conv_tf32x3_sm90"]
        if three:
            row["one_pass_vs_three"] = three[0]["ms"] / one["ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1")
    ap.add_argument("--files", default="", help="comma list of file-name prefixes (54_,55_)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds judged per family and file")
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--name", default="conv_tf32")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.protocol.precision import STRICT_EAGER

    config = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False, precision="pytorch")
    rows = []
    t0 = time.perf_counter()
    with Supervisor(gpu=0) as sup:
        info = sup.start()
        for level, path in files_of([x for x in a.levels.split(",") if x], [x for x in a.files.split(",") if x]):
            problems, skipped = load_files([path])
            row: dict = {"file": f"level{level}/{path.name}", "kernels": []}
            rows.append(row)
            if skipped:
                row["why"] = skipped[0].reason
                continue
            p = problems[0].under("pytorch")
            families, why = families_for(p, several=False)
            if not families:
                row["why"] = why
                continue
            for f, c in chosen_seeds(families, p, a.seeds):
                ev = sup.evaluate(p, f.render(c, p), config)
                t = {k: v.median_ms for k, v in ev.timings.items()}
                row["kernels"].append({"family": f.name, "config": c, "one_product": f.reduced_precision(c),
                                       "status": ev.status, "message": ev.message[:300],
                                       "ms": t.get("candidate"), "cudnn_tf32_ms": t.get("torch"),
                                       "eager_strict_ms": t.get(STRICT_EAGER)})
                print(path.name, f.name, c, ev.status, t, flush=True)
            summarize(row)
            record(a.name, rows, t0, info)  # after each file, so that a run cut short keeps what it timed
    record(a.name, rows, t0, info)


def record(name: str, rows: list[dict], t0: float, info: dict) -> None:
    from cuforge.rewards import geomean

    ratios = [r["vs_cudnn_tf32"] for r in rows if r.get("vs_cudnn_tf32")]
    ones = [r["one_product_vs_cudnn_tf32"] for r in rows if r.get("one_product_vs_cudnn_tf32")]
    write_result(name, {"contract": "pytorch", "baseline": "eager under PyTorch's default flags (cuDNN, TF32 where it picks it)",
                        "files": len(rows), "with_a_correct_kernel": len(ratios), "geomean_vs_cudnn_tf32": geomean(ratios),
                        "faster_than_cudnn_tf32": sum(r > 1 for r in ratios),
                        "with_a_correct_one_pass_kernel": len(ones), "one_product_geomean_vs_cudnn_tf32": geomean(ones),
                        "wall_s": round(time.perf_counter() - t0, 1), "rows": rows, "worker": info})


if __name__ == "__main__":
    main()
