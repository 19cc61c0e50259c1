"""The Ray executor: one evaluation actor per GPU of a Ray cluster (num_gpus=1, so Ray pins it to one
GPU), each owning a supervised worker exactly as the local executor does. The driver keeps the
store and the population; actors only evaluate. Actors that die are restarted by Ray and the
evaluation is retried once on the restarted actor (the candidate runs in the worker process under
the actor, so an actor's death is the cluster's failure, not the candidate's).

    ray start --head                       # on the head node, then `ray start --address ...` on the others
    cuforge run --executor ray --ray-address auto
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.driver.executor import ExecutorError, SlotPool, tag_device
from cuforge.sandbox.driver.supervisor import START_TIMEOUT_S, Supervisor

RESULT_MARGIN_S = 120.0  # beyond the evaluation's own limit, which the actor's supervisor enforces
RESTART_WAIT_S = 180.0  # how long an evaluation waits for an actor Ray is restarting


class EvalActor:
    """Lives in a Ray worker process; Ray sets CUDA_VISIBLE_DEVICES to the one GPU it was given."""

    def __init__(self, cpu_mode: bool, compile_only: bool, judge: str | None = None) -> None:
        gpu = None
        if not (cpu_mode or compile_only):
            visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
            if len(visible) != 1:
                raise RuntimeError(f"evaluation actor expected exactly one GPU, Ray gave {visible or 'none'}")
            gpu = visible[0]
        self.gpu = gpu
        self.sup = Supervisor(gpu=gpu, cpu_mode=cpu_mode, compile_only=compile_only, judge=judge)

    def start(self) -> dict[str, Any]:
        info = dict(self.sup.start())
        info.update(host=socket.gethostname(), actor_pid=os.getpid())
        return info

    def evaluate(self, problem: Problem, candidate: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        ev = self.sup.evaluate(problem, Candidate.from_dict(candidate), EvalConfig.from_dict(config))
        return tag_device(ev, self.gpu, "ray", socket.gethostname()).to_dict()

    def pid(self) -> int:
        return os.getpid()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError("the ray executor needs Ray: pip install 'cuforge[ray]'") from None
    return ray


class RayExecutor:
    def __init__(self, address: str | None = None, resource: str = "GPU", cpu_mode: bool = False,
                 compile_only: bool = False, workers: int | None = None, judge: str | None = None) -> None:
        ray = self.ray = _import_ray()
        if not ray.is_initialized():
            # A remote cluster gets this very cuforge shipped to it, so driver and actors never differ.
            runtime_env = {"py_modules": [str(Path(__file__).resolve().parents[2])]} if address else None
            try:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, include_dashboard=False)
            except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the message says which
                raise ExecutorError(f"cannot connect to Ray at {address or 'a new local instance'}: {e}") from None
        available = int(ray.cluster_resources().get(resource, 0))
        count = workers or available
        if count < 1:
            raise ExecutorError(f"the Ray cluster has no {resource!r} resources; start nodes with GPUs "
                                "(or name a custom resource with --ray-resource)")
        if count > available:
            raise ExecutorError(f"asked for {count} Ray workers but the cluster has {available} {resource!r}")
        options: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": 1}
        if resource == "GPU":
            options["num_gpus"] = 1
        else:
            options["resources"] = {resource: 1}
        actor_cls = ray.remote(EvalActor).options(**options)
        self.actors = [actor_cls.remote(cpu_mode, compile_only, judge) for _ in range(count)]
        try:
            self.infos = ray.get([a.start.remote() for a in self.actors], timeout=START_TIMEOUT_S + 60)
        except Exception as e:  # noqa: BLE001
            self.close()
            raise ExecutorError(f"Ray evaluation workers failed to start: {type(e).__name__}: {e}") from None
        self.pool = SlotPool(self.actors)
        self.slots = count
        self.restarts = 0

    def evaluate(self, problem: Problem, candidate: Candidate, config: EvalConfig) -> Evaluation:
        return self.pool.run(lambda actor: self._on(actor, problem, candidate, config))

    def _on(self, actor: Any, problem: Problem, candidate: Candidate, config: EvalConfig) -> Evaluation:
        ray = self.ray
        t0 = time.monotonic()
        base = {"problem_id": problem.id, "candidate_id": candidate.id}
        last, deaths = "", 0
        # An actor Ray is still restarting is unavailable, not dead: waited for (on a loaded machine
        # its restart outlasted two attempts and an honest candidate came out 'crash').
        unavailable = getattr(ray.exceptions, "ActorUnavailableError", ())
        waiting_until = t0 + RESTART_WAIT_S
        while deaths < 2:
            ref = actor.evaluate.remote(problem, candidate.to_dict(), config.to_dict())
            try:
                return Evaluation.from_dict(ray.get(ref, timeout=config.timeout_s + RESULT_MARGIN_S))
            except ray.exceptions.GetTimeoutError:
                ray.kill(actor, no_restart=False)  # Ray brings it back for the next evaluation
                return Evaluation(status="timeout", message=f"Ray actor gave no result within "
                                  f"{config.timeout_s + RESULT_MARGIN_S:g} s; actor restarted",
                                  wall_s=time.monotonic() - t0, worker_restarted=True, **base)
            except unavailable as e:
                last = str(e).splitlines()[0] if str(e) else type(e).__name__
                if time.monotonic() > waiting_until:
                    return Evaluation(status="crash", message=f"Ray actor still unavailable after "
                                      f"{RESTART_WAIT_S:g} s: {last}", wall_s=time.monotonic() - t0,
                                      worker_restarted=True, **base)
                time.sleep(0.5)
            except ray.exceptions.RayActorError as e:
                self.restarts += 1
                deaths += 1
                last = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Evaluation(status="crash", message=f"Ray actor died twice during this evaluation: {last}",
                          wall_s=time.monotonic() - t0, worker_restarted=True, **base)

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
