"""KernelBench fidelity (issue #22): every level 1-3 file of ../shared/kernelbench/ validated, then
evaluated on one GPU with PyTorch's own implementation as the candidate (policy any): status, the
evaluation's peak device memory next to eager PyTorch's own footprint, eager time, and KernelBench's
reported H100 eager time for the same file where it publishes one. Also KernelBench's example
solutions (must be ok) and adversarial kernels (must be rejected, named).

    python benchmarks/kernelbench.py --levels 1,2,3 --shard 1/3           # one device call per shard
    python benchmarks/kernelbench.py --examples --adversarial
    python benchmarks/kernelbench.py --files 19_ReLU,23_Softmax --levels 1 --name kb_oom_subset

Results: benchmarks/results/NAME.json (and $OUT/NAME.json), written after every file so that a
shard cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import ROOT, stamp

# ../shared/kernelbench beside the checkout; a copy carried to a device machine in .kb/; or $CUFORGE_KERNELBENCH.
KB = Path(os.environ.get("CUFORGE_KERNELBENCH") or next(
    (p for p in (ROOT.parent / "shared" / "kernelbench", ROOT / ".kb") if p.is_dir()), ROOT.parent / "shared" / "kernelbench"))
KB_TIMINGS = ROOT / "benchmarks" / "data" / "kernelbench_h100_modal_eager_ms.csv"
# Each example solution with the problem it solves.
EXAMPLES = {
    "few_shot_model_new_ex_add.py": "few_shot_model_ex_add.py",
    "few_shot_model_new_ex_fuse_gelu.py": "few_shot_model_ex_fuse_gelu.py",
    "few_shot_model_new_ex_tiled_matmul.py": "few_shot_model_ex_tiled_matmul.py",
    "few_shot_model_new_ex_mnist2.py": "few_shot_model_ex_mnist2.py",
    "few_shot_model_new_ex_flash_attn.py": "few_shot_model_ex_flash_attn.py",
    "model_new_ex_add_triton.py": "model_ex_add.py",
    "model_new_ex_add_cute.py": "model_ex_add.py",
    "model_new_ex_add_tilelang.py": "model_ex_add.py",
}
ADVERSARIAL_PROBLEM = KB / "level1" / "1_Square_matrix_multiplication_.py"


def kb_timings() -> dict[tuple[str, str], float]:
    """(level, file) -> KernelBench's reported eager mean in ms on an H100 (their harness, their method)."""
    if not KB_TIMINGS.is_file():
        return {}
    with open(KB_TIMINGS) as f:
        return {(r["level"], r["file"]): float(r["mean_ms"]) for r in csv.DictReader(f)}


def as_candidate(problem_source: str) -> str:
    """PyTorch's own implementation as the candidate: the problem's Model, renamed."""
    return problem_source + "\n\nclass ModelNew(Model):\n    pass\n"


def shard_of(items: list[Any], spec: str | None) -> list[Any]:
    if not spec:
        return items
    i, n = (int(x) for x in spec.split("/"))
    return [x for k, x in enumerate(items) if k % n == i - 1]


def prevalidate(paths: list[Path], inspectors: int) -> None:
    """Inspect the files in parallel first (one inspector process per chunk); the inspection cache
    then answers each evaluation's own load at once, so the GPU waits on no CPU reference."""
    from concurrent.futures import ThreadPoolExecutor

    from cuforge.problems.loader import inspect_files

    t0 = time.perf_counter()
    n = max(1, min(inspectors, len(paths)))
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(inspect_files, [paths[i::n] for i in range(n)]))
    print(f"validated {len(paths)} files with {n} inspectors in {time.perf_counter() - t0:.0f} s", flush=True)


def row_of(ev: Any, extra: dict[str, Any]) -> dict[str, Any]:
    c = ev.correctness
    t = ev.timings
    return {**extra, "status": ev.status, "message": ev.message[:300], "wall_s": round(ev.wall_s, 2),
            "peak_device_gib": round(c.get("peak_device_bytes", 0) / 2**30, 3),
            "eager_footprint_gib": round(c.get("eager_footprint_bytes", 0) / 2**30, 3),
            "reference": c.get("reference"), "timing_input_sets": c.get("timing_input_sets"),
            "eager_ms": t["torch"].median_ms if "torch" in t else None,
            "candidate_ms": t["candidate"].median_ms if "candidate" in t else None,
            "method": t["candidate"].method if "candidate" in t else None,
            "graph_fallback": c.get("graph_fallback")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="", help="comma list of 1,2,3")
    ap.add_argument("--files", default="", help="comma list of file-name prefixes (e.g. 19_ReLU,23_Softmax)")
    ap.add_argument("--shard", default=None, help="i/n: every n-th file starting at the i-th")
    ap.add_argument("--examples", action="store_true")
    ap.add_argument("--adversarial", action="store_true")
    ap.add_argument("--max-timing", type=float, default=2.0, help="seconds of timing per evaluation")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--trials", type=int, default=5, help="correctness trials per evaluation (the house rule is 5)")
    ap.add_argument("--name", default="kernelbench")
    ap.add_argument("--cpu", action="store_true", help="the CPU test mode (no GPU): validation and correctness only")
    ap.add_argument("--inspectors", type=int, default=4,
                    help="files validated in parallel up front (each inspector runs full-size references on the CPU)")
    a = ap.parse_args()

    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.protocol.candidate import Candidate
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    device = "cpu" if a.cpu else "cuda"
    sup = Supervisor(gpu=0, cpu_mode=a.cpu)
    cfg = EvalConfig(device=device, baselines=("torch",), max_timing_s=a.max_timing, timeout_s=a.timeout,
                     min_samples=10, max_samples=100, trials=a.trials)
    timings = kb_timings()
    out: dict[str, Any] = {"benchmark": a.name, **stamp(), "config": vars(a), "rows": []}
    out_path = ROOT / "benchmarks" / "results" / f"{a.name}.json"

    def save() -> None:
        text = json.dumps(out, indent=1, default=str)
        out_path.write_text(text)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], f"{a.name}.json").write_text(text)

    def evaluate(kind: str, level: str, problem_path: Path, source: str | None, policy: str | None) -> None:
        """policy None: the problem's own (KernelBench files: mixed, KernelBench's rule)."""
        t0 = time.perf_counter()
        base = {"kind": kind, "level": level, "file": problem_path.name}
        try:
            problem = load_problem(str(problem_path))
        except Exception as e:  # noqa: BLE001 - a file that does not validate is a row, not a crash
            out["rows"].append({**base, "status": "invalid", "message": str(e)[:300]})
            print(f"{level}/{problem_path.name}: invalid - {e}", flush=True)
            save()
            return
        if policy is not None:
            problem = replace(problem, meta=replace(problem.meta, policy=policy))
        cand = Candidate(as_candidate(problem.source) if source is None else source, "module", proposer="benchmark")
        ev = sup.evaluate(problem, cand, cfg)
        row = row_of(ev, {**base, "policy": problem.meta.policy, "validate_s": round(time.perf_counter() - t0 - ev.wall_s, 2),
                          "kernelbench_h100_eager_ms": timings.get((level, problem_path.name))})
        out["rows"].append(row)
        print(f"{level}/{problem_path.name}: {ev.status} peak {row['peak_device_gib']} GiB (eager "
              f"{row['eager_footprint_gib']} GiB) eager {row['eager_ms']} ms {ev.message[:120]}", flush=True)
        save()

    files: list[tuple[str, Path]] = []
    for level in [x for x in a.levels.split(",") if x]:
        d = KB / f"level{level}"
        names = sorted(d.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
        if a.files:
            wanted = [w for w in a.files.split(",") if w]
            names = [p for p in names if any(p.name.startswith(w) for w in wanted)]
        files += [(f"level{level}", p) for p in names]
    chosen = shard_of(files, a.shard)
    prevalidate([p for _, p in chosen], a.inspectors)
    for level, path in chosen:
        evaluate("pytorch_as_candidate", level, path, None, "any")
    if a.examples:
        for sol, prob in EXAMPLES.items():
            evaluate("example", "examples", KB / "examples" / prob, (KB / "examples" / sol).read_text(), None)
            out["rows"][-1]["solution"] = sol
    if a.adversarial:
        for adv in sorted((KB / "adversarial").glob("*.py")):
            evaluate("adversarial", "adversarial", ADVERSARIAL_PROBLEM, adv.read_text(), None)
            out["rows"][-1]["solution"] = adv.name
    sup.close()
    rows = out["rows"]
    out["summary"] = {"files": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
                      "out_of_memory": sum("out of GPU memory" in (r.get("message") or "") for r in rows),
                      "max_peak_gib": max((r.get("peak_device_gib") or 0 for r in rows), default=0)}
    save()
    print(json.dumps(out["summary"]))


if __name__ == "__main__":
    main()
