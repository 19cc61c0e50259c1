"""The random draws of the eager reference, replayed into the float64 reference.

A stochastic reference (a training-mode dropout) is judged by reseeding torch's generators before the
candidate and before each reference, so that PyTorch's own implementation draws the same numbers. That
holds between two float32 forwards, but not between float32 and float64 ones: on a GPU, native_dropout's
vectorised kernel maps its draws to elements by the vector width of the dtype (a float32 and a float64
dropout of one 16 x 96 tensor after one seed disagree on ~500 of its 1536 elements, measured on an H100
with torch 2.11), and on any device rand_like / randn_like of a float64 tensor draw other numbers. The
eager forward therefore runs under a `RandomTape` that records each random op's draw, and the float64
forward replays them in order instead of drawing: the float64 reference then uses exactly the draws the
eager reference and an honest candidate make. A forward whose random ops do not line up (other ops, other
shapes) raises `ReplayMismatch`, and the caller falls back to the eager reference."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that draw from a generator (in place or out of place); native_dropout's draw is its mask.
RANDOM_OPS = frozenset({
    "native_dropout", "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint",
    "randint_like", "randperm", "normal", "normal_", "uniform_", "random_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "multinomial", "poisson", "rrelu_with_noise", "rrelu_with_noise_",
})


class ReplayMismatch(RuntimeError):
    """The float64 forward's random ops are not the eager forward's, in the same order and shapes."""


class _Recording(TorchDispatchMode):
    def __init__(self, tape: RandomTape) -> None:
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in RANDOM_OPS:
            drawn = out[1] if name == "native_dropout" else out  # the mask: the output is input x mask x scale
            if isinstance(drawn, torch.Tensor):
                self.tape.draws.append((name, drawn.detach().clone()))
        return out


class _Replaying(TorchDispatchMode):
    def __init__(self, tape: RandomTape) -> None:
        super().__init__()
        self.tape, self.next = tape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name not in RANDOM_OPS:
            return func(*args, **kwargs)
        if self.next >= len(self.tape.draws) or self.tape.draws[self.next][0] != name:
            raise ReplayMismatch(f"random op {self.next} is {name}, not the eager forward's")
        drawn = self.tape.draws[self.next][1]
        self.next += 1
        if name == "native_dropout":
            x, p = args[0], float(args[1])
            if tuple(x.shape) != tuple(drawn.shape):
                raise ReplayMismatch(f"dropout of shape {tuple(x.shape)}, not {tuple(drawn.shape)}")
            mask = drawn.to(x.device)
            y = torch.zeros_like(x) if p >= 1 else x * mask.to(x.dtype) * (1.0 / (1.0 - p))
            return y, mask
        out = func(*args, **kwargs)  # the right dtype, shape and device; its values are replaced
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(drawn.shape):
            raise ReplayMismatch(f"{name} of another shape than the eager forward's")
        out.copy_(drawn)
        return out


class RandomTape:
    """Record one forward's random draws (`recording`), then replay them into another (`replaying`)."""

    def __init__(self) -> None:
        self.draws: list[tuple[str, torch.Tensor]] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.draws.clear()
        with _Recording(self):
            yield

    @contextlib.contextmanager
    def replaying(self) -> Iterator[Any]:
        mode = _Replaying(self)
        with mode:
            yield mode
        if mode.next != len(self.draws):
            raise ReplayMismatch(f"{len(self.draws) - mode.next} of the eager forward's random ops were not made")
