"""The judge's side of the candidate hosts: a zygote that forks them, spares kept ready, and a
client that speaks to one host with deadlines and byte budgets, turning anything it says into
at worst a failed evaluation of its own candidate. How the judge times a host's batches is
`sandbox/brackets.py`.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch

from cuforge.sandbox.protocol.evaluation import is_valid_status
from cuforge.sandbox.protocol.stop import Stop
from cuforge.sandbox.protocol.wire import (
    Channel,
    Mappings,
    PeerGone,
    PeerTimeout,
    WireError,
    describe,
    materialize,
)

START_TIMEOUT_S = 120.0
# Spares kept on a GPU, whose GPU parts start together once none is left started. Measured on an
# H100 (benchmarks/host_start.py): one host's GPU start 0.25 s, eight at once 1.1-1.4 s - CUDA context
# creation serialises in the driver (~0.12 s each), the rest overlaps - so ~0.15 s an evaluation.
START_BATCH = 8
EXIT_WAIT_S = 10.0
CONTEXT_BYTES = 2**30  # device memory a started spare may hold (a context, its warm-ups), kept free for it


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
        default = int(os.environ.get("CUFORGE_HOST_SPARES", "0") or 0) or (START_BATCH if device == "cuda" else 1)
        self.spares = spares if spares is not None else max(1, min(default, 16))
        self.graveyard: list[tuple[int, Path, float]] = []
        self.root = Path(root or tempfile.gettempdir()) / "hosts"
        self.root.mkdir(parents=True, exist_ok=True)
        self.count = 0
        ours, theirs = socket.socketpair()
        from cuforge import runtime

        # A compile-only judge's hosts compile for its arch (device "none"): told on the command line.
        arch = [runtime.SETTINGS.arch or "sm_90a"] if device == "none" else []
        self.zygote = subprocess.Popen([sys.executable, "-m", "cuforge.sandbox.host.host", "--zygote", str(theirs.fileno()),
                                        device, *arch], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=2)
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
        client.neighbours_busy = self.neighbours_busy
        raw = hello.get("start_s")  # the host's own account of its start: for benchmarks, never trusted
        client.start_s = {str(k)[:40]: float(v) for k, v in list(raw.items())[:20]
                          if isinstance(v, (int, float))} if isinstance(raw, dict) else {}
        return client

    def replenish(self, evaluation_peak_bytes: int = 0) -> None:
        """Order spares up to the pool's size (their start's CPU part runs at once) and, once none is
        left started, start the GPU part of a batch of them together: called once the judge's timing
        is over, since a starting host's GPU work shares the GPU's time slices (measured on an H100: a
        host started during the timed batches tripled their wall time; the judge waits for a batch
        still starting before it calibrates). `evaluation_peak_bytes`, the device memory the last
        evaluation needed (judge and host), sizes the batch: the next one likely needs as much."""
        while len(self.ready) < self.spares:
            self._order()
        if self.device == "cuda" and not any(o.started for o in self.ready):
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory  # no driver call
            for ordered in self.ready[:spares_affordable(len(self.ready), total, evaluation_peak_bytes)]:
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

    def wait_quiet(self, timeout_s: float = 30.0) -> float:
        """Wait until no other host of this pool uses the GPU: no spare in the GPU part of its start, and
        no killed host still exiting (a dying process's context is torn down by the driver, which
        takes the GPU's time slices as a live one does). Returns the seconds waited."""
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            self._bury()
            starting = self.starting()
            if not starting and not self._exiting():
                break
            if starting:
                select.select([o.chan.sock for o in self.ready if o.started], [], [], 0.005)
            else:
                time.sleep(0.002)
        return time.monotonic() - t

    def wait_exited(self, timeout_s: float = EXIT_WAIT_S) -> float:
        """Wait until no host this pool killed is still exiting. A judge calls it before its evaluation
        ends: the GPU's turn is released with the reply, and another cuforge process's evaluation
        must not calibrate or time beside this one's dying context (a host killed in a hung kernel
        keeps the GPU busy for seconds while the driver tears it down). Returns the seconds waited."""
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            self._bury()
            if not self._exiting():
                break
            time.sleep(0.002)
        return time.monotonic() - t

    def _exiting(self) -> bool:
        """A host killed in the last EXIT_WAIT_S still exiting (one that takes longer is stuck in the
        driver, and waiting for it would stall every evaluation)."""
        return any(time.monotonic() - at < EXIT_WAIT_S and _running(pid)
                   for pid, _, at in self.graveyard)

    def neighbours_busy(self) -> bool:
        """Whether another host of this pool may be using the GPU now (starting or exiting)."""
        return self.starting() or self._exiting()

    def _bury(self) -> None:
        """Scratch directories of hosts that are gone (the zygote reaps them)."""
        alive = []
        for pid, scratch, at in self.graveyard:
            if _running(pid):
                alive.append((pid, scratch, at))
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
                 how_ended: Any = None, graveyard: list[tuple[int, Path, float]] | None = None) -> None:
        self.chan, self.pid, self.pgid, self.confinement, self.scratch = chan, pid, pgid, confinement, scratch
        self.how_ended = how_ended
        self.graveyard = graveyard
        self.device = torch.device("cpu" if device == "none" else device)
        self.deadline = time.monotonic() + 3600.0
        self.alive = True
        self.prebuilt_used = 0  # extensions built ahead that the host says its load used (for the record)
        self.mappings = Mappings()
        self._events: tuple[Any, Any] | None = None
        self.kernel_resources: list[dict[str, Any]] = []  # what the host says its kernels use (prompt material)
        self.waited: dict[str, float] = {}  # seconds spent waiting for each kind of reply
        # Whether another host is starting or exiting on this GPU (it then shares the GPU's time slices).
        self.neighbours_busy: Any = lambda: False
        self.busy_discarded = 0
        self.start_s: dict[str, float] = {}
        self.reply_budget = 2**20  # bytes a reply may carry: the judge raises it to fit the outputs

    def call(self, header: dict[str, Any], parts: Sequence[bytes] = (), max_bytes: int | None = None,
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

    def load(self, problem: dict[str, Any], candidate: dict[str, Any], scale: Any, init_seed: int,
             precision: str = "fp32") -> tuple[str, str, list]:
        reply, _ = self.call({"op": "load", "problem_source": problem["source"], "scale": scale, "candidate": candidate,
                              "cast": problem["meta"].get("cast"),
                              "init_seed": init_seed, "policy": problem["meta"]["policy"], "precision": precision},
                             what="loading the candidate")
        status, message, diags = (reply.get("load") or [None, "", []])[:3]
        if not isinstance(status, str) or not is_valid_status(status) or not isinstance(message, str):
            raise Stop("runtime_error", "the candidate's process gave no load result the judge can read")
        used = reply.get("prebuilt_extensions")
        # The host's own account, for the record only: at most what it was handed.
        self.prebuilt_used = min(used, len(candidate.get("prebuilt") or {})) if isinstance(used, int) and used > 0 else 0
        return status, message[:4000], diags if isinstance(diags, list) else []

    def forward(self, inputs: list[Any], rng_seed: int | None, monitor: bool, out_bytes: int) -> tuple[list[Any], dict[str, Any]]:
        parts: list[bytes] = []
        descs = [describe(x, parts) for x in inputs]
        self.reply_budget = 4 * out_bytes + 2**20
        reply, rparts = self.call({"op": "forward", "inputs": descs, "rng_seed": rng_seed, "monitor": monitor}, parts,
                                  what="forward")
        return self.values(reply.get("outputs"), rparts, inputs), _findings(reply.get("findings"))

    def values(self, descs: Any, parts: list[bytes], inputs: Sequence[Any] = ()) -> list[Any]:
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
            self.graveyard.append((self.pid, self.scratch, time.monotonic()))
        else:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and _running(self.pid):
                time.sleep(0.005)
            shutil.rmtree(self.scratch, ignore_errors=True)


def spares_affordable(wanted: int, total_bytes: int, evaluation_peak_bytes: int) -> int:
    """How many spares may hold a CUDA context (~0.8 GiB each, CONTEXT_BYTES kept) beside an evaluation
    as large as the last, with a tenth of the device spare for the judge's own context and
    fragmentation; at least one, so an evaluation never waits a whole start."""
    room = total_bytes - total_bytes // 10 - evaluation_peak_bytes * 5 // 4
    return max(1, min(wanted, room // CONTEXT_BYTES))


def leave_room(share: float = 0.25) -> None:
    """Return the judge's cached, unused device memory to the driver when little is free: the host
    allocates in its own context and cannot use the judge's cache (KernelBench's 6 GiB tensors: the
    judge's float64 reference leaves tens of GiB cached that the host's output then does not find)."""
    free, total = torch.cuda.mem_get_info()
    if free < total * share:
        torch.cuda.empty_cache()


def _running(pid: int) -> bool:
    """Whether the process still exists and has not finished exiting (a zombie has: its files, and so
    its CUDA context, are released)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


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
