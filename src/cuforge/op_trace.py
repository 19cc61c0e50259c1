"""Recording the aten ops a piece of PyTorch code dispatches (from Python or C++ extensions)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpRecorder(TorchDispatchMode):
    """Use as a context manager; `ops` lists every aten op name dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
