"""A results store holding a template run with real kernel sources and known measurements, for
export tests: hgemm 64^3 and 128x256x64 won (two different configs; a faster gemm_sm90 kernel for
64^3 cannot be exported), hgemm 1024^3 lost to cuBLAS (and its best candidate overall was a Python
module), and a small row softmax won."""

from __future__ import annotations

from pathlib import Path

from cuforge.agent.config import RunConfig
from cuforge.kernels.gemm import GemmSm80, GemmSm90
from cuforge.kernels.softmax import SoftmaxRows
from cuforge.problems.hgemm import hgemm_problem
from cuforge.problems.loader import load_files
from cuforge.results.store import Store

RUN_ID = "run-20261122-export-fixture"
GPU = "NVIDIA H100 80GB HBM3"
SOFTMAX_SOURCE = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(64, 1000)]


def get_init_inputs():
    return []
'''


def _evaluation(problem_id: str, cand_ms: float, speedups: dict[str, float]) -> dict:
    timings = {"candidate": {"median_ms": cand_ms, "p20_ms": cand_ms, "p80_ms": cand_ms, "n": 30, "rse": 0.001,
                             "method": "graph+rotating"}}
    for b, s in speedups.items():
        timings[b] = {**timings["candidate"], "median_ms": cand_ms * s}
    return {"problem_id": problem_id, "status": "ok", "message": "", "timings": timings, "speedups": speedups,
            "device": {"name": GPU, "sm_count": 132, "compute_capability": "9.0"}, "wall_s": 0.4}


def build(path: Path, workdir: Path) -> Store:
    store = Store(path)
    cfg = RunConfig(suite="fixture").to_dict()
    cfg["prompt_dir"] = None
    store.create_run(RUN_ID, "fixture", cfg, gpu=GPU, software="torch 2.11.0+cu130")
    (workdir / "softmax_small.py").write_text(SOFTMAX_SOURCE)
    loaded, skipped = load_files([workdir / "softmax_small.py"])
    assert not skipped, skipped
    softmax = loaded[0]
    softmax_id = "fixture/softmax_small"
    gemm, rows = GemmSm80(), SoftmaxRows()
    p64, p128, p1024 = hgemm_problem(64, 64, 64), hgemm_problem(128, 256, 64), hgemm_problem(1024, 1024, 1024)
    for p in (p64, p128, p1024):
        store.add_run_problem(RUN_ID, p.id, p.source, {"dtype": "float16"})
    store.add_run_problem(RUN_ID, softmax_id, softmax.source, {"dtype": "float32"})
    results = [
        (p64.id, gemm.render(gemm.seeds(p64)[0], p64).to_dict(), 0.0040, {"torch": 1.30, "cublas": 1.25, "cublaslt": 1.10}),
        (p64.id, gemm.render(gemm.seeds(p64)[1], p64).to_dict(), 0.0050, {"torch": 1.04, "cublas": 1.00, "cublaslt": 0.88}),
        # Faster still, but a TMA kernel: not exportable, so the 1.25x one is used and the README says so.
        (p64.id, GemmSm90().render(GemmSm90().seeds(p64)[0], p64).to_dict(), 0.0030, {"torch": 1.7, "cublas": 1.6}),
        (p128.id, gemm.render(gemm.seeds(p128)[1], p128).to_dict(), 0.0060, {"torch": 1.12, "cublas": 1.08, "cublaslt": 1.01}),
        (p1024.id, gemm.render(gemm.seeds(p1024)[0], p1024).to_dict(), 0.0300, {"torch": 0.80, "cublas": 0.79}),
        (p1024.id, {"source": "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", "format": "module",
                    "proposer": "openai"}, 0.0150, {"torch": 1.6, "cublas": 1.58}),
        (softmax_id, rows.render(rows.seeds(softmax)[0], softmax).to_dict(), 0.0080, {"torch": 1.21}),
    ]
    for i, (pid, cand, ms, speedups) in enumerate(results):
        cid = store.add_candidate(RUN_ID, pid, cand, f"h{i}", generation=i)
        store.add_evaluation(cid, RUN_ID, _evaluation(pid, ms, speedups), reward=0.1)
    store.set_run_status(RUN_ID, "finished")
    return store
