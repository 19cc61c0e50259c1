import math

import pytest

from cuforge.rewards import Outcome, fast_p, geomean, get_reward


def test_speedup_reward_orders_every_outcome():
    r = get_reward("speedup")
    ladder = [Outcome("cheat:side_stream"), Outcome("wrong_output"), Outcome("runtime_error"),
              Outcome("compile_error"), Outcome("ok", 0.1), Outcome("ok", 0.9), Outcome("ok", 1.0),
              Outcome("ok", 1.5), Outcome("ok", 100.0)]
    values = [r(o) for o in ladder]
    assert values == sorted(values) and len(set(values[:4])) == 4
    assert r(Outcome("ok", 1.5)) == pytest.approx(math.log(1.5))
    assert r(Outcome("ok", 100.0)) == pytest.approx(math.log(20.0))  # clipped
    assert r(Outcome("ok", 0.1)) == pytest.approx(-0.9)
    assert r(Outcome("ok", 0.1)) > r(Outcome("compile_error"))
    assert r(Outcome("timeout")) == r(Outcome("crash")) == r(Outcome("runtime_error"))


def test_fast_p_and_contrastive_rewards():
    assert get_reward("fast_p")(Outcome("ok", 1.01)) == 1.0
    assert get_reward("fast_p")(Outcome("ok", 0.99)) == 0.0
    assert get_reward("fast_p")(Outcome("cheat:thread")) == 0.0
    c = get_reward("contrastive")
    assert c(Outcome("ok", 2.0, parent_speedup=1.0)) == pytest.approx(math.log(2.0))
    assert c(Outcome("ok", 1.0, parent_speedup=2.0)) == pytest.approx(-math.log(2.0))
    assert c(Outcome("ok", 100.0, parent_speedup=1.0)) == 1.0
    assert c(Outcome("wrong_output", parent_speedup=1.0)) == get_reward("speedup")(Outcome("wrong_output"))
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("nope")


def test_suite_metrics_follow_kernelbench():
    best = {"a": 2.0, "b": 0.5, "c": None}
    problems = ["a", "b", "c", "d"]  # d has no result at all: a failure
    assert fast_p(best, problems, 0.0) == 0.5
    assert fast_p(best, problems, 1.0) == 0.25
    assert fast_p(best, problems, 2.0) == 0.0
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([]) is None and geomean([None, 4.0]) == pytest.approx(4.0)
