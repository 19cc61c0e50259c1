"""Executors: GPU selection, one evaluation per slot, the local pool of compile-only workers, and the
Ray backend on a real local Ray instance (a custom resource stands in for GPUs) giving the same
results as the local pool."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cuforge.sandbox.driver.executor import ExecutorError, LocalExecutor, SlotPool, select_gpus
from cuforge.sandbox.driver.gpu_turn import physical_gpu

ROOT = Path(__file__).resolve().parents[1]


def test_select_gpus_maps_indices_to_physical_ids():
    visible = ["3", "5", "7"]
    assert select_gpus("all", visible) == ["3", "5", "7"]
    assert select_gpus("0,2", visible) == ["3", "7"]
    with pytest.raises(ExecutorError, match="no GPU 3 here"):
        select_gpus("3", visible)
    with pytest.raises(ExecutorError, match="named twice"):
        select_gpus("1,1", visible)
    with pytest.raises(ExecutorError, match="comma-separated"):
        select_gpus("first", visible)
    with pytest.raises(ExecutorError, match="no GPU visible"):
        select_gpus("all", [])


def test_gpus_counts_workers_where_there_are_no_gpu_indices():
    from cuforge.sandbox.driver.executor import worker_count
    from cuforge.sandbox.driver.executor_choice import make_executor

    assert worker_count("all") is None and worker_count("4") == 4 and worker_count("0,1,2") == 3
    with pytest.raises(ExecutorError, match="0 workers; it must be from 1 to"):
        worker_count("0")
    ex = make_executor("local", "3", cpu_mode=False, compile_only=True)
    try:
        assert ex.slots == 3  # --compile-only --gpus 3: three compile workers
    finally:
        ex.close()


def test_worker_gpu_follows_the_drivers_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert physical_gpu(1) == "6" and physical_gpu("2") == "2"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpu(1) == "1"


def test_slot_pool_lends_each_slot_to_one_evaluation_at_a_time():
    pool = SlotPool(["gpu0", "gpu1"])
    busy: dict[str, int] = {"gpu0": 0, "gpu1": 0}
    seen: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def work(slot: str) -> str:
        with lock:
            busy[slot] += 1
            seen.append((slot, busy[slot], sum(busy.values())))
        time.sleep(0.02)
        with lock:
            busy[slot] -= 1
        return slot

    threads = [threading.Thread(target=pool.run, args=(work,)) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 12
    assert max(per_slot for _, per_slot, _ in seen) == 1  # never two evaluations on one GPU
    assert max(total for _, _, total in seen) == 2  # but both GPUs busy together
    assert {slot for slot, _, _ in seen} == {"gpu0", "gpu1"}


def _candidates():
    """Three template GEMM configs and one that does not compile, for hgemm 64x64x64."""
    from cuforge.kernels.gemm import GemmSm80
    from cuforge.problems.hgemm import hgemm_problem
    from cuforge.sandbox.protocol.candidate import Candidate

    problem = hgemm_problem(64, 64, 64)
    fam = GemmSm80()
    cands = [fam.render(c, problem) for c in fam.seeds(problem)[:3]]
    broken = cands[0].source.replace("__syncthreads();", "__syncthreads()", 1)
    cands.append(Candidate(broken, "kernel", cands[0].launch, proposer="template"))
    return problem, cands


def _comparable(ev) -> dict:
    d = ev.to_dict()
    # Seeds are drawn per evaluation and step times are wall clock: the rest must be the same.
    d["correctness"] = {k: v for k, v in d["correctness"].items() if k not in ("seed", "init_seed", "judge_phases_s")}
    return {k: d[k] for k in ("problem_id", "candidate_id", "status", "message", "diagnostics", "speedups",
                              "correctness")}


def _evaluate_all(executor, problem, cands) -> list:
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    config = EvalConfig(device="cpu", compile_only=True, baselines=("torch",))
    out: list = [None] * len(cands)

    def one(i: int) -> None:
        out[i] = executor.evaluate(problem, cands[i], config)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cands))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture(scope="module")
def local_results():
    problem, cands = _candidates()
    ex = LocalExecutor(["0", "1"], compile_only=True)
    try:
        evs = _evaluate_all(ex, problem, cands)
    finally:
        ex.close()
    return problem, cands, evs


def test_local_pool_spreads_compile_only_evaluations_over_its_workers(local_results):
    _, _, evs = local_results
    assert [e.status for e in evs] == ["compiled"] * 3 + ["compile_error"]
    assert evs[3].diagnostics and "expected a \";\"" in evs[3].message + str(evs[3].diagnostics[0])
    assert {e.device["gpu"] for e in evs} == {"0", "1"}  # both workers took evaluations
    assert {e.device["executor"] for e in evs} == {"local"}
    assert len({e.device["pid"] for e in evs}) == 2


ray = pytest.importorskip("ray")
# One test process for the Ray tests where pytest-xdist can keep a group together (with pytest 9.2 and
# xdist 3.8 it cannot: the group name it appends to a test's id is lost). So no test may stop Ray
# machine-wide (`ray stop` ends every Ray process there, another test process's cluster with it):
# the CLI test ends only the processes of the cluster it started.
ON_RAY = pytest.mark.xdist_group("ray")


def _stop_cluster(temp_dir: str, timeout_s: float = 30.0) -> list[int]:
    """End every process of the Ray cluster started with `--temp-dir temp_dir` (each names its session
    directory under it on its command line), and no other: SIGTERM, then SIGKILL what is left. Returns
    the pids still there."""
    def members() -> list[int]:
        out = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        if temp_dir.encode() in f.read():
                            out.append(int(entry.name))
                except OSError:
                    continue  # gone meanwhile
        return out

    from cuforge.sandbox.driver.gpu_turn import wait_exited

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = members()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        wait_exited(set(pids), timeout_s / 2)
    return members()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, resources={"cuforge_slot": 2}, include_dashboard=False, object_store_memory=100 * 2**20,
             log_to_driver=False)
    yield ray
    ray.shutdown()


@ON_RAY
def test_ray_backend_gives_the_local_pools_results(local_ray, local_results):
    from cuforge.sandbox.driver.ray_executor import RayExecutor

    problem, cands, local_evs = local_results
    ex = RayExecutor(resource="cuforge_slot", compile_only=True)
    try:
        assert ex.slots == 2 and all(i["self_test"].startswith("skipped") for i in ex.infos)
        ray_evs = _evaluate_all(ex, problem, cands)
        assert [_comparable(e) for e in ray_evs] == [_comparable(e) for e in local_evs]
        assert {e.device["executor"] for e in ray_evs} == {"ray"}

        # An actor killed between evaluations is restarted by Ray; evaluation goes on.
        victim = ex.actors[0]
        old_pid = ray.get(victim.pid.remote())
        ray.kill(victim, no_restart=False)
        again = _evaluate_all(ex, problem, cands[:2] * 2)
        assert [e.status for e in again] == ["compiled"] * 4
        assert ray.get(victim.pid.remote()) != old_pid
    finally:
        ex.close()


@ON_RAY
def test_ray_backend_refuses_a_cluster_without_the_resource(local_ray):
    from cuforge.sandbox.driver.ray_executor import RayExecutor

    with pytest.raises(ExecutorError, match="no 'GPU' resources"):
        RayExecutor(resource="GPU", compile_only=True)
    with pytest.raises(ExecutorError, match="asked for 3 Ray workers but the cluster has 2"):
        RayExecutor(resource="cuforge_slot", compile_only=True, workers=3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@ON_RAY
def test_cli_run_on_a_ray_cluster(tmp_path):
    """`cuforge run --executor ray --ray-address` against a cluster started with `ray start`: the
    driver keeps the store and population, the actors evaluate; cuforge is shipped to them."""
    if ray.is_initialized():
        ray.shutdown()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="cfray-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Token authentication, as a cluster reachable over a network should have: driver and nodes share it.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    start = subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                            "--resources", json.dumps({"cuforge_slot": 2}), "--object-store-memory", str(100 * 2**20),
                            "--temp-dir", ray_tmp],
                           capture_output=True, text=True, env=env, timeout=180)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        db = tmp_path / "r.db"
        r = subprocess.run([sys.executable, "-m", "cuforge.cli", "run", "--suite", "hgemm-small", "--problem",
                            "hgemm/64_64_64", "--islands", "1", "--generations", "4", "--compile-only", "--executor",
                            "ray", "--ray-address", f"127.0.0.1:{port}", "--ray-resource", "cuforge_slot", "--results",
                            str(db), "--json"], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["evaluations"] == 4
        import sqlite3

        with sqlite3.connect(db) as c:
            got = c.execute("SELECT status, device FROM evaluations").fetchall()
        assert [s for s, _ in got] == ["compiled"] * 4
        assert {json.loads(d)["executor"] for _, d in got} == {"ray"}
    finally:
        left = _stop_cluster(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left, f"processes of the test's Ray cluster still running: {left}"


def test_an_old_runs_single_gpu_setting_still_loads():
    from cuforge.agent.config import RunConfig

    cfg = RunConfig.from_dict({**{k: v for k, v in RunConfig().to_dict().items() if k != "gpus"}, "gpu": 1})
    assert cfg.gpus == "1" and replace(cfg, executor="ray").executor == "ray"
