"""The in-process judge's event timer on a real GPU: a call bound by its host side (a network's forward
of many Python launches) is timed by its device time, its host time hidden behind a spin however
long; a call that waits for the device cannot be, and its samples say so (TimingStats.late)."""

import statistics
import time

import pytest
import torch

from cuforge.sandbox.judge import timing

pytestmark = pytest.mark.gpu
# Under the launch queue's depth: a call of more kernels blocks on it, and is late under any spin.
LAUNCHES = 200
CONFIG = timing.TimingConfig(min_samples=10, max_samples=12, max_seconds=5.0, warmup=2, batch=4)


def _host_heavy(x):
    """LAUNCHES tiny kernels, each after about 100 us of host work: 20 ms of host time a call for well
    under a millisecond of device time."""
    def call(k):
        y = x
        for _ in range(LAUNCHES):
            deadline = time.perf_counter() + 100e-6
            while time.perf_counter() < deadline:
                pass
            y = y + 1
        return y
    return call


def test_a_host_bound_call_is_timed_by_its_device_time():
    x = torch.zeros(256, device="cuda")
    call = _host_heavy(x)
    call(0)
    torch.cuda.synchronize()
    host = []
    for _ in range(3):
        t0 = time.perf_counter()
        call(0)
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    host_ms = statistics.median(host) * 1e3
    timer = timing.EventTimer(call, 1, timing.L2Flusher(x.device))
    stats = timing.measure_interleaved({"call": timer}, CONFIG)["call"]
    assert stats.n >= CONFIG.min_samples and stats.late == 0, stats
    # The spin outgrew the old 5 ms cap, and the events hold far less than the host's time.
    assert timer.spin_cycles > 10_000_000 and host_ms > 10, (timer.spin_cycles, host_ms)
    assert stats.median_ms < 0.5 * host_ms, (stats, host_ms)
    out = timer.outputs[0]
    assert torch.equal(out, torch.full_like(x, float(LAUNCHES)))


def test_a_call_that_waits_for_the_device_is_kept_and_counted_late():
    x = torch.zeros(1 << 20, device="cuda")

    def call(k):
        y = x * 2
        y.sum().item()  # waits for the device: no spin can get ahead of it
        return y

    timer = timing.EventTimer(call, 1, timing.L2Flusher(x.device))
    stats = timing.measure_interleaved({"call": timer}, CONFIG)["call"]
    # Bounded: after MAX_LATE_RETRIES dropped samples in a row the late ones are kept, and named.
    assert stats.n >= CONFIG.min_samples and stats.late == stats.n, stats
