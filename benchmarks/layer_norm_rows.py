"""What limits the whole-GPU layer norm (`layer_norm_team`): every valid config on KernelBench's shape
(16 rows of 64 x 256 x 256) with its weight and bias, and the same without a bias (nothing of the bias read
from L2 each row), evaluated in one jailed worker beside eager PyTorch; each against the device-to-device
copy bandwidth measured in the run.

    python benchmarks/layer_norm_rows.py --name layer_norm_rows

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from pathlib import Path

from _common import write_result
from kernelbench_bandwidth import copy_bandwidth_gbs, problem_bytes

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((64, 256, 256), bias={bias})

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.rand(16, 64, 256, 256)]


def get_init_inputs():
    return []
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--name", default="layer_norm_rows")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.layer_norm_team import LayerNormTeam
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    fam = LayerNormTeam()
    copy = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    cfg = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False)
    folder = Path(tempfile.mkdtemp(prefix="ln-rows-"))
    rows = []
    with Supervisor(gpu=0) as sup:
        for bias in (True, False):
            path = folder / f"ln_bias_{bias}.py"
            path.write_text(PROBLEM.format(bias=bias))
            (problem,), _ = load_files([path])
            for values in itertools.product(*fam.knobs.values()):
                config = dict(zip(fam.knobs, values))
                if not fam.valid(config, problem):
                    continue
                ev = sup.evaluate(problem, fam.render(config, problem), cfg)
                t, eager = ev.timings.get("candidate"), ev.timings.get("torch")
                row = {"bias": bias, "config": config, "status": ev.status, "ms": t.median_ms if t else None,
                       "eager_ms": eager.median_ms if eager else None,
                       "vs_copy": problem_bytes(problem) / (t.median_ms * 1e-3) / 1e9 / copy if t else None}
                rows.append(row)
                print(row, flush=True)
    write_result(a.name, {"copy_gbs": copy, "rows": rows})


if __name__ == "__main__":
    main()
