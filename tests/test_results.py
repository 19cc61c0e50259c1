"""Results store runs, concurrent writers, leaderboard, export and their CLI."""

import json
import multiprocessing as mp
import sqlite3

import pandas as pd
import pytest

from conftest import run_cli
from fixture_store import PROBLEMS, build
from cuforge.results.leaderboard import build_leaderboard, cuda_l2_reported
from cuforge.results.store import Store, StoreError


def test_runs_candidates_evaluations_round_trip(tmp_path):
    s = build(tmp_path / "r.db")
    run = s.latest_run()
    assert run.id == "run-fixture" and run.status == "finished" and run.config == {"provider": "template"}
    evs = s.evaluations(run.id)
    assert len(evs) == 6 and evs[0]["speedups"]["cublas"] == pytest.approx(1.5)
    assert evs[2]["failure_kind"] == "side_stream"
    assert s.run_problems(run.id) == sorted(PROBLEMS)
    with pytest.raises(sqlite3.IntegrityError):  # one evaluation per candidate: a replayed write is refused
        s.add_evaluation(evs[0]["candidate_id"], run.id, {"problem_id": "x", "status": "ok"}, None)
    with pytest.raises(StoreError, match="no run 'nope'.*latest: run-fixture"):
        s.run("nope")
    s.add_llm_call(run.id, "level1/relu", "openai", "gpt-x", "ok", tokens_in=100, tokens_out=50, cost_usd=0.01)
    assert s.llm_usage(run.id) == {"calls": 1, "tokens_in": 100, "tokens_out": 50, "tokens_cached": 0, "cost_usd": 0.01,
                                   "estimated_calls": 0, "replies": 1, "errors": 0}


def _writer(path: str, worker: int, count: int) -> None:
    s = Store(path)
    for i in range(count):
        cid = s.add_candidate("run-c", "p", {"source": f"{worker}-{i}"}, f"{worker}-{i}")
        s.add_evaluation(cid, "run-c", {"problem_id": "p", "status": "ok"}, 0.0)


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "c.db"
    Store(path).create_run("run-c", None, {})
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(Store(path).evaluations("run-c")) == 160


def test_leaderboard_counts_missing_results_as_failures(tmp_path):
    s = build(tmp_path / "r.db")
    board = build_leaderboard(s.evaluations("run-fixture"), s.run_problems("run-fixture"), "run-fixture", "cublas")
    rows = {r.problem_id: r for r in board.rows}
    assert rows["hgemm/64_64_64"].best_speedup == pytest.approx(1.5) and rows["hgemm/64_64_64"].correct == 2
    assert rows["hgemm/64_64_64"].correct_rate == pytest.approx(2 / 3)
    assert rows["hgemm/1024_1024_1024"].best_speedup == pytest.approx(0.5)
    assert rows["level1/relu"].best_speedup is None and rows["level1/relu"].failures == {"wrong_output": 1}
    assert board.fast == {"fast_0": pytest.approx(2 / 3), "fast_1": pytest.approx(1 / 3), "fast_1.5": 0.0, "fast_2": 0.0}
    assert board.geomean_speedup == pytest.approx((1.5 * 0.5) ** 0.5)
    h = {r["problem_id"]: r for r in board.hgemm}
    assert h["hgemm/64_64_64"]["measured_vs_cublaslt"] == pytest.approx(1.25)
    assert h["hgemm/64_64_64"]["cuda_l2_reported_vs_cublas"] == cuda_l2_reported()[(64, 64, 64)]["cublas"]
    # Issue #5's size classes: 64^3 (2^18) and 1024^3 (2^30) are both "small"; none is >= 2^36.
    tg = board.hgemm_targets
    assert tg["shapes"] == 2 and tg["with_result"] == 2 and tg["small_shapes"] == 2 and tg["large_shapes"] == 0
    assert tg["geomean_vs_cublas_small"] == pytest.approx((1.5 * 0.5) ** 0.5) and tg["geomean_vs_cublas_large"] is None


def test_cuda_l2_reference_covers_the_grid():
    ref = cuda_l2_reported()
    assert len(ref) == 1000 and ref[(64, 64, 64)]["cublas"] == pytest.approx(1.859)


def test_leaderboard_and_export_cli(tmp_path):
    db = tmp_path / "r.db"
    build(db).close()
    r = run_cli("leaderboard", "--results", str(db), "--baseline", "cublas", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["run_id"] == "run-fixture" and data["fast"]["fast_1"] == pytest.approx(1 / 3)
    r = run_cli("leaderboard", "--results", str(db))
    assert r.returncode == 0 and "CUDA-L2" in r.stdout and "fast_1" in r.stdout
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"x.{fmt}"
        r = run_cli("results", "export", "run-fixture", "--format", fmt, "-o", str(out), "--results", str(db))
        assert r.returncode == 0, r.stderr
        frame = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
        assert len(frame) == 6 and "speedup_vs_cublas" in frame.columns
    r = run_cli("results", "export", "nope", "--results", str(db))
    assert r.returncode == 2 and "no run 'nope'" in r.stderr
    r = run_cli("leaderboard", "--results", str(tmp_path / "missing.db"))
    assert r.returncode == 2 and "no results store there" in r.stderr
    empty = tmp_path / "empty.db"
    Store(empty).close()
    r = run_cli("leaderboard", "--results", str(empty))
    assert r.returncode == 2 and "holds no runs" in r.stderr
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    r = run_cli("results", "list", "--results", str(bad))
    assert r.returncode == 2 and "not an SQLite database, so not a results store" in r.stderr
    assert bad.read_bytes() == b"garbage" * 1000  # nothing overwritten
