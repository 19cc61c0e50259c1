"""Where a whole-GPU batch norm (`batch_norm_team`) beats the two-pass one (`batch_norm`): training-mode
BatchNorm2d over 1 GiB inputs whose channels are 4 to 64 MiB, both families' first seeds evaluated in one
jailed worker with eager PyTorch timed beside each, interleaved size by size. `batch_norm_team` takes
only channels of at least MIN_CHANNEL_BYTES; here it is rendered for the smaller ones too.

    python benchmarks/batch_norm_channels.py --name batch_norm_channels
    python benchmarks/batch_norm_channels.py --team-config '{"BLOCK": 256, "UNROLL": 4, "VEC": 4, "KEEP": 1, "REGS": 32, "BACK": 1}'

Each --team-config is timed after the first seed (under "batch_norm_team_configs").

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from _common import write_result

# (N, C, H, W): 16 images, channels of 4, 8, 16, 32 and 64 MiB, 1 GiB in all.
SHAPES = ((16, 256, 256, 256), (16, 128, 256, 512), (16, 64, 512, 512), (16, 32, 512, 1024), (16, 16, 1024, 1024))

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.rand({n}, {c}, {h}, {w})]


def get_init_inputs():
    return [{c}]
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-timing", type=float, default=0.5)
    ap.add_argument("--team-config", action="append", default=[], help="another batch_norm_team config (JSON)")
    ap.add_argument("--name", default="batch_norm_channels")
    a = ap.parse_args()
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    from cuforge.kernels.batch_norm import BatchNorm, match_batch_norm
    from cuforge.kernels.batch_norm_team import BatchNormTeam
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    class AnyChannels(BatchNormTeam):  # the same kernels, without the family's lower bound on channel size
        def match(self, problem):  # type: ignore[no-untyped-def]
            return match_batch_norm(problem)

    extra = [json.loads(c) for c in a.team_config]
    cfg = EvalConfig(baselines=("torch",), max_timing_s=a.max_timing, profile=False)
    folder = Path(tempfile.mkdtemp(prefix="bn-channels-"))
    rows = []
    with Supervisor(gpu=0) as sup:
        for n, c, h, w in SHAPES:
            path = folder / f"bn_{n}x{c}x{h}x{w}.py"
            path.write_text(PROBLEM.format(n=n, c=c, h=h, w=w))
            (problem,), _ = load_files([path])
            row = {"shape": [n, c, h, w], "channel_mib": n * h * w * 4 / 2**20}
            for fam in (BatchNorm(), AnyChannels()):
                config = fam.seeds(problem)[0]
                ev = sup.evaluate(problem, fam.render(config, problem), cfg)
                t, eager = ev.timings.get("candidate"), ev.timings.get("torch")
                row[fam.name] = {"config": config, "status": ev.status, "ms": t.median_ms if t else None,
                                 "p20_ms": t.p20_ms if t else None, "p80_ms": t.p80_ms if t else None,
                                 "eager_ms": eager.median_ms if eager else None}
            team_fam, row["batch_norm_team_configs"] = AnyChannels(), []
            for config in extra:
                if not team_fam.valid(team_fam.complete(config), problem):
                    raise SystemExit(f"--team-config {config}: not a valid batch_norm_team config for {path.name}")
                ev = sup.evaluate(problem, team_fam.render(config, problem), cfg)
                t = ev.timings.get("candidate")
                row["batch_norm_team_configs"].append({"config": config, "status": ev.status, "ms": t.median_ms if t else None})
                print(f"    {config}: {ev.status} {t.median_ms if t else None} ms", flush=True)
            two, team = row["batch_norm"]["ms"], row["batch_norm_team"]["ms"]
            row["team_speedup"] = two / team if two and team else None
            rows.append(row)
            print(f"  {row['channel_mib']:.0f} MiB channels: batch_norm {two} ms, batch_norm_team {team} ms", flush=True)
    write_result(a.name, {"rows": rows})


if __name__ == "__main__":
    main()
