"""Where kernel families are registered: each family's class is decorated in its own module with its
rank (the order of preference when several cover a problem: lower first), and `registered()` makes
one of each, in that order. Importing the kernels package's modules registers them all."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)

_RANKED: dict[int, type] = {}


def family(rank: int) -> Callable[[T], T]:
    """Register a family class at `rank`; two families at one rank are a mistake, named at import."""
    def register(cls: T) -> T:
        if rank in _RANKED and _RANKED[rank] is not cls:
            raise ValueError(f"families {_RANKED[rank].__name__} and {cls.__name__} both have rank {rank}")
        _RANKED[rank] = cls
        return cls

    return register


def import_family_modules() -> None:
    """Import every module of the kernels package, so that each family's decorator has run."""
    import cuforge.kernels as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def registered() -> list:
    """One instance of every registered family, most preferred first."""
    import_family_modules()
    return [_RANKED[rank]() for rank in sorted(_RANKED)]
