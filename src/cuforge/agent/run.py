"""Starting, resuming and watching a run: builds the proposers and the evaluator, restores state
from the store on --resume, handles Ctrl-C, and shows live progress."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuforge.agent.config import ConfigError, RunConfig
from cuforge.agent.loop import Search
from cuforge.agent.population import Member, register_bucket, source_key, technique_tags
from cuforge.agent.providers import AnthropicProposer, OpenAIProposer, ReplayProposer, RetryPolicy, load_prices
from cuforge.problems.problem import Problem
from cuforge.problems.suites import load_suite
from cuforge.results.store import Store
from cuforge.sandbox.candidate import Candidate
from cuforge.sandbox.executor import Executor, ExecutorError, make_executor


def build_proposers(cfg: RunConfig) -> list[tuple[Any, float]]:
    prices = load_prices(Path(cfg.prices)) if cfg.prices else load_prices()
    out: list[tuple[Any, float]] = []
    for spec in cfg.proposers:
        common = dict(temperature=cfg.temperature, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency,
                      retry=RetryPolicy(), prices=prices)
        if spec.provider == "openai":
            out.append((OpenAIProposer(spec.model, spec.base_url, spec.reasoning_effort, **common), spec.weight))
        elif spec.provider == "anthropic":
            out.append((AnthropicProposer(spec.model, spec.base_url, **common), spec.weight))
        elif spec.provider == "replay":
            out.append((ReplayProposer(Path(spec.replay_file)), spec.weight))
        else:
            from cuforge.agent.templates.proposer import TemplateProposer

            out.append((TemplateProposer(cfg.seed), spec.weight))
    return out


def select_problems(cfg: RunConfig) -> list[Problem]:
    suite = load_suite(cfg.suite)
    problems = suite.problems
    if cfg.problems:
        wanted = set(cfg.problems)
        problems = [p for p in problems if p.id in wanted or p.name in wanted]
        missing = wanted - {p.id for p in problems} - {p.name for p in problems}
        if missing:
            raise ConfigError(f"no problem {', '.join(sorted(missing))} in suite {suite.name}")
    if not problems:
        raise ConfigError(f"suite {suite.name} has no loadable problems")
    return problems


def build_executor(cfg: RunConfig) -> Executor:
    try:
        return make_executor(cfg.executor, cfg.gpus, cfg.device == "cpu", cfg.compile_only, cfg.ray_address,
                             cfg.ray_resource)
    except ExecutorError as e:
        raise ConfigError(str(e)) from None


def restore(search: Search, store: Store, run_id: str) -> list[tuple[int, Problem, Candidate, Member | None]]:
    """Rebuild populations and budgets from what the store holds; return candidates still to evaluate."""
    cfg = search.cfg
    members: dict[int, Member] = {}
    for row in store.evaluations(run_id):
        st = search.states.get(row["problem_id"])
        if st is None:
            continue
        src = store.candidate_source(row["candidate_id"])["source"]
        speedup = (row["speedups"] or {}).get(cfg.baseline) if row["status"] == "ok" else None
        m = Member(row["candidate_id"], source_key(src), row["status"], row["reward"] or 0.0, speedup,
                   row["island"] or 0, row["generation"] or 0, technique_tags(src) + (register_bucket(row["profile"]),),
                   tuple(row["parents"]), source=src, feedback=f"status: {row['status']} {row['message']}".strip())
        members[m.candidate_id] = m
        st.population.add(m)
        st.proposed += 1
        st.evaluated += 1
        if speedup is not None and (st.best_speedup is None or speedup > st.best_speedup):
            st.best_speedup, st.since_improvement = speedup, 0
        else:
            st.since_improvement += 1
        st.history.append(st.best_speedup or 0.0)
    usage = store.llm_usage(run_id)
    search.stats.tokens_in, search.stats.tokens_out = int(usage["tokens_in"]), int(usage["tokens_out"])
    search.stats.cost_usd, search.stats.llm_calls = usage["cost_usd"], int(usage["calls"])
    for proposer, _ in search.proposers:
        if isinstance(proposer, ReplayProposer):
            proposer.skip(int(usage["calls"]))
    pending = []
    for row in store.pending_candidates(run_id):
        st = search.states.get(row["problem_id"])
        if st is None or row["format"] == "raw":
            continue
        from cuforge.sandbox.candidate import LaunchSpec

        launch = LaunchSpec.from_dict(row["launch"]) if row["launch"] else None
        cand = Candidate(row["source"], row["format"], launch, row["proposer"])
        parent = members.get(row["parents"][0]) if row["parents"] else None
        pending.append((row["candidate_id"], st.problem, cand, parent))
        st.population.keys.add(source_key(row["source"]))
    return pending


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def execute(cfg: RunConfig, store: Store, run_id: str | None, resume: bool,
            on_update: Callable[[Search], None] | None = None) -> tuple[str, Search]:
    """Run (or resume) to completion, a budget, or Ctrl-C. The run's status is kept current."""
    problems = select_problems(cfg)
    proposers = build_proposers(cfg)
    if resume:
        assert run_id is not None
    else:
        run_id = run_id or new_run_id()
        store.create_run(run_id, cfg.suite, cfg.to_dict())
        for p in problems:
            store.add_run_problem(run_id, p.id, p.source, {"flops": p.meta.flops, "bytes": p.meta.bytes,
                                                           "dtype": p.meta.dtype, "families": list(p.meta.families)})
    executor = build_executor(cfg)
    search = Search(cfg, store, run_id, problems, proposers, executor, on_update)
    status = "failed"
    try:
        status = asyncio.run(_drive(search, store, run_id, resume))
    finally:
        executor.close()
        store.set_run_status(run_id, status, gpu=search.device.get("name"),
                             software=f"torch {search.device.get('torch')}" if search.device else None)
    return run_id, search


async def _drive(search: Search, store: Store, run_id: str, resume: bool) -> str:
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        search.stats.stop_reason = "interrupted (Ctrl-C); resume with --resume " + run_id
        search.stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C aborts at once

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError):
        pass
    if resume:
        store.set_run_status(run_id, "running")
        await search.resume_pending(restore(search, store, run_id))
    try:
        await search.run()
    except Exception as e:  # noqa: BLE001 - recorded as the run's end
        search.stats.stop_reason = search.stats.stop_reason or f"{type(e).__name__}: {e}"
        return "aborted"
    return "stopped" if search.stop.is_set() else "finished"
