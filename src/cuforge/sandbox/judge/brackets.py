"""The judge's clock for contenders: batches of calls bracketed by the judge's own CUDA events.
The candidate's batch runs in its host (`sandbox/hosts.py`), ordered between the judge's events by
interprocess events; the baselines' batch runs in the judge's process, timed the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from cuforge.sandbox.judge.hosts import HostClient
from cuforge.sandbox.judge.timing import MAX_SPIN_CYCLES, SPIN_CYCLES
from cuforge.sandbox.protocol.stop import Stop

BATCH_TARGET_MS = 1.0
MAX_LATE_RETRIES = 8
BUSY_AFTER_MS = 0.75  # an H100's time slice between contexts measured ~2 ms; an idle GPU answers in us


def batch_size(estimate_ms: float, target_ms: float = BATCH_TARGET_MS, cap: int = 4096) -> int:
    """Calls per bracket: enough that one bracket lasts about target_ms."""
    return max(1, min(cap, round(target_ms / max(estimate_ms, 1e-4))))


def first_set(k: int, n_sets: int) -> int:
    return (1 - k) % n_sets


def checked_batch(batch: int, first: int = 3) -> bool:
    """Outputs are checked after the first batches and every fourth after them."""
    return batch < first or batch % 4 == 0


def capture_batch(fn: Any, k: int, start: int, n_sets: int) -> Any:
    """k calls in one CUDA graph, or None where capture fails or a replay does not reproduce the
    eager outputs (work outside the capture stream)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(min(k, 2)):
                fn((start + i) % n_sets)
        torch.cuda.current_stream().wait_stream(side)
        eager = [o.clone() for o in _tensors(fn((start + k - 1) % n_sets))]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(k):
                out = fn((start + i) % n_sets)
        replayed = _tensors(out)
        for o in replayed:
            if o.is_contiguous():
                o.view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        if len(replayed) != len(eager) or not all(torch.allclose(a, b, rtol=1e-3, atol=1e-5, equal_nan=False)
                                                  for a, b in zip(replayed, eager)):
            return None
        return graph
    except Exception:  # noqa: BLE001 - not capturable: call by call
        torch.cuda.synchronize()
        return None


def _tensors(out: Any) -> list[torch.Tensor]:
    return [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)]


def calls_per_batch(timer_for: Any, overhead_ms: float, target_ms: float = 0.0) -> tuple[int, float]:
    """Calls per bracket for a contender: a one-call bracket, then (for short calls) a longer one, the
    per-call time taken from their difference (the fixed cost cancels); capped so that enqueueing a
    batch stays under ~50 ms of the host's time. Returns (calls, the per-call estimate in ms)."""
    target_ms = target_ms or BATCH_TARGET_MS
    one = timer_for(1)
    t1 = statistics.median(one.brackets(3))
    est = t1 - overhead_ms
    if est >= target_ms:
        return 1, est
    k2 = int(min(256, max(8, target_ms / max(est, 0.005))))
    more = timer_for(k2)
    tk = statistics.median(more.brackets(3))
    per_call = max((tk - t1) / (k2 - 1), 1e-4)
    enqueue_per_call = max(more.enqueue_s / k2, 1e-7)
    return max(1, min(batch_size(per_call, target_ms), int(0.05 / enqueue_per_call))), per_call


# Batches longer than a few of the GPU's time slices between contexts (~2 ms measured on an H100):
# work a candidate leaves running past 'done' then outlasts the slice, and the judge sees it.
ESCAPE_BATCH_MS = 6.0


_GATE_SOURCE = r"""
extern "C" __global__ void cuforge_gate(const volatile int* word, int want, long long max_cycles) {
    long long start = clock64();
    while (*word < want && clock64() - start < max_cycles) { __nanosleep(2000); }
}
"""
GATE_CYCLES = 100_000_000  # ~55 ms on an H100: the gate gives way after this even if never opened


class Gate:
    """Holds the judge's stream until the judge opens it: one thread polling a word of the judge's own
    pinned memory, with a time limit. A start event queued behind it passes only once the contender's
    batch is enqueued (the host has replied), so no spin has to be guessed long enough; a host whose
    enqueueing blocks on the device (a candidate that synchronises inside forward) finds the gate
    giving way after the limit, and that bracket is late."""

    def __init__(self) -> None:
        from cuforge.runtime import compile_cuda

        self.kernel = compile_cuda(_GATE_SOURCE).kernel("cuforge_gate")
        self.word = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # pinned: the device reads it in place
        self.count = 0

    def hold(self, max_cycles: int) -> None:
        self.count += 1
        self.kernel((1,), (1,), self.word.data_ptr(), self.count, int(max_cycles))

    def open(self) -> None:
        self.word[0] = self.count


_GATE: list[Gate | None] = []


def gate() -> Gate | None:
    """The judge's gate, made once; None where the fast runtime cannot build it (a device spin then)."""
    if not _GATE:
        try:
            _GATE.append(Gate())
        except Exception:  # noqa: BLE001 - no NVRTC: spin instead
            _GATE.append(None)
    return _GATE[0]


class Bracket:
    """The judge's own events around a batch: the gate (so the batch is enqueued before the start
    event passes), the start event, the batch, the end event. For the candidate the batch is the
    host's, ordered between the two by interprocess events: the judge's clock measures it, and a
    fixed cross-context cost measured before the candidate was loaded is taken off."""

    def __init__(self) -> None:
        self.gate = gate()
        self.spin = GATE_CYCLES if self.gate is not None else SPIN_CYCLES
        self.batches = 0
        self.enqueue_s = 0.0
        self.lates = 0
        self.late_kept = 0  # brackets kept late: host time may show in them (TimingStats.late)

    def hold(self) -> None:
        if self.gate is not None:
            self.gate.hold(self.spin)
        else:
            torch.cuda._sleep(self.spin)

    def release(self) -> None:
        if self.gate is not None:
            self.gate.open()

    def _retry(self) -> bool:
        """Whether to drop a late bracket and try again with a longer hold: a bounded number of times
        in a row (a call that waits for the device can never be enqueued ahead of it)."""
        self.lates += 1
        return self.lates <= MAX_LATE_RETRIES

    def settle(self, late: bool) -> None:
        """After a kept bracket: a late one kept (its calls wait for the device, so no hold can get
        ahead of them) makes later holds short, since holding longer only idles the GPU."""
        if not late:
            self.lates = 0
            return
        self.late_kept += 1
        if self.gate is not None:
            self.spin = SPIN_CYCLES

    def fit_spin(self, enqueue_s: float) -> None:
        if self.gate is not None:
            self.spin = min(MAX_SPIN_CYCLES, self.spin * 2)
        else:
            self.spin = int(min(MAX_SPIN_CYCLES, max(self.spin, enqueue_s * 2.0e9 * 1.5)))


class LocalBracketTimer(Bracket):
    """A contender in the judge's own process (the baselines), timed like the candidate: its batch
    captured in one CUDA graph where the candidate's is (`graph=True`) and capture works."""

    method = "bracket+rotating"

    def __init__(self, fn: Any, n_sets: int, k: int, graph: bool = False) -> None:
        super().__init__()
        self.fn, self.n_sets, self.k = fn, n_sets, k
        self.outputs: dict[int, Any] = {}
        self.graph = capture_batch(fn, k, first_set(k, n_sets), n_sets) if graph else None

    def brackets(self, count: int) -> list[float]:
        return [ms * self.k for ms in self.samples(count)]

    def samples(self, count: int) -> list[float]:
        out: list[float] = []
        while len(out) < count:
            end, start = 0, first_set(self.k, self.n_sets)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.hold()
            e0.record()
            t = time.perf_counter()
            try:
                if self.graph is not None:
                    self.graph.replay()
                    r = None
                else:
                    for i in range(self.k):
                        r = self.fn((start + i) % self.n_sets)
                enq = time.perf_counter() - t
                e1.record()
                late = e0.query()
            finally:
                self.release()
            e1.synchronize()
            self.outputs[end] = r
            self.batches += 1
            self.enqueue_s = enq
            if late and self.spin < MAX_SPIN_CYCLES and self._retry():  # the device ran ahead of the host: idle inside the bracket
                self.fit_spin(enq)
                continue
            self.settle(late)
            out.append(e0.elapsed_time(e1) / self.k)
        return out


class RemoteBracketTimer(Bracket):
    """The candidate, in its host: the host enqueues k calls behind the judge's 'go' event and
    records 'done'; the judge's end event waits on 'done'. Work left running past 'done' shows as
    a GPU still busy with the host's context when the judge's next kernel wants it (_busy_after);
    the last call's outputs are checked against the reference for their inputs."""

    method = "bracket+rotating, judge's events"

    def __init__(self, host: HostClient, n_sets: int, k: int, overhead_ms: float, check: Any, first_checked: int = 3) -> None:
        super().__init__()
        self.host, self.n_sets, self.k, self.overhead_ms, self.check = host, n_sets, k, overhead_ms, check
        self.first_checked = first_checked
        self.go, self.done = host.bracket_events()
        self.busy: list[float] = []
        self.outputs: list[torch.Tensor] = []

    def _busy_after(self, e1: Any) -> None:
        """Was the GPU still someone else's after the batch's end? A tiny kernel of the judge's, right
        after, waits for the next time slice if the candidate's context still has work queued (one
        left running on a stream 'done' did not wait for); otherwise it starts at once."""
        t = time.perf_counter()
        p0, p1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        p0.record()
        torch.cuda._sleep(1000)
        p1.record()
        cpu_ms = (time.perf_counter() - t) * 1e3
        p1.synchronize()
        waited = e1.elapsed_time(p0) - cpu_ms
        if waited > BUSY_AFTER_MS:
            if self.host.neighbours_busy():  # another host starting or exiting may hold the GPU: no evidence
                self.host.busy_discarded += 1
                return
            self.busy.append(waited)
            if len(self.busy) >= 2:
                raise Stop("cheat:escaped_work", f"after its timed batches ended, the candidate's process kept the GPU "
                           f"busy for {max(self.busy):.3g} ms more: work ran on past the judge's timer "
                           f"(batches of {self.k} calls)")

    def samples(self, count: int) -> list[float]:
        return [max(ms - self.overhead_ms, 0.0) / self.k for ms in self.brackets(count)]

    def brackets(self, count: int) -> list[float]:
        """Whole brackets (ms), the fixed cost not taken off."""
        out: list[float] = []
        while len(out) < count:
            end, start = 0, first_set(self.k, self.n_sets)
            checked = checked_batch(self.batches, self.first_checked)
            if checked:  # the outputs a captured batch rewrites: poisoned, so a replay that skips them shows
                for o in self.outputs:
                    if o.is_contiguous():
                        o.view(torch.uint8).fill_(0xFF)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.hold()
            e0.record()
            self.go.record()
            t = time.perf_counter()
            try:
                reply, parts = self.host.call({"op": "batch", "k": self.k, "start": start}, what="a timed batch")
                enq = time.perf_counter() - t
                late = e0.query()
            finally:
                self.release()
            torch.cuda.current_stream().wait_event(self.done)
            e1.record()
            e1.synchronize()
            self.batches += 1
            self._busy_after(e1)
            self.outputs = [t for t in self.host.values(reply.get("outputs"), parts) if isinstance(t, torch.Tensor)]
            if checked:
                self.check(end, self.outputs)
            self.enqueue_s = enq
            if late and self.spin < MAX_SPIN_CYCLES and self._retry():  # the host enqueued after the spin: idle inside
                self.fit_spin(enq)
                continue
            self.settle(late)
            out.append(e0.elapsed_time(e1))
        return out


def calibrate(host: HostClient, reps: int = 7) -> float:
    """The bracket's fixed cost (two context switches and the waits), measured on a host that has
    not loaded its candidate yet, so nothing of the candidate's can lengthen it."""
    go, done = host.bracket_events()
    costs = []
    bracket = Bracket()
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        bracket.hold()
        e0.record()
        go.record()
        try:
            host.call({"op": "batch", "k": 0}, what="calibrating the timer")
        finally:
            bracket.release()
        torch.cuda.current_stream().wait_event(done)
        e1.record()
        e1.synchronize()
        costs.append(e0.elapsed_time(e1))
    return statistics.median(costs[1:])


class RemoteWallTimer:
    """CPU test mode: the judge's wall clock around a batch of calls in the host."""

    method = "cpu-wallclock"

    def __init__(self, host: HostClient, n_sets: int, check: Any, k: int = 1) -> None:
        self.host, self.n_sets, self.check, self.k, self.calls = host, n_sets, check, k, 0

    def samples(self, count: int) -> list[float]:
        out = []
        for _ in range(count):
            start = self.calls % self.n_sets
            t = time.perf_counter()
            reply, parts = self.host.call({"op": "batch", "k": self.k, "start": start}, what="a timed batch")
            out.append((time.perf_counter() - t) * 1e3 / self.k)
            self.calls += self.k
            self.check((start + self.k - 1) % self.n_sets, self.host.values(reply.get("outputs"), parts))
        return out
