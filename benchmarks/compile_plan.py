"""What eager PyTorch and torch.compile run for a problem file, under PyTorch's default flags: each one's
time and its kernels (torch.profiler, per forward), and the file's first convolution alone in NCHW and
channels-last. Where torch.compile wins, its kernel list says how (a fused tail, a bias added inside it,
a layout change), which is the plan a family would have to match. GPU only.

    python benchmarks/compile_plan.py .kb/level2/4_Conv2d_Mish_Mish.py .kb/level2/34_*.py --name compile_plan
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any, Callable

from _common import parser, write_result


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(fn: Callable[..., Any], args: list[Any], runs: int = 10) -> float:
    import statistics

    import torch

    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 3)


def kernels(fn: Callable[..., Any], args: list[Any], top: int = 8) -> list[list[Any]]:
    """The GPU kernels one call runs, slowest first: [name, ms per call]."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
    rows = [[e.key[:120], round(e.device_time_total / 3 / 1000, 3)] for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])[:top]


def plan(path: Path) -> dict[str, Any]:
    import torch

    m = load(path)
    torch.manual_seed(0)
    model = m.Model(*m.get_init_inputs()).cuda().eval()
    args = [t.cuda() if isinstance(t, torch.Tensor) else t for t in m.get_inputs()]
    out: dict[str, Any] = {}
    with torch.no_grad():
        compiled = torch.compile(model)
        out["eager_ms"], out["compile_ms"] = median_ms(model, args), median_ms(compiled, args)
        out["eager_kernels"], out["compile_kernels"] = kernels(model, args), kernels(compiled, args)
        conv = next((mod for mod in model.modules() if isinstance(mod, torch.nn.modules.conv._ConvNd)), None)
        x = args[0]
        if conv is not None and isinstance(x, torch.Tensor) and x.dim() in (4, 5):
            layout = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            conv_cl = copy.deepcopy(conv).to(memory_format=layout)
            out["conv_nchw_ms"] = median_ms(conv, [x])
            out["conv_channels_last_ms"] = median_ms(lambda t: conv_cl(t.contiguous(memory_format=layout)), [x])
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--name", default="compile_plan")
    a = ap.parse_args()
    import torch

    missing = [str(f) for f in a.files if not f.is_file()]
    if missing:
        raise SystemExit(f"no such problem file: {missing[0]}")
    if not torch.cuda.is_available():
        raise SystemExit("compile_plan.py times on a GPU: none is visible")
    rows = {}
    for f in a.files:
        rows[f.name] = plan(f)
        print(f.name, {k: v for k, v in rows[f.name].items() if k.endswith("_ms")}, flush=True)
    write_result(a.name, {"flags": "PyTorch's defaults (cuDNN TF32 on, matmul TF32 off)", "files": rows}, echo=False)


if __name__ == "__main__":
    main()
