"""Where the whole-GPU norms lose to the copy (issue #23): KernelBench's group norm (`rows_team`), batch
norm (`batch_norm_team`) and layer norm (`layer_norm_team`), each family's first seed as rendered beside
text edits of it, every variant timed in one process, interleaved round by round with torch's copy of the
same bytes (CUDA events; median, p20, p80).

With --config FILE:NAME='{"KNOB": value}' (repeatable; FILE: the start of a file's name, as "35"), that file's
first seed with those knobs changed is rendered from the current template and timed beside it as variant
NAME (it must still be right).

With --before REV, the family's template at that git revision (or in a folder of templates) is rendered beside
the current one ("before" and "as_rendered"), and the edits below, written for the templates of 480882c,
apply to the before rendering.

Edits are of two kinds. Variants must still be right: each is checked against eager PyTorch first.
Diagnostics are wrong by design and only say what a phase costs: `no_wait` passes every team barrier
without waiting (the time of the barriers), `no_stats` drops the statistics' arithmetic (in batch norm
also the tail's first read, whose only use they are: the compiler drops those loads), `no_reread`
writes batch norm's tail without reading it again.

    python benchmarks/norm_team_probe.py --name norm_team_probe
    python benchmarks/norm_team_probe.py --before 480882c --name norm_team_ab

Results: benchmarks/results/NAME.json (and $OUT/NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from _common import write_result
from kernelbench_bandwidth import problem_bytes
from rows_cluster_probe import time_interleaved

NO_WAIT = {"if (seen >= target) break;": "break;"}
# Each file: the family expected first on it, and its edits: name -> ({old: new}, is_diagnostic).
EDITS: dict[str, tuple[str, dict[str, tuple[dict[str, str], bool]]]] = {
    "35_GroupNorm_.py": ("rows_team", {
        "no_wait": (NO_WAIT, True),
        "no_stats": ({"s1 += v; s2 += (double)v * v;": ""}, True),
    }),
    "33_BatchNorm.py": ("batch_norm_team", {
        "no_wait": (NO_WAIT, True),
        "no_stats": ({"{ s1 += v; s2 += (double)v * v; }": "{ }"}, True),
        "no_reread": ({"const vec_t v = __ldcs(p);": "const vec_t v = {};"}, True),
    }),
    "40_LayerNorm.py": ("layer_norm_team", {
        "no_wait": (NO_WAIT, True),
        "no_stats": ({"s1 += v; s2 += (double)v * v;": ""}, True),
        # The grid's 132 partials: 2 a lane loaded at once, the rest one round trip after another (the
        # weight's registers set TEAM_LOADS to 2); 3 or 5 at once instead.
        "team_loads3": ({"for (int j = 0; j < 2; ++j) {": "for (int j = 0; j < 3; ++j) {",
                         "for (int k = lane + 64; k < team; k += 32)": "for (int k = lane + 96; k < team; k += 32)"}, False),
        "team_loads5": ({"for (int j = 0; j < 2; ++j) {": "for (int j = 0; j < 5; ++j) {",
                         "for (int k = lane + 64; k < team; k += 32)": "for (int k = lane + 160; k < team; k += 32)"}, False),
    }),
}


def model_call(cand: Any, mod: Any, inputs: list[Any], tag: str) -> Callable[[], Any]:
    """A call on `inputs` of the candidate module's ModelNew, built as the judge builds it."""
    import torch

    from cuforge.sandbox.protocol.loading import candidate_class

    torch.manual_seed(1)
    model = candidate_class(cand.module_source(), mod, tag)(*mod.get_init_inputs()).cuda()
    return lambda: model(*inputs)


def apply_edits(source: str, edits: dict[str, str], name: str) -> str:
    for old, new in edits.items():
        if old not in source:
            raise SystemExit(f"edit {name}: {old[:60]!r} is not in the rendered source (the template changed)")
        source = source.replace(old, new)
    return source


def template_at(before: str, family: Any) -> str:
    """The family's template at a git revision, or from a folder of templates where no git history travels."""
    name = getattr(family, "template", family.name)
    if Path(before).is_dir():
        return (Path(before) / f"{name}.cu.j2").read_text()
    return subprocess.run(["git", "show", f"{before}:src/cuforge/kernels/{name}.cu.j2"], capture_output=True, text=True,
                          check=True).stdout


def probe_file(path: Path, rounds: int, before: str | None, configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    configs = {name: knobs for (prefix, name), knobs in configs.items() if path.name.startswith(prefix + "_")}
    import torch

    from cuforge.kernels.families import families_for
    from cuforge.problems.loader import load_files
    from cuforge.sandbox.protocol.loading import problem_module

    expected, edits = EDITS[path.name]
    (problem,), _ = load_files([path])
    families, why = families_for(problem)
    fam = next((f for f in families if f.name == expected), None)
    if fam is None:
        raise SystemExit(f"{path.name}: {expected} does not cover it ({why or [f.name for f in families]})")
    mod = problem_module(problem.source)
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    torch.manual_seed(1)
    with torch.no_grad():
        want = mod.Model(*mod.get_init_inputs()).cuda()(*inputs)
    config = fam.seeds(problem)[0]
    now = fam.render(config, problem)
    base = fam.render(config, problem, template_text=template_at(before, fam)) if before else now
    calls: dict[str, Callable[[], Any]] = {}
    errors: dict[str, float] = {}
    src = inputs[0]
    dst = torch.empty_like(src)
    calls["torch_copy"] = lambda: dst.copy_(src)
    variants = {"as_rendered": ({}, False), **({"before": ({}, False)} if before else {}), **edits,
                **{name: ({}, False) for name in configs}}
    for name, knobs in configs.items():
        if not fam.valid({**config, **knobs}, problem):
            raise SystemExit(f"--config {name}: {fam.name} calls {dict(config, **knobs)} invalid for {path.name}")
    with torch.no_grad():
        for name, (edit, diagnostic) in variants.items():
            if name in configs:
                cand = fam.render({**config, **configs[name]}, problem)
            else:
                cand = now if name == "as_rendered" else replace(base, source=apply_edits(base.source, edit, name))
            call = model_call(cand, mod, inputs, f"probe_{path.stem}_{name}")
            got = call()
            torch.cuda.synchronize()
            errors[name] = (got - want).abs().max().item()
            if not diagnostic and errors[name] > 1e-3:
                raise SystemExit(f"{path.name} {name}: off by {errors[name]:.3g} (a variant must be right)")
            calls[name] = call
        del want
        timed = time_interleaved(calls, rounds)
    copy_gbs = 2 * src.numel() * src.element_size() / (timed["torch_copy"]["median_ms"] * 1e-3) / 1e9
    need = problem_bytes(problem)
    for name, v in timed.items():
        if name != "torch_copy":
            v["vs_copy"] = need / (v["median_ms"] * 1e-3) / 1e9 / copy_gbs
            v["max_abs_error"] = errors[name]
            v["diagnostic"] = variants[name][1]
        print(f"{path.name:20s} {name:14s} {v['median_ms']:.4f} ms ({v['p20_ms']:.4f}-{v['p80_ms']:.4f})"
              + (f"  {v['vs_copy']:.3f} of copy" if "vs_copy" in v else ""), flush=True)
    return {"file": path.name, "family": fam.name, "config": now.meta["config"], "configs": configs, "before": before, "copy_gbs": copy_gbs,
            "bytes": need, "timed": timed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", default=".kb/level1")
    ap.add_argument("--files", nargs="*", default=list(EDITS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--before", help="a git revision, or a folder of templates, whose template is timed beside the current one")
    ap.add_argument("--config", action="append", default=[], metavar='FILE:NAME={"KNOB": value}',
                    help="FILE:NAME={...}: that file's first seed with these knobs changed, timed as variant NAME")
    ap.add_argument("--name", default="norm_team_probe")
    a = ap.parse_args()
    configs: dict[tuple[str, str], dict[str, Any]] = {}
    for item in a.config:
        head, sep, text = item.partition("=")
        prefix, colon, name = head.partition(":")
        try:
            knobs = json.loads(text)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--config {item!r}: not FILE:NAME=<json object> ({e})") from None
        if not sep or not colon or not isinstance(knobs, dict):
            raise SystemExit(f"--config {item!r}: not FILE:NAME=<json object>")
        configs[(prefix, name)] = knobs
    os.environ.setdefault("CUFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="cuforge-bench-cache-"))
    import torch

    unknown = [f for f in a.files if f not in EDITS]
    if unknown:
        raise SystemExit(f"--files: no edits for {', '.join(unknown)} (known: {', '.join(EDITS)})")
    rows = []
    for f in a.files:
        rows.append(probe_file(Path(a.kb) / f, a.rounds, a.before, configs))
        torch.cuda.empty_cache()
    write_result(a.name, {"rounds": a.rounds, "before": a.before, "files": rows})


if __name__ == "__main__":
    main()
