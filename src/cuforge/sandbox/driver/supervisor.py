"""The supervisor: owns one worker process per GPU, gives each evaluation a hard wall-clock limit,
and kills and respawns the worker on timeout, crash, sticky CUDA error or runaway host memory.

The driver process never runs candidate code: it only sends JSON and reads JSON back.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from cuforge.procenv import scrubbed_env
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol import trusted_cache
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.protocol.prebuilt import builds_ahead
from cuforge.sandbox.protocol.prebuilt_cubins import KernelSource, kernel_sources
from cuforge.sandbox.driver.gpu_turn import TurnAbandoned, gpu_turn, physical_gpu, process_tree, turn_busy, wait_exited
from cuforge.sandbox.driver.payload import problem_payload
from cuforge.sandbox.driver.worker_process import describe_exit, rss_bytes
from cuforge.sandbox.confine.isolation import ADDRESS_SPACE_HEADROOM, Limits, child_setup
from cuforge.sandbox.protocol.evaluation import default_worker_memory_gib
from cuforge.sandbox.protocol.judges import requested_judge
from cuforge.sandbox.confine.landlock import jail_uid, unreadable_to
from cuforge.sandbox.confine.pids_cgroup import CgroupError, PidsCgroup
from cuforge.sandbox.driver.jail import (LANDLOCK, NAMESPACES, SHARED_CACHE, JailPlan, bwrap_argv, jail_env, jail_plan, landlock_spec,
                                  python_executable, scratch_env, unconfined_allowed)

# What torch says when an operator namespace or operator is registered a second time in a process.
NAMESPACE_TAKEN = ("Only a single TORCH_LIBRARY can be used to register the namespace",
                   "with the same name and overload name multiple times")
START_TIMEOUT_S = 180.0
POLL_S = 0.25
SHUT_DOWN_WHILE_STARTING = "worker failed to start: it was shut down while it started (the run is stopping)"


class WorkerStartError(RuntimeError):
    pass


class NoJailError(WorkerStartError):
    """No jail is available and the caller did not accept running candidates unconfined."""


class Supervisor:
    """One worker, pinned to one GPU (or the CPU test mode), respawned as needed."""

    def __init__(self, gpu: int | str | None = 0, cpu_mode: bool = False, isolate_network: bool = True,
                 limits: Limits | None = None, extra_env: dict[str, str] | None = None, compile_only: bool = False,
                 unsafe_no_jail: bool | None = None, jail: JailPlan | None = None, judge: str | None = None,
                 target_arch: str | None = None) -> None:
        """target_arch: what a compile-only worker compiles for (sm_90a); None: CUFORGE_ARCH, else sm_90a."""
        self.gpu, self.cpu_mode, self.isolate_network = gpu, cpu_mode or compile_only, isolate_network
        self.compile_only = compile_only
        self.target_arch = target_arch
        self.unsafe_no_jail = unconfined_allowed() if unsafe_no_jail is None else unsafe_no_jail
        self._jail = jail
        # Workers without CUDA also get a hard address-space limit: a runaway candidate fails its own
        # allocation instead of pushing the machine into the OOM killer.
        self.limits = limits or Limits(address_space_bytes=int(default_worker_memory_gib() * 2**30) + ADDRESS_SPACE_HEADROOM
                                       if self.cpu_mode else None)
        self.extra_env = dict(extra_env or {})
        # The worker's judge (protocol/judges.py), passed to it on its command line; None: the user's
        # CUFORGE_JUDGE, else in-process. An unknown name is refused when the worker starts.
        self.judge = (judge or requested_judge()).strip().lower()
        # Whether candidates run in hosts beside the worker (the split judge): the Landlock jail's layer differs.
        self.split_judge = self.judge == "split"
        self.proc: subprocess.Popen[str] | None = None
        self.cgroup: PidsCgroup | None = None
        self.info: dict[str, Any] = {}
        # A GPU supervisor's compile-only worker, where a candidate's extensions are built before its
        # evaluation takes the GPU's turn (protocol/prebuilt.py); a fresh one for every candidate.
        self.builder: Supervisor | None = None
        # Its compile-only worker for template kernels' cubins (protocol/prebuilt_cubins.py): it runs no
        # candidate code, so one serves every candidate.
        self.kernel_builder: Supervisor | None = None
        self.start_failed = False  # a compile-only worker that could not start is not started again
        self.prebuilt: dict[str, str] = {}  # what the last compile-only evaluation handed back
        self.workdir: Path | None = None
        self.in_turn = False  # this supervisor holds the GPU's turn (a worker started in it needs no other)
        self._closing = threading.Lock()
        self.log_path: Path | None = None
        self.spawns = 0
        self.served = 0  # evaluations the running worker has answered
        self.processes = ""  # what bounds the running worker's process count, said in its info
        self.ready = False  # the running worker is started up to its `ready` (imports, CUDA context)
        self.ready_arch: str | None = None  # the GPU's compute capability, as the worker said at `ready`
        self.greeted = False  # and has said hello (a worker waits after `ready` for a go, sent in the turn)
        self.closes = 0  # close() calls: one made while an evaluation waits for the GPU's turn ends the wait

    @property
    def jail(self) -> JailPlan:
        if self._jail is None:
            self._jail = jail_plan()
        return self._jail

    # -------------------------------------------------------------- lifecycle

    def _command(self) -> tuple[list[str], dict[str, str]]:
        """The worker's argv and environment: inside the jail where there is one."""
        jail = self.jail
        if not jail.confined and not self.unsafe_no_jail:
            raise NoJailError(f"no jail for candidate code on this machine ({jail.detail}); "
                              "pass --unsafe-no-jail to run candidates unconfined")
        src_root = str(Path(__file__).resolve().parents[3])
        env = scrubbed_env({
            "CUDA_VISIBLE_DEVICES": "" if self.cpu_mode else physical_gpu(self.gpu),
            "PYTHONPATH": os.pathsep.join(p for p in (src_root, os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
        })
        args = [python_executable(), "-m", "cuforge.sandbox.judge.worker", "--judge", self.judge]
        if self.cpu_mode:
            args.append("--cpu")
        if self.compile_only:
            args += ["--compile-only", "--arch", self.target_arch or os.environ.get("CUFORGE_ARCH") or "sm_90a"]
        shared = _cache_dir()
        if jail.kind == NAMESPACES:
            args += ["--jailed", NAMESPACES]
            if shared.is_dir():  # mounted read-only at SHARED_CACHE inside the jail
                args += ["--shared-cache", SHARED_CACHE]
            env.update(jail_env())
            env.update(self.extra_env)
            return bwrap_argv(jail, args, gpu=not self.cpu_mode, shared_cache=shared), env
        assert self.workdir is not None
        if jail.kind == LANDLOCK:
            # The worker confines itself first thing, before any thread or import (confine/landlock.py).
            spec = landlock_spec(str(self.workdir), shared if shared.is_dir() else None, gpu=not self.cpu_mode,
                                 hosts=self.split_judge)
            uid = jail_uid()
            if uid is not None:  # started as root: the worker drops to this uid, so its scratch is that uid's
                blocked = next((b for b in map(lambda p: unreadable_to(uid, p), spec["python"]) if b), None)
                if blocked:
                    raise NoJailError(f"the Landlock jail runs candidates as uid {uid}, which cannot read {blocked} "
                                      "(where Python runs from): install Python where others can read it, or set "
                                      "CUFORGE_JAIL_UID=0 to keep root (other root processes' environments stay readable)")
                spec["uid"] = uid
                os.chown(self.workdir, uid, uid)
            args += ["--jailed", LANDLOCK, "--jail-spec", json.dumps(spec)]
        elif self.isolate_network:
            # Unconfined (--unsafe-no-jail): a private network namespace where the kernel allows one.
            args.append("--isolate-network")
        args += ["--shared-cache", str(shared)]
        env.update(scratch_env(str(self.workdir)))
        env.update(self.extra_env)
        return args, env

    def start(self) -> dict[str, Any]:
        """Start the worker; its info. On a GPU its imports and CUDA context come first, outside the
        GPU's turn (they run no GPU work), and the rest in the turn: the worker's self-test times an
        honest kernel and checks it for escaped work, which another process's evaluation on the same
        GPU would make look busy."""
        self._spawn()
        return self._greet_in_turn()

    def _greet_in_turn(self) -> dict[str, Any]:
        if self.cpu_mode or self.in_turn:
            return self._greet()
        with gpu_turn(physical_gpu(self.gpu)):
            self.in_turn = True
            try:
                return self._greet()
            finally:
                self.in_turn = False

    def _spawn(self) -> None:
        """A new worker, up to its `ready`: imported and holding a CUDA context, before any GPU work."""
        self.close(by_user=False)
        closes = self.closes
        try:
            proc = self._start_process()
        except Exception:
            # A shutdown from another thread (a stopping run) may pull the scratch space or the cgroup
            # from under the start: whatever that breaks is the shutdown, named as such.
            if self.closes == closes:
                raise
            self.close(by_user=False)
            raise WorkerStartError(SHUT_DOWN_WHILE_STARTING) from None
        with self._closing:
            shut_down = self.closes != closes
            self.proc = proc
        if shut_down:  # that shutdown found no worker to end: this one is ended here, not left running
            self.close(by_user=False)
            raise WorkerStartError(SHUT_DOWN_WHILE_STARTING)
        self.spawns += 1
        self.served = 0
        self.ready = self.greeted = False
        # The worker read from is the one spawned here: a close() from another thread clears self.proc
        # at any moment, which _read sees as the worker gone.
        reply = self._read(START_TIMEOUT_S, proc=proc)
        if reply is None or reply.get("op") != "ready":
            self._start_failed(proc, reply, "ready")
        self.ready = True
        self.ready_arch = str(reply.get("compute_capability") or "") or None

    def _start_process(self) -> subprocess.Popen[str]:
        """The worker's process in a fresh scratch space, started under its jail and limits."""
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix="cuforge-worker-"))
        self.log_path = workdir / "worker.log"
        try:
            args, env = self._command()
        except NoJailError:
            self.close(by_user=False)
            raise
        setup = child_setup(self.limits)
        self.processes = f"at most {self.limits.max_processes} (rlimit)"
        if os.geteuid() == 0 and self.jail.confined:
            # The kernel exempts root from the process limit: a pids cgroup bounds the count instead.
            try:
                self.cgroup = PidsCgroup(self.limits.max_processes)
                self.processes = f"at most {self.limits.max_processes} (pids cgroup)"
            except CgroupError as e:
                self.processes = f"not bounded in count as root ({e}); bounded in lifetime by the jail"
        if self.cgroup is not None:
            plain, join = setup, self.cgroup.join

            def setup() -> None:
                join()
                plain()
        log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the worker
        try:
            return _spawner().submit(
                subprocess.Popen, args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                env=env, cwd=workdir, preexec_fn=setup).result()
        finally:
            log.close()

    def _start_failed(self, proc: subprocess.Popen[str], reply: dict[str, Any] | None, expected: str) -> NoReturn:
        if reply is None:
            why = f"no {expected} within {START_TIMEOUT_S:.0f} s"
        elif reply.get("op") == "eof" and self.proc is not proc:
            why = SHUT_DOWN_WHILE_STARTING.removeprefix("worker failed to start: ")
        elif reply.get("op") == "eof":
            why = f"it exited before its {expected} ({describe_exit(proc.wait(), self.jail.confined)})"
        else:
            why = reply.get("error") or f"an unexpected reply {str(reply)[:200]} where its {expected} was due"
        tail = self.log_tail()
        self.close(by_user=False)
        raise WorkerStartError(f"worker failed to start: {why}" + (f" ({tail})" if tail else ""))

    def _greet(self) -> dict[str, Any]:
        """The spawned worker's go-ahead, and its hello: its self-test and trusted artifacts are made
        now, in the GPU's turn where it has one."""
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise WorkerStartError(SHUT_DOWN_WHILE_STARTING)
        try:
            proc.stdin.write(json.dumps({"op": "go"}) + "\n")
            proc.stdin.flush()
            reply = self._read(START_TIMEOUT_S)
        except (BrokenPipeError, ValueError):  # closed under us (ValueError: a write to a closed pipe)
            reply = {"op": "eof"}
        if reply is None or reply.get("op") != "hello" or "info" not in reply:
            self._start_failed(proc, reply, "hello")
        self.greeted = True
        self.info = {**reply["info"], "processes": self.processes}
        self.info["jail"] = self.jail.kind if self.jail.confined else "none (--unsafe-no-jail)"
        if self.jail.confined and self.info.get("jail_applied") is False:
            self.close(by_user=False)
            raise WorkerStartError(f"the worker could not confine itself: {self.info.get('isolation')}")
        if self.jail.confined and self.info.get("jailed") != self.jail.kind:
            # Fail closed: a worker that does not know the jail it was started in (a command line
            # it did not understand, say) has not applied it.
            self.close(by_user=False)
            raise WorkerStartError(f"the worker did not confirm the {self.jail.kind} jail it was started in "
                                   f"(it reports {self.info.get('jailed')!r}): not evaluating unconfined")
        # Made before the worker received any candidate, in the jail it confirmed: the only moment its
        # output is trusted.
        trusted_cache.accept(_cache_dir(), reply.get("trusted") or {})
        if "no candidate process" in str(self.info.get("self_test")):
            # The split judge's own honest self-test could not start a candidate host: every evaluation
            # would fail the same way, so say so once, with what to do instead.
            tail = self.log_tail(3)
            self.close(by_user=False)
            remedy = ("the namespaces jail (bubblewrap, where user namespaces are allowed) starts them; "
                      "CUFORGE_JUDGE=inprocess judges candidates inside the jailed worker instead"
                      if self.jail.kind == LANDLOCK else "see cuforge doctor")
            raise WorkerStartError(f"candidate hosts cannot start under the {self.jail.kind} jail here "
                                   f"({self.info.get('self_test')}): {remedy}" + (f" ({tail})" if tail else ""))
        self.info["jail_pid"], self.info["pid"] = self.info.get("pid"), proc.pid  # the host's pid, not the jail's
        return self.info

    def close(self, by_user: bool = True) -> None:
        """End the worker. by_user: a shutdown (a stopping run), which ends a wait for the GPU's turn or a
        start in progress; a new worker's start ends its predecessor with by_user=False."""
        # Another thread may close it meanwhile (a stopping run, while this one starts the worker): each
        # close takes what it ends under the lock, so the worker is ended once.
        for builder in (self.builder, self.kernel_builder):
            if builder is not None:
                builder.close(by_user)
        with self._closing:
            self.closes += by_user
            proc, self.proc = self.proc, None
            self.ready = self.greeted = False
            cgroup, self.cgroup = self.cgroup, None
            workdir, self.workdir = self.workdir, None
        if proc is not None:
            tree = set() if self.cpu_mode else process_tree(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own process group
            except (ProcessLookupError, PermissionError):
                pass
            for pid in tree - {proc.pid}:  # and whatever left it (a new session) before the kill
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.wait()
            wait_exited(tree)  # in the GPU's turn where evaluate() closes it: its context must be gone
            for f in (proc.stdin, proc.stdout):
                try:
                    if f:
                        f.close()
                except OSError:
                    pass
        if cgroup is not None:
            cgroup.remove()
        if workdir is not None:  # the worker's scratch space, its log with it
            shutil.rmtree(workdir, ignore_errors=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""
        kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)[-1500:]

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- I/O

    def _read(self, timeout_s: float, max_rss: int | None = None,
              proc: subprocess.Popen[str] | None = None) -> dict[str, Any] | None:
        """One reply line of `proc` (the current worker where None), or None on timeout; {"op": "eof"}
        once the worker is gone or closed; raises MemoryError when the worker outgrows max_rss."""
        proc = self.proc if proc is None else proc
        if proc is None or proc.stdout is None:
            return {"op": "eof"}
        sel = selectors.DefaultSelector()
        try:
            sel.register(proc.stdout, selectors.EVENT_READ)
        except (OSError, ValueError):  # its pipe already closed by close()
            sel.close()
            return {"op": "eof"}
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self.proc is not proc:  # close() from another thread (a stopping run): the worker is gone
                    return {"op": "eof"}
                try:
                    if sel.select(timeout=min(POLL_S, left)):
                        line = proc.stdout.readline()
                        if not line:
                            return {"op": "eof"}
                        return json.loads(line)
                except (OSError, ValueError):  # its pipe closed under us by close()
                    return {"op": "eof"}
                if max_rss and rss_bytes(proc.pid) > max_rss:
                    raise MemoryError(rss_bytes(proc.pid))
        finally:
            sel.close()

    def probe(self, targets: dict[str, Any], timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Ask the (jailed) worker to try what a hostile candidate would; see sandbox/jail_probe.py."""
        if not self.alive():
            self.start()
        elif not self.greeted:
            self._greet_in_turn()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "probe", "targets": targets}) + "\n")
        self.proc.stdin.flush()
        reply = self._read(timeout_s)
        if not reply or reply.get("op") != "probe":
            raise WorkerStartError(f"the worker did not answer the jail probe ({self.log_tail()})")
        return list(reply["report"])

    def evaluate(self, problem: Problem, candidate: Candidate, config: EvalConfig,
                 prebuilt: dict[str, str] | None = None) -> Evaluation:
        """One evaluation in the worker, in the GPU's turn (gpu_turn: no other cuforge process evaluates on
        it meanwhile); the time waited for the turn counts toward no limit. A module candidate's
        extensions are built before the turn (`prebuilt`: already built by the caller's builders)."""
        if self.cpu_mode:
            return self._evaluate_in_worker(problem, candidate, config, prebuilt)
        closes = self.closes
        t0 = time.monotonic()
        if not self.alive():
            # A new worker's imports and CUDA context need no turn: made while others evaluate.
            try:
                self._spawn()
            except WorkerStartError as e:
                if self.closes == closes:
                    raise
                return Evaluation(problem.id, candidate.id, "crash", f"not evaluated: the worker was shut down while "
                                  f"it started ({e})", wall_s=time.monotonic() - t0, device=self.info)
        packed = self._prebuild(problem, candidate, config) if prebuilt is None else prebuilt
        try:
            with gpu_turn(physical_gpu(self.gpu), give_up=lambda: self.closes != closes) as waited:
                self.in_turn = True
                try:
                    ev = self._evaluate_in_worker(problem, candidate, config, packed)
                finally:
                    self.in_turn = False
        except TurnAbandoned as e:  # close() from another thread: the run is stopping
            return Evaluation(problem.id, candidate.id, "crash", f"not evaluated: the worker was shut down while it waited "
                              f"for the GPU, which another cuforge process was evaluating on ({e})",
                              wall_s=time.monotonic() - t0, device=self.info)
        if waited is not None and waited >= 0.1:
            ev.device = {**ev.device, "gpu_turn_wait_s": round(waited, 2)}
        return ev

    def _prebuild(self, problem: Problem, candidate: Candidate, config: EvalConfig) -> dict[str, str]:
        """What the candidate builds as it is imported, built now in a compile-only worker while other
        evaluations have the GPU: a module's load_inline extensions, or (for the in-process judge, when
        another evaluation holds or awaits the GPU's turn) its template kernels' cubins; {} where there
        are none or they could not be built there. Only once the GPU worker has said its architecture."""
        arch = self.arch()
        if self.compile_only or not arch:
            return {}
        if builds_ahead(candidate):
            if self.builder is None:
                self.builder = self.new_builder(arch)
            return self.builder.build_ahead(problem, candidate, config)
        if self.judge != "inprocess" or not turn_busy(physical_gpu(self.gpu)):
            return {}  # an idle GPU: compiling in the turn costs no one a wait
        kernels = kernel_sources(candidate)
        if not kernels:
            return {}
        if self.kernel_builder is None:
            self.kernel_builder = self.new_builder(arch)
        return self.kernel_builder.compile_kernels(kernels, config.timeout_s)

    def arch(self) -> str | None:
        """The GPU's compute capability ("9.0"), once a worker has said it."""
        return self.info.get("compute_capability") or self.ready_arch

    def new_builder(self, arch: str) -> Supervisor:
        """A compile-only supervisor in this one's jail, building for the GPU architecture `arch` ("9.0")."""
        from cuforge.runtime import sm_arch

        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST") or arch  # what the GPU worker's torch would use
        major, _, minor = arch.partition(".")
        return Supervisor(compile_only=True, judge="inprocess", jail=self._jail, unsafe_no_jail=self.unsafe_no_jail,
                          isolate_network=self.isolate_network, target_arch=sm_arch(int(major), int(minor or 0)),
                          extra_env={**self.extra_env, "TORCH_CUDA_ARCH_LIST": arch_list})

    def compile_kernels(self, kernels: list[KernelSource], timeout_s: float) -> dict[str, str]:
        """(A compile-only supervisor's job.) The kernels' cubins, compiled by NVRTC in this worker,
        which stays up for the next candidate's (it runs no candidate code); {} where the worker
        could not start (then or before: each candidate compiles in its evaluation instead), did not
        answer within `timeout_s` (then ended) or compiled none."""
        if self.start_failed:
            return {}
        if not self.alive():
            try:
                self.start()
            except WorkerStartError:
                self.start_failed = True
                return {}
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": "compile", "kernels": [k.to_wire() for k in kernels]}) + "\n")
            self.proc.stdin.flush()
            reply = self._read(timeout_s)
        except OSError:  # its pipe broken (BrokenPipeError) or closed under us by close()
            reply = None
        if not reply or reply.get("op") != "compiled" or not isinstance(reply.get("prebuilt"), dict):
            self.close(by_user=False)
            return {}
        return {str(k): str(v) for k, v in reply["prebuilt"].items()}

    def build_ahead(self, problem: Problem, candidate: Candidate, config: EvalConfig) -> dict[str, str]:
        """(A compile-only supervisor's job.) Import the candidate in a fresh worker and return the
        extensions its import built (protocol/prebuilt.py); {} where it built none or failed, which
        decides nothing: the evaluation then builds as it would have. The worker then ends: the
        candidate's code ran in it, and no other candidate's build may."""
        build = replace(config, device="cpu", compile_only=True, prebuild=True, profile=False)
        try:
            ev = self.evaluate(problem, candidate, build)
            return self.prebuilt if ev.status == "compiled" else {}
        except WorkerStartError:
            return {}
        finally:
            self.close(by_user=False)

    def _evaluate_in_worker(self, problem: Problem, candidate: Candidate, config: EvalConfig,
                            prebuilt: dict[str, str] | None = None) -> Evaluation:
        """One evaluation; again in a fresh worker where it failed on an operator namespace that an
        earlier candidate left registered in this one (torch's dispatcher keeps a namespace for the life
        of a process, and a search's candidates keep their parent's: the failure was the worker's)."""
        earlier = self.served if self.alive() else 0
        ev = self._evaluate_once(problem, candidate, config, prebuilt)
        if earlier and ev.status in ("runtime_error", "compile_error") and any(m in ev.message for m in NAMESPACE_TAKEN):
            self.close(by_user=False)
            first = ev.message
            ev = self._evaluate_once(problem, candidate, config, prebuilt)
            ev.correctness = {**ev.correctness, "retried_in_a_fresh_worker": first[:300]}
        return ev

    def _evaluate_once(self, problem: Problem, candidate: Candidate, config: EvalConfig,
                       prebuilt: dict[str, str] | None = None) -> Evaluation:
        base = {"problem_id": problem.id, "candidate_id": candidate.id}
        t0 = time.monotonic()
        restarted = False
        if not self.alive():
            restarted = self.spawns > 0
            self.start()
        elif not self.greeted:  # spawned before the turn
            restarted = self.spawns > 1
            self._greet()
        assert self.proc is not None and self.proc.stdin is not None
        sent = candidate.to_dict()
        if prebuilt:
            sent["prebuilt"] = prebuilt
        self.prebuilt = {}
        request = {"op": "evaluate", "problem": problem_payload(problem), "candidate": sent, "config": config.to_dict()}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = self._read(config.timeout_s, int(config.max_host_memory_gib * 2**30))
        except BrokenPipeError:
            reply = {"op": "eof"}
        except MemoryError as e:
            self.close(by_user=False)
            return Evaluation(status="crash", message=f"worker host memory {int(e.args[0]) / 2**30:.1f} GiB exceeded the "
                              f"{config.max_host_memory_gib:g} GiB limit; worker killed", wall_s=time.monotonic() - t0,
                              worker_restarted=True, device=self.info, **base)
        if reply is None:
            self.close(by_user=False)
            return Evaluation(status="timeout", message=f"no result within {config.timeout_s:g} s; worker killed",
                              wall_s=time.monotonic() - t0, worker_restarted=True, device=self.info, **base)
        if reply.get("op") == "eof":
            code = self.proc.wait() if self.proc else None
            tail = self.log_tail()
            self.close(by_user=False)
            return Evaluation(status="crash", message=f"worker died ({describe_exit(code, self.jail.confined)})" + (f": {tail}" if tail else ""),
                              wall_s=time.monotonic() - t0, worker_restarted=True, device=self.info, **base)
        if reply.get("op") == "error":
            self.close(by_user=False)
            return Evaluation(status="crash", message=f"harness error in worker: {reply.get('message')}",
                              wall_s=time.monotonic() - t0, worker_restarted=True, device=self.info, **base)
        ev = Evaluation.from_dict(reply["evaluation"])
        self.served += 1
        self.prebuilt = dict(reply.get("prebuilt") or {})
        ev.device = {**ev.device, "pid": self.info.get("pid"), "jail": self.info.get("jail")}
        ev.worker_restarted = restarted
        if reply.get("restart"):
            self.close(by_user=False)
        return ev


_SPAWNER: ThreadPoolExecutor | None = None


def _spawner() -> ThreadPoolExecutor:
    """One long-lived thread starts every worker. The jail dies with its parent (PR_SET_PDEATHSIG),
    and the kernel means the parent *thread*: a worker started from a short-lived thread (an
    executor's request thread) would be killed the moment that thread ended."""
    global _SPAWNER
    if _SPAWNER is None:
        _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuforge-spawn")
    return _SPAWNER


def _cache_dir() -> Path:
    from cuforge.problems.loader import cache_dir

    return cache_dir()
