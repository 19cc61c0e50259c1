"""`cuforge eval` and `cuforge baseline`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from cuforge.cli.app import EXIT_FAILURES, app, console, emit_json, err_console, fail, store_path, show_table


def _require_jail(unsafe_no_jail: bool) -> None:
    from cuforge.sandbox.driver.jail import JailError, require_jail

    try:
        require_jail(unsafe_no_jail)
    except JailError as e:
        fail(str(e))


def _parse_baselines(value: Optional[str], problem: Any) -> tuple[str, ...]:
    from cuforge.problems.problem import BASELINES

    if value is None:
        return tuple(problem.meta.baselines)
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in BASELINES]
    if bad or not names:
        fail(f"--baselines: unknown baseline(s) {', '.join(bad) or repr(value)}; choose from {', '.join(BASELINES)}")
    return names


def cpu_test_baselines(chosen: tuple[str, ...], named: bool) -> tuple[str, ...]:
    """The baselines a CPU test evaluation times: the problem's own without torch.compile, as a CPU test
    run's (inductor's C++ build of the reference takes longer than the whole evaluation of a small
    problem, for a wall-clock time no GPU user reads); all of them where --baselines named them."""
    return chosen if named else tuple(b for b in chosen if b != "torch.compile")


@app.command("eval")
def eval_cmd(
    problem_ref: str = typer.Argument(..., metavar="PROBLEM", help="hgemm/M_N_K, level1/NAME, or a problem file."),
    candidate_path: Path = typer.Argument(..., metavar="CANDIDATE.py", help="A Python file defining ModelNew."),
    baselines: Optional[str] = typer.Option(None, help="Comma-separated: torch, torch.compile, cublas, cublaslt "
                                            "(default: the problem's)."),
    trials: int = typer.Option(5, min=5, max=1000, help="Correctness trials, each on fresh inputs."),
    compile_mode: str = typer.Option("default", help="torch.compile mode for that baseline: default or max-autotune."),
    timeout: float = typer.Option(300.0, min=1, max=86400, help="Hard wall-clock limit for the evaluation, seconds."),
    gpu: int = typer.Option(0, min=0, max=1023, help="GPU index."),
    cpu: bool = typer.Option(False, "--cpu", help="Harness test mode without a GPU: correctness only, wall-clock times."),
    policy: Optional[str] = typer.Option(None, help="Override the problem's policy: custom (the candidate must compute "
                                         "with its own kernels) or any (library calls allowed, e.g. PyTorch itself)."),
    ncu: bool = typer.Option(False, "--ncu", help="Also collect an Nsight Compute profile of the candidate."),
    precision: Optional[str] = typer.Option(None, help="Precision contract: fp32 (TF32 off everywhere), pytorch "
                                            "(PyTorch's default flags: cuDNN TF32) or kernelbench (its tolerances); "
                                            "default: the problem's own, else fp32."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Run an fp32 problem in bf16 or fp16: its inputs and "
                                        "weights cast, as KernelBench's precision option does (default: the problem's own)."),
    unsafe_no_jail: bool = typer.Option(False, "--unsafe-no-jail", help="Evaluate candidate code without a jail "
                                        "where none is available (it can then read your files and keys)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Evaluate one candidate: correctness, anti-cheat, timing against each baseline, profile."""
    from cuforge.problems.loader import load_in_dtype
    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import load_problem
    from cuforge.sandbox.driver.evaluate import CandidateFileError, candidate_from_file, supervisor_for
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import WorkerStartError

    from cuforge.problems.problem import POLICIES

    precision = _contract_option(precision)
    dtype = dtype_option(dtype)
    if policy is not None and policy not in POLICIES:
        fail(f"--policy: unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    modes = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
    if compile_mode not in modes:
        fail(f"--compile-mode: unknown torch.compile mode {compile_mode!r}; choose from {', '.join(modes)}")
    try:
        candidate = candidate_from_file(candidate_path)
    except CandidateFileError as e:
        fail(str(e))
    _require_jail(unsafe_no_jail)
    if not cpu:
        _check_gpu(gpu)
    try:
        problem = load_problem(problem_ref)
        if dtype:
            problem = load_in_dtype(problem, dtype)
    except ProblemError as e:
        fail(str(e))
    chosen_baselines = _parse_baselines(baselines, problem)
    if policy is not None:
        from dataclasses import replace

        problem = replace(problem, meta=replace(problem.meta, policy=policy))
    if cpu and problem.cpu_mode_refusal():
        fail(problem.cpu_mode_refusal() or "")
    if cpu:
        kept = cpu_test_baselines(chosen_baselines, named=baselines is not None)
        if kept != chosen_baselines and not as_json:
            err_console.print("CPU test mode: torch.compile is not timed (its C++ build would dominate); "
                              "--baselines torch,torch.compile times it", highlight=False, soft_wrap=True)
        chosen_baselines = kept
    if cpu and problem.meta.policy != "any":
        err_console.print(f"CPU test mode: {problem.id}'s policy {problem.meta.policy!r} is judged as 'any' (no custom "
                          "kernel runs without a GPU)", highlight=False, soft_wrap=True)
        problem = problem.for_cpu_test_mode()
    config = EvalConfig(device="cpu" if cpu else "cuda", trials=trials, timeout_s=timeout, compile_mode=compile_mode,
                        baselines=chosen_baselines, precision=problem.contract(precision))
    try:
        with console.status(f"evaluating {candidate_path.name} on {problem.id} ...", spinner="dots"):
            ev = supervisor_for(config, gpu).evaluate(problem, candidate, config)
            if ncu and ev.ok:
                from cuforge.sandbox.driver.ncu import NcuError, ncu_profile

                try:
                    from cuforge.sandbox.protocol.evaluation import Profile
                    from cuforge.sandbox.protocol.evaluation import summarize_profile

                    ev.profile = ev.profile or Profile()
                    ev.profile.ncu = ncu_profile(problem, candidate, gpu)
                    ev.profile.summary = summarize_profile(ev.profile)
                except NcuError as e:
                    err_console.print(f"[yellow]ncu profile unavailable:[/] {e}", highlight=False)
    except WorkerStartError as e:
        fail(str(e))
    if as_json:
        emit_json(ev.to_dict())
    else:
        print_evaluation(ev)
    raise typer.Exit(0 if ev.ok else EXIT_FAILURES)


def _check_gpu(gpu: int, without: str = "--cpu runs the harness's CPU test mode") -> None:
    """--gpu names a GPU this machine has (no GPU at all: say so, and what to do instead)."""
    from cuforge.sandbox.driver.executor import visible_gpus

    gpus = visible_gpus()
    if not gpus:
        fail(f"no GPU visible (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES is empty); {without}")
    if gpu >= len(gpus):
        fail(f"--gpu: no GPU {gpu} here ({len(gpus)} visible)")


def dtype_option(value: str | None) -> str | None:
    """--dtype's value as a torch dtype name; an unknown one is one line naming the valid ones."""
    from cuforge.problems.problem import ProblemError, cast_dtype

    if value is None:
        return None
    try:
        return cast_dtype(value)
    except ProblemError as e:
        fail(f"--dtype: {e}")


def _contract_option(value: str | None) -> str | None:
    """--precision's value, normalised; an unknown contract is one line naming the valid ones."""
    from cuforge.sandbox.protocol.precision import UnknownContract, contract

    if value is None:
        return None
    try:
        return contract(value).name
    except UnknownContract as e:
        fail(f"--precision: {e}")


def baseline_label(name: str, precision: str) -> str:
    """A stored baseline's name says which flags it ran under: eager and torch.compile under a
    default-flags contract get `.default_flags` (the fp32 contract's keep their plain names)."""
    from cuforge.sandbox.protocol.precision import contract

    if name in ("torch", "torch.compile") and contract(precision).default_flags:
        return f"{name}.default_flags"
    return name


def print_evaluation(ev: Any) -> None:
    color = "green" if ev.ok else "red"
    console.print(f"[bold]{ev.problem_id}[/] candidate {ev.candidate_id}: [{color}]{ev.status}[/]"
                  + (f" - {ev.message}" if ev.message else ""), highlight=False, soft_wrap=True)
    for d in ev.diagnostics[:10]:
        console.print(f"  {d}", highlight=False)
    c = ev.correctness
    if c.get("trials_passed"):
        console.print(f"correctness: {c['trials_passed']}/{c.get('trials', c['trials_passed'])} trials vs {c.get('reference')} "
                      f"reference; max abs err {c.get('max_abs_err', 0):.3g}, rel-norm err {c.get('rel_norm_err', 0):.3g}")
    if c.get("precision"):
        from cuforge.sandbox.protocol.precision import CONTRACTS, other_compiled, other_eager

        name = c["precision"]
        twin = f", {other_compiled(name)} = torch.compile under them" if other_compiled(name) in ev.timings else ""
        console.print(f"precision contract: {name} ({CONTRACTS[name].summary}); torch = eager under its flags, "
                      f"{other_eager(name)} = eager under the other contract's"
                      + (" (the same kernels here)" if c.get("eager_flags") else "") + twin, highlight=False, soft_wrap=True)
    if ev.timings:
        t = Table(title="timings (interleaved, same worker)")
        for col in ("contender", "median ms", "p20 ms", "p80 ms", "n", "method", "speedup"):
            t.add_column(col)
        for name, st in ev.timings.items():
            sp = ev.speedup_vs(name) if name != "candidate" else None
            t.add_row(name, f"{st.median_ms:.4f}", f"{st.p20_ms:.4f}", f"{st.p80_ms:.4f}", str(st.n), st.method,
                      f"{sp:.3f}x" if sp else "")
        show_table(t)
    if c.get("baselines_skipped"):
        for name, why in c["baselines_skipped"].items():
            console.print(f"[yellow]baseline {name} skipped:[/] {why}", highlight=False)
    if ev.profile and ev.profile.summary:
        console.print("profile: " + ev.profile.summary, highlight=False)
    if ev.device.get("name"):
        console.print(f"device: {ev.device['name']} (torch {ev.device.get('torch')}, CUDA {ev.device.get('cuda')}); "
                      f"{ev.wall_s:.2f} s", highlight=False)


@app.command("baseline")
def baseline_cmd(
    suite: str = typer.Option(..., "--suite", "-s", help="Built-in suite or a directory of problem files."),
    problem: Optional[str] = typer.Option(None, "--problem", "-p", help="Only this problem id (or name)."),
    baselines: Optional[str] = typer.Option(None, help="Comma-separated baselines (default: each problem's)."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file or a directory)."),
    gpu: int = typer.Option(0, min=0, max=1023, help="GPU index."),
    precision: Optional[str] = typer.Option(None, help="Precision contract the baselines run under: fp32 (TF32 off) "
                                            "or pytorch/kernelbench (PyTorch's default flags); default: each problem's, "
                                            "else fp32. Stored under names that say which (torch, torch.default_flags)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Run an fp32 problem in bf16 or fp16: its inputs and "
                                        "weights cast, as KernelBench's precision option does (default: the problem's own)."),
    unsafe_no_jail: bool = typer.Option(False, "--unsafe-no-jail", help="Run the problems' code without a jail "
                                        "where none is available."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Measure baselines (eager, torch.compile, cuBLAS, cuBLASLt autotuned) for a suite and store them."""
    from rich.progress import Progress

    from cuforge.problems.loader import load_in_dtype, shared_inspector
    from cuforge.problems.problem import ProblemError
    from cuforge.problems.suites import load_suite
    from cuforge.results.store import Store, StoreError
    from cuforge.sandbox.driver.baseline_run import measure_baselines, software_tag
    from cuforge.sandbox.driver.evaluate import supervisor_for
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.supervisor import WorkerStartError

    try:
        loaded = load_suite(suite)
    except ProblemError as e:
        fail(str(e))
    chosen = [p for p in loaded.problems if problem in (None, p.id, p.name)]
    if not chosen:
        fail(f"--problem: no problem {problem!r} in {loaded.name}")
    precision = _contract_option(precision)
    cast = dtype_option(dtype)
    if cast:
        try:
            with shared_inspector():  # one inspector child traces them all
                chosen = [load_in_dtype(p, cast) for p in chosen]
        except ProblemError as e:
            fail(str(e))
    _require_jail(unsafe_no_jail)
    for p in chosen:
        _parse_baselines(baselines, p)
    _check_gpu(gpu, "baselines are GPU timings: run cuforge baseline on a machine with an NVIDIA GPU")
    try:
        store = Store(store_path(results))
    except StoreError as e:
        fail(str(e))
    rows, failures = [], 0
    with Progress(console=err_console) as progress:
        task = progress.add_task("baselines", total=len(chosen))
        for p in chosen:
            wanted = tuple(b for b in _parse_baselines(baselines, p) if b != "torch")
            config = EvalConfig(baselines=wanted, profile=False, precision=p.contract(precision))
            try:
                sup = supervisor_for(config, gpu, untrusted=False)  # only the problem's own reference runs
                ev = measure_baselines(sup, p, config)
            except WorkerStartError as e:
                fail(str(e))
            progress.advance(task)
            if not ev.ok:
                failures += 1
                rows.append({"problem": p.id, "error": f"{ev.status}: {ev.message}"})
                continue
            gpu_name, sw = ev.device.get("name", "?"), software_tag(ev.device)
            for name, st in ev.timings.items():
                label = baseline_label("torch" if name == "candidate" else name, config.precision)
                store.add_baseline(p.id, p.source, gpu_name, sw, label, vars(st), ev.correctness.get(label) or {})
                rows.append({"problem": p.id, "baseline": label, "median_ms": st.median_ms, "p20_ms": st.p20_ms,
                             "p80_ms": st.p80_ms, "n": st.n, "method": st.method, "gpu": gpu_name})
    if as_json:
        emit_json(rows)
    else:
        t = Table(title=f"baselines: {loaded.name} -> {results}")
        for col in ("problem", "baseline", "median ms", "p20", "p80", "n", "method"):
            t.add_column(col)
        for r in rows:
            if "error" in r:
                t.add_row(r["problem"], "[red]error[/]", r["error"][:80], "", "", "", "")
            else:
                t.add_row(r["problem"], r["baseline"], f"{r['median_ms']:.4f}", f"{r['p20_ms']:.4f}",
                          f"{r['p80_ms']:.4f}", str(r["n"]), r["method"])
        show_table(t)
    raise typer.Exit(EXIT_FAILURES if failures else 0)
