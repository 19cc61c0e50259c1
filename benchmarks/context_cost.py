"""What a CUDA context's creation costs in a fresh process, step by step, and what changes it:
cuInit, the primary context's retain (the context itself), the first allocation and the first kernel
(through torch), each in a fresh process on an otherwise idle GPU, under environment variants
(CUDA_DEVICE_MAX_CONNECTIONS, lazy or eager module loading). Writes benchmarks/results/context_cost.json.

    python benchmarks/context_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _common import write_result

CHILD = r"""
import ctypes, json, time
t0 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0
t1 = time.perf_counter()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
t2 = time.perf_counter()
import torch
t3 = time.perf_counter()
torch.cuda.init(); torch.cuda.set_device(0); torch.empty(1, device="cuda")
t4 = time.perf_counter()
torch.zeros(1, device="cuda").add_(1); torch.cuda.synchronize()
t5 = time.perf_counter()
print(json.dumps({"cu_init": t1 - t0, "primary_context": t2 - t1, "torch_init_alloc": t4 - t3, "first_kernel": t5 - t4}))
"""

VARIANTS = {
    "default": {},
    "max_connections_1": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    "max_connections_2": {"CUDA_DEVICE_MAX_CONNECTIONS": "2"},
    "eager_modules": {"CUDA_MODULE_LOADING": "EAGER"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for _ in range(a.rounds):
        for name, env in VARIANTS.items():
            out = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, **env}, capture_output=True,
                                 text=True, timeout=120)
            steps = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-500:]}
            rows.append({"variant": name, **steps})
            print(rows[-1], flush=True)
    summary = {name: {k: round(statistics.median(r[k] for r in rows if r["variant"] == name and k in r), 4)
                      for k in ("cu_init", "primary_context", "torch_init_alloc", "first_kernel")}
               for name in VARIANTS}
    write_result("context_cost", {"rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
