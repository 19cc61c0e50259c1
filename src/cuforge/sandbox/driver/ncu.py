"""Nsight Compute profiles of a candidate: a subprocess runs one forward inside an NVTX range under
`ncu --clock-control none`, and the compact metric set comes back as a dict.

Only metrics the installed ncu knows are requested (its --query-metrics list is read once), so a
renamed counter on another ncu version drops out instead of failing the profile.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import tempfile
from functools import lru_cache
from glob import glob
from pathlib import Path
from typing import Any

from cuforge.procenv import scrubbed_env
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate

def find_ncu() -> str | None:
    """Nsight Compute's command line: on PATH, or the newest under the usual install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(glob("/opt/nvidia/nsight-compute/*/ncu") + glob("/usr/local/cuda*/bin/ncu"))
    return candidates[-1] if candidates else None


RANGE = "cuforge_profile"
# label -> metric (base name + rollup). The first of several alternatives that exists is used.
WANTED: dict[str, list[str]] = {
    "duration_us": ["gpu__time_duration.sum"],
    "compute_sol_pct": ["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
    "memory_sol_pct": ["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"],
    "achieved_occupancy_pct": ["sm__warps_active.avg.pct_of_peak_sustained_active"],
    "dram_gbps": ["dram__bytes.sum.per_second"],
    "l2_hit_pct": ["lts__t_sector_hit_rate.pct"],
    "l1_hit_pct": ["l1tex__t_sector_hit_rate.pct"],
    "smem_bank_conflicts": ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"],
    "tensor_pipe_pct": ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                        "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active"],
}
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "math_pipe_throttle", "wait",
          "not_selected", "lg_throttle", "membar", "dispatch_stall", "no_instruction", "tex_throttle",
          "drain", "sleeping", "branch_resolving", "imc_miss", "selected")


class NcuError(RuntimeError):
    pass


@lru_cache(maxsize=1)
def available_metrics(ncu: str) -> frozenset[str]:
    r = subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=120)
    names = set()
    for line in r.stdout.splitlines():
        first = line.split(",")[0].strip().strip('"')
        if "__" in first:
            names.add(first)
    return frozenset(names)


def choose_metrics(known: frozenset[str]) -> dict[str, str]:
    chosen: dict[str, str] = {}
    for label, options in WANTED.items():
        for m in options:
            if not known or m.split(".")[0] in known:
                chosen[label] = m
                break
    for reason in STALLS:
        m = f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
        if not known or m.split(".")[0] in known:
            chosen[f"stall_{reason}"] = m
    return chosen


def parse_csv(text: str) -> list[dict[str, str]]:
    """ncu --csv --page raw: a header row, a units row, then one row per profiled kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[2:]
    return [dict(zip(header, r)) for r in body]


def _num(x: str) -> float | None:
    try:
        return float(x.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def summarize_rows(rows: list[dict[str, str]], metrics: dict[str, str]) -> dict[str, Any]:
    """Kernels weighted by their duration; the top stall reason by its weighted ratio."""
    durations = [(_num(r.get(metrics.get("duration_us", ""), "")) or 0.0) for r in rows]
    total = sum(durations) or 1.0
    out: dict[str, Any] = {"kernels": len(rows), "kernel_names": [r.get("Kernel Name", "")[:80] for r in rows][:5]}
    for label, m in metrics.items():
        vals = [_num(r.get(m, "")) for r in rows]
        pairs = [(v, d) for v, d in zip(vals, durations) if v is not None]
        if not pairs:
            continue
        if label == "duration_us":
            out[label] = sum(v for v, _ in pairs) / 1e3  # ns -> us
        elif label == "smem_bank_conflicts":
            out[label] = sum(v for v, _ in pairs)
        else:
            out[label] = sum(v * d for v, d in pairs) / total
    stalls = {k[6:]: v for k, v in out.items() if k.startswith("stall_")}
    for k in list(out):
        if k.startswith("stall_"):
            del out[k]
    if stalls:
        top = max(stalls, key=stalls.get)
        out["top_stall"] = f"{top} ({stalls[top]:.2f} cycles/issue)"
    return out


def jailed(cmd: list[str], tmp: str) -> list[str]:
    """The candidate runs under ncu inside the namespace jail too (its request directory bound in);
    Landlock cannot confine ncu's injection, and no jail needs the user's --unsafe-no-jail."""
    from cuforge.sandbox.driver.jail import LANDLOCK, NAMESPACES, bwrap_argv, jail_plan, unconfined_allowed

    plan = jail_plan()
    if plan.kind == NAMESPACES:
        return bwrap_argv(plan, cmd, gpu=True, shared_cache=None, extra_rw=(tmp,))
    if plan.kind == LANDLOCK:
        raise NcuError("--ncu runs the candidate under Nsight Compute, which the Landlock jail does not confine; "
                       "it needs the namespace jail")
    if not unconfined_allowed():
        raise NcuError(f"no jail for the profiled candidate ({plan.detail}); pass --unsafe-no-jail")
    return cmd


def ncu_profile(problem: Problem, candidate: Candidate, gpu: int = 0, timeout_s: float = 300.0) -> dict[str, Any]:
    ncu = find_ncu()
    if ncu is None:
        raise NcuError("ncu not found: install Nsight Compute")
    from cuforge.sandbox.driver.jail import python_executable
    from cuforge.sandbox.driver.payload import problem_payload

    metrics = choose_metrics(available_metrics(ncu))
    with tempfile.TemporaryDirectory(prefix="cuforge-ncu-") as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"problem": problem_payload(problem), "candidate": candidate.to_dict(), "range": RANGE}))
        src_root = str(Path(__file__).resolve().parents[3])
        env = scrubbed_env({"CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONPATH": src_root, "TMPDIR": tmp, "HOME": tmp})
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", f"{RANGE}/",
               "--metrics", ",".join(metrics.values()), "--csv", "--page", "raw",
               python_executable(), "-m", "cuforge.sandbox.host.ncu_target", str(req)]
        cmd = jailed(cmd, tmp)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise NcuError(f"ncu did not finish within {timeout_s:g} s") from None
    rows = parse_csv(r.stdout)
    if r.returncode != 0 or not rows:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise NcuError(f"ncu failed (exit {r.returncode}): {tail}")
    return summarize_rows(rows, metrics)


def harness_vs_ncu(harness_ms: float, ncu_summary: dict[str, Any]) -> float | None:
    """Ratio of the harness's median to ncu's summed kernel duration (1.0 = agreement)."""
    d = ncu_summary.get("duration_us")
    return harness_ms * 1e3 / d if d else None

