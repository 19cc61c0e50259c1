"""The judge's side of the candidate hosts: a zygote that forks them, a spare kept ready, and a
client that speaks to one host with deadlines and byte budgets, turning anything it says into
at worst a failed evaluation of its own candidate.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cuforge.sandbox.evaluation import is_valid_status
from cuforge.sandbox.stop import Stop
from cuforge.sandbox.wire import (
    Channel,
    Mappings,
    PeerGone,
    PeerTimeout,
    WireError,
    describe,
    materialize,
)

START_TIMEOUT_S = 120.0
STARTED_AHEAD = 2  # spares holding a CUDA context ahead of their turn: the next one is ready at once


class HostStartError(RuntimeError):
    pass


@dataclass
class _Ordered:
    chan: Channel
    scratch: Path
    at: float
    started: bool = False  # told to start its GPU part


class HostPool:
    """A zygote (torch imported, CUDA untouched) and spare hosts forked from it, ready before they
    are needed: a candidate gets a fresh process without paying Python's and torch's start."""

    def __init__(self, device: str, root: Path | None = None, spares: int | None = None) -> None:
        self.device = device
        # A host takes about a second to start (imports, NVRTC, CUDA, the profiler's threads): several
        # are kept, their CPU part done ahead (see replenish); CUFORGE_HOST_SPARES overrides the count.
        default = int(os.environ.get("CUFORGE_HOST_SPARES", "0") or 0) or (3 if device == "cuda" else 1)
        self.spares = spares if spares is not None else max(1, min(default, 16))
        self.graveyard: list[tuple[int, Path]] = []
        self.root = Path(root or tempfile.gettempdir()) / "hosts"
        self.root.mkdir(parents=True, exist_ok=True)
        self.count = 0
        ours, theirs = socket.socketpair()
        self.zygote = subprocess.Popen([sys.executable, "-m", "cuforge.sandbox.host", "--zygote", str(theirs.fileno()),
                                        device], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=2)
        theirs.close()
        self.ctl = ours
        self.ready: list[_Ordered] = []
        self.exits: dict[int, str] = {}
        self._pending = b""
        self.arch = ""
        if device == "cuda":
            from cuforge.runtime import current_arch

            self.arch = current_arch()
        self.replenish()

    def how_ended(self, pid: int, wait_s: float = 1.0) -> str:
        """How a host ended, as its parent (the zygote) saw it: 'killed by SIGSEGV', 'exit code 7'."""
        deadline = time.monotonic() + wait_s
        while pid not in self.exits and time.monotonic() < deadline:
            if not select.select([self.ctl], [], [], max(deadline - time.monotonic(), 0))[0]:
                break
            chunk = self.ctl.recv(65536)
            if not chunk:
                break
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                    self.exits[int(rec["pid"])] = str(rec["how"])
                except (ValueError, KeyError, TypeError):
                    continue
        return self.exits.pop(pid, "how, unknown")

    def _order(self) -> None:
        mine, theirs = socket.socketpair()
        self.count += 1
        scratch = self.root / f"host-{os.getpid()}-{self.count}"
        try:
            socket.send_fds(self.ctl, [json.dumps({"scratch": str(scratch), "arch": self.arch}).encode()], [theirs.fileno()])
        except OSError as e:
            mine.close()
            raise HostStartError(f"the candidate hosts' zygote is gone ({e.strerror or e})") from None
        finally:
            theirs.close()
        self.ready.append(_Ordered(Channel(mine), scratch, time.monotonic()))

    def take(self) -> HostClient:
        """The oldest spare, once it is ready. Its replacement is ordered by `replenish`, when the
        judge is not timing: a starting host's GPU work (its context, warm-ups) would share the GPU."""
        self._bury()
        if not self.ready:
            self._order()
        ordered = self.ready.pop(0)
        self._start(ordered)
        try:
            hello, _ = ordered.chan.recv(timeout_s=START_TIMEOUT_S, max_bytes=0)
        except WireError as e:
            raise HostStartError(f"a candidate host did not start: {e}") from None
        if hello.get("error"):
            raise HostStartError(str(hello["error"]))
        client = HostClient(ordered.chan, int(hello["pid"]), int(hello["pgid"]), str(hello.get("confinement", "")),
                            ordered.scratch, self.device, self.how_ended, self.graveyard)
        client.neighbours_starting = self.starting
        return client

    def replenish(self) -> None:
        """Order spares up to the pool's size (their start's CPU part runs at once) and start the GPU
        part of the next two to be taken: called once the judge's timing is over, since a starting
        host's GPU work shares the GPU's time slices (measured on an H100: a host started during the
        timed batches tripled their wall time; the judge waits for it before calibrating instead)."""
        while len(self.ready) < self.spares:
            self._order()
        for ordered in self.ready[:STARTED_AHEAD]:
            self._start(ordered)

    def _start(self, ordered: _Ordered) -> None:
        if self.device == "cuda" and not ordered.started:
            ordered.started = True
            try:
                ordered.chan.send({"op": "start"})
            except WireError:
                pass  # it is gone: take() reports it

    def starting(self) -> bool:
        """Whether a spare is in the GPU part of its start (it says hello once that is done)."""
        pending = [o.chan.sock for o in self.ready if o.started]
        return bool(pending) and len(select.select(pending, [], [], 0)[0]) < len(pending)

    def wait_started(self, timeout_s: float = 30.0) -> float:
        """Wait until no spare is in the GPU part of its start; returns the seconds waited."""
        t = time.monotonic()
        while self.starting() and time.monotonic() - t < timeout_s:
            select.select([o.chan.sock for o in self.ready if o.started], [], [], 0.01)
        return time.monotonic() - t

    def _bury(self) -> None:
        """Scratch directories of hosts that are gone (the zygote reaps them)."""
        alive = []
        for pid, scratch in self.graveyard:
            if Path(f"/proc/{pid}").exists() and not _zombie(pid):
                alive.append((pid, scratch))
            else:
                shutil.rmtree(scratch, ignore_errors=True)
        self.graveyard[:] = alive

    def close(self) -> None:
        self.ctl.close()
        for ordered in self.ready:
            ordered.chan.close()
        try:
            self.zygote.kill()
            self.zygote.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


class HostClient:
    """One host, one candidate. Every reply is bounded in time and size; a "stop" it reports can only
    fail its own candidate; its death or silence is that candidate's crash or timeout."""

    def __init__(self, chan: Channel, pid: int, pgid: int, confinement: str, scratch: Path, device: str,
                 how_ended: Any = None, graveyard: list[tuple[int, Path]] | None = None) -> None:
        self.chan, self.pid, self.pgid, self.confinement, self.scratch = chan, pid, pgid, confinement, scratch
        self.how_ended = how_ended
        self.graveyard = graveyard
        self.device = torch.device("cpu" if device == "none" else device)
        self.deadline = time.monotonic() + 3600.0
        self.alive = True
        self.mappings = Mappings()
        self._events: tuple[Any, Any] | None = None
        self.kernel_resources: list[dict[str, Any]] = []  # what the host says its kernels use (prompt material)
        self.waited: dict[str, float] = {}  # seconds spent waiting for each kind of reply
        # Whether another host is starting on this GPU (its work then shares the GPU's time slices).
        self.neighbours_starting: Any = lambda: False
        self.busy_discarded = 0
        self.reply_budget = 2**20  # bytes a reply may carry: the judge raises it to fit the outputs

    def call(self, header: dict[str, Any], parts: list[bytes] = (), max_bytes: int | None = None,
             what: str = "") -> tuple[dict[str, Any], list[bytes]]:
        what = what or str(header.get("op"))
        max_bytes = self.reply_budget if max_bytes is None else max_bytes
        if self.device.type == "cuda" and header.get("op") != "batch":  # a batch reuses what its first call took
            leave_room()
        t = time.perf_counter()
        try:
            self.chan.send(header, list(parts))
            reply, rparts = self.chan.recv(timeout_s=max(self.deadline - time.monotonic(), 0.0), max_bytes=max_bytes)
            op = str(header.get("op"))
            self.waited[op] = self.waited.get(op, 0.0) + time.perf_counter() - t
        except PeerTimeout:
            self.kill()
            raise Stop("timeout", f"the candidate's process did not answer ({what}) before the evaluation's time limit") from None
        except PeerGone:
            self.kill()
            how = self.how_ended(self.pid) if self.how_ended else "how, unknown"
            raise Stop("crash", f"the candidate's process died during {what} ({how})") from None
        except WireError as e:
            self.kill()
            raise Stop("runtime_error", f"the candidate's process broke the protocol during {what}: {e}") from None
        if "stop" in reply:
            raise self._stop(reply["stop"])
        return reply, rparts

    @staticmethod
    def _stop(raw: Any) -> Stop:
        if (not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[0], str) or not isinstance(raw[1], str)
                or not is_valid_status(raw[0]) or raw[0] in ("ok", "compiled")):
            return Stop("runtime_error", "the candidate's process reported a failure the judge cannot read")
        return Stop(raw[0], raw[1][:2000])

    def load(self, problem: dict[str, Any], candidate: dict[str, Any], scale: Any, init_seed: int) -> tuple[str, str, list]:
        reply, _ = self.call({"op": "load", "problem_source": problem["source"], "scale": scale, "candidate": candidate,
                              "init_seed": init_seed, "policy": problem["meta"]["policy"]}, what="loading the candidate")
        status, message, diags = (reply.get("load") or [None, "", []])[:3]
        if not isinstance(status, str) or not is_valid_status(status) or not isinstance(message, str):
            raise Stop("runtime_error", "the candidate's process gave no load result the judge can read")
        return status, message[:4000], diags if isinstance(diags, list) else []

    def forward(self, inputs: list[Any], rng_seed: int | None, monitor: bool, out_bytes: int) -> tuple[list[Any], dict[str, Any]]:
        parts: list[bytes] = []
        descs = [describe(x, parts) for x in inputs]
        self.reply_budget = 4 * out_bytes + 2**20
        reply, rparts = self.call({"op": "forward", "inputs": descs, "rng_seed": rng_seed, "monitor": monitor}, parts,
                                  what="forward")
        return self.values(reply.get("outputs"), rparts, inputs), _findings(reply.get("findings"))

    def values(self, descs: Any, parts: list[bytes], inputs: list[Any] = ()) -> list[Any]:
        """Tensors the host described, opened here (CUDA) or rebuilt from its bytes (CPU); an input it
        says it handed back is the judge's own input tensor."""
        if not isinstance(descs, list) or len(descs) > 256:
            raise Stop("wrong_output", "the candidate's process returned no list of outputs")
        try:
            return [inputs[d["input"]] if isinstance(d, dict) and isinstance(d.get("input"), int)
                    and 0 <= d["input"] < len(inputs) else materialize(d, parts, self.device, self.mappings)
                    for d in descs]
        except WireError as e:
            raise Stop("wrong_output", f"an output the candidate's process described cannot be read: {e}") from None

    def bracket_events(self) -> tuple[Any, Any]:
        """The judge's interprocess 'go' event and the host's 'done' event, made once per host."""
        if self._events is None:
            go = torch.cuda.Event(interprocess=True)
            go.record()
            reply, _ = self.call({"op": "events", "go": base64.b64encode(go.ipc_handle()).decode()},
                                 what="setting up timing")
            try:
                done = torch.cuda.Event.from_ipc_handle(self.device, base64.b64decode(str(reply["done"])))
            except (KeyError, ValueError, RuntimeError) as e:
                raise Stop("runtime_error", f"the candidate's process gave no usable timing event ({e})") from None
            self._events = (go, done)
        return self._events

    def kill(self) -> None:
        """End the host and everything it started; its scratch directory goes with it."""
        if not self.alive:
            return
        self.alive = False
        try:
            if self.pgid == self.pid:
                os.killpg(self.pgid, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.chan.close()
        self._events = None
        if self.mappings.opened:  # the host's memory is freed once the judge no longer maps it
            self.mappings.close()
        if self.graveyard is not None:  # its scratch goes once the process is gone (HostPool._bury)
            self.graveyard.append((self.pid, self.scratch))
        else:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and Path(f"/proc/{self.pid}").exists() and not _zombie(self.pid):
                time.sleep(0.005)
            shutil.rmtree(self.scratch, ignore_errors=True)


def leave_room(share: float = 0.25) -> None:
    """Return the judge's cached, unused device memory to the driver when little is free: the host
    allocates in its own context and cannot use the judge's cache (KernelBench's 6 GiB tensors: the
    judge's float64 reference leaves tens of GiB cached that the host's output then does not find)."""
    free, total = torch.cuda.mem_get_info()
    if free < total * share:
        torch.cuda.empty_cache()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _findings(raw: Any) -> dict[str, Any]:
    """What a host reports about its first call, kept only in the shapes the judge expects."""
    out: dict[str, Any] = {}
    if not isinstance(raw, dict):
        return out
    kernels = raw.get("kernels")
    if isinstance(kernels, list):
        out["kernels"] = [str(k)[:200] for k in kernels[:20]]
    for key, kind in (("kernels_per_call", int), ("device_us_first_call", float), ("host_peak_bytes", int)):
        if isinstance(raw.get(key), (int, float)) and not isinstance(raw.get(key), bool):
            out[key] = kind(raw[key])
    if isinstance(raw.get("no_own_kernel"), str):
        out["no_own_kernel"] = raw["no_own_kernel"][:300]
    return out


# ------------------------------------------------------------------------------------------- timing

SPIN_CYCLES = 200_000
MAX_SPIN_CYCLES = 400_000_000
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
        elif self.gate is not None:
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
            if self.host.neighbours_starting():  # another host's start may hold the GPU: no evidence
                self.host.busy_discarded += 1
                return
            self.busy.append(waited)
            if len(self.busy) >= 2:
                raise Stop("cheat:escaped_work", f"after its timed batches ended, the candidate's process kept the GPU "
                           f"busy for {max(self.busy):.3g} ms more: work ran on past the judge's timer")

    def samples(self, count: int) -> list[float]:
        return [max(ms - self.overhead_ms, 0.0) / self.k for ms in self.brackets(count)]

    def brackets(self, count: int) -> list[float]:
        """Whole brackets (ms), the fixed cost not taken off."""
        out: list[float] = []
        while len(out) < count:
            end, start = 0, first_set(self.k, self.n_sets)
            checked = checked_batch(self.batches, self.first_checked)
            if checked:  # the outputs a captured batch rewrites: poisoned, so a replay that skips them shows
                for t in self.outputs:
                    if t.is_contiguous():
                        t.view(torch.uint8).fill_(0xFF)
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
