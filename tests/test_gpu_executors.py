"""The local executor on a host with two or more GPUs: evaluations spread over the GPUs, one at a
time on each, every speedup measured against baselines timed on the same GPU."""

import threading

import pytest

from cuforge.kernels.gemm import GemmSm80
from cuforge.problems.hgemm import hgemm_problem
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.executor import LocalExecutor, visible_gpus

pytestmark = pytest.mark.gpu


def test_local_pool_spreads_evaluations_over_two_gpus():
    gpus = visible_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs two GPUs, {len(gpus)} visible")
    problem = hgemm_problem(512, 512, 512)
    fam = GemmSm80()
    cands = [fam.render(c, problem) for c in fam.seeds(problem)[:6]]
    config = EvalConfig(baselines=("torch", "cublas"), max_timing_s=1.0, profile=False)
    ex = LocalExecutor(gpus[:2])
    evs: list = [None] * len(cands)

    def one(i: int) -> None:
        evs[i] = ex.evaluate(problem, cands[i], config)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cands))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ex.close()
    assert [e.status for e in evs] == ["ok"] * len(cands), [e.message for e in evs]
    by_gpu = {}
    for e in evs:
        by_gpu.setdefault(e.device["gpu"], set()).add(e.device["uuid"])
        assert set(e.timings) >= {"candidate", "torch", "cublas"} and e.speedups["cublas"] > 0
    assert set(by_gpu) == set(gpus[:2])  # both GPUs evaluated
    assert all(len(u) == 1 for u in by_gpu.values())  # a slot is always the same physical GPU
    assert len(set().union(*by_gpu.values())) == 2
