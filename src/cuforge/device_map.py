"""Running KernelBench-style code where its CUDA device is not: `.cuda()`, `.to("cuda")` and
`device="cuda"` in a problem's get_inputs() or __init__ are sent to another device (the meta device
for inspection, the CPU for CPU-side validation and the CPU test mode).

KernelBench's own example problems and many user files create their inputs with `.cuda()`; on a GPU
machine the sandbox honours that as written, and only where no CUDA device is meant to be used is it
mapped here."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(x: Any) -> bool:
    if isinstance(x, torch.device):
        return x.type == "cuda"
    if isinstance(x, str):
        return x == "cuda" or x.startswith("cuda:")
    return False


class CudaTo(TorchFunctionMode):
    """A torch function mode under which every request for a CUDA device means `device` instead."""

    def __init__(self, device: str | torch.device) -> None:
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0].to(self.device, non_blocking=kwargs.get("non_blocking", False))
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = self.device
        if func in (torch.Tensor.to, torch.Tensor.type) or getattr(func, "__name__", "") == "to":
            args = tuple(self.device if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def cuda_mapped_to(device: str | torch.device) -> CudaTo:
    return CudaTo(device)
