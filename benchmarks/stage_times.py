"""Benchmark: where a template candidate's time goes, kernel by kernel, beside eager PyTorch's kernels -
for KernelBench files whose searched kernel loses, which stage of a staged pair or pipeline is slow.

Each file's preferred family renders its seeds; the candidate module (cuforge's own rendered code, so
it runs here in the benchmark's process, not in the sandbox) and the eager model each run under
torch.profiler, and every CUDA kernel's mean time per forward is listed, by name and in launch order
(a partition's kernels of one family apart).

    python benchmarks/stage_times.py .kb/level2/23_Conv3d_GroupNorm_Mean.py --name stage_times
    python benchmarks/stage_times.py .kb/level2/23_Conv3d_GroupNorm_Mean.py --prefer conv_direct
    python benchmarks/stage_times.py models/resnet_bottleneck@bf16 models/gru_cell@fp16 --name models_stages

--prefer NAME: the family (or a staged pair or pipeline whose first kernel is NAME) profiled where it covers.

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import write_result

ITERS = 5


def in_launch_order(kernels: list[tuple[float, str, float]], iters: int) -> list[dict[str, Any]] | None:
    """(start, name, ms) of every kernel `iters` calls launched -> each launch of one call in order with its
    mean ms over the calls: a partition's three convolutions apart, where by name they are one row. None
    where the calls did not launch the same kernels in the same order."""
    ordered = sorted(kernels)
    if not ordered or len(ordered) % iters:
        return None
    n = len(ordered) // iters
    calls = [ordered[i * n:(i + 1) * n] for i in range(iters)]
    if any([k[1] for k in call] != [k[1] for k in calls[0]] for call in calls):
        return None
    return [{"kernel": calls[0][j][1][:120], "ms": round(sum(call[j][2] for call in calls) / iters, 4)} for j in range(n)]


def kernel_times(fn: Any, iters: int = ITERS) -> tuple[list[dict[str, Any]], float, list[dict[str, Any]] | None]:
    """Every CUDA kernel `fn` launches, with its mean ms per call; the calls' total kernel ms; and one
    call's launches in order (in_launch_order)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = defaultdict(float)
    seen: list[tuple[float, str, float]] = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] += ev.device_time / 1000.0
            seen.append((ev.time_range.start, ev.name, ev.device_time / 1000.0))
    rows = sorted(({"kernel": name[:120], "ms": round(ms / iters, 4)} for name, ms in per.items()), key=lambda r: -r["ms"])
    return rows, round(sum(r["ms"] for r in rows), 4), in_launch_order(seen, iters)


def load(ref: str) -> Any:
    """A problem file, or a built-in suite's problem by id (models/resnet_bottleneck@bf16: cast to its dtype)."""
    from cuforge.problems.loader import load_files
    from cuforge.problems.suites import load_suite

    if Path(ref).is_file():
        problems, _ = load_files([Path(ref)])  # a file listing more dtypes loads one problem each, its own first
        if not problems:
            raise SystemExit(f"stage_times: {ref}: not a problem file cuforge can load")
        return problems[0]
    suite = ref.split("/")[0]
    found = next((p for p in load_suite(suite).problems if p.id == ref), None)
    if found is None:
        raise SystemExit(f"stage_times: {ref}: no such file, nor a problem of the {suite!r} suite")
    return found


def profile_file(ref: str, seeds: int, prefer: str) -> dict[str, Any]:
    import torch

    from cuforge.kernels.families import families_for
    from cuforge.sandbox.protocol.loading import candidate_class, problem_module

    problem = load(ref)
    name = problem.id if not Path(ref).is_file() else Path(ref).name
    families, why = families_for(problem)
    if not families:
        return {"file": name, "error": why}
    family = next((f for f in families if prefer and prefer in f.name.split("+")[0]), families[0])
    mod = problem_module(problem.source, cast=problem.meta.cast)  # a suite's @bf16 problem: inputs and model cast
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    torch.manual_seed(1)
    eager = mod.Model(*mod.get_init_inputs()).cuda().eval()
    with torch.no_grad():
        eager_kernels, eager_ms, eager_launches = kernel_times(lambda: eager(*inputs))
        out: dict[str, Any] = {"file": name, "family": family.name, "eager_ms": eager_ms, "eager": eager_kernels,
                               "eager_launches": eager_launches, "candidates": []}
        for i, cfg in enumerate(family.seeds(problem)[:seeds]):
            cand = family.render(cfg, problem)
            torch.manual_seed(1)
            model = candidate_class(cand.module_source(), mod, f"stage_times_{i}")(*mod.get_init_inputs()).cuda().eval()
            kernels, total, launches = kernel_times(lambda: model(*inputs))
            out["candidates"].append({"config": cand.meta.get("config"), "stages": cand.meta.get("stages"), "ms": total,
                                      "kernels": kernels, "launches": launches})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", help="problem files, or built-in suite problems by id (models/gru_cell@bf16)")
    ap.add_argument("--seeds", type=int, default=1, help="how many of the family's seeds to profile")
    ap.add_argument("--prefer", default="", help="a head family to profile first where it covers (conv_direct)")
    ap.add_argument("--name", default="stage_times")
    a = ap.parse_args()
    import torch

    if a.prefer:  # pipelines take the first head family that covers their first part
        from cuforge.kernels import families as registry

        registry._HEADS.sort(key=lambda f: f.name != a.prefer)
    rows = []
    for f in a.files:
        try:
            row = profile_file(f, a.seeds, a.prefer)
        except Exception as e:  # noqa: BLE001 - one file's failure is reported, the rest still run
            row = {"file": f, "error": f"{type(e).__name__}: {e}"[:500]}
        rows.append(row)
        torch.cuda.empty_cache()  # the file's tensors are gone with its frame
        if "error" in row:
            print(f"{row['file']}: {row['error']}", flush=True)
            continue
        print(f"{row['file']} [{row['family']}]: eager {row['eager_ms']} ms", flush=True)
        for k in row["eager"][:4]:
            print(f"    eager {k['ms']:9.4f}  {k['kernel'][:90]}", flush=True)
        for c in row["candidates"]:
            print(f"  candidate {c['ms']} ms {c['stages']}", flush=True)
            for i, k in enumerate(c["launches"] or c["kernels"]):  # in launch order where every call ran the same
                print(f"    cand  {k['ms']:9.4f}  {'#%d ' % (i + 1) if c['launches'] else ''}{k['kernel'][:90]}", flush=True)
    write_result(a.name, {"rows": rows})


if __name__ == "__main__":
    main()
