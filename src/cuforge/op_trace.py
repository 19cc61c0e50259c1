"""Recording the aten ops a piece of PyTorch code dispatches (from Python or C++ extensions)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpRecorder(TorchDispatchMode):
    """Use as a context manager; `ops` lists every aten op name dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.overloadpacket.__name__
        if name == "gelu" and (kwargs or {}).get("approximate") == "tanh":
            name = "gelu_tanh"  # a different function, not a flavour of the same one
        elif name in ("_softmax", "_log_softmax") and len(args) > 1 and hasattr(args[0], "dim"):
            if int(args[1]) % max(args[0].dim(), 1) == args[0].dim() - 1:
                name += "_lastdim"  # row-wise kernels cover the last dimension only
        elif name in ("sum", "max", "argmax") and len(args) > 1 and hasattr(args[0], "dim") and args[0].dim() > 0:
            dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            keepdim = bool(args[2]) if len(args) > 2 else bool((kwargs or {}).get("keepdim", False))
            if len(dims) == 1 and isinstance(dims[0], int) and dims[0] % args[0].dim() == args[0].dim() - 1 and not keepdim:
                name += "_lastdim"
        self.ops.append(name)
        return func(*args, **(kwargs or {}))
