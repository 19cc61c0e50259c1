"""Reward functions (what the search learns from) and suite metrics (what users read).

Rewards are registered by name and chosen per run:

- ``speedup`` (default): for a correct candidate, log(speedup) clipped to [-0.9, ln 20]; failures get
  fixed values ordered cheat (-3) < wrong output (-2) < runtime error, timeout, crash (-1.5) <
  compile or parse error (-1) < any correct candidate (> -0.9), so slower-than-baseline correct code
  (reward in [-0.9, 0)) still beats every failure and faster code (reward > 0) beats it.
- ``fast_p``: 1.0 for a correct candidate faster than the baseline by more than p (default p = 1), else 0.
- ``contrastive``: log(speedup / parent's speedup), clipped to [-1, 1], for a correct child of a
  correct parent: improvement over the parent. Other cases fall back to ``speedup``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

LOG_CLIP_LOW = -0.9
LOG_CLIP_HIGH = math.log(20.0)
FAILURE_REWARD = {
    "cheat": -3.0,
    "wrong_output": -2.0,
    "runtime_error": -1.5,
    "timeout": -1.5,
    "crash": -1.5,
    "compile_error": -1.0,
    "parse_error": -1.0,
    "compiled": -0.95,  # compile-only runs: built, never checked; above failures, below any correct result
}


@dataclass(frozen=True)
class Outcome:
    """What a reward needs to know of one evaluation."""

    status: str
    speedup: float | None = None  # vs the run's baseline; None unless status is "ok"
    parent_speedup: float | None = None

    @property
    def correct(self) -> bool:
        return self.status == "ok" and self.speedup is not None and self.speedup > 0


def failure_reward(status: str) -> float:
    key = "cheat" if status.startswith("cheat:") else status
    if key not in FAILURE_REWARD:
        raise ValueError(f"no reward defined for status {status!r}")
    return FAILURE_REWARD[key]


def speedup_reward(o: Outcome) -> float:
    if not o.correct:
        return failure_reward(o.status) if o.status != "ok" else FAILURE_REWARD["runtime_error"]
    return min(max(math.log(o.speedup), LOG_CLIP_LOW), LOG_CLIP_HIGH)  # type: ignore[arg-type]


def fast_p_reward(o: Outcome, p: float = 1.0) -> float:
    return 1.0 if o.correct and o.speedup > p else 0.0  # type: ignore[operator]


def contrastive_reward(o: Outcome) -> float:
    if o.correct and o.parent_speedup and o.parent_speedup > 0:
        return min(max(math.log(o.speedup / o.parent_speedup), -1.0), 1.0)  # type: ignore[operator]
    return speedup_reward(o)


REWARDS: dict[str, Callable[[Outcome], float]] = {
    "speedup": speedup_reward,
    "fast_p": fast_p_reward,
    "contrastive": contrastive_reward,
}


def get_reward(name: str) -> Callable[[Outcome], float]:
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; choose from {', '.join(REWARDS)}")
    return REWARDS[name]


# ---------------------------------------------------------------------------------- suite metrics

def geomean(values: Iterable[float]) -> float | None:
    xs = [v for v in values if v is not None and v > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def fast_p(best_speedups: Mapping[str, float | None], problems: Iterable[str], p: float) -> float:
    """KernelBench's fast_p: the share of the suite's problems with a correct result faster than p.
    Problems without a correct result count as failures."""
    ids = list(problems)
    if not ids:
        return 0.0
    wins = sum(1 for pid in ids if (best_speedups.get(pid) or 0.0) > p)
    return wins / len(ids)
