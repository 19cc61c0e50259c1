"""Which steps of another process's CUDA start disturb a batch the judge is timing.

The split judge starts each candidate's host (a process with its own CUDA context) only where it is
not timing, because a starting host once tripled the timed batches' wall time. This measures which
part of a start does that: the parent times ~1 ms CUDA-graph batches with events, back to back, while
N child processes (torch imported, CUDA untouched until told) do one step of a start each:

  driver_ctx  cuInit + the primary context retained and made current (libcuda through ctypes)
  torch_ctx   torch's CUDA initialisation and set_device (no allocation, no kernel)
  alloc       torch_ctx + one 2 MiB device allocation
  kernel      alloc + one tiny kernel, synchronised
  warm        kernel + what a host's warm-up does (a graph capture, a few ops' device code)
  exit        children holding a context (made before the window) exit

For each mode: the batch time's median, p90 and max inside the window (from "go" until the last
child is done) against the same run's quiet batches, and each child's own seconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _common import write_result

CHILD = r"""
import ctypes, os, sys, time
import torch
mode = sys.argv[1]
if mode == "exit":
    torch.zeros(1, device="cuda").add_(1); torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
t = time.perf_counter()
if mode == "exit":
    os._exit(0)
if mode == "driver_ctx":
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
else:
    torch.cuda.init(); torch.cuda.set_device(0)
    if mode in ("alloc", "kernel", "warm"):
        x = torch.empty(1 << 19, device="cuda")
    if mode in ("kernel", "warm"):
        x.fill_(1); torch.cuda.synchronize()
    if mode == "warm":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            x.add_(1)
        g.replay()
        for dt in (torch.float16, torch.bfloat16, torch.float64):
            torch.empty(64, dtype=dt, device="cuda").fill_(1).sum().item()
        torch.randn(4, device="cuda").sum().item()
        torch.cuda.synchronize()
print("done", round(time.perf_counter() - t, 4), flush=True)
sys.stdin.readline()
"""


def batch_timer():
    import torch

    x = torch.ones(16 << 20, device="cuda")  # 64 MiB: ~45 us a pass on an H100
    g = torch.cuda.CUDAGraph()
    x.mul_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(20):
            x.mul_(1.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def one() -> float:
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(50):
        one()
    return one


def run_mode(mode: str, n: int, one) -> dict:
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True) for _ in range(n)]
    for k in kids:
        assert k.stdout.readline().strip() == "ready"
    quiet = [one() for _ in range(300)]
    for k in kids:
        k.stdin.write("go\n")
        k.stdin.flush()
    t0 = time.perf_counter()
    inside: list[float] = []
    child_s: list[float] = []
    if mode == "exit":
        while any(k.poll() is None for k in kids):
            inside.append(one())
    else:
        import select

        pending = {k.stdout.fileno(): k for k in kids}
        while pending:
            inside.append(one())
            for fd in select.select(list(pending), [], [], 0)[0]:
                line = pending.pop(fd).stdout.readline().split()
                child_s.append(float(line[1]) if len(line) == 2 else float("nan"))
    window = time.perf_counter() - t0
    after = [one() for _ in range(100)]
    for k in kids:
        if k.poll() is None:
            k.stdin.close()
            k.wait()
    q = sorted(quiet)
    s = sorted(inside) or [float("nan")]
    return {"mode": mode, "children": n, "window_s": round(window, 4), "batches_inside": len(inside),
            "quiet_median_ms": round(statistics.median(q), 4), "quiet_max_ms": round(q[-1], 4),
            "inside_median_ms": round(statistics.median(s), 4), "inside_p90_ms": round(s[int(0.9 * (len(s) - 1))], 4),
            "inside_max_ms": round(s[-1], 4), "inside_over_1p2x_quiet": sum(v > 1.2 * statistics.median(q) for v in s),
            "after_median_ms": round(statistics.median(after), 4), "child_s": sorted(child_s)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="driver_ctx,torch_ctx,alloc,kernel,warm,exit")
    ap.add_argument("--children", default="1,8")
    a = ap.parse_args()
    one = batch_timer()
    rows = []
    for n in [int(c) for c in a.children.split(",")]:
        for mode in a.modes.split(","):
            rows.append(run_mode(mode, n, one))
            print(rows[-1], flush=True)
    write_result("context_disturbance", {"rows": rows})


if __name__ == "__main__":
    main()
