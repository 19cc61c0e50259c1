"""Starting, resuming and watching a run: builds the proposers and the evaluator, restores state
from the store on --resume, handles Ctrl-C (first: stop and record; second: exit at once), keeps a
heartbeat so that a run whose driver died reads as died, and reports progress."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuforge.agent.config import DEFAULT_CONCURRENCY, ConfigError, RunConfig, has_redactions
from cuforge.agent.llm_errors import Failure, RetryBudget
from cuforge.agent.loop import Search
from cuforge.agent.population import Member, register_bucket, source_key, technique_tags
from cuforge.agent.providers import (
    AnthropicProposer,
    OpenAIProposer,
    Price,
    PriceError,
    ProviderAuthError,
    ReplayProposer,
    RetryPolicy,
    load_prices,
)
from cuforge.problems.problem import Problem, ProblemError, SkippedProblem
from cuforge.problems.loader import load_in_dtype, shared_inspector
from cuforge.problems.suites import load_suite
from cuforge.results.store import HEARTBEAT_S, Store
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.driver.executor import Executor, ExecutorError
from cuforge.sandbox.driver.executor_choice import make_executor
from cuforge.sandbox.protocol.judges import judge_for

EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # stopped by SIGTERM: 128 + its number, as shells report it


def prices_for(cfg: RunConfig) -> dict[str, Price]:
    try:
        prices = load_prices(Path(cfg.prices)) if cfg.prices else load_prices()
    except PriceError as e:
        raise ConfigError(f"--prices: {e}") from None
    if cfg.price_in is not None and cfg.price_out is not None:
        for spec in cfg.proposers:
            if spec.provider in ("openai", "anthropic"):
                prices[spec.model] = Price(cfg.price_in, cfg.price_out, cfg.price_in)
    return prices


def build_proposers(cfg: RunConfig, on_failure: Callable[[str, Failure, bool], None] | None = None
                    ) -> list[tuple[Any, float]]:
    prices = prices_for(cfg)
    if cfg.budget_usd is not None:
        unpriced = sorted({s.model for s in cfg.proposers if s.provider in ("openai", "anthropic") and s.model not in prices})
        if unpriced:
            raise ConfigError(f"--budget-usd: no price for model {', '.join(unpriced)}, so spend cannot be counted; "
                              "pass --prices FILE or --price-in/--price-out (USD per million tokens)")
    retry = RetryPolicy(cfg.max_retries, cfg.retry_base_s, cfg.retry_max_wait_s, cfg.request_timeout_s)
    budget = RetryBudget(cfg.retry_budget)
    out: list[tuple[Any, float]] = []
    for spec in cfg.proposers:
        common = dict(temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                      concurrency=cfg.concurrency or DEFAULT_CONCURRENCY,
                      retry=retry, prices=prices, retry_budget=budget, on_failure=on_failure)
        try:
            if spec.provider == "openai":
                out.append((OpenAIProposer(spec.model, spec.base_url, spec.reasoning_effort, **common), spec.weight))
            elif spec.provider == "anthropic":
                out.append((AnthropicProposer(spec.model, spec.base_url, **common), spec.weight))
            elif spec.provider == "replay":
                out.append((ReplayProposer(Path(spec.replay_file)), spec.weight))
            else:
                from cuforge.agent.template_proposer import TemplateProposer

                out.append((TemplateProposer(cfg.seed), spec.weight))
        except ProviderAuthError as e:
            raise ConfigError(str(e)) from None
    return out


def _why_skipped(skipped: list[SkippedProblem], limit: int = 3) -> str:
    shown = "; ".join(f"{Path(s.path).name}: {s.reason.splitlines()[0] if s.reason else '?'}" for s in skipped[:limit])
    return shown + (f" (+{len(skipped) - limit} more)" if len(skipped) > limit else "")


def select_problems(cfg: RunConfig, on_file: Callable[[Path], None] | None = None
                    ) -> tuple[list[Problem], list[SkippedProblem]]:
    """The run's problems, and the suite's files that could not be loaded (each with why)."""
    suite = load_suite(cfg.suite, cfg.inspect_timeout_s, on_file)
    problems, skipped = suite.problems, list(suite.skipped)
    if cfg.problems:
        wanted = set(cfg.problems)
        problems = [p for p in problems if p.id in wanted or p.name in wanted]
        missing = wanted - {p.id for p in problems} - {p.name for p in problems}
        broken = [s for s in skipped if Path(s.path).stem in missing or s.path in missing]
        if broken:
            raise ConfigError(f"--problem: {_why_skipped(broken)}")
        if missing:
            raise ConfigError(f"--problem: no problem {', '.join(sorted(missing))} in suite {suite.name}")
        skipped = []  # the files not asked for are not this run's business
    if cfg.dtype:  # every problem in that dtype; one that is not fp32 cannot be cast, and says so
        cast: list[Problem] = []
        with shared_inspector():  # one inspector child traces them all
            for p in problems:
                try:
                    cast.append(load_in_dtype(p, cfg.dtype, cfg.inspect_timeout_s))
                except ProblemError as e:
                    skipped.append(SkippedProblem(str(p.path or p.id), str(e)))
        problems = cast
    if cfg.precision:  # the run's contract decides what the families may compute (a TF32 convolution)
        problems = [p.under(cfg.precision) for p in problems]
    if cfg.device == "cpu" and not cfg.compile_only:
        refused = [(p, p.cpu_mode_refusal()) for p in problems]
        skipped += [SkippedProblem(str(p.path or p.id), why) for p, why in refused if why]
        problems = [p.for_cpu_test_mode() for p, why in refused if not why]
    if not problems:
        why = f": every file was skipped ({_why_skipped(skipped)})" if skipped else ""
        raise ConfigError(f"--suite: suite {suite.name} has no loadable problems{why}")
    return problems, skipped


def build_executor(cfg: RunConfig) -> Executor:
    try:
        # Code an LLM (or a replayed run) wrote goes to the split judge; the template search's own kernels
        # to the in-process one, where evaluations per GPU-minute are what the search is limited by.
        untrusted = any(p.provider != "template" for p in cfg.proposers)
        return make_executor(cfg.executor, cfg.gpus, cfg.device == "cpu", cfg.compile_only, cfg.ray_address,
                             cfg.ray_resource, judge_for(untrusted))
    except ExecutorError as e:
        raise ConfigError(str(e)) from None


def resume_config(stored: dict[str, Any], flags: dict[str, Any], provider_flags: dict[str, Any]) -> dict[str, Any]:
    """A stored run's settings with what was given now on top: other flags as usual, and provider
    settings (--model, --base-url, --replay, --reasoning-effort) without --provider applied to the
    stored proposers of the kind they fit."""
    merged = dict(stored)
    given = {k: v for k, v in provider_flags.items() if v is not None}
    if given and "proposers" not in flags:
        specs = []
        for p in stored.get("proposers", []):
            p = dict(p)
            if p.get("provider") in ("openai", "anthropic"):
                p.update({k: v for k, v in given.items() if k in ("model", "base_url", "reasoning_effort")})
            if p.get("provider") == "replay" and "replay_file" in given:
                p["replay_file"] = given["replay_file"]
            specs.append(p)
        merged["proposers"] = specs
    for p in merged.get("proposers", []):
        url = p.base_url if hasattr(p, "base_url") else p.get("base_url")
        if has_redactions(url):
            raise ConfigError("--base-url: the stored URL had credentials, which are never stored; "
                              "pass --base-url again to resume")
    merged.update({k: v for k, v in flags.items() if v is not None})
    return merged


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
        search.stats.evaluations += 1
        search.stats.succeeded += row["status"] in ("ok", "compiled")
        _remember(search, st.problem, src)
        if speedup is not None and (st.best_speedup is None or speedup > st.best_speedup):
            st.best_speedup, st.since_improvement = speedup, 0
        else:
            st.since_improvement += 1
        st.history.append(st.best_speedup or 0.0)
    # Requests that gave no candidate (provider errors, duplicates) used their slots too.
    for problem_id, n in store.llm_calls_without_candidate(run_id).items():
        if problem_id in search.states:
            search.states[problem_id].proposed += n
    usage = store.llm_usage(run_id)
    spend = search.budget.spend
    spend.tokens_in, spend.tokens_out, spend.cost_usd = int(usage["tokens_in"]), int(usage["tokens_out"]), usage["cost_usd"]
    spend.estimated_calls = int(usage["estimated_calls"])
    s = search.stats
    s.tokens_in, s.tokens_out, s.cost_usd, s.llm_calls = spend.tokens_in, spend.tokens_out, spend.cost_usd, int(usage["calls"])
    s.estimated_calls, s.errors = spend.estimated_calls, store.llm_errors(run_id)
    for proposer, _ in search.proposers:
        if isinstance(proposer, ReplayProposer):
            proposer.skip(int(usage["replies"]))
    pending = []
    for row in store.pending_candidates(run_id):
        st = search.states.get(row["problem_id"])
        if st is None or row["format"] == "raw":
            continue
        from cuforge.sandbox.protocol.candidate import LaunchSpec

        launch = LaunchSpec.from_dict(row["launch"]) if row["launch"] else None
        cand = Candidate(row["source"], row["format"], launch, row["proposer"])
        parent = members.get(row["parents"][0]) if row["parents"] else None
        pending.append((row["candidate_id"], st.problem, cand, parent, row["started_at"]))
        st.population.keys.add(source_key(row["source"]))
        _remember(search, st.problem, row["source"])
    return pending


def _remember(search: Search, problem: Problem, source: str) -> None:
    """The template search does not propose again what the run already has."""
    for proposer, _ in search.proposers:
        remember = getattr(proposer, "remember", None)
        if remember is not None:
            remember(problem, source)


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@dataclass
class Prepared:
    """Everything a run needs, built before anything is shown or started, so that bad settings fail
    with one line and nothing half-made."""

    cfg: RunConfig
    problems: list[Problem]
    proposers: list[tuple[Any, float]]
    executor: Executor
    skipped: list[SkippedProblem]


def prepare(cfg: RunConfig, on_failure: Callable[[str, Failure, bool], None] | None = None,
            on_file: Callable[[Path], None] | None = None) -> Prepared:
    # Options first, the suite last: a bad option fails at once, before problem files are inspected.
    proposers = build_proposers(cfg, on_failure)
    executor = build_executor(cfg)
    try:
        problems, skipped = select_problems(cfg, on_file)
    except BaseException:
        executor.close()
        raise
    return Prepared(cfg, problems, proposers, executor, skipped)


def execute(prep: Prepared | RunConfig, store: Store, run_id: str | None, resume: bool,
            on_update: Callable[[Search], None] | None = None,
            on_event: Callable[[str, str], None] | None = None) -> tuple[str, Search]:
    """Run (or resume) to completion, a budget, an error or Ctrl-C. The run's status is kept current.
    Takes what prepare() built, or settings to prepare from (benchmarks and tests)."""
    if isinstance(prep, RunConfig):
        prep = prepare(prep)
    cfg = prep.cfg
    if resume:
        assert run_id is not None
        store.claim_run(run_id, cfg.to_stored_dict())
    else:
        run_id = run_id or new_run_id()
        store.create_run(run_id, cfg.suite, cfg.to_stored_dict())
        for p in prep.problems:
            store.add_run_problem(run_id, p.id, p.source, {"flops": p.meta.flops, "bytes": p.meta.bytes,
                                                           "dtype": p.meta.dtype, "families": list(p.meta.families)})
        for sk in prep.skipped:
            store.add_run_skipped(run_id, sk.path, sk.reason)
    search = Search(cfg, store, run_id, prep.problems, prep.proposers, prep.executor, on_update, on_event)
    status = "failed"
    try:
        status = asyncio.run(_drive(search, store, run_id, resume))
    except KeyboardInterrupt:  # Ctrl-C before the run's own handlers were in place
        status = "stopped"
        raise
    finally:
        prep.executor.close()
        for st in search.states.values():
            if st.finished:  # not covered, nothing left to try, a reply kept failing: the whole reason
                store.note_run_problem(run_id, st.problem.id, ended=st.finished)
        store.set_run_status(run_id, status, gpu=search.device.get("name"),
                             software=f"torch {search.device.get('torch')}" if search.device else None)
    return run_id, search


async def _drive(search: Search, store: Store, run_id: str, resume: bool) -> str:
    loop = asyncio.get_running_loop()

    def second_interrupt() -> None:
        # At once: end the workers, record the run as stopped, exit.
        try:
            close = getattr(search.executor, "close", None)
            if close:
                close()
            store.set_run_status(run_id, "stopped")
        finally:
            os._exit(EXIT_INTERRUPTED)

    signalled: list[int] = []

    def interrupt(signum: int) -> None:
        # One handler for both signals, never swapped: between removing a handler and adding another,
        # a second Ctrl-C met Python's default one and its KeyboardInterrupt recorded the run as failed.
        if signalled:
            second_interrupt()
            return
        signalled.append(signum)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        verb = "interrupted" if signum == signal.SIGINT else "terminated"
        search.request_stop(f"{verb} ({name}); resume with: cuforge run --resume {run_id}")
        search.on_event("warn", f"stopping on {name}: requests cancelled, evaluations in progress abandoned "
                                f"({'Ctrl-C again' if signum == signal.SIGINT else 'a second signal'} exits at once)")

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt, sig)
    except (NotImplementedError, RuntimeError):
        pass
    heart = asyncio.create_task(_heartbeat(store, run_id))
    try:
        if resume:
            await search.resume_pending(restore(search, store, run_id))
        if not search.stop.is_set():
            await search.run()
    except Exception as e:  # noqa: BLE001 - recorded as the run's end
        search.stats.stop_reason = search.stats.stop_reason or f"{type(e).__name__}: {e}"
        return "aborted"
    finally:
        heart.cancel()
    if search.aborted:
        return "aborted"
    return "stopped" if search.abandoned else "finished"


async def _heartbeat(store: Store, run_id: str) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        try:
            store.heartbeat(run_id)
        except Exception:  # noqa: BLE001 - a busy store must not end the run; the next beat retries
            pass
