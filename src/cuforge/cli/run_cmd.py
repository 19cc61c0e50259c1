"""`cuforge run`: the search, with live progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from cuforge.cli.app import EXIT_FAILURES, app, console, emit_json, err_console, fail


@app.command()
def run(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Built-in suite or a directory of problem files."),
    problem: Optional[list[str]] = typer.Option(None, "--problem", "-p", help="Only these problems (repeatable)."),
    provider: Optional[str] = typer.Option(None, help="openai, anthropic, replay (template: the offline search)."),
    model: Optional[str] = typer.Option(None, help="Model name for openai/anthropic."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (vLLM, SGLang, Ollama, llama.cpp)."),
    replay: Optional[Path] = typer.Option(None, help="JSONL of recorded replies, for --provider replay."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature (default 0.7)."),
    max_tokens: Optional[int] = typer.Option(None, help="Most tokens per reply (default 8192)."),
    reasoning_effort: Optional[str] = typer.Option(None, help="openai reasoning models: low, medium or high."),
    prices: Optional[Path] = typer.Option(None, help="TOML price table overriding the built-in one."),
    islands: Optional[int] = typer.Option(None, min=1, help="Islands per problem (default 4)."),
    generations: Optional[int] = typer.Option(None, min=1, help="Proposals per island per problem (default 4)."),
    budget_usd: Optional[float] = typer.Option(None, help="Stop when LLM spend reaches this many dollars."),
    budget_tokens: Optional[int] = typer.Option(None, help="Stop when this many LLM tokens are used."),
    wall_time: Optional[float] = typer.Option(None, help="Stop after this many seconds."),
    patience: Optional[int] = typer.Option(None, help="Stop a problem after N evaluations without a new best."),
    concurrency: Optional[int] = typer.Option(None, min=1, help="LLM requests in flight (default 4)."),
    baseline: Optional[str] = typer.Option(None, help="Baseline the reward is measured against (default torch)."),
    results: Path = typer.Option(Path("results/cuforge.db"), help="SQLite results store (a file, or a directory for DIR/cuforge.db)."),
    resume: Optional[str] = typer.Option(None, help="Continue this run where it stopped."),
    compile_only: bool = typer.Option(False, "--compile-only", help="Compiler feedback only: no GPU needed."),
    cpu: bool = typer.Option(False, "--cpu", help="Evaluate with the harness's CPU test mode (no GPU timings)."),
    executor: Optional[str] = typer.Option(None, help="local (default: a worker per GPU of this host) or ray."),
    gpus: Optional[str] = typer.Option(None, help="GPUs to use: all (default), indices like 0,1, or a worker count "
                                              "with --compile-only/--cpu or --executor ray."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster: auto or ray://host:port (default: running or new local)."),
    ray_resource: Optional[str] = typer.Option(None, help="Ray resource one evaluation worker takes (default GPU)."),
    config: Optional[Path] = typer.Option(None, help="TOML file with the same settings; flags win."),
    prompt_dir: Optional[Path] = typer.Option(None, help="Directory of prompt templates overriding the built-in ones."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary at the end."),
) -> None:
    """Search for faster kernels: propose, evaluate in the sandbox, evolve; everything goes to the store."""
    from cuforge.agent.config import ConfigError, ProposerSpec, load_toml, merge
    from cuforge.agent.run import execute
    from cuforge.problems.problem import ProblemError
    from cuforge.results.store import Store, StoreError

    if results.is_dir():
        results = results / "cuforge.db"
    try:
        store = Store(results)
        if resume:
            file_settings = store.run(resume).config
        else:
            file_settings = load_toml(config) if config else {}
        flags: dict[str, Any] = {"suite": suite, "problems": problem or None, "islands": islands,
                                 "generations": generations, "budget_usd": budget_usd, "budget_tokens": budget_tokens,
                                 "wall_time_s": wall_time, "patience": patience, "concurrency": concurrency,
                                 "baseline": baseline, "compile_only": compile_only or None,
                                 "device": "cpu" if cpu else None, "prompt_dir": str(prompt_dir) if prompt_dir else None,
                                 "temperature": temperature, "max_tokens": max_tokens,
                                 "prices": str(prices) if prices else None, "executor": executor, "gpus": gpus,
                                 "ray_address": ray_address, "ray_resource": ray_resource}
        if provider:
            flags["proposers"] = [ProposerSpec(provider, model or "", base_url, 1.0, str(replay) if replay else None,
                                               reasoning_effort)]
        cfg = merge(file_settings, flags)
    except (ConfigError, StoreError) as e:
        fail(str(e))
    live_table = _RunView(cfg)
    try:
        from rich.live import Live

        with Live(live_table.render(None), console=err_console, refresh_per_second=4, transient=as_json) as live:
            run_id, search = execute(cfg, store, resume, bool(resume), lambda s: live.update(live_table.render(s)))
            live.update(live_table.render(search))
    except (ConfigError, ProblemError, StoreError) as e:
        fail(str(e))
    summary = {"run_id": run_id, "stop_reason": search.stats.stop_reason, "evaluations": search.stats.evaluations,
               "parse_errors": search.stats.parse_errors, "duplicates": search.stats.duplicates,
               "llm_calls": search.stats.llm_calls, "cost_usd": search.stats.cost_usd,
               "best": {pid: st.best_speedup for pid, st in search.states.items()}}
    if as_json:
        emit_json(summary)
    else:
        console.print(f"run {run_id}: {search.stats.stop_reason}; {search.stats.evaluations} evaluations. "
                      f"Next: cuforge leaderboard --run {run_id}; cuforge report {run_id}", highlight=False)
    aborted = search.stats.stop_reason and not search.stats.stop_reason.startswith(("all problems", "interrupted", "budget",
                                                                                    "wall time", "every proposer"))
    raise typer.Exit(EXIT_FAILURES if aborted else 0)


class _RunView:
    """The live progress table of `cuforge run`."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def render(self, search: Any) -> Table:
        t = Table(title="cuforge run" + (" (compile-only)" if self.cfg.compile_only else ""))
        for col in ("problem", "evaluated", "best speedup", "state"):
            t.add_column(col)
        if search is None:
            return t
        for pid, st in search.states.items():
            best = f"{st.best_speedup:.3f}x" if st.best_speedup else "-"
            t.add_row(pid, f"{st.evaluated}/{self.cfg.max_candidates_per_problem}", best,
                      search.problem_done(st) or ("running" if st.in_flight else "waiting"))
        s = search.stats
        t.caption = (f"{s.evaluations} evaluations, {s.evals_per_minute:.1f}/min; LLM {s.llm_calls} calls, "
                     f"{s.tokens_in + s.tokens_out} tokens, ${s.cost_usd:.2f}; parse errors {s.parse_errors}, "
                     f"duplicates {s.duplicates}")
        return t
