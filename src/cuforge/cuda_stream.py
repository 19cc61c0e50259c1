"""torch's current CUDA stream as the driver's handle, cheaply: every kernel launch asks for it."""

from __future__ import annotations

from typing import Any

_RAW_STREAM: Any = None  # the accessor, resolved at the first call (torch imports lazily)


def current_stream_handle() -> int:
    """torch's current CUDA stream on the current device, as the driver's handle (an int). Through
    torch's own raw accessors (those its compiled kernels launch with) where the build has them:
    torch.cuda.current_stream() builds a Stream object and resolves the device, about 8 us a call,
    more than a small kernel's launch."""
    global _RAW_STREAM
    if _RAW_STREAM is None:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        device = getattr(torch._C, "_cuda_getDevice", None)
        _RAW_STREAM = (lambda: raw(device())) if raw is not None and device is not None else \
            (lambda: torch.cuda.current_stream().cuda_stream)
    return int(_RAW_STREAM())
