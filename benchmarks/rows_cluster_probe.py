"""rows_cluster on KernelBench's softmax and log-softmax (4096 x 393216 fp32; issue #23): where its time goes
and what a template change buys, every variant timed in one process, interleaved round by round with torch's
copy (CUDA events; median, p20, p80), each checked against torch first unless it is a diagnostic.

- the template now against the one at --before (git), for the family's first two seeds, each also ONLINE;
- --edits: text edits of the --before template's second seed (written for the template of 016662b):
  cache hints (streaming stores, streaming loads, a 256-byte L2 prefetch) and diagnostics that are wrong
  by design (no cluster exchange, no sum-of-exp pass, neither: what those phases cost);
- --patterns: one streaming kernel y = x * a + b with the same instructions for every (a, b), only the bits
  written differ (softmax-like values near 2.5e-6, log-softmax-like near -13): whether the time follows the data.

    python benchmarks/rows_cluster_probe.py --before 016662b --edits --patterns --name rows_cluster_probe

(--before is a git revision, or a template file where the working tree travels without its history.)
"""

from __future__ import annotations

import argparse
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from _common import spread, write_result

STORE = "reinterpret_cast<Vec*>(ys)[i] = o;"
LOAD = "a[u] = reinterpret_cast<const Vec*>(xs)[base + u * BLOCK];"
HINTS = {
    "as_rendered": {},
    "stores_cs": {STORE: "__stcs(reinterpret_cast<float4*>(ys) + i, *reinterpret_cast<const float4*>(&o));"},
    "loads_cs": {LOAD: "{ const float4 q = __ldcs(reinterpret_cast<const float4*>(xs) + base + u * BLOCK); "
                       "a[u] = *reinterpret_cast<const Vec*>(&q); }"},
    "loads_l2_256": {LOAD: "{ float4 q; asm volatile(\"ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];\" "
                           ": \"=f\"(q.x), \"=f\"(q.y), \"=f\"(q.z), \"=f\"(q.w) : \"l\"(reinterpret_cast<const float4*>(xs) + base + u * BLOCK)); "
                           "a[u] = *reinterpret_cast<const Vec*>(&q); }"},
}
SUM_PASS = "if (bmax != -CUDART_INF_F) for (int i = t; i < n; i += BLOCK) tsum += expf(buf[i] - bmax);"
PEERS = {"cluster_sync();": "__syncthreads();", "peer_double(&part[0], r)": "part[0]", "peer_double(&part[1], r)": "part[1]"}
# Diagnostics, wrong by design (not checked against torch): what the block's own phases cost - the
# cluster's two barriers and its statistics through distributed shared memory, and the sum-of-exp pass.
DIAGNOSTICS = {"no_cluster": PEERS, "no_sum_pass": {SUM_PASS: "tsum = 1.f;"}, "no_cluster_no_sum": {**PEERS, SUM_PASS: "tsum = 1.f;"}}
PATTERN_KERNEL = r"""
extern "C" __global__ void affine(const float4* __restrict__ x, float4* __restrict__ y, long long n, float a, float b) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        y[i] = make_float4(fmaf(v.x, a, b), fmaf(v.y, a, b), fmaf(v.z, a, b), fmaf(v.w, a, b));
    }
}
"""
PATTERNS = {"copy": (1.0, 0.0), "softmax_like": (2.5e-6, 0.0), "log_softmax_like": (1.0, -13.0), "constant": (0.0, -13.0)}


def time_interleaved(calls: dict[str, Callable[[], None]], rounds: int) -> dict[str, dict[str, float]]:
    """Median, p20, p80 of each call's event time, the calls taken in turn every round. The GPU spins for
    about 1 ms before each start event, so the host has queued the call's launches before the GPU reaches
    them: the time between the events is the GPU's, not the host's launch path (which, on an idle GPU, the
    events would count)."""
    import torch

    times: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(rounds + 2):
        for k, f in calls.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(2_000_000)  # cycles: about 1 ms at the H100's clocks
            a.record()
            f()
            b.record()
            b.synchronize()
            if r >= 2:
                times[k].append(a.elapsed_time(b))
    return {k: spread(t) for k, t in times.items()}


def kb_problem(path: Path) -> tuple[Any, Any]:
    """The problem a KernelBench file defines and the family the search tries first on it."""
    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files

    (problem,), _ = load_files([path])
    return problem, families_for(problem)[0][0]


def launcher(cand: Any, rows: int, cols: int, x: Any, y: Any) -> Callable[[], None]:
    """A direct launch of a rendered rows_cluster kernel (cluster size and block read from its launch spec)."""
    from cuforge.runtime import compile_cuda

    spec = cand.launch
    cluster = int(spec.grid.split("*")[1].split(",")[0])
    block = int(spec.block.strip("(,)"))
    unit = 4
    shared = -(-(-(-cols // cluster)) // unit) * unit * 4
    k = compile_cuda(cand.source, spec.options).kernel(spec.entry)
    return lambda: k((rows * cluster,), (block,), x, y, rows, cols, shared_mem=shared)


def main() -> None:
    import torch

    from cuforge.runtime import compile_cuda

    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", default=".kb/level1")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--before", default="HEAD", help="a git revision, or a template file, whose rows_cluster template is timed beside")
    ap.add_argument("--edits", action="store_true", help="also the cache-hint and diagnostic edits of --before's template")
    ap.add_argument("--patterns", action="store_true", help="also the store-pattern kernel")
    ap.add_argument("--name", default="rows_cluster_probe")
    a = ap.parse_args()
    before = (Path(a.before).read_text() if Path(a.before).is_file() else  # a template file, where no git history travels
              subprocess.run(["git", "show", f"{a.before}:src/cuforge/kernels/rows_cluster.cu.j2"], capture_output=True,
                             text=True, check=True).stdout)
    rows, cols = 4096, 393216
    x = torch.rand(rows, cols, device="cuda")
    y = torch.empty_like(x)
    calls: dict[str, Callable[[], None]] = {"torch_copy": lambda: y.copy_(x)}
    if a.patterns:
        affine = compile_cuda(PATTERN_KERNEL).kernel("affine")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for name, (mul, add) in PATTERNS.items():
            calls["pattern." + name] = lambda mul=mul, add=add: affine((sms * 8,), (512,), x, y, x.numel() // 4, mul, add)
    diagnostics = set()
    for fname in ("23_Softmax.py", "24_LogSoftmax.py"):
        problem, fam = kb_problem(Path(a.kb) / fname)
        op = fname[3:-3]
        for label, config in (("seed0", fam.seeds(problem)[0]), ("seed1", fam.seeds(problem)[1])):
            calls[f"{op}.{label}.before"] = launcher(fam.render(config, problem, template_text=before), rows, cols, x, y)
            for tag, cfg in (("now", config), ("online", {**config, "ONLINE": True})):
                if fam.valid(fam.complete(cfg), problem):
                    calls[f"{op}.{label}.{tag}"] = launcher(fam.render(cfg, problem), rows, cols, x, y)
        if a.edits:
            base = fam.render(fam.seeds(problem)[1], problem, template_text=before)
            for name, edits in {**HINTS, **DIAGNOSTICS}.items():
                src = base.source
                for old, new in edits.items():
                    if old not in src:
                        raise SystemExit(f"--edits: {name} expects the template of 016662b (--before), not {a.before}")
                    src = src.replace(old, new)
                calls[f"{op}.edit.{name}"] = launcher(replace(base, source=src), rows, cols, x, y)
                if name in DIAGNOSTICS:
                    diagnostics.add(f"{op}.edit.{name}")
    # every variant but the diagnostics against torch (fp32 math: a loose bound catches a wrong edit)
    for op, ref in (("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)):
        want = ref(x, 1)
        for key, f in calls.items():
            if key.startswith(op + ".") and key not in diagnostics:
                y.zero_()
                f()
                err = (y - want).abs().max().item()
                assert err < 1e-4, (key, err)
        del want
    timed = time_interleaved(calls, a.rounds)
    copy_ms = timed["torch_copy"]["median_ms"]
    for k, v in timed.items():
        v["vs_copy"] = copy_ms / v["median_ms"]
        print(f"{k:34s} {v['median_ms']:.4f} ms  ({v['p20_ms']:.4f}-{v['p80_ms']:.4f})  {v['vs_copy']:.3f} of copy", flush=True)
    write_result(a.name, {"bytes": 2 * x.numel() * 4, "rounds": a.rounds, "before": a.before, "timed": timed,
                          "diagnostics": sorted(diagnostics), "gpu": torch.cuda.get_device_name(0)})

if __name__ == "__main__":
    main()
