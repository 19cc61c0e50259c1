"""Whether a partition's cuts and the values fed between its parts compute the forward, on the CPU: each
file's partition (kernels/partition.py) rendered with every part run by PyTorch, written out from the
trace, against the file's own Model on the file's own inputs (same seed, same weights). Files whose
inputs exceed --max-elements are listed, not run. No GPU is needed; the kernels are not run.

    python benchmarks/partition_replay.py [DIR]   # default ../shared/kernelbench/level3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from pathlib import Path

from _common import ROOT, write_result


def replay(path: Path, max_elements: int) -> dict:
    import torch

    from cuforge.kernels.families import PARTITION
    from cuforge.problems.loader import load_files

    problems, skipped = load_files([path], timeout_s=600)
    if skipped:
        return {"outcome": "not loaded", "why": skipped[0].reason.splitlines()[0]}
    p = problems[0]
    parts = PARTITION.match(p)
    if isinstance(parts, str):
        return {"outcome": "not cut", "why": parts[:200]}
    row = {"nodes": len(p.graph), "parts": len(parts), "kernel_parts": sum(q.family is not None for q in parts)}
    ns: dict = {"__name__": "problem"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    torch.manual_seed(1)
    inputs = ns["get_inputs"]()
    size = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    if size > max_elements:
        return {**row, "outcome": "not run", "why": f"inputs of {size / 1e6:.0f}M elements"}
    cand = types.ModuleType("candidate")
    cand.__dict__["__cuforge_problem__"] = types.SimpleNamespace(Model=ns["Model"])
    exec(compile(PARTITION.in_pytorch(p), "<candidate>", "exec"),
         cand.__dict__)
    torch.manual_seed(0)
    ref = ns["Model"](*ns["get_init_inputs"]())
    torch.manual_seed(0)
    new = cand.ModelNew(*ns["get_init_inputs"]())
    t0 = time.perf_counter()
    with torch.no_grad():
        want, got = ref(*inputs), new(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    same = len(want) == len(got) and all(
        a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-5, rtol=1e-5, equal_nan=True)
        for a, b in zip(want, got))
    worst = max(((a.double() - b.double()).abs().max().item() for a, b in zip(want, got) if a.shape == b.shape), default=None)
    return {**row, "outcome": "same" if same else "differs", "max_abs_diff": worst,
            "run_s": round(time.perf_counter() - t0, 2)}


def one_file(path: Path, max_elements: int, memory_gib: float) -> dict:
    """replay() in a child process under an address-space limit: a network too large for this machine's
    memory fails its own row, not the run."""
    code = (f"import json, resource, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"resource.setrlimit(resource.RLIMIT_AS, ({int(memory_gib * 2**30)}, {int(memory_gib * 2**30)})); "
            f"from partition_replay import replay; from pathlib import Path; "
            f"print(json.dumps(replay(Path({str(path)!r}), {max_elements})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if done.returncode == 0 and done.stdout.strip():
        return json.loads(done.stdout.strip().splitlines()[-1])
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    why = f"out of memory under {memory_gib:g} GiB" if "MemoryError" in done.stderr or "alloc" in tail.lower() else tail[:200]
    return {"outcome": "error", "why": why}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", nargs="?", default=str(ROOT.parent / "shared" / "kernelbench" / "level3"))
    ap.add_argument("--max-elements", type=float, default=3e6)
    ap.add_argument("--memory-gib", type=float, default=16.0, help="address space per file's child process")
    ap.add_argument("--name", default="partition_replay")
    a = ap.parse_args()
    rows = []
    for path in sorted(Path(a.folder).glob("*.py"), key=lambda q: int(q.name.split("_")[0]) if q.name[0].isdigit() else 0):
        row = {"file": path.name, **one_file(path, int(a.max_elements), a.memory_gib)}
        print(row, flush=True)
        rows.append(row)
    count = {k: sum(r["outcome"] == k for r in rows) for k in ("same", "differs", "error", "not run", "not cut", "not loaded")}
    write_result(a.name, {"folder": Path(a.folder).name, "files": len(rows), "max_elements": a.max_elements, **count,
                          "rows": rows})


if __name__ == "__main__":
    main()
