"""The candidate host: the only code that runs beside a candidate. It loads one candidate, calls it
on the inputs the judge sends, and returns what it produced. The judge trusts none of it.

    python -m cuforge.sandbox.host.host --zygote FD DEVICE [ARCH]

The zygote imports torch once (and never touches CUDA), then forks one host per candidate on the
judge's request; a forked host confines itself (its own process group, Landlock: writes only in its
scratch and /dev/shm, no signal to, ptrace of or /proc access to any process outside it; seccomp),
starts its own CUDA context and serves one socket. What it reports about the candidate (threads,
kernels, streams, library calls, patched functions) can only fail the candidate: the verdict,
the comparison and the timing are the judge's (`judge/core.py` with `judge/in_host.py`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from cuforge.sandbox.protocol.stop import Stop
from cuforge.sandbox.protocol.tensors import as_list

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def confine(scratch: str, gpu: bool) -> str:
    """Confine this (single-threaded, just forked) process; returns what holds, in words."""
    from cuforge.sandbox.confine import landlock as ll

    os.makedirs(scratch, exist_ok=True)
    for var in ("HOME", "TMPDIR"):
        os.environ[var] = scratch
    cache = f"{scratch}/.cache"
    os.environ.update(XDG_CACHE_HOME=cache, CUFORGE_CACHE_DIR=f"{cache}/cuforge", TRITON_CACHE_DIR=f"{cache}/triton",
                      TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TORCH_EXTENSIONS_DIR=f"{cache}/torch_extensions")
    import tempfile

    tempfile.tempdir = scratch  # the zygote may have cached the judge's before the fork
    try:
        os.setpgid(0, 0)  # its own group: the judge ends everything it starts with one kill
        group = "own process group"
    except OSError:
        group = "the judge's process group (setpgid refused by the jail)"
    import glob

    devices = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"] + (sorted(glob.glob("/dev/nvidia*")) if gpu else [])
    if ll.landlock_abi() >= ll.MIN_ABI:
        # CUDA's initialisation writes under the process's own /proc/<pid> (measured on an H100: it
        # fails with error 304 without it); "/proc/self" resolves to this process's directory only.
        # setpgid stays allowed (ninja gives each compile job its own group: load_inline needs it);
        # a process that leaves the host's group is an orphan of the jail once the host is killed.
        ll.restrict(["/"], [scratch, "/dev/shm", "/proc/self"], devices, allow=("setpgid",))
        return f"candidate host: {group}; Landlock (writes only in its scratch and /dev/shm; no signal, ptrace or /proc of the judge); seccomp"
    ll.install_seccomp_only(allow=("setpgid",))
    return f"candidate host: {group}; seccomp only (no Landlock on this kernel: the judge is kept from it by PR_SET_DUMPABLE=0)"


class Host:
    """One candidate's process, serving the judge's requests in order."""

    def __init__(self, chan: Any, device: str) -> None:
        import torch

        self.chan, self.device = chan, torch.device(device if device != "none" else "cpu")
        self.compile_only = device == "none"
        self.model: Any = None
        self.guard: Any = None
        self.kept: list[Any] = []  # outputs the judge maps: alive until the next request
        self.sets: list[list[Any]] = []
        self.last: list[Any] = []
        self.go = self.done = None
        self.policy = "mixed"
        self.graph: Any = None
        self.graph_key: tuple[int, int] | None = None
        self.graph_out: Any = None
        from cuforge.sandbox.protocol.wire import Mappings

        self.mappings = Mappings()

    # ----------------------------------------------------------------------------- requests

    def serve(self) -> None:
        while True:
            try:
                req, parts = self.chan.recv()
            except Exception:  # noqa: BLE001 - the judge went away
                return
            op = req.get("op")
            if op == "exit":
                return
            try:
                handler = getattr(self, f"op_{op}", None)
                if handler is None:
                    raise ValueError(f"unknown request {op!r}")
                reply, out_parts = _profiled(handler, req, parts) if _PROFILE else handler(req, parts)
            except Stop as s:
                reply, out_parts = {"stop": [s.status, s.message, s.restart, s.extra]}, []
            except Exception as e:  # noqa: BLE001 - a host fault is reported, never hidden
                traceback.print_exc()
                reply, out_parts = {"stop": ["runtime_error", f"candidate host: {type(e).__name__}: {e}"[:2000], True, {}]}, []
            self.chan.send(reply, out_parts)

    def op_load(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        import torch

        from cuforge.sandbox.host import monitor
        from cuforge.sandbox.protocol import tensors
        from cuforge.sandbox.protocol.loading import problem_tf32
        from cuforge.sandbox.protocol.precision import apply_flags
        from cuforge.sandbox.protocol.candidate import Candidate
        from cuforge.sandbox.protocol.loading import (
            CandidateLoadError,
            cast_module,
            load_candidate,
            problem_module,
        )

        self.policy = req["policy"]
        module = problem_module(req["problem_source"], req.get("scale"), req.get("cast"))
        apply_flags(req.get("precision"), problem_tf32(module))  # the judge's contract: the same flags as its reference
        cand = Candidate.from_dict(req["candidate"])
        self.guard = monitor.Guard.snapshot()
        try:
            cls, extensions = load_candidate(cand.module_source(), module, cand.id, req["candidate"].get("prebuilt"))
        except CandidateLoadError as e:
            return {"load": [e.status, str(e), [vars(d) for d in e.diagnostics]]}, []
        self._raise_guard()
        if self.compile_only:
            return {"load": ["compiled", "", []]}, []
        with tensors.on_device(self.device):
            init = list(module.get_init_inputs())
            torch.manual_seed(int(req["init_seed"]))
            model = _run(lambda: cls(*init), self.device, "ModelNew(*get_init_inputs())")
        if isinstance(model, torch.nn.Module):
            model = _run(lambda: model.to(self.device), self.device, "ModelNew.to(device)")
        if req.get("cast"):  # the problem runs in another dtype: the candidate's model is cast as the reference is
            model = _run(lambda: cast_module(model, getattr(torch, req["cast"])), self.device, "ModelNew.to(dtype)")
        self.model = model
        self._raise_guard()
        return {"load": ["ok", "", []], "prebuilt_extensions": len(extensions.used)}, []

    def op_forward(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        import torch

        from cuforge.sandbox.protocol import tensors
        from cuforge.sandbox.protocol.wire import describe, materialize

        self.kept = []
        inputs = [materialize(d, parts, self.device, self.mappings) for d in req["inputs"]]
        if req.get("monitor"):
            # The first trial's output, if allocated and never written, reads as NaN. Later trials need
            # no poisoning: this process's memory never held a reference's result, only the candidate's
            # own for other inputs (wrong for these), and returning it to the driver costs ~5 ms a trial.
            tensors.poison_free_memory(self.device)
        tensors.reseed(req.get("rng_seed"))
        # On a GPU the judge sees its own input memory change; on the CPU the host has copies, so it
        # says so itself (it can only fail its own candidate by it).
        before = [x.clone() for x in inputs] if self.device.type == "cpu" else []
        outs, findings = self._monitored(inputs) if req.get("monitor") else (self._plain(inputs), {})
        for i, (x, b) in enumerate(zip(inputs, before)):
            if isinstance(x, torch.Tensor) and not tensors.same_bits(x, b):
                raise Stop("cheat:input_mutation", f"input {i} was modified by the candidate")
        self._raise_guard()
        self.kept = outs
        out_parts: list[bytes] = []
        descs = []
        for o in outs:  # an input handed back is named, not exported: it is the judge's own memory
            same = [j for j, x in enumerate(inputs) if isinstance(o, torch.Tensor) and isinstance(x, torch.Tensor)
                    and _overlap(o, x)]
            descs.append({"input": same[0]} if same else describe(o, out_parts))
        if self.device.type == "cuda":
            findings["host_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        return {"outputs": descs, "findings": findings}, out_parts

    def op_events(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """The judge's interprocess 'go' event; ours, 'done', back: the judge's bracket around a batch."""
        import base64

        import torch

        self.go = torch.cuda.Event.from_ipc_handle(self.device, base64.b64decode(req["go"]))
        self.done = torch.cuda.Event(interprocess=True)
        self.done.record()
        return {"done": base64.b64encode(self.done.ipc_handle()).decode()}, []

    def op_sets(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """The rotating input sets of the timed batches, and what the candidate's kernels use."""
        from cuforge.runtime import kernel_resources
        from cuforge.sandbox.protocol.wire import materialize

        self.kept = []
        self.sets = [[materialize(d, parts, self.device, self.mappings) for d in s] for s in req["sets"]]
        return {"resources": kernel_resources()}, []

    def op_batch(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Enqueue k calls on rotating sets behind the judge's 'go' and record 'done'; the last call's
        outputs go back for checking (on the CPU the calls simply run)."""
        import torch

        from cuforge.sandbox.protocol.wire import describe

        k, start = int(req["k"]), int(req.get("start", 0))
        gpu = self.device.type == "cuda"
        if gpu:
            torch.cuda.current_stream().wait_event(self.go)
        out: Any = None
        if self.graph is not None and (k, start) == self.graph_key:
            self.graph.replay()
            out = self.graph_out
        else:
            with torch.no_grad():
                for i in range(k):
                    out = self.model(*self.sets[(start + i) % len(self.sets)])
        if gpu:
            self.done.record()
        # No guard census here (a millisecond or two a batch, the judge's clock waiting): its findings are
        # the candidate's own report and can only fail it; outputs during timing are checked by the judge.
        self.kept = as_list(out) if out is not None else []
        out_parts: list[bytes] = []
        descs = [describe(o, out_parts) if isinstance(o, torch.Tensor) else {"value": None} for o in self.kept]
        return {"enqueued": True, "outputs": descs}, out_parts

    def op_graph(self, req: dict[str, Any], parts: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Capture k calls in one CUDA graph, so that a batch is enqueued in one launch. Kept only if a
        replay recomputes the outputs (work outside the capture stream - a kernel on the legacy default
        stream - would not be in it); otherwise batches are enqueued call by call."""
        import torch

        from cuforge.sandbox.protocol import tensors

        k, start = int(req["k"]), int(req.get("start", 0))
        self.graph, self.graph_key, self.graph_out = None, None, None
        if k <= 0:  # the judge found the replayed batch wrong: call by call from now on
            return {"graph": False, "why": "dropped"}, []
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                for i in range(min(k, 2)):
                    self.model(*self.sets[(start + i) % len(self.sets)])
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                for i in range(k):
                    out = self.model(*self.sets[(start + i) % len(self.sets)])
            outs = [o for o in as_list(out) if isinstance(o, torch.Tensor)]
            for o in outs:
                if o.is_contiguous():
                    o.view(torch.uint8).fill_(tensors.POISON_BYTE)
            graph.replay()
            torch.cuda.synchronize()
            if not outs or any(not o.is_contiguous() or tensors.poison_fraction(o) > 0.5 for o in outs):
                return {"graph": False, "why": "a replay does not recompute the outputs"}, []
        except Exception as e:  # noqa: BLE001 - not capturable: batches go call by call
            torch.cuda.synchronize()
            return {"graph": False, "why": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}, []
        self.graph, self.graph_key, self.graph_out = graph, (k, start), out
        return {"graph": True, "why": ""}, []

    # ----------------------------------------------------------------------------- calls

    def _plain(self, inputs: list[Any]) -> list[Any]:
        return self._call(inputs, first=False)[0]

    def _monitored(self, inputs: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """The first trial's call, watched: threads, aten ops, kernels and their streams."""
        return self._call(inputs, first=True)

    def _call(self, inputs: list[Any], first: bool) -> tuple[list[Any], dict[str, Any]]:
        """The monitored call the in-process judge makes too (monitor.run_monitored); what it notes
        goes back to the judge as findings."""
        from cuforge.sandbox.host.monitor import run_monitored

        notes: dict[str, Any] = {}
        outs = run_monitored(self.device, notes, self.model, inputs, self.policy, first=first)
        return outs, notes

    def _raise_guard(self) -> None:
        found = self.guard.violations() if self.guard is not None else []
        if found:
            raise Stop(f"cheat:{found[0][0]}", found[0][1], restart=True)


_PROFILE = os.environ.get("CUFORGE_HOST_PROFILE") == "1"


def _profiled(handler: Any, req: dict[str, Any], parts: list[bytes]) -> Any:
    """A developer's view of where a host's time goes (CUFORGE_HOST_PROFILE=1): any request over
    5 ms prints its profile to stderr. Never part of an evaluation."""
    import cProfile
    import io
    import pstats
    import time

    prof, t = cProfile.Profile(), time.perf_counter()
    prof.enable()
    try:
        return handler(req, parts)
    finally:
        prof.disable()
        ms = (time.perf_counter() - t) * 1e3
        if ms > 5:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(14)
            print(f"[host {os.getpid()}] {req.get('op')} {ms:.1f} ms\n{out.getvalue()[-3000:]}", file=sys.stderr, flush=True)


def _overlap(a: Any, b: Any) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() < sb.data_ptr() + sb.nbytes() and sb.data_ptr() < sa.data_ptr() + sa.nbytes() and \
        sa.nbytes() > 0 and sb.nbytes() > 0


def _run(fn: Any, device: Any, what: str) -> Any:
    """Call candidate code; an exception is the candidate's runtime error."""
    from cuforge.sandbox.host.monitor import run_candidate

    return run_candidate(fn, device, what)


# ------------------------------------------------------------------------------------------ processes

def host_main(sock: socket.socket, scratch: str, device: str, arch: str = "") -> None:
    """A freshly forked host: confine, warm what needs no GPU, wait for the judge's word (on a GPU),
    start CUDA, say ready, serve."""
    from cuforge.sandbox.protocol.wire import Channel

    steps = _Steps()
    _die_with_parent()
    chan = Channel(sock)
    try:
        confinement = confine(scratch, gpu=device == "cuda")
    except OSError as e:
        chan.send({"op": "ready", "error": f"candidate host could not confine itself: {e}"})
        return
    import torch

    if device == "cuda":  # its candidate's work is the GPU's; see host_threads
        torch.set_num_threads(host_threads(torch.get_num_threads()))
    from cuforge.sandbox.host.monitor import start_thread_pools

    start_thread_pools()
    if device == "cuda":
        if arch:  # NVRTC's first compilation (~0.35 s of CPU): before the GPU part of the start
            from cuforge import runtime

            runtime.compile_to_cubin(_WARM_KERNEL, arch)
        steps.mark("cpu_part")
        # Nothing on the GPU until the judge says so: a starting host's context and warm-ups share the
        # GPU's time slices, so the judge starts them where it is not calibrating or checking for escapes.
        try:
            req, _ = chan.recv()
        except Exception:  # noqa: BLE001 - the judge went away
            return
        if req.get("op") != "start":
            return
        steps.mark("wait")
        torch.cuda.init()
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        steps.mark("cuda_context")
    torch.manual_seed(0)
    torch.randn(4, device="cuda" if device == "cuda" else "cpu").sum().item()
    if device == "cuda":  # and the profiler's threads, which the first traced call would otherwise start
        from cuforge.sandbox.host.monitor import trace_kernels

        steps.mark("seed")
        trace_kernels(lambda: torch.zeros(1, device="cuda").add_(1))
        steps.mark("profiler")
        _warm_runtime(steps)
    os.chdir(scratch)
    # start_s: where its start went (a developer's view for benchmarks/host_start.py; the judge trusts
    # none of it).
    chan.send({"op": "ready", "pid": os.getpid(), "pgid": os.getpgid(0), "confinement": confinement,
               "start_s": steps.seconds})
    Host(chan, device).serve()


GPU_HOST_THREADS = 4


def host_threads(default: int) -> int:
    """Intra-op threads of a GPU candidate's host. torch starts one per core (and as many OpenMP
    threads: 32 threads for 16 here), and a worker keeps up to 9 hosts per GPU: on a 128-core,
    8-GPU machine that is ~18,000 threads of one user, past the workers' RLIMIT_NPROC (4096 per
    user) for anyone but root. A GPU candidate's own CPU work is its launches."""
    return max(1, min(default, GPU_HOST_THREADS))


_WARM_KERNEL = 'extern "C" __global__ void cuforge_host_warm(float* x) { x[threadIdx.x] += 1.0f; }\n'


class _Steps:
    """Wall seconds of each step of a host's start, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 4)
        self._t = now


def _warm_runtime(steps: _Steps | None = None) -> None:
    """The fast runtime's first compilation, module load and launch (~0.4 s in a fresh process) and a
    first graph capture, paid while this host is a spare rather than inside its candidate's evaluation."""
    import torch

    from cuforge import runtime

    x = torch.zeros(32, device="cuda")
    runtime.compile_cuda(_WARM_KERNEL).kernel("cuforge_host_warm")((1,), (32,), x)
    torch.cuda.synchronize()
    runtime.reset_launch_records()
    if steps:
        steps.mark("warm_launch")
    # And the first CUDA graph capture (the batch graph of op_graph), which costs tens of ms once.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    del graph
    if steps:
        steps.mark("warm_graph")
    # The device code of the torch ops the host itself runs (poisoning, the replay check): loaded lazily
    # per process, a few ms each on first use.
    from cuforge.sandbox.protocol import tensors

    tensors.poison_free_memory(torch.device("cuda"))
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        tensors.poison_fraction(torch.empty(64, dtype=dtype, device="cuda").fill_(1).view(torch.uint8).fill_(tensors.POISON_BYTE).view(dtype))
    torch.cuda.synchronize()
    if steps:
        steps.mark("warm_checks")


def zygote(fd: int, device: str, arch: str = "") -> None:
    """Import once, fork per candidate, and tell the judge how each host ended. Never initialises
    CUDA: a fork after that is unsafe. Device "none": its hosts compile for `arch` and launch nothing."""
    import select

    _die_with_parent()
    import torch  # noqa: F401 - the import every host would otherwise repeat

    if device == "none":
        from cuforge import runtime

        runtime.configure(compile_only=True, arch=arch or "sm_90a")

    from cuforge.op_trace import OpRecorder  # noqa: F401
    from cuforge.sandbox.protocol import loading  # noqa: F401
    from cuforge.sandbox.host.monitor import settle_torch
    from cuforge.sandbox.protocol import tensors, wire  # noqa: F401

    # Once, before any fork: torch's lazy rebinding (dynamo's hooks, a second or so of imports), done
    # before any host's guard snapshot. Nothing here starts CUDA or a thread pool.
    settle_torch()
    # No NVRTC warm-up here: cuda.core's compile initialises the driver and starts a thread, after
    # which a forked host's CUDA fails to initialise (seen on an H100). Each host warms its own.

    ctl = socket.socket(fileno=fd)
    while True:
        _report_exits(ctl)
        if not select.select([ctl], [], [], 0.05)[0]:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 4096, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        order = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            ctl.close()
            code = 0
            try:
                host_main(socket.socket(fileno=fds[0]), order["scratch"], device, str(order.get("arch") or ""))
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        os.close(fds[0])


def _report_exits(ctl: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSIGNALED(status):
            how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            how = f"exit code {os.WEXITSTATUS(status)}"
        try:
            ctl.sendall(json.dumps({"pid": pid, "how": how}).encode() + b"\n")
        except OSError:
            return


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else "")
    else:
        sys.exit("usage: python -m cuforge.sandbox.host.host --zygote FD DEVICE [ARCH]")
