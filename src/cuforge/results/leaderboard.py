"""Leaderboards: per problem the best correct speedup against a chosen baseline, correct rate and
KernelBench's fast_p; for hgemm, a per-shape table against cuBLAS and cuBLASLt-autotune with
CUDA-L2's reported H100 speedups beside ours ("reported, their method" vs "measured here")."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuforge.rewards import fast_p, geomean

FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
DATA_DIR = Path(__file__).resolve().parents[1] / "data"


@dataclass
class ProblemRow:
    problem_id: str
    evaluations: int
    correct: int
    best_speedup: float | None  # vs the chosen baseline, best correct candidate
    best_candidate_id: int | None
    best_median_ms: float | None
    speedups_of_best: dict[str, float] = field(default_factory=dict)  # the best candidate vs every baseline
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def correct_rate(self) -> float:
        return self.correct / self.evaluations if self.evaluations else 0.0


@dataclass
class Leaderboard:
    run_id: str
    baseline: str
    rows: list[ProblemRow]
    problems: list[str]  # every problem of the run: those without a correct result count as failures
    fast: dict[str, float]
    geomean_speedup: float | None
    hgemm: list[dict[str, Any]] = field(default_factory=list)
    hgemm_targets: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, row in zip(d["rows"], self.rows):
            r["correct_rate"] = row.correct_rate
        return d


def baseline_words(baseline: str, precision: str | None) -> str:
    """What a baseline name means in a run under that precision contract (None: each problem's own)."""
    from cuforge.sandbox.protocol.precision import DEFAULT_COMPILED, DEFAULT_EAGER, STRICT_COMPILED, STRICT_EAGER

    contract = f"the {precision} contract" if precision else "each problem's contract (fp32 unless it declares one)"
    return {"torch": f"eager PyTorch under {contract}",
            "torch.compile": f"torch.compile under {contract}",
            STRICT_EAGER: "eager PyTorch with TF32 and reduced-precision reductions off",
            DEFAULT_EAGER: "eager PyTorch under its default flags (cuDNN TF32 on)",
            STRICT_COMPILED: "torch.compile with TF32 and reduced-precision reductions off",
            DEFAULT_COMPILED: "torch.compile under PyTorch's default flags (cuDNN TF32 on)",
            "cublas": "cuBLAS (torch.matmul)", "cublaslt": "cuBLASLt, algorithms autotuned"}.get(baseline, baseline)


def build_leaderboard(evaluations: list[dict[str, Any]], problems: list[str], run_id: str, baseline: str,
                      only: set[str] | None = None) -> Leaderboard:
    """Pure: evaluations as Store.evaluations returns them."""
    ids = [p for p in problems if only is None or p in only]
    by_problem: dict[str, list[dict[str, Any]]] = {p: [] for p in ids}
    for ev in evaluations:
        if ev["problem_id"] in by_problem:
            by_problem[ev["problem_id"]].append(ev)
    rows = [_problem_row(pid, evs, baseline) for pid, evs in by_problem.items()]
    best = {r.problem_id: r.best_speedup for r in rows}
    fast = {f"fast_{t:g}": fast_p(best, ids, t) for t in FAST_P_THRESHOLDS}
    board = Leaderboard(run_id, baseline, rows, ids, fast, geomean(v for v in best.values() if v))
    if any(p.startswith("hgemm/") for p in ids):
        board.hgemm = hgemm_table(rows)
        board.hgemm_targets = hgemm_targets(board.hgemm)
    return board


def _problem_row(pid: str, evs: list[dict[str, Any]], baseline: str) -> ProblemRow:
    ok = [e for e in evs if e["status"] == "ok" and baseline in (e["speedups"] or {})]
    failures: dict[str, int] = {}
    for e in evs:
        if e["status"] != "ok":
            failures[e["status"]] = failures.get(e["status"], 0) + 1
    top = max(ok, key=lambda e: e["speedups"][baseline], default=None)
    return ProblemRow(
        problem_id=pid, evaluations=len(evs), correct=sum(1 for e in evs if e["status"] == "ok"),
        best_speedup=top["speedups"][baseline] if top else None,
        best_candidate_id=top["candidate_id"] if top else None,
        best_median_ms=top["median_ms"] if top else None,
        speedups_of_best=dict(top["speedups"]) if top else {}, failures=failures,
    )


def cuda_l2_reported(variant: str = "offline") -> dict[tuple[int, int, int], dict[str, float]]:
    """CUDA-L2's reported H100 speedups per (M, N, K): over cuBLAS (faster layout) and over
    cuBLASLt-autotune (faster layout). Their method, not ours: see data/README.md."""
    path = DATA_DIR / f"cuda_l2_h100_{variant}.csv"
    out: dict[tuple[int, int, int], dict[str, float]] = {}
    with path.open() as f:
        for rec in csv.DictReader(f):
            m, n, k = (int(x) for x in rec["mnk"].split("_"))
            out[(m, n, k)] = {"cublas": float(rec["cuBLAS-max"]), "cublaslt": float(rec["cuBLASLt-auto-tuning-max"])}
    return out


def hgemm_table(rows: list[ProblemRow]) -> list[dict[str, Any]]:
    reported = cuda_l2_reported()
    table = []
    for r in rows:
        if not r.problem_id.startswith("hgemm/"):
            continue
        m, n, k = (int(x) for x in r.problem_id.split("/", 1)[1].split("_"))
        rep = reported.get((m, n, k), {})
        table.append({
            "problem_id": r.problem_id, "M": m, "N": n, "K": k,
            "best_ms": r.best_median_ms,
            "measured_vs_cublas": r.speedups_of_best.get("cublas"),
            "measured_vs_cublaslt": r.speedups_of_best.get("cublaslt"),
            "cuda_l2_reported_vs_cublas": rep.get("cublas"),
            "cuda_l2_reported_vs_cublaslt": rep.get("cublaslt"),
        })
    return table


SMALL_MNK, LARGE_MNK = 2**30, 2**36  # issue #5's size classes for the hgemm targets


def hgemm_targets(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Geomean speedups of the per-shape table: all shapes, M*N*K <= 2^30 and M*N*K >= 2^36, vs cuBLAS
    and cuBLASLt-autotune. A shape without a correct result counts as missing, never as 1.0."""
    small = [r for r in table if r["M"] * r["N"] * r["K"] <= SMALL_MNK]
    large = [r for r in table if r["M"] * r["N"] * r["K"] >= LARGE_MNK]

    def gm(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rows if r[key]]
        return geomean(vals) if vals else None

    return {"shapes": len(table), "with_result": sum(1 for r in table if r["measured_vs_cublas"]),
            "geomean_vs_cublas": gm(table, "measured_vs_cublas"), "geomean_vs_cublaslt": gm(table, "measured_vs_cublaslt"),
            "small_shapes": len(small), "geomean_vs_cublas_small": gm(small, "measured_vs_cublas"),
            "large_shapes": len(large), "geomean_vs_cublas_large": gm(large, "measured_vs_cublas")}
