"""A pytest plugin for benchmarks/gpu_suite.py: with --start-no-test-after=T (seconds since the epoch), a
test process starts no test once the clock passes T. A test not started sends no report, so the suite's
record keeps it as not run; the tests already running go on to the end. Without it, the call's limit
interrupts every test in flight, and on one GPU shared by a dozen test processes those have each run for
minutes."""

from __future__ import annotations

import time

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--start-no-test-after", type=float, default=None, metavar="EPOCH_S",
                     help="start no test once time.time() passes this (the tests running finish)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    deadline = item.config.getoption("--start-no-test-after")
    if deadline is not None and time.time() >= deadline:
        return True  # handled: no setup, no call, no report; the session's end tears down its fixtures
    return None
