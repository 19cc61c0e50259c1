"""A small results store with known contents, for leaderboard, export and CLI tests."""

from pathlib import Path

from cuforge.results.store import Store

PROBLEMS = ["hgemm/64_64_64", "hgemm/1024_1024_1024", "level1/relu"]


def timing(ms: float) -> dict:
    return {"median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01, "n": 30, "rse": 0.001, "method": "events+l2flush"}


def evaluation(problem: str, status: str, cand_ms: float | None = None, base: dict | None = None) -> dict:
    timings = {"candidate": timing(cand_ms)} if cand_ms else {}
    for name, ms in (base or {}).items():
        timings[name] = timing(ms)
    speedups = {k: v["median_ms"] / cand_ms for k, v in timings.items() if k != "candidate"} if status == "ok" else {}
    profile = None
    if status == "ok":
        flops = 2 * 64**3 if problem == "hgemm/64_64_64" else 2 * 1024**3
        profile = {"achieved_tflops": flops / (cand_ms / 1e3) / 1e12, "summary": "",
                   "ceilings": {"device": "H100", "bytes_per_s": 3.0e12, "flops_per_s": {"float16": 7.9e14, "float32": 5.0e13}}}
    return {"problem_id": problem, "status": status, "message": "" if status == "ok" else "fixture failure",
            "timings": timings, "speedups": speedups, "device": {"name": "NVIDIA H100 80GB HBM3"}, "wall_s": 0.3,
            "profile": profile}


def build(path: Path, run_id: str = "run-fixture") -> Store:
    s = Store(path)
    s.create_run(run_id, "fixture", {"provider": "template"}, gpu="NVIDIA H100 80GB HBM3", software="torch 2.11")
    for p in PROBLEMS:
        m = {"hgemm/64_64_64": 64, "hgemm/1024_1024_1024": 1024}.get(p)
        meta = {"flops": 2 * m**3, "bytes": 6 * m * m, "dtype": "float16"} if m else {"flops": None, "bytes": None}
        s.add_run_problem(run_id, p, f"source of {p}", meta)
    rows = [
        ("hgemm/64_64_64", "ok", 0.004, {"cublas": 0.006, "cublaslt": 0.005, "torch": 0.006}),
        ("hgemm/64_64_64", "ok", 0.005, {"cublas": 0.006, "cublaslt": 0.005, "torch": 0.006}),
        ("hgemm/64_64_64", "cheat:side_stream", None, None),
        ("hgemm/1024_1024_1024", "ok", 0.02, {"cublas": 0.01, "cublaslt": 0.009, "torch": 0.01}),
        ("hgemm/1024_1024_1024", "compile_error", None, None),
        # level1/relu: no correct candidate at all
        ("level1/relu", "wrong_output", None, None),
    ]
    ids: dict[str, int] = {}
    for i, (problem, status, ms, base) in enumerate(rows):
        parents = [ids[problem]] if problem in ids else []
        cid = s.add_candidate(run_id, problem, {"source": f"// candidate {i}", "format": "module",
                                                "proposer": "template" if i % 2 == 0 else "openai"},
                              f"hash{i}", parents=parents, generation=i)
        ids.setdefault(problem, cid)
        s.add_evaluation(cid, run_id, evaluation(problem, status, ms, base), reward=0.0)
    s.set_run_status(run_id, "finished")
    return s
