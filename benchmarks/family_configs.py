"""Benchmark: every seed config (plus N random valid ones) of the family that covers each named
built-in problem, evaluated by the sandbox against torch eager and torch.compile in one worker -
where a family's search space is good or bad on a problem, config by config.

    python benchmarks/family_configs.py level2/matmul_softmax level2/masked_scaled_softmax --random 2
    python benchmarks/family_configs.py hgemm/1024_1024_4096 --baseline cublas \
        --config '{"BM": 128, "BN": 128, "GROUP_M": 8, "SPLIT_K": 2, "REDUCE": "atomic", "EPI": "tma", "STAGES": 6}'
    python benchmarks/family_configs.py hgemm/64_64_1024 hgemm/256_256_4096 --baseline cublas --configs sweep.json
    python benchmarks/family_configs.py .kb/level1/87_conv_pointwise_2D.py --vary PERSIST=0,1 --seeds 2
    python benchmarks/family_configs.py .kb/level1/54_conv_standard_3D__square_input__square_kernel.py --family conv_direct

--family NAME times a family other than the preferred one (any that covers the problem).
--vary KNOB=V1,V2 times each seed once per value of KNOB (in a staged or pipeline family, the stage knob
ending in .KNOB), side by side in one worker: an A/B of one knob over real problems.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from _common import write_result


def load_sweep(path: str) -> list | dict:
    """A --configs file: a list of configs, or problem refs mapped to lists; bad files exit with the cause."""
    try:
        swept = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--configs {path}: {e}") from None
    if not isinstance(swept, (list, dict)):
        raise SystemExit(f"--configs {path}: expected a list of configs or an object of problem -> list")
    return swept


def parse_vary(text: str) -> tuple[str, list]:
    """--vary KNOB=V1,V2 -> (KNOB, [V1, V2]); a malformed value exits with the cause."""
    knob, sep, values = text.partition("=")
    if not sep or not knob or not values:
        raise SystemExit(f"--vary {text}: expected KNOB=V1,V2")
    try:
        return knob, [json.loads(v) for v in values.split(",")]
    except json.JSONDecodeError as e:
        raise SystemExit(f"--vary {text}: {e}") from None


def knob_keys(fam, problem, knob: str) -> list[str]:
    """The config keys that set `knob`: its own, or those of each stage (or kernel part) whose family has it."""
    if knob in fam.knobs:
        return [knob]
    if hasattr(fam, "stage_configs"):  # a pipeline: s0., s1., ...
        return [f"s{i}.{knob}" for i, s in enumerate(fam.matched(problem)) if knob in s.family.knobs]
    if hasattr(fam, "head"):  # a staged pair: h., t.
        return [f"{pre}.{knob}" for pre, part in (("h", fam.head), ("t", fam.tail)) if knob in part.knobs]
    if hasattr(fam, "kernel_configs"):  # a partition: p0., p1., ... for its kernel parts
        return [f"p{i}.{knob}" for i, part in enumerate(fam.matched(problem)) if part.family is not None and knob in part.family.knobs]
    return []


def fitted(fam, problem, config: dict, keys: list[str]) -> dict | None:
    """`config` if valid, else with fewer STAGES where that makes it valid (a knob that takes shared memory
    leaves fewer stages room): one stage's count lowered alone if that is enough, else every named stage's
    together; None if no count fits."""
    if fam.valid(config, problem):
        return config
    stage_keys = [k.rpartition(".")[0] + ".STAGES" if "." in k else "STAGES" for k in keys]
    stage_keys = [k for k in stage_keys if k in config]
    for key in stage_keys:
        for n in range(config[key] - 1, 0, -1):
            if fam.valid({**config, key: n}, problem):
                return {**config, key: n}
    while any(config[k] > 1 for k in stage_keys):
        config = {**config, **{k: config[k] - 1 for k in stage_keys if config[k] > 1}}
        if fam.valid(config, problem):
            return config
    return None


def varied(configs: list[dict], fam, problem, knob: str, values: list) -> list[dict]:
    """Each config once per value of `knob` (every stage's that has it), where valid, with fewer stages
    where only that fits."""
    keys = knob_keys(fam, problem, knob)
    if not keys:  # said, so that a misspelt knob is not read as an A/B that changed nothing
        print(f"--vary: {fam.name} has no knob {knob} on {problem.id}: its seeds run once each", file=sys.stderr)
        return list(configs)
    out: list[dict] = []
    for c in configs:
        for v in values:
            d = fitted(fam, problem, {**c, **{k: v for k in keys}}, keys)
            if d is not None and d not in out:
                out.append(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems", nargs="+", help="built-in problem refs, e.g. level2/matmul_softmax")
    ap.add_argument("--random", type=int, default=0, help="random valid configs beyond the seeds and given configs")
    ap.add_argument("--config", action="append", default=[], help="an extra config (JSON) to time after the seeds")
    ap.add_argument("--configs", help="a JSON file of extra configs, timed where valid: a list (for every "
                    "problem) or an object mapping problem refs to lists")
    ap.add_argument("--no-seeds", action="store_true", help="time only the --config/--configs configs")
    ap.add_argument("--baseline", action="append", default=[], help="baselines (default torch, torch.compile)")
    ap.add_argument("--vary", help="KNOB=V1,V2: each seed once per value of KNOB (values parsed as JSON)")
    ap.add_argument("--seeds", type=int, default=0, help="only the first N seeds (0: all)")
    ap.add_argument("--family", help="a covering family other than the preferred one (its name)")
    ap.add_argument("--precision", default=None, help="the precision contract the problems are judged under "
                    "and their families seeded for (fp32, pytorch, kernelbench; default fp32)")
    ap.add_argument("--name", default="family_configs")
    a = ap.parse_args()
    from cuforge.kernels.families import families_for
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import Supervisor

    from cuforge.sandbox.protocol.precision import CONTRACTS

    if a.precision is not None and a.precision not in CONTRACTS:
        raise SystemExit(f"--precision {a.precision}: not a contract (one of {', '.join(CONTRACTS)})")
    baselines = tuple(a.baseline) or ("torch", "torch.compile")
    cfg = EvalConfig(baselines=baselines, max_timing_s=1.5, profile=False, **({"precision": a.precision} if a.precision else {}))
    swept = load_sweep(a.configs) if a.configs else []
    vary = parse_vary(a.vary) if a.vary else None
    rows = []
    with Supervisor(gpu=0) as sup:
        for ref in a.problems:
            p = load_problem(ref)
            if a.precision:  # the families read it too (one TF32 product where the contract allows TF32)
                p = p.under(a.precision)
            fams, why = families_for(p)
            if a.family:
                fams = [f for f in fams if f.name == a.family]
                why = why or f"{a.family} does not cover it (covering: {', '.join(f.name for f in families_for(p)[0])})"
            if not fams:
                rows.append({"problem": ref, "status": "not covered", "message": why})
                print(rows[-1], flush=True)
                continue
            fam = fams[0]
            configs, rng = ([] if a.no_seeds else fam.seeds(p)[:a.seeds or None]), random.Random(0)
            if vary:
                configs = varied(configs, fam, p, *vary)
            for extra in map(json.loads, a.config):
                if not fam.valid(extra, p):
                    raise SystemExit(f"--config {extra} is not a valid {fam.name} config for {ref}")
                configs.append(extra)
            listed = swept.get(ref, []) if isinstance(swept, dict) else swept
            configs += [c for c in listed if fam.valid(c, p) and c not in configs]
            wanted = len(configs) + a.random
            for _ in range(200 * a.random):
                if len(configs) >= wanted:
                    break
                c = {k: rng.choice(v) for k, v in fam.knobs.items()}
                if fam.valid(c, p) and c not in configs:
                    configs.append(c)
            for c in configs:
                ev = sup.evaluate(p, fam.render(c, p), cfg)
                rows.append({"problem": ref, "family": fam.name, "config": c, "status": ev.status,
                             "message": ev.message[:200], **{f"vs_{b}": ev.speedups.get(b) for b in baselines},
                             "ms": ev.timings["candidate"].median_ms if "candidate" in ev.timings else None})
                print(rows[-1], flush=True)
    write_result(a.name, {"rows": rows})


if __name__ == "__main__":
    main()
