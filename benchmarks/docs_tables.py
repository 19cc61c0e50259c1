"""The tables of docs/benchmarks.md, made from benchmarks/results/ and nothing else.

Each generated table in the page sits between two markers naming the command that prints it:

    <!-- table: python benchmarks/docs_tables.py throughput eval_throughput_s42 -->
    | ... |
    <!-- /table -->

    python benchmarks/docs_tables.py             # rewrite every marked table from its command
    python benchmarks/docs_tables.py --check     # exit 1 naming each table that is not what its command prints
    python benchmarks/docs_tables.py NAME RESULT...   # print one table (the commands the markers name)

The tables printed here (NAME): compile, throughput, repeatability, jail, hgemm, level3, gpu_checks, conv_half,
models, dtype_coverage, conv_tf32, replay, skinny, models_search, both_flags, attention, configs.
Commands run from the repository root; the KernelBench search tables come from
kernelbench_search_summary.py.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- table: (?P<cmd>[^\n]+?) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def load(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"no result {path.relative_to(ROOT)}")
    return json.loads(path.read_text())


def row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*names: str) -> list[str]:
    return [row(*names), "|" + "---|" * len(names)]


def stamp(d: dict[str, Any]) -> str:
    return f"{d.get('gpu') or 'CPU'}, torch {d.get('torch', '?')}, {str(d.get('date', '?'))[:10]}"


# ------------------------------------------------------------------------------------------- tables

def compile_table(name: str = "compile_latency") -> list[str]:
    d = load(name)
    return [*header("path", "time", "target"),
            row("NVRTC -> sm_90a cubin, cold, median of distinct sources",
                f"{1e3 * d['fast_runtime_cold_median_s']:.0f} ms (max {1e3 * d['fast_runtime_cold_max_s']:.0f} ms)", "<= 0.5 s"),
            row("first compile in a fresh process (loads NVRTC)", f"{1e3 * d['fast_runtime_first_in_process_s']:.0f} ms", ""),
            row("cached in memory", f"{d['fast_runtime_memory_cached_median_ms']:.2f} ms", "<= 5 ms"),
            row("cached on disk", f"{d['fast_runtime_disk_cached_median_ms']:.2f} ms", "<= 5 ms"),
            row("cubin -> loaded kernel (first use)", f"{1e3 * d['module_load_s']:.0f} ms", ""),
            row("`torch.utils.cpp_extension.load_inline`, same kernel", f"{d['load_inline_cold_s']:.1f} s", ""),
            "", f"({stamp(d)}; `{name}.json`)"]


def throughput_table(*names: str) -> list[str]:
    out = header("judge", "evaluations", "all ok", "evaluations per GPU-minute", "median s per evaluation", "GPU, torch, date", "result")
    for name in names or ("eval_throughput",):
        d = load(name)
        out.append(row(d.get("judge", "inprocess"), d["evaluations"], "yes" if d["all_ok"] else "no",
                       f"{d['evals_per_gpu_minute']:.0f}", f"{d['median_eval_s']:.3f}", stamp(d), f"`{name}.json`"))
    return out


def compile_ahead_table(name: str = "compile_ahead") -> list[str]:
    """compile_ahead.py: a template search's evaluation rate with its kernels compiled ahead of the GPU's
    turn and in it, problem by problem, side by side in one run."""
    d = load(name)
    out = header("problem", "family", "configs", "compiled in the turn: evaluations/min (s loading in the turn)",
                 "compiled ahead: evaluations/min (cubins used)", "ahead / in the turn", "all ok")
    ratios = []
    for r in d["rows"]:
        a, t = r["ahead"], r["in_turn"]
        ratios.append(r["speedup"])
        out.append(row(f"`{r['problem']}`", r["family"], r["configs"], f"{t['evals_per_min']:.0f} ({t['load_s']:.1f})",
                       f"{a['evals_per_min']:.0f} ({a['prebuilt_cubins']})", f"{r['speedup']:.2f}x",
                       "yes" if a["statuses"] == t["statuses"] == ["ok"] else "no"))
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")
    return out + ["", f"Geomean {geo:.2f}x; {d['inflight']} candidates in flight ({stamp(d)}; `{name}.json`)"]


def repeatability_table(name: str = "repeatability") -> list[str]:
    d = load(name)
    out = header("problem", "method", "median ms", "max/min of the medians", "baseline max/min", "ncu ms", "harness / ncu",
                 "ncu top stall")
    for pid, c in d["cases"].items():
        meds = sorted(c["candidate_medians_ms"])
        ncu = c.get("ncu") or {}
        out.append(row(pid, c["method"], f"{meds[len(meds) // 2]:.4f}", f"{c['max_over_min']:.4f}",
                       f"{c['torch_max_over_min']:.4f}", f"{ncu.get('duration_us', 0) / 1e3:.4f}" if ncu else "-",
                       f"{c['harness_over_ncu']:.3f}" if c.get("harness_over_ncu") else "-", ncu.get("top_stall", "-")))
    out += ["", f"{d['repeats']} evaluations of each in one worker; target max/min <= {d['target_max_over_min']} ({stamp(d)})"]
    return out


def jail_table(name: str = "jail_overhead") -> list[str]:
    d = load(name)
    ws, ev = d["worker_start_s"], d["evaluation_wall_s"]
    return [*header("", "jailed", "not jailed"),
            row("worker start, s (median)", f"{ws['jailed']['median']:.1f}", f"{ws['unjailed']['median']:.1f}"),
            row("warm evaluation, s (median)", f"{ev['jailed']['median']:.3f}", f"{ev['unjailed']['median']:.3f}"),
            row("evaluations per minute", f"{d['evals_per_minute']['jailed']:.0f}", f"{d['evals_per_minute']['unjailed']:.0f}"),
            "", f"bubblewrap itself starts in {d['bubblewrap_start_ms']['median']:.1f} ms; {d['problem']} ({stamp(d)})"]


def hgemm_table(name: str = "hgemm_suite") -> list[str]:
    d = load(name)
    t = d["targets"]
    fmt = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
    return [*header("shapes", "with a correct result", "geomean vs cuBLAS", "vs cuBLASLt (autotuned)",
                    "geomean vs cuBLAS, M*N*K <= 2^30", "geomean vs cuBLAS, >= 2^36"),
            row(t["shapes"], t["with_result"], fmt(t["geomean_vs_cublas"]), fmt(t["geomean_vs_cublaslt"]),
                f"{fmt(t['geomean_vs_cublas_small'])} ({t['small_shapes']} shapes)",
                f"{fmt(t['geomean_vs_cublas_large'])} ({t['large_shapes']} shapes)"),
            "", f"{d['suite']}, {d['evaluations']} evaluations, {d['generations']} generations, {d['wall_s']:.0f} s "
                f"({stamp(d)})"]


def level3_table(name: str = "level3_coverage") -> list[str]:
    d = load(name)
    out = [f"{d['files']} files, {d['loaded']} loaded, {d['covered']} covered; deciding coverage took at most "
           f"{d['max_coverage_s']:.1f} s a file, tracing at most {d['max_trace_s']:.1f} s ({stamp(d)})", "",
           *header("file", "nodes", "trace s", "coverage s", "covered by", "its parts, or why not")]
    for r in d["rows"]:
        why = (r.get("why") or "").splitlines()[0][:120] if r.get("why") else r.get("parts", "")[:160]
        out.append(row(r["file"], r.get("nodes", "-"), r.get("trace_s", "-"), r.get("coverage_s", "-"),
                       ", ".join(r.get("families") or []) or "-", why.replace("|", "/")))
    return out


def models_table(name: str = "models_coverage") -> list[str]:
    d = load(name)
    per = ", ".join(f"{k}: {v['covered']} of {v['problems']}" for k, v in d["by_dtype"].items())
    out = [f"{d['problems']} problems, {d['covered']} covered by the offline search ({per}; {stamp(d)})", "",
           *header("problem", "dtype", "covered by", "its parts, or why not")]
    for r in d["rows"]:
        why = r["why"].removeprefix("not covered offline (")[:110] if not r["covered"] else (r.get("parts") or "")[:140]
        out.append(row(r["problem"], r["dtype"], ", ".join(r["families"]) or "-", why.replace("|", "/")))
    return out


def models_search_table(name: str, *later: str) -> list[str]:
    """level_suites.py's search of the models suite: each problem's best kernel re-timed beside eager and
    torch.compile; rows of `later` runs (a re-measure of some problems after a fix) replace the first's.
    A later run named `RUN:half` gives only its bf16/fp16 rows (where a change was kept for those alone)."""
    from cuforge.rewards import geomean

    d = load(name)
    suite = next(iter(d["suites"].values()))
    rows = {r["problem"]: (r, name) for r in suite["rows"]}
    for other in later:
        run, _, only = other.partition(":")
        if only not in ("", "half"):
            raise SystemExit(f"{other}: the only row filter is ':half' (bf16/fp16 rows)")
        for r in next(iter(load(run)["suites"].values()))["rows"]:
            if r["evaluations"] and (only != "half" or r["problem"].endswith(("@bf16", "@fp16"))):
                rows[r["problem"]] = (r, run)
    fmt = lambda x: f"{x:.2f}x" if x else "-"  # noqa: E731
    eager = [r["vs_torch"] for r, _ in rows.values()]
    compiled = [r["vs_torch_compile"] for r, _ in rows.values()]
    faster = sum(1 for v in eager if v and v >= 1.0)
    faster_c = sum(1 for v in compiled if v and v >= 1.0)
    out = [f"{len(rows)} problems under the `{suite['precision']}` contract: faster than eager on {faster} "
           f"({100 * faster / len(rows):.0f}%), than torch.compile on {faster_c} ({100 * faster_c / len(rows):.0f}%); "
           f"geomean {geomean(v for v in eager if v):.2f}x eager, {geomean(v for v in compiled if v):.2f}x torch.compile "
           f"over the {sum(1 for v in eager if v)} with a correct kernel ({stamp(d)})", "",
           *header("problem", "vs eager", "vs torch.compile", "correct / evaluated", "run", "why none is correct")]
    for problem in sorted(rows):
        r, run = rows[problem]
        why = "" if r["correct"] else (r["failures"][0][:110] if r.get("failures") else "no evaluation")
        out.append(row(problem, fmt(r["vs_torch"]), compile_cell(r), f"{r['correct']} / {r['evaluations']}",
                       run, why.replace("|", "/")))
    return out


def both_flags_table(name: str) -> list[str]:
    """level_suites.py's search of a suite under `pytorch`: each best kernel re-timed once beside eager and
    torch.compile under PyTorch's default flags and under strict fp32 flags (TF32 off), all in one worker."""
    from cuforge.rewards import geomean

    d = load(name)
    suite = next(iter(d["suites"].values()))
    fmt = lambda x: f"{x:.2f}x" if x else "-"  # noqa: E731
    out = [*header("problem", "evaluated", "vs eager, default flags", "vs torch.compile, default flags",
                   "vs eager, TF32 off", "vs torch.compile, TF32 off")]
    for r in sorted(suite["rows"], key=lambda r: r["problem"]):
        c = r.get("recheck", {})
        out.append(row(r["problem"].split("/")[-1][:56], r["evaluations"], fmt(c.get("vs_torch")),
                       fmt(c.get("vs_torch_compile")), fmt(c.get("vs_torch.strict")), fmt(c.get("vs_torch.compile.strict"))))
    eager = [r.get("recheck", {}).get("vs_torch") for r in suite["rows"]]
    compiled = [r.get("recheck", {}).get("vs_torch_compile") for r in suite["rows"]]
    return out + ["", f"contract `{suite['precision']}`, {d['generations']} generations; faster than default-flag eager "
                      f"on {sum(1 for v in eager if v and v > 1)} of {len(eager)}, geomean {geomean(v for v in eager if v):.2f}x; "
                      f"than default-flag torch.compile on {sum(1 for v in compiled if v and v > 1)}, geomean "
                      f"{geomean(v for v in compiled if v):.2f}x ({stamp(d)})"]


def compile_cell(r: dict[str, Any]) -> str:
    """The recheck's ratio to torch.compile, and the search's own beside it where the two differ by more
    than a quarter (torch.compile's kernels are picked afresh in each process, and their time with them)."""
    recheck, search = r["vs_torch_compile"], r.get("search_vs_torch_compile")
    if not recheck:
        return "-"
    if search and abs(math.log(recheck / search)) > math.log(1.25):
        return f"{recheck:.2f}x (search: {search:.2f}x)"
    return f"{recheck:.2f}x"


def dtype_coverage_table(name: str = "kernelbench_dtype_coverage") -> list[str]:
    d = load(name)
    out = [*header("dtype", "files", "covered by the offline search", "by family (first choice)")]
    for dtype, v in d["dtypes"].items():
        fams = ", ".join(f"{k} {n}" for k, n in list(v["by_family"].items())[:6])
        more = len(v["by_family"]) - 6
        out.append(row(dtype, v["files"], f"{v['covered']} ({100 * v['covered'] / max(v['files'], 1):.0f}%)",
                       fams + (f", {more} more" if more > 0 else "")))
    return out + ["", f"({stamp(d)})"]


def gpu_checks_table(name: str) -> list[str]:
    d = load(name)
    out = [f"{d['gpu']}, torch {d['torch']}, as {d['user']}; {d['jail']} ({d['date']})", "", *header("what ran", "outcome")]
    out += [row(c["what"], c["outcome"].replace("|", "/")) for c in d["calls"]]
    return out


def gpu_suite_rows(d: dict[str, Any]) -> list[str]:
    """A GPU-suite record (gpu_suite.py) by test file: each test's last outcome; then every test whose
    last run failed, with the first error line of its failure."""
    by_file: dict[str, dict[str, int]] = {}
    last = {t: runs[-1] for t, runs in d["tests"].items() if runs}
    for test in sorted(set(last) | set(d.get("left", []))):
        counts = by_file.setdefault(test.split("::")[0], {})
        outcome = last[test]["outcome"] if test in last else "not run"
        counts[outcome] = counts.get(outcome, 0) + 1
    gpus = sorted({c.get("gpu", "no GPU") for c in d["calls"]})
    counts = ", ".join(f"{n} {k}" for k, n in sorted(d["counts"].items()))
    out = [f"tree {d['tree'][:12]}: {d['collected']} tests, {counts}; {len(d['calls'])} call(s) on {', '.join(gpus)}", "",
           *header("file", "passed", "failed", "error", "skipped", "not run")]
    for f, c in sorted(by_file.items()):
        out.append(row(f, *(c.get(k, 0) for k in ("passed", "failed", "error", "skipped", "not run"))))
    failed = [(t, r) for t, r in sorted(last.items()) if r["outcome"] in ("failed", "error")]
    if failed:
        out += ["", *header("failed test", "call", "why")]
        for t, r in failed:
            lines = (r.get("failure") or "").strip().splitlines()
            why = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[-1] if lines else "")
            out.append(row(t.replace("|", "/"), r["call"], why[:200].replace("|", "/")))
    return out


def gpu_suite_table(name: str) -> list[str]:
    return gpu_suite_rows(load(name))


def conv_tf32_table(name: str = "conv_tf32_l1") -> list[str]:
    d = load(name)
    if "with_a_correct_kernel" not in d:
        return conv_tf32_one_product_table(d)
    fmt = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
    # One TF32 product a step (1xTF32) or fp32 accuracy (3xTF32, or fp32 arithmetic in the direct convolution).
    out = [*header("file", "best correct kernel ms", "its family", "eager, default flags (cuDNN) ms", "ratio",
                   "eager, TF32 off ms", "best 1xTF32 kernel ms", "its ratio", "judged")]
    for r in d["rows"]:
        judged = ", ".join(f"{'1xTF32' if k['one_product'] else 'fp32'} {k['status']}" for k in r.get("kernels", []))
        family = f"{r['best_family']} ({'1xTF32' if r['best_one_product'] else 'fp32'})" if r.get("best_family") else "-"
        out.append(row(r["file"].split("/")[-1][:48], fmt(r.get("best_ms")), family, fmt(r.get("cudnn_tf32_ms")),
                       fmt(r.get("vs_cudnn_tf32")), fmt(r.get("eager_strict_ms")), fmt(r.get("one_product_ms")),
                       fmt(r.get("one_product_vs_cudnn_tf32")), judged or r.get("why", "-")))
    return out + ["", f"contract `{d['contract']}`; geomean vs cuDNN (default flags) {fmt(d['geomean_vs_cudnn_tf32'])} over "
                      f"{d['with_a_correct_kernel']} files with a correct kernel, {d['faster_than_cudnn_tf32']} faster; "
                      f"one TF32 product: {fmt(d['one_product_geomean_vs_cudnn_tf32'])} over "
                      f"{d['with_a_correct_one_pass_kernel']} files ({stamp(d)})"]


def conv_tf32_one_product_table(d: dict[str, Any]) -> list[str]:
    """Records before conv_tf32.py timed every covering family: the best one-product kernel per file."""
    fmt = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
    # Records before conv_pointwise_f32 hold the implicit GEMM alone, one product where PASSES is 1.
    one = lambda k: k.get("one_product", k["config"].get("PASSES") == 1)  # noqa: E731
    families = any("best_family" in r for r in d["rows"])
    out = [*header("file", "best 1xTF32 kernel ms", *(("its family",) if families else ()),
                   "eager, default flags (cuDNN TF32) ms", "ratio", "eager, TF32 off ms",
                   "1xTF32 vs the first 3xTF32 seed", "judged")]
    for r in d["rows"]:
        judged = ", ".join(f"{'1x' if one(k) else '3x'} {k['status']}" for k in r.get("kernels", []))
        out.append(row(r["file"].split("/")[-1][:48], fmt(r.get("best_ms")),
                       *((r.get("best_family", "-"),) if families else ()), fmt(r.get("cudnn_tf32_ms")),
                       fmt(r.get("vs_cudnn_tf32")), fmt(r.get("eager_strict_ms")), fmt(r.get("one_pass_vs_three")),
                       judged or r.get("why", "-")))
    return out + ["", f"contract `{d['contract']}`; geomean vs cuDNN TF32 {fmt(d['geomean_vs_cudnn_tf32'])} over "
                      f"{d['with_a_correct_one_pass_kernel']} files with a correct 1xTF32 kernel, "
                      f"{d['faster_than_cudnn_tf32']} faster ({stamp(d)})"]


def conv_half_table(name: str) -> list[str]:
    d = load(name)
    fmt = lambda x: f"{x:.3f}" if x else "-"  # noqa: E731
    out = [*header("file", "best kernel ms", f"eager in {d['dtype']} (cuDNN) ms", "ratio", "judged")]
    for r in d["rows"]:
        judged = ", ".join(k["status"] for k in r.get("kernels", []))
        out.append(row(r["file"].split("/")[-1][:48], fmt(r.get("best_ms")), fmt(r.get("eager_ms")), fmt(r.get("vs_eager")),
                       judged or r.get("why", "-")))
    return out + ["", f"contract `{d['contract']}`, {d['dtype']}; geomean vs eager {fmt(d['geomean_vs_eager'])} over "
                      f"{d['with_an_ok_kernel']} files with an ok kernel, {d['faster_than_eager']} faster ({stamp(d)})"]


def replay_table(name: str = "partition_replay", *later: str) -> list[str]:
    """partition_replay.py's rows; a `later` run's rows (files replayed again after a change to what a
    partition cuts) replace the first's, and the counts are of the rows shown."""
    d = load(name)
    rows = {r["file"]: (r, "") for r in d["rows"]}
    for run in later:
        for r in load(run)["rows"]:
            rows[r["file"]] = (r, run)
    count = {k: sum(r["outcome"] == k for r, _ in rows.values()) for k in ("same", "differs", "error", "not run", "not cut")}
    again = f"; rows of {', '.join(later)} replace the first run's" if later else ""
    out = [f"{len(rows)} files: the parts compute the forward on {count['same']}, differ on {count['differs']}, fail on "
           f"{count['error']}; {count['not run']} not run (inputs too large for this CPU), {count['not cut']} not cut "
           f"({stamp(d)}{again})", "",
           *header("file", "ops", "parts", "kernel parts", "outcome", "max abs diff or why", *(("run",) if later else ()))]
    for r, run in rows.values():
        diff = f"{r['max_abs_diff']:.2g}" if r.get("max_abs_diff") is not None else (r.get("why") or "")[:110]
        out.append(row(r["file"], r.get("nodes", "-"), r.get("parts", "-"), r.get("kernel_parts", "-"), r["outcome"],
                       diff.replace("|", "/"), *((run or name,) if later else ())))
    return out


def skinny_table(name: str = "skinny_gemm") -> list[str]:
    d = load(name)
    out = [*header("problem", "contract", "fastest kernel (family: config)", "kernel us (p20-p80)",
                   "eager us", "vs eager", "vs copy bandwidth", "vs a copy of its bytes", "configs ok")]
    for problem in dict.fromkeys(r["problem"] for r in d["rows"]):
        rows = [r for r in d["rows"] if r["problem"] == problem]
        ok = [r for r in rows if r["status"] == "ok" and r["ms"]]
        best = min(ok, key=lambda r: r["ms"]) if ok else None
        if best is None:
            out.append(row(problem, rows[0]["precision"], "-", "-", "-", "-", "-", "-", f"0 of {len(rows)}"))
            continue
        config = ", ".join(f"{k}={v}" for k, v in best["config"].items())
        out.append(row(problem, best["precision"], f"{best.get('family', 'gemm_skinny')}: {config}",
                       f"{1e3 * best['ms']:.1f} ({1e3 * best['p20_ms']:.1f}-{1e3 * best['p80_ms']:.1f})",
                       f"{1e3 * best['eager_ms']:.1f}", f"{best['eager_ms'] / best['ms']:.2f}x",
                       f"{best['vs_copy']:.2f}",
                       f"{best['vs_same_size_copy']:.2f}" if best.get("vs_same_size_copy") else "-", f"{len(ok)} of {len(rows)}"))
    return out + ["", f"copy bandwidth {d['copy_gbs']:.0f} GB/s ({stamp(d)})"]


def l2_flush_table(name: str = "l2_flush") -> list[str]:
    """l2_flush.py: eager launches timed after a written and after a read L2 flush, interleaved."""
    d = load(name)
    out = header("launch", "MB moved", "after a written flush: us (GB/s)", "after a read flush: us (GB/s)", "written / read")
    for r in d["rows"]:
        cells = [f"{1e3 * r[f]['median_ms']:.1f} ({r[f]['gbs']:.0f})" for f in ("write", "read")]
        out.append(row(r["launch"], f"{r['bytes'] / 1e6:.0f}", *cells, f"{r['write_over_read']:.2f}"))
    return out + ["", f"L2 {d['l2_bytes'] / 2**20:.0f} MiB, flush buffer twice that ({stamp(d)})"]


def configs_table(name: str) -> list[str]:
    """family_configs.py's record: each config timed beside eager and torch.compile in one worker."""
    d = load(name)
    out = header("problem", "config", "kernel us", "vs eager", "vs torch.compile", "status")
    for r in d["rows"]:
        ok = r["status"] == "ok" and r.get("ms")
        config = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        ratios = [f"{r[key]:.2f}x" if ok and r.get(key) else "-" for key in ("vs_torch", "vs_torch.compile")]
        out.append(row(r["problem"], config, f"{1e3 * r['ms']:.1f}" if ok else "-", *ratios,
                       r["status"] if ok else f"{r['status']}: {r.get('message', '')[:80]}".replace("|", "/")))
    return out + ["", f"({stamp(d)})"]


def attention_table(name: str) -> list[str]:
    """flash_attention.py: the family's fastest kernel per shape against each SDPA backend, side by side."""
    d = load(name)
    out = [*header("shape (batch, heads / kv heads, seq, head dim)", "backend", "kernel ms (p20-p80)", "backend ms",
                   "vs backend", "kernel TFLOP/s", "backend TFLOP/s", "fastest config")]
    for r in d["rows"]:
        s = r["shape"]
        shape = f"{s['batch']}, {s['heads']}/{s['kv_heads']}, {s['seq']}, {s['head_dim']}{', causal' if s['causal'] else ''}"
        ok = [k for k in r.get("kernels", []) if k["status"] == "ok" and k["ms"]]
        if not ok:
            out.append(row(shape, r["backend"], "-", "-", "-", "-", "-", r.get("why", "no ok kernel")[:80]))
            continue
        k = min(ok, key=lambda k: k["ms"])
        cfg = ", ".join(f"{n}={v}" for n, v in k["config"].items())
        out.append(row(shape, r["backend"], f"{k['ms']:.3f} ({k['p20_ms']:.3f}-{k['p80_ms']:.3f})",
                       f"{r['backend_ms']:.3f}", f"{r['vs_backend']:.2f}x", f"{r['kernel_tflops']:.0f}",
                       f"{r['backend_tflops']:.0f}", cfg))
    family = d.get("family", "flash_attention")  # records from before --family: the mma.sync family's
    return out + ["", f"{family}; contract `{d['contract']}`, {d['dtype']}; baseline: {d['baseline']} ({stamp(d)})"]


TABLES: dict[str, Callable[..., list[str]]] = {
    "compile": compile_table, "throughput": throughput_table, "repeatability": repeatability_table,
    "jail": jail_table, "hgemm": hgemm_table, "compile_ahead": compile_ahead_table, "level3": level3_table, "gpu_checks": gpu_checks_table,
    "gpu_suite": gpu_suite_table,
    "models": models_table, "dtype_coverage": dtype_coverage_table, "conv_tf32": conv_tf32_table,
    "replay": replay_table, "skinny": skinny_table, "l2_flush": l2_flush_table, "conv_half": conv_half_table,
    "models_search": models_search_table, "both_flags": both_flags_table, "attention": attention_table, "configs": configs_table,
}


# ------------------------------------------------------------------------------------------- the page

def run_command(cmd: str) -> str:
    argv = shlex.split(cmd)
    if argv[:1] != ["python"] or len(argv) < 2 or not argv[1].startswith("benchmarks/"):
        raise SystemExit(f"docs/benchmarks.md: a table's command must be python benchmarks/SCRIPT ..., not {cmd!r}")
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{cmd} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return done.stdout.rstrip() + "\n"


def regenerate(text: str) -> tuple[str, list[str]]:
    """(the page with every table made again, the commands whose table changed)."""
    changed: list[str] = []

    def redo(m: re.Match[str]) -> str:
        body = run_command(m.group("cmd"))
        if body != m.group("body"):
            changed.append(m.group("cmd"))
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(redo, text), changed


def main(argv: list[str]) -> int:
    if argv and argv[0] in TABLES:
        print("\n".join(TABLES[argv[0]](*argv[1:])))
        return 0
    if argv and argv[0] not in ("--check",):
        raise SystemExit(f"unknown table {argv[0]!r}; tables: {', '.join(TABLES)} (or --check)")
    text = DOC.read_text()
    new, changed = regenerate(text)
    if argv[:1] == ["--check"]:
        for cmd in changed:
            print(f"docs/benchmarks.md: the table of `{cmd}` is not what it prints now")
        return 1 if changed else 0
    if new != text:
        DOC.write_text(new)
    print(f"{len(BLOCK.findall(text))} tables, {len(changed)} rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
