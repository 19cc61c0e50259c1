"""cuforge.rewards: reward functions and fast_p / geomean metrics."""

from cuforge.rewards.rewards import REWARDS, Outcome, fast_p, geomean, get_reward

__all__ = ["REWARDS", "Outcome", "fast_p", "geomean", "get_reward"]
