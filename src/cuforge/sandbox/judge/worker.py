"""The evaluation worker process: one per GPU, long-lived, holding a warm CUDA context.

    python -m cuforge.sandbox.judge.worker [--isolate-network]

Speaks JSON lines: requests on stdin, replies on a private copy of the original stdout. File
descriptor 1 is pointed at stderr before any candidate code runs, so prints from Python, C++ or
device printf cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from cuforge.sandbox.protocol.judges import checked_judge, requested_judge


def _protocol_stream() -> Any:
    proto_fd = os.dup(1)
    os.dup2(2, 1)  # everything else written to fd 1 goes to the log
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", buffering=1)


def _device_info(device: str, isolation: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                            "isolation": isolation, "pid": os.getpid()}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, sm_count=p.multi_processor_count, compute_capability=f"{p.major}.{p.minor}",
                    memory_gib=round(p.total_memory / 2**30, 1), l2_bytes=getattr(p, "L2_cache_size", None),
                    uuid=str(getattr(p, "uuid", "")))
    return info


# A tiny problem and an honest candidate, evaluated once at start: it warms the CUDA context and
# makes torch rebind its lazily wrapped functions (torch.manual_seed, ...) before any candidate's
# guard snapshot, so such rebinding is never mistaken for a candidate's patch.
_SELF_TEST_PROBLEM = {
    "id": "self-test/relu",
    "source": "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
              "def get_inputs():\n    return [torch.randn(4096)]\ndef get_init_inputs():\n    return []\n",
    "meta": {"tolerance": {"atol": 1e-4, "rtol": 1e-4, "rel_norm": 1e-5}, "flops": 4096.0, "bytes": 32768.0,
             "dtype": "float32", "policy": "any"},
    "outputs": [{"shape": [4096], "dtype": "float32"}],
}
_SELF_TEST_CANDIDATE = {"source": "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                                  "        return x.clamp_min(0)\n", "format": "module"}


def _option(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv (the supervisor's explicit settings for this worker)."""
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def evaluator(judge: str) -> Any:
    if judge == "split":
        from cuforge.sandbox.judge.in_host import evaluate_request
    else:
        from cuforge.sandbox.judge.in_worker import evaluate_request
    return evaluate_request


def judge_helpers(judge: str) -> set[int]:
    """The worker's own children that serve every evaluation (the split judge's host zygotes, started
    by the first evaluation where no self-test started them): never a candidate's leftovers."""
    if judge != "split":
        return set()
    from cuforge.sandbox.judge.in_host import helper_processes

    return helper_processes()


def self_test(device: str, info: dict[str, Any]) -> str:
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    evaluate_request = evaluator(info["judge"])
    config = EvalConfig(device=device, trials=2, min_samples=5, max_samples=10, profile=False)
    evaluate_request(_SELF_TEST_PROBLEM, _SELF_TEST_CANDIDATE, config, info)  # warm-up: lazy rebinding happens here
    ev, _ = evaluate_request(_SELF_TEST_PROBLEM, _SELF_TEST_CANDIDATE, config, info)
    return "ok" if ev.ok else f"{ev.status}: {ev.message}"


def exit_with_parent(poll_s: float = 1.0) -> None:
    """A worker must never outlive its supervisor (a killed Ray actor, a crashed driver) and keep a
    GPU busy: a daemon thread ends the process once it is orphaned, even mid-evaluation."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="cuforge-parent-watch", daemon=True).start()


def trusted_artifacts() -> dict[str, str]:
    """Before any candidate: what the shared cache lacks and later workers may trust (the ceilings,
    the cuBLASLt helper), made here and handed to the supervisor in the hello; see trusted_cache."""
    import torch

    from cuforge.sandbox.protocol import trusted_cache
    from cuforge.sandbox.judge.baselines import BaselineUnavailable, build_cublaslt_helper
    from cuforge.sandbox.judge.profile import ceilings_for, ceilings_path

    made = {}
    device = torch.device("cuda")
    path = ceilings_path(device)
    if trusted_cache.verified_path("ceilings", path.name) is None:
        try:
            ceilings_for(device)
            made[f"ceilings/{path.name}"] = path
        except Exception as e:  # noqa: BLE001 - measured again when a profile needs them; no reason not to start
            print(f"ceilings not measured at start: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        helper = build_cublaslt_helper()
        if trusted_cache.shared_dir() is None or not str(helper).startswith(str(trusted_cache.shared_dir())):
            made[f"native/{helper.name}"] = helper
    except BaselineUnavailable as e:
        print(f"cuBLASLt helper unavailable: {e}", file=sys.stderr)
    return trusted_cache.handover(made)


def stray_processes(jailed: str | None) -> list[int]:
    """Orphans of the jail (its own pid namespace): processes its init adopted besides this worker,
    which is what a double fork leaves behind. The worker's own children (torch.compile's compile
    workers, a candidate's subprocess) are the forward's child census's business. Empty outside a jail."""
    if not jailed:
        return []
    me, group = os.getpid(), os.getpgid(0)
    procs: dict[int, tuple[str, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            procs[int(name)] = (fields[0], int(fields[1]), int(fields[2]))  # state, ppid, process group
    if jailed == "landlock":
        # No pid namespace: the worker's process group (seccomp forbids leaving it) is the jail;
        # an orphan is a member whose parent is not one.
        members = {pid for pid, (_, _, pgrp) in procs.items() if pgrp == group} | {me}
        return [pid for pid, (state, ppid, pgrp) in procs.items()
                if pgrp == group and ppid not in members and state != "Z"]
    return [pid for pid, (state, ppid, _) in procs.items() if pid != 1 and ppid == 1 and state != "Z"]


def child_pids() -> set[int]:
    """This process's live children (of every thread), zombies left out."""
    out: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    alive = set()
    for pid in out:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except (OSError, IndexError):
            continue
    return alive


def _wait_for_go() -> bool:
    """The supervisor's go-ahead after `ready` (sent once it holds the GPU's turn); False: it asked the
    worker to exit, or went away, before that."""
    for line in sys.stdin:
        if line.strip():
            return json.loads(line).get("op") == "go"
    return False


def main(argv: list[str] | None = None) -> None:
    t_start = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    isolation = "host network"
    jail_applied = True
    jailed = _option(argv, "--jailed")
    if jailed == "landlock":
        # First thing: Landlock and seccomp apply to this thread and what it creates from now on.
        from cuforge.sandbox.confine.landlock import LandlockError, drop_to, restrict  # noqa: F401

        try:
            spec = json.loads(_option(argv, "--jail-spec") or "")
            if spec.get("uid") is not None:  # started as root: an unprivileged uid first, for good
                try:
                    drop_to(int(spec["uid"]), spec.get("python", []))
                except OSError as e:  # half-dropped, it can import nothing more: say why and stop
                    _protocol_stream().write(json.dumps({"op": "hello", "error": f"jail (landlock): {e}"}) + "\n")
                    return
            restrict(spec["read_only"], spec["writable"], spec["devices"])
            isolation = "jail (landlock): Landlock file system, TCP, signal and socket scoping; seccomp" + (
                f"; uid {spec['uid']}" if spec.get("uid") is not None else "")
        except (OSError, KeyError, ValueError) as e:  # LandlockError is an OSError, as are setresuid's
            isolation, jail_applied = f"jail (landlock) failed: {e}", False
    elif jailed:
        isolation = f"jail ({jailed}): private network, pid, mount and user namespaces"
    elif "--isolate-network" in argv:
        # unshare(CLONE_NEWUSER) fails in a process with more than one thread: before any thread starts.
        from cuforge.sandbox.confine.isolation import enter_private_network

        isolation = "private network namespace" if enter_private_network() else "host network (namespace refused)"
    exit_with_parent()
    proto = _protocol_stream()
    try:
        judge = checked_judge(_option(argv, "--judge") or requested_judge())
    except ValueError as e:
        proto.write(json.dumps({"op": "hello", "error": str(e)}) + "\n")
        return
    if judge == "split":
        # The judge: no process of its uid (a candidate host) may ptrace it or read its memory
        # through /proc, where Landlock does not already forbid that.
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    from cuforge.sandbox.protocol import trusted_cache

    trusted_cache.configure(_option(argv, "--shared-cache"))
    if "--compile-only" in argv:
        from cuforge import runtime

        runtime.configure(compile_only=True, arch=_option(argv, "--arch") or "sm_90a")
    device = "cpu" if "--cpu" in argv else "cuda"
    import torch

    from cuforge.sandbox.host.monitor import settle_torch, start_thread_pools
    from cuforge.sandbox.protocol.precision import set_strict_precision
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    evaluate_request = evaluator(judge)

    if device == "cuda":
        if not torch.cuda.is_available():
            proto.write(json.dumps({"op": "hello", "error": "no CUDA device visible to the worker"}) + "\n")
            return
        torch.cuda.init()
        torch.cuda.set_device(0)
    set_strict_precision()
    settle_torch()
    start_thread_pools()
    info = _device_info(device, isolation)
    info["jail_applied"] = jail_applied
    info["jailed"] = jailed  # the jail it was told it runs in; the supervisor checks it is the one it planned
    info["judge"] = judge
    # Started (imports, the CUDA context) without running any GPU work: the supervisor may let other
    # processes evaluate meanwhile. What follows times kernels, so it waits for the GPU's turn.
    started = time.monotonic() - t_start
    proto.write(json.dumps({"op": "ready", "compute_capability": info.get("compute_capability")}) + "\n")
    if not _wait_for_go():
        return
    t_turn = time.monotonic()
    info["self_test"] = "skipped (compile-only)" if "--compile-only" in argv else self_test(device, info)
    t_test = time.monotonic()
    trusted = {} if device != "cuda" or "--compile-only" in argv else trusted_artifacts()
    # The worker's own account of its start, for benchmarks and diagnostics only.
    info["start_s"] = {"until_ready": round(started, 3), "self_test": round(t_test - t_turn, 3),
                       "trusted_artifacts": round(time.monotonic() - t_test, 3)}
    proto.write(json.dumps({"op": "hello", "info": info, "trusted": trusted}) + "\n")
    children_at_start = child_pids()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        if req.get("op") == "ping":
            proto.write(json.dumps({"op": "pong"}) + "\n")
            continue
        if req.get("op") == "compile" and "--compile-only" in argv:
            from cuforge.sandbox.protocol.prebuilt_cubins import compile_kernels

            proto.write(json.dumps({"op": "compiled", **compile_kernels(list(req.get("kernels") or []))}) + "\n")
            proto.flush()
            continue
        if req.get("op") == "probe":
            from cuforge.sandbox.judge.jail_probe import probe

            proto.write(json.dumps({"op": "probe", "report": probe(req.get("targets") or {})}) + "\n")
            continue
        try:
            config = EvalConfig.from_dict(req["config"])
            ev, restart = evaluate_request(req["problem"], req["candidate"], config, info)
            strays = stray_processes(jailed)
            if strays:
                # A double fork escapes the worker's own child census: the jail's census sees it, and
                # the jail (every process in it) ends with this worker.
                restart = True
                if ev.ok:
                    ev.status, ev.message = "cheat:thread", (f"the candidate left {len(strays)} process(es) running "
                                                             "in the jail after its evaluation")
            if not ev.ok and child_pids() - children_at_start - judge_helpers(judge):
                # A failed candidate (one that raised while loading, say) left processes behind; they
                # would hold the jail's process and memory budget against the next candidate.
                restart = True
            built = ev.correctness.pop("prebuilt", None)
            reply = {"op": "result", "evaluation": ev.to_dict(), "restart": restart}
            if built is not None:
                reply["prebuilt"] = built
        except Exception as e:  # noqa: BLE001 - a harness bug must still produce a verdict
            traceback.print_exc()
            reply = {"op": "error", "message": f"{type(e).__name__}: {e}", "restart": True}
        proto.write(json.dumps(reply, default=str) + "\n")
        proto.flush()
        if reply.get("restart"):
            break  # the supervisor starts a fresh worker for the next evaluation


if __name__ == "__main__":
    main()
