"""What eager PyTorch and torch.compile run for a problem file, under PyTorch's default flags: their times
side by side (the judge's timing: L2 flushed, interleaved, median/p20/p80), their kernels (torch.profiler,
per forward), and the file's first convolution alone in NCHW and channels-last, side by side too. Where torch.compile wins, its kernel list says how (a fused tail, a bias added inside it,
a layout change), which is the plan a family would have to match. GPU only.

    python benchmarks/compile_plan.py .kb/level2/4_Conv2d_Mish_Mish.py .kb/level2/34_*.py --name compile_plan
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from _common import parser, write_result


def interleaved(contenders: dict[str, Callable[[], Any]]) -> dict[str, dict[str, float]]:
    """The contenders timed as the judge times them: one launch between events after an L2 flush,
    round-robin in rotating order; median, p20 and p80 (ms) of each."""
    import torch

    from cuforge.sandbox.judge.timing import EventTimer, L2Flusher, TimingConfig, measure_interleaved

    flush = L2Flusher(torch.device("cuda"))
    timers = {name: EventTimer(lambda k, f=fn: f(), 1, flush) for name, fn in contenders.items()}
    stats = measure_interleaved(timers, TimingConfig(max_seconds=5.0))
    return {name: {"median_ms": round(t.median_ms, 3), "p20_ms": round(t.p20_ms, 3), "p80_ms": round(t.p80_ms, 3)}
            for name, t in stats.items()}


def kernels(fn: Callable[[], Any], top: int = 8) -> list[list[Any]]:
    """The GPU kernels one call runs, slowest first: [name, ms per call]."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    rows = [[e.key[:120], round(e.device_time_total / 3 / 1000, 3)] for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])[:top]


def plan(path: Path) -> dict[str, Any]:
    import torch

    from cuforge.sandbox.protocol.loading import module_from_source

    m = module_from_source(path.read_text(), f"plan_{path.stem}")
    torch.manual_seed(0)
    model = m.Model(*m.get_init_inputs()).cuda().eval()
    args = [t.cuda() if isinstance(t, torch.Tensor) else t for t in m.get_inputs()]
    out: dict[str, Any] = {}
    with torch.no_grad():
        compiled = torch.compile(model)
        out["times"] = interleaved({"eager": lambda: model(*args), "torch.compile": lambda: compiled(*args)})
        out["eager_kernels"] = kernels(lambda: model(*args))
        out["compile_kernels"] = kernels(lambda: compiled(*args))
        conv = next((mod for mod in model.modules() if isinstance(mod, torch.nn.modules.conv._ConvNd)), None)
        x = args[0]
        if conv is not None and isinstance(x, torch.Tensor) and x.dim() in (4, 5):
            layout = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            conv_cl = copy.deepcopy(conv).to(memory_format=layout)
            out["first_convolution"] = interleaved({"nchw": lambda: conv(x),
                                                    "channels_last": lambda: conv_cl(x.contiguous(memory_format=layout))})
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--name", default="compile_plan")
    a = ap.parse_args()
    import torch

    from cuforge.sandbox.protocol.precision import set_pytorch_defaults

    missing = [str(f) for f in a.files if not f.is_file()]
    if missing:
        raise SystemExit(f"no such problem file: {missing[0]}")
    if not torch.cuda.is_available():
        raise SystemExit("compile_plan.py times on a GPU: none is visible")
    set_pytorch_defaults()
    rows = {}
    for f in a.files:
        rows[f.name] = plan(f)
        print(f.name, rows[f.name]["times"], rows[f.name].get("first_convolution", ""), flush=True)
    write_result(a.name, {"flags": "PyTorch's defaults (cuDNN TF32 on, matmul TF32 off)", "files": rows}, echo=False)


if __name__ == "__main__":
    main()
