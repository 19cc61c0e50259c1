"""Issue #56's attention target: an attention family's kernel (flash_attention, or flash_attention_sm90 on
Hopper: --family) against PyTorch's own SDPA backends
(its default dispatch, FlashAttention-2, cuDNN), side by side in one worker under the `pytorch` contract.
Each backend is a problem file whose forward runs F.scaled_dot_product_attention under that backend
(the float64 reference runs the math path); the family's seeds are judged and timed against the default
dispatch, and the fastest against each backend.

    python benchmarks/flash_attention.py --name flash_attention
    python benchmarks/flash_attention.py --family flash_attention_sm90 --name flash_attention_sm90

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per shape and backend the kernel's median,
the backend's, their ratio, and the attained TFLOP/s (causal: half the square of scores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import write_result

# (batch, query heads, key/value heads, sequence, head dim, causal): the target shape first.
SHAPES = ((8, 32, 8, 4096, 128, True), (1, 32, 8, 2048, 128, True), (4, 12, 12, 1024, 64, True),
          (16, 16, 16, 512, 64, False))
BACKENDS = ("default", "FLASH_ATTENTION", "CUDNN_ATTENTION")

PROBLEM = '''import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Model(nn.Module):
    def forward(self, q, k, v):
        if {backend!r} != "default" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            with sdpa_kernel(SDPBackend.{backend}):
                return F.scaled_dot_product_attention(q, k, v, is_causal={causal}, enable_gqa={gqa})
        return F.scaled_dot_product_attention(q, k, v, is_causal={causal}, enable_gqa={gqa})


def get_inputs():
    return [torch.randn({b}, {h}, {s}, {d}, dtype=torch.{dtype}), torch.randn({b}, {kv}, {s}, {d}, dtype=torch.{dtype}),
            torch.randn({b}, {kv}, {s}, {d}, dtype=torch.{dtype})]


def get_init_inputs():
    return []
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--seeds", type=int, default=3, help="seeds judged per shape against the default dispatch")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes")
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--family", default="flash_attention", choices=("flash_attention", "flash_attention_sm90"))
    ap.add_argument("--name", default="flash_attention")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.flash_attention import FlashAttention
    from cuforge.kernels.flash_attention_sm90 import FlashAttentionSm90
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.driver.supervisor import Supervisor
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    fam = FlashAttentionSm90() if a.family == "flash_attention_sm90" else FlashAttention()
    config = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False, precision="pytorch")
    folder = Path(tempfile.mkdtemp(prefix="cuforge-attention-"))
    rows = []
    t0 = time.perf_counter()
    with Supervisor(gpu=int(os.environ.get("CUFORGE_BENCH_GPU", "0"))) as sup:
        info = sup.start()
        for b, h, kv, s, d, causal in SHAPES[:a.shapes]:
            flops = 4 * b * h * s * s * d // (2 if causal else 1)
            best = None
            for backend in BACKENDS:
                f = folder / f"attn_{b}_{h}_{kv}_{s}_{d}_{int(causal)}_{backend.lower()}.py"
                f.write_text(PROBLEM.format(backend=backend, causal=causal, gqa=kv != h, b=b, h=h, kv=kv, s=s, d=d,
                                            dtype=a.dtype))
                (p,), _ = load_files([f])
                p = p.under("pytorch")
                row: dict = {"shape": {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": d, "causal": causal},
                             "backend": backend, "dtype": a.dtype}
                rows.append(row)
                why = fam.supports(p)
                if why is not None:
                    row["why"] = why
                    continue
                configs = fam.seeds(p)[:a.seeds] if best is None else [best]
                kernels = []
                for c in configs:
                    ev = sup.evaluate(p, fam.render(c, p), config)
                    t = {k: v.median_ms for k, v in ev.timings.items()}
                    kernels.append({"config": c, "status": ev.status, "message": ev.message[:300],
                                    "ms": t.get("candidate"), "backend_ms": t.get("torch"),
                                    "p20_ms": ev.timings["candidate"].p20_ms if "candidate" in ev.timings else None,
                                    "p80_ms": ev.timings["candidate"].p80_ms if "candidate" in ev.timings else None})
                    print(f.name, c, ev.status, t, ev.message[:200], flush=True)
                row["kernels"] = kernels
                ok = [k for k in kernels if k["status"] == "ok" and k["ms"] and k["backend_ms"]]
                if ok:
                    k = min(ok, key=lambda k: k["ms"])
                    best = best or k["config"]
                    row.update(best_ms=k["ms"], backend_ms=k["backend_ms"], vs_backend=k["backend_ms"] / k["ms"],
                               kernel_tflops=flops / k["ms"] / 1e9, backend_tflops=flops / k["backend_ms"] / 1e9)
    write_result(a.name, {"contract": "pytorch", "dtype": a.dtype, "family": fam.name,
                          "baseline": "F.scaled_dot_product_attention under each backend (default: PyTorch's dispatch)",
                          "wall_s": round(time.perf_counter() - t0, 1), "rows": rows, "worker": info})


if __name__ == "__main__":
    main()
