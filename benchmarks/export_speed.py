"""Benchmark: do exported ops keep the search's speedups? A template search over hgemm shapes, an
export of its winners as a torch package, then the package's own bench.py on the same GPU: each
tuned shape's exported op against torch.matmul (cuBLAS), interleaved, L2 flushed, device time; and
the shapes left to the fallback, to show the dispatch costs nothing there.

    python benchmarks/export_speed.py [--generations 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import write_result

SHAPES = ["hgemm/64_64_64", "hgemm/64_64_1024", "hgemm/128_128_128", "hgemm/256_256_256", "hgemm/64_1024_64",
          "hgemm/512_512_512", "hgemm/1024_1024_1024", "hgemm/1024_64_1024"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=6)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    from cuforge.agent.config import RunConfig
    from cuforge.agent.run import execute
    from cuforge.export import export_run
    from cuforge.results.store import Store

    work = Path(tempfile.mkdtemp(prefix="cuforge-export-bench-"))
    store = Store(work / "cuforge.db")
    run_id, search = execute(RunConfig(suite="hgemm-small", problems=SHAPES, islands=1, generations=a.generations,
                                       gpus="0"), store, None, False)
    result = export_run(work / "cuforge.db", run_id, "torch", work / "pkg", "bench_ops")
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(work / "pkg")], check=True)
    out_json = work / "bench.json"
    subprocess.run([sys.executable, str(work / "pkg" / "bench.py"), "--reps", str(a.reps), "--json", str(out_json)],
                   check=True, env=dict(os.environ, PYTHONPATH=str(site)), cwd=work)
    bench = json.loads(out_json.read_text())
    write_result("export_speed", {"run_id": run_id, "shapes": SHAPES, "generations": a.generations,
                                  "search_best_vs_torch": {p: s.best_speedup for p, s in search.states.items()},
                                  "export": result.summary(), "bench": bench})


if __name__ == "__main__":
    main()
