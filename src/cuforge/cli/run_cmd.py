"""`cuforge run`: the search, with live progress (a rich display on a terminal, one plain line per
evaluation or error otherwise) and a final table that always ends with the totals."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cuforge.cli.app import EXIT_FAILURES, app, console, emit_json, err_console, fail, inspecting, one_line, store_path, show_table

LIVE_ROWS = 12  # problems shown in the live display; the rest are counted


@app.command()
def run(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Built-in suite or a directory of problem files."),
    problem: Optional[list[str]] = typer.Option(None, "--problem", "-p", help="Only these problems (repeatable)."),
    provider: Optional[str] = typer.Option(None, help="openai, anthropic, replay (template: the offline search)."),
    model: Optional[str] = typer.Option(None, help="Model name for openai/anthropic."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (vLLM, SGLang, Ollama, llama.cpp)."),
    replay: Optional[Path] = typer.Option(None, help="JSONL of recorded replies, for --provider replay."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature, 0-2 (default 0.7)."),
    max_tokens: Optional[int] = typer.Option(None, help="Most tokens per reply (default 8192)."),
    reasoning_effort: Optional[str] = typer.Option(None, help="openai reasoning models: low, medium or high."),
    prices: Optional[Path] = typer.Option(None, help="TOML price table overriding the built-in one."),
    price_in: Optional[float] = typer.Option(None, help="USD per million input tokens (a model the table lacks)."),
    price_out: Optional[float] = typer.Option(None, help="USD per million output tokens (with --price-in)."),
    islands: Optional[int] = typer.Option(None, help="Islands per problem (default 4)."),
    generations: Optional[int] = typer.Option(None, help="Proposals per island per problem (default 4)."),
    budget_usd: Optional[float] = typer.Option(None, help="Most LLM dollars to spend (each request's worst case is reserved)."),
    budget_tokens: Optional[int] = typer.Option(None, help="Most LLM tokens to use (each request's worst case is reserved)."),
    wall_time: Optional[float] = typer.Option(None, help="Stop after this many seconds."),
    patience: Optional[int] = typer.Option(None, help="End a problem after N evaluations without a new best."),
    max_failures: Optional[int] = typer.Option(None, help="End a problem after N requests in a row with nothing to "
                                               "evaluate; end the run after N failed requests in a row (default 5)."),
    max_retries: Optional[int] = typer.Option(None, help="Retries of one request on transient errors (default 3)."),
    retry_budget: Optional[int] = typer.Option(None, help="Retries the whole run may spend (default 50)."),
    request_timeout: Optional[float] = typer.Option(None, help="Seconds one LLM request may take (default 600)."),
    concurrency: Optional[int] = typer.Option(None, help="Proposals and LLM requests in flight: exactly this many when given (1: each edit sees the last verdict); default 4, or 2 per GPU over 2 GPUs."),
    baseline: Optional[str] = typer.Option(None, help="Baseline the reward is measured against (default torch)."),
    results: Optional[Path] = typer.Option(None, help="SQLite results store (a file, or a directory for DIR/cuforge.db; "
                                           "default results/cuforge.db)."),
    resume: Optional[str] = typer.Option(None, help="Continue this run where it stopped."),
    compile_only: bool = typer.Option(False, "--compile-only", help="Compiler feedback only: no GPU needed."),
    cpu: bool = typer.Option(False, "--cpu", help="Evaluate with the harness's CPU test mode (no GPU timings)."),
    executor: Optional[str] = typer.Option(None, help="local (default: a worker per GPU of this host) or ray."),
    gpus: Optional[str] = typer.Option(None, help="GPUs to use: all (default), indices like 0,1, or a worker count "
                                              "with --compile-only/--cpu or --executor ray."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster: auto or ray://host:port (default: running or new local)."),
    ray_resource: Optional[str] = typer.Option(None, help="Ray resource one evaluation worker takes (default GPU)."),
    inspect_timeout: Optional[float] = typer.Option(None, help="Seconds one problem file's import and trace may take; "
                                                    "a file past it is skipped, named (default 180)."),
    precision: Optional[str] = typer.Option(None, help="Precision contract: fp32 (TF32 off everywhere), pytorch "
                                            "(PyTorch's default flags: cuDNN TF32) or kernelbench (its tolerances); "
                                            "default: each problem's own, else fp32."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Run every fp32 problem in bf16 or fp16: inputs and "
                                        "weights cast, as KernelBench's precision option does (default: each problem's own)."),
    config: Optional[Path] = typer.Option(None, help="TOML file with the same settings (the flags' names); flags win."),
    prompt_dir: Optional[Path] = typer.Option(None, help="Directory of prompt templates overriding the built-in ones."),
    unsafe_no_jail: bool = typer.Option(False, "--unsafe-no-jail", help="Evaluate candidate code without a jail "
                                        "where none is available (it can then read your files and keys)."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary at the end."),
) -> None:
    """Search for faster kernels: propose, evaluate in the sandbox, evolve; everything goes to the store.

    Exit codes: 0 at least one evaluation succeeded; 1 none did, or the run was aborted (a fatal
    provider error, a failing provider); 2 bad input; 130 stopped with Ctrl-C; 143 stopped by SIGTERM."""
    from cuforge.agent.config import ConfigError, ProposerSpec, check_url, load_toml, merge, redact_url
    from cuforge.agent.run import EXIT_INTERRUPTED, EXIT_TERMINATED, execute, prepare, resume_config
    from cuforge.problems.problem import ProblemError
    from cuforge.results.store import Store, StoreError

    from cuforge.cli.eval_cmd import _require_jail

    try:
        file_settings = load_toml(config) if config else {}
    except ConfigError as e:
        fail(str(e))
    # A config file takes every flag's name; flags given on the command line win.
    from_file = file_settings.pop("cli", {})
    results = store_path(results or Path(from_file.get("results") or "results/cuforge.db"))
    as_json = as_json or bool(from_file.get("json"))
    unsafe_no_jail = unsafe_no_jail or bool(from_file.get("unsafe_no_jail"))
    if resume is None and from_file.get("resume"):
        if file_settings:
            fail(f"--config: {config} resumes run {from_file['resume']}, which keeps its stored settings; "
                 f"the file also sets {', '.join(sorted(file_settings))} (give changes as flags)")
        resume, config = from_file["resume"], None
    _require_jail(unsafe_no_jail)
    try:
        if base_url is not None:
            check_url(base_url)
        if prompt_dir is not None and not prompt_dir.is_dir():
            raise ConfigError(f"--prompt-dir: {prompt_dir} is not a directory")
        if replay is not None and not replay.is_file():
            shipped = Path(__file__).resolve().parents[1] / "data" / replay.name
            if len(replay.parts) != 1 or replay.suffix != ".jsonl" or not shipped.is_file():
                raise ConfigError(f"--replay: {replay} is not a file")
            replay = shipped  # a recorded demo shipped with cuforge, found from any directory
        if provider is None and not resume and (model or base_url or replay or reasoning_effort):
            raise ConfigError("--model/--base-url/--replay need --provider")
        flags: dict[str, Any] = {"suite": suite, "problems": problem or None, "islands": islands,
                                 "generations": generations, "budget_usd": budget_usd, "budget_tokens": budget_tokens,
                                 "wall_time_s": wall_time, "patience": patience, "concurrency": concurrency,
                                 "baseline": baseline, "compile_only": compile_only or None,
                                 "device": "cpu" if cpu else None, "prompt_dir": str(prompt_dir) if prompt_dir else None,
                                 "temperature": temperature, "max_tokens": max_tokens,
                                 "prices": str(prices) if prices else None, "price_in": price_in, "price_out": price_out,
                                 "executor": executor, "gpus": gpus, "ray_address": ray_address,
                                 "ray_resource": ray_resource, "max_failures": max_failures, "max_retries": max_retries,
                                 "retry_budget": retry_budget, "request_timeout_s": request_timeout,
                                 "inspect_timeout_s": inspect_timeout, "precision": precision, "dtype": dtype}
        if provider:
            flags["proposers"] = [ProposerSpec(provider, model or "", base_url, 1.0, str(replay) if replay else None,
                                               reasoning_effort)]
        if resume:
            store = Store(results, create=False)
            row = store.run(resume)
            if row.status == "running":
                raise ConfigError(f"--resume: run {resume} is still running (pid {row.pid} on {row.host}); "
                                  "stop it first (Ctrl-C)")
            if config is not None:
                raise ConfigError("--config: a resumed run keeps its stored settings; give changes as flags")
            settings = resume_config(row.config, {k: v for k, v in flags.items() if v is not None},
                                     {"model": model, "base_url": base_url, "reasoning_effort": reasoning_effort,
                                      "replay_file": str(replay) if replay else None})
            cfg = merge(settings, {})
        else:
            cfg = merge(file_settings, flags)
        progress = _Progress(cfg, quiet=as_json)
        with inspecting(cfg.suite) as on_file:
            prep = prepare(cfg, progress.on_failure, on_file)
        for sk in prep.skipped:
            err_console.print(f"[yellow]skipped[/] {escape(sk.path)}: {escape(one_line(sk.reason))}", highlight=False,
                              soft_wrap=True)
        if not resume:
            store = Store(results)  # only once everything else checked out: a bad flag leaves no file behind
    except (ConfigError, StoreError, ProblemError) as e:
        fail(str(e))
    try:
        run_id, search = progress.watch(lambda upd, ev: execute(prep, store, resume, bool(resume), upd, ev))
    except (ConfigError, ProblemError, StoreError) as e:
        fail(str(e))
    stats = search.stats
    summary = {"run_id": run_id, "stop_reason": stats.stop_reason, "evaluations": stats.evaluations,
               "succeeded": stats.succeeded, "parse_errors": stats.parse_errors, "duplicates": stats.duplicates,
               "llm_calls": stats.llm_calls, "http_requests": stats.http_requests, "errors": stats.errors,
               "tokens_in": stats.tokens_in, "tokens_out": stats.tokens_out, "tokens_estimated_calls": stats.estimated_calls,
               "cost_usd": stats.cost_usd, "aborted": search.aborted,
               "proposers": [redact_url(p.base_url) or p.provider for p in cfg.proposers],
               "best": {pid: st.best_speedup for pid, st in search.states.items()},
               "problems": {pid: search.problem_done(st) or "open" for pid, st in search.states.items()},
               "skipped": [{"path": sk.path, "reason": sk.reason} for sk in prep.skipped]}
    if as_json:
        summary["compile_only"] = cfg.compile_only  # "succeeded" then counts compiled candidates
        emit_json(summary)
    else:
        show_table(summary_table(search, cfg))
        console.print(totals_line(search), highlight=False, soft_wrap=True)
        console.print(f"run {run_id}: {stats.stop_reason}. Next: cuforge leaderboard --run {run_id}; "
                      f"cuforge report {run_id}", highlight=False, soft_wrap=True)
    if search.abandoned and not search.aborted and stats.stop_reason.startswith("interrupted"):
        raise typer.Exit(EXIT_INTERRUPTED)
    if search.abandoned and not search.aborted and stats.stop_reason.startswith("terminated"):
        raise typer.Exit(EXIT_TERMINATED)
    if search.aborted:
        err_console.print(f"[bold red]error:[/] run aborted: {stats.stop_reason}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILURES)
    if stats.succeeded == 0:
        err_console.print(f"[bold red]no evaluation succeeded[/] ({stats.evaluations} evaluations, "
                          f"{stats.failed_requests} failed requests)", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILURES)
    raise typer.Exit(0)


def totals_line(search: Any) -> str:
    s = search.stats
    est = f" ({s.estimated_calls} estimated)" if s.estimated_calls else ""
    sent = f" ({s.http_requests} sent, retries included)" if s.http_requests else ""
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "none"
    counted = "compiled" if search.cfg.compile_only else "succeeded"  # compile-only runs nothing
    return (f"totals: {s.evaluations} evaluations ({s.succeeded} {counted}), {s.evals_per_minute:.1f}/min; "
            f"LLM {s.llm_calls} requests{sent}, {s.tokens_in + s.tokens_out} tokens{est}, ${s.cost_usd:.4f}; "
            f"parse errors {s.parse_errors}, duplicates {s.duplicates}; provider errors: {errors}")


def summary_table(search: Any, cfg: Any, rows: list[Any] | None = None) -> Table:
    t = Table(title="cuforge run" + (" (compile-only)" if cfg.compile_only else ""))
    for col in ("problem", "requests", "evaluated", "best speedup", "state"):
        t.add_column(col)
    states = rows if rows is not None else list(search.states.values())
    for st in states:
        best = f"{st.best_speedup:.3f}x" if st.best_speedup else "-"
        t.add_row(st.problem.id, f"{st.proposed}/{cfg.max_candidates_per_problem}", str(st.evaluated), best,
                  problem_state(search, st))
    return t


def problem_state(search: Any, st: Any) -> str:
    """One line: why a problem's search ended (the first line of a long reason), or what it is doing;
    once the run itself has ended, a problem it left open says why."""
    done = search.problem_done(st)
    if done:
        return one_line(done, 70)
    if st.in_flight:
        return "running"
    if search.stats.stop_reason:
        return "open: " + one_line(search.stats.stop_reason, 60)
    return "waiting"


class _Progress:
    """Live progress: on a terminal a rich display (totals first, then the problems in play) with
    events printed above it; otherwise one plain line per evaluation, warning or error on stderr."""

    def __init__(self, cfg: Any, quiet: bool = False) -> None:
        self.cfg = cfg
        self.terminal = err_console.is_terminal
        self.live: Any = None

    def on_event(self, level: str, text: str) -> None:
        tag = {"eval": "", "warn": "warning: ", "error": "error: ", "info": ""}.get(level, "")
        if self.live is not None:
            style = {"warn": "yellow", "error": "red"}.get(level)
            self.live.console.print(Text(tag + text, style=style or ""), soft_wrap=True)
        else:
            sys.stderr.write(tag + text + "\n")
            sys.stderr.flush()

    def on_failure(self, name: str, failure: Any, retrying: bool) -> None:
        """A failed attempt of a request (the proposer reports each one as it happens)."""
        if retrying:
            self.on_event("warn", failure.describe(name.split(":", 1)[0]) + "; retrying")

    def render(self, search: Any) -> Group:
        if search is None:
            return Group(Text("starting ..."))
        states = list(search.states.values())
        active = [st for st in states if st.in_flight] + [st for st in states if not st.in_flight and st.evaluated]
        shown = active[-LIVE_ROWS:] if len(active) > LIVE_ROWS else active
        done = sum(1 for st in states if search.problem_done(st))
        parts: list[Any] = [Text(totals_line(search)), Text(f"problems: {done}/{len(states)} done")]
        parts.append(summary_table(search, self.cfg, shown))
        if len(states) > len(shown):
            parts.append(Text(f"... {len(states) - len(shown)} more problems not shown"))
        return Group(*parts)

    def watch(self, start: Any) -> Any:
        if not self.terminal:
            return start(lambda s: None, self.on_event)
        from rich.live import Live

        with Live(self.render(None), console=err_console, refresh_per_second=4, transient=True) as live:
            self.live = live
            try:
                return start(lambda s: live.update(self.render(s)), self.on_event)
            finally:
                self.live = None
