"""The search loop: concurrent proposal requests feed one evaluation queue drained by one consumer
per executor slot (one evaluation at a time per GPU, so timings never interfere); rewards update each problem's population; everything is
written to the results store as it happens, so a killed run resumes without losing or repeating a
finished evaluation."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuforge.agent.config import RunConfig
from cuforge.agent.parse import ParseError, parse_response
from cuforge.agent.population import Member, Population, register_bucket, source_key, technique_tags
from cuforge.agent.prompts import render
from cuforge.agent.providers import ContextLengthError, ProposerExhausted, ProviderAuthError, ProviderError
from cuforge.problems.problem import Problem
from cuforge.results.store import Store
from cuforge.rewards import Outcome, get_reward
from cuforge.sandbox.candidate import Candidate
from cuforge.sandbox.evaluation import EvalConfig, Evaluation


class RunAborted(RuntimeError):
    """The run cannot go on (credentials refused, say); the message names the cause."""


@dataclass
class ProblemState:
    problem: Problem
    population: Population
    proposed: int = 0  # candidates created (evaluated or in flight)
    evaluated: int = 0
    in_flight: int = 0
    best_speedup: float | None = None
    since_improvement: int = 0
    finished: str = ""  # why this problem stopped, once it has
    history: list[float] = field(default_factory=list)  # best speedup so far after each evaluation


@dataclass
class RunStats:
    started: float = field(default_factory=time.monotonic)
    evaluations: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    llm_calls: int = 0
    parse_errors: int = 0
    duplicates: int = 0
    stop_reason: str = ""

    @property
    def evals_per_minute(self) -> float:
        minutes = (time.monotonic() - self.started) / 60
        return self.evaluations / minutes if minutes > 0 else 0.0


def eval_config(cfg: RunConfig, problem: Problem) -> EvalConfig:
    """Every baseline the problem names is timed beside each candidate (the leaderboard's per-shape
    table needs cuBLAS and cuBLASLt), except torch.compile unless it is the run's baseline: its
    compile time would dominate short evaluations."""
    wanted = [b for b in problem.meta.baselines if b != "torch.compile" or cfg.baseline == "torch.compile"]
    baselines = tuple(dict.fromkeys(["torch", *wanted]))
    return EvalConfig(device="cpu" if cfg.compile_only else cfg.device, baselines=baselines, compile_only=cfg.compile_only,
                      timeout_s=cfg.eval_timeout_s, max_timing_s=cfg.max_timing_s)


def feedback_text(ev: Evaluation, baseline: str) -> str:
    """What the next prompt learns of this evaluation."""
    lines = [f"status: {ev.status}" + (f" - {ev.message}" if ev.message else "")]
    lines += [str(d) for d in ev.diagnostics[:8]]
    comp = ev.correctness.get("comparison") or {}
    if comp.get("sample"):
        lines.append(f"max abs err {comp.get('max_abs_err', 0):.3g}, max rel err {comp.get('max_rel_err', 0):.3g}; "
                     "mismatches: " + "; ".join(f"{tuple(s['index'])}: got {s['got']:.5g} expected {s['expected']:.5g}"
                                                for s in comp["sample"][:5]))
    for name, t in ev.timings.items():
        lines.append(f"{name}: median {t.median_ms:.4f} ms (p20 {t.p20_ms:.4f}, p80 {t.p80_ms:.4f}, n {t.n})")
    s = ev.speedup_vs(baseline)
    if s:
        lines.append(f"speedup vs {baseline}: {s:.3f}x")
    if ev.profile and ev.profile.summary:
        lines.append(ev.profile.summary)
    return "\n".join(lines)


class Search:
    """One run over a set of problems."""

    def __init__(self, cfg: RunConfig, store: Store, run_id: str, problems: list[Problem],
                 proposers: list[tuple[Any, float]], evaluate: Callable[[Problem, Candidate, EvalConfig], Evaluation],
                 on_update: Callable[[Search], None] | None = None) -> None:
        self.cfg, self.store, self.run_id = cfg, store, run_id
        self.proposers = proposers
        # An executor (sandbox/executor.py) or any callable; one evaluation per slot at a time.
        self.evaluate_blocking = getattr(evaluate, "evaluate", evaluate)
        self.slots = max(1, int(getattr(evaluate, "slots", 1)))
        self.on_update = on_update or (lambda s: None)
        self.rng = random.Random(cfg.seed)
        self.states = {p.id: ProblemState(p, Population(cfg.islands, seed=cfg.seed)) for p in problems}
        self.stats = RunStats()
        self.stop = asyncio.Event()
        self.device: dict[str, Any] = {}
        self.ceilings: dict[str, Any] | None = None  # measured by the worker; quoted in prompts
        self.reward = get_reward(cfg.reward)
        self._exhausted: set[int] = set()

    # -------------------------------------------------------------- budgets

    def budget_left(self) -> str:
        """Empty while the run may go on, else the reason it must stop."""
        c = self.cfg
        if self.stop.is_set():
            return self.stats.stop_reason or "stopped"
        if c.budget_usd is not None and self.stats.cost_usd >= c.budget_usd:
            return f"budget of ${c.budget_usd:g} spent"
        if c.budget_tokens is not None and self.stats.tokens_in + self.stats.tokens_out >= c.budget_tokens:
            return f"budget of {c.budget_tokens} tokens spent"
        if c.wall_time_s is not None and time.monotonic() - self.stats.started >= c.wall_time_s:
            return f"wall time of {c.wall_time_s:g} s used"
        if len(self._exhausted) == len(self.proposers):
            return "every proposer is exhausted"
        return ""

    def problem_done(self, st: ProblemState) -> str:
        if st.finished:
            return st.finished
        if st.proposed >= self.cfg.max_candidates_per_problem:
            return "generations done"
        if self.cfg.patience and st.since_improvement >= self.cfg.patience and st.best_speedup is not None:
            return f"no improvement in {self.cfg.patience} evaluations"
        return ""

    def next_problem(self) -> ProblemState | None:
        open_states = [s for s in self.states.values() if not self.problem_done(s)]
        if not open_states:
            return None
        return min(open_states, key=lambda s: (s.in_flight, s.proposed))

    # -------------------------------------------------------------- the loop

    async def run(self) -> RunStats:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=max(self.slots, self.cfg.concurrency))
        consumers = [asyncio.create_task(self._gpu_consumer(queue)) for _ in range(self.slots)]
        # With several GPUs, enough proposals in flight that each has its next candidate waiting when it
        # frees up; with one, exactly `concurrency` (1 keeps an LLM's edits strictly sequential).
        n_workers = max(1, self.cfg.concurrency) if self.slots == 1 else max(self.cfg.concurrency, 2 * self.slots)
        workers = [asyncio.create_task(self._proposal_worker(queue)) for _ in range(n_workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for _ in consumers:
                await queue.put(None)
            await asyncio.gather(*consumers)
        self.stats.stop_reason = self.stats.stop_reason or self.budget_left() or "all problems done"
        return self.stats

    async def resume_pending(self, pending: list[tuple[int, Problem, Candidate, Member | None]]) -> None:
        """Candidates a killed run stored but never finished evaluating: evaluate them first, one per slot."""
        slots = asyncio.Semaphore(self.slots)

        async def one(cid: int, problem: Problem, cand: Candidate, parent: Member | None) -> None:
            st = self.states[problem.id]
            async with slots:
                ev = await asyncio.to_thread(self.evaluate_blocking, problem, cand, eval_config(self.cfg, problem))
            self._record(st, cid, cand, ev, parent, island=0, generation=st.proposed)
            st.proposed += 1

        await asyncio.gather(*(one(*p) for p in pending))

    async def _gpu_consumer(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            problem, cand, future = item
            try:
                ev = await asyncio.to_thread(self.evaluate_blocking, problem, cand, eval_config(self.cfg, problem))
                if ev.device.get("name"):
                    self.device = ev.device
                if ev.profile and ev.profile.ceilings:
                    self.ceilings = ev.profile.ceilings
                future.set_result(ev)
            except Exception as e:  # noqa: BLE001 - surfaced to the waiting proposal
                future.set_exception(e)

    async def _proposal_worker(self, queue: asyncio.Queue[Any]) -> None:
        while not self.budget_left():
            st = self.next_problem()
            if st is None:
                return
            st.in_flight += 1
            st.proposed += 1
            try:
                await self._step(st, queue)
            except RunAborted as e:
                self.stats.stop_reason = str(e)
                self.stop.set()
                raise
            finally:
                st.in_flight -= 1
                self.on_update(self)

    def _pick_proposer(self) -> tuple[int, Any]:
        live = [(i, p, w) for i, (p, w) in enumerate(self.proposers) if i not in self._exhausted]
        i, p, _ = self.rng.choices(live, weights=[w for _, _, w in live], k=1)[0]
        return i, p

    async def _step(self, st: ProblemState, queue: asyncio.Queue[Any]) -> None:
        pop = st.population
        island = pop.next_island()
        mode = pop.mode()
        parent = pop.select_parent(island) if mode == "IMPROVE" else pop.fix_target(island) if mode == "FIX" else None
        generation = st.proposed - 1
        idx, proposer = self._pick_proposer()
        if hasattr(proposer, "propose_candidate"):  # the offline template search: no LLM in between
            await self._template_step(st, queue, proposer, mode, parent, island, generation)
            return
        proposal, prompt = await self._ask(st, proposer, idx, mode, parent)
        if proposal is None:
            st.proposed -= 1  # nothing was proposed: the slot is not used up
            return
        call = dict(provider=proposal.provider, model=proposal.model, status="ok", tokens_in=proposal.tokens_in,
                    tokens_out=proposal.tokens_out, tokens_cached=proposal.tokens_cached, cost_usd=proposal.cost_usd,
                    latency_s=proposal.latency_s, prompt=prompt.user, response=proposal.text)
        lineage = dict(parents=[parent.candidate_id] if parent else [], prompt=prompt.user, island=island,
                       generation=generation)
        try:
            parsed = parse_response(proposal.text, parent.source if parent else None)
        except ParseError as e:
            self.stats.parse_errors += 1
            raw = {"source": proposal.text, "format": "raw", "proposer": proposer.name}
            self.store.record_proposal(
                self.run_id, st.problem.id, call,
                dict(candidate=raw, candidate_hash=source_key(proposal.text), meta={"mode": mode}, **lineage),
                {"problem_id": st.problem.id, "status": "parse_error", "message": str(e)},
                self.reward(Outcome("parse_error")))
            return
        if pop.is_duplicate(parsed.source):
            self.stats.duplicates += 1
            self.store.record_proposal(self.run_id, st.problem.id, call)
            st.proposed -= 1
            return
        cand = Candidate(parsed.source, "module", proposer=proposer.name, meta={"mode": mode, "edit": parsed.kind})
        cid = self.store.record_proposal(
            self.run_id, st.problem.id, call,
            dict(candidate=cand.to_dict(), candidate_hash=source_key(parsed.source),
                 meta={"mode": mode, "edit": parsed.kind}, **lineage))
        assert cid is not None
        pop.keys.add(source_key(parsed.source))  # no second copy while this one is in flight
        future: asyncio.Future[Evaluation] = asyncio.get_running_loop().create_future()
        await queue.put((st.problem, cand, future))
        ev = await future
        self._record(st, cid, cand, ev, parent, island, generation)

    async def _template_step(self, st: ProblemState, queue: asyncio.Queue[Any], proposer: Any, mode: str,
                             parent: Member | None, island: int, generation: int) -> None:
        from cuforge.agent.templates.proposer import NotCovered

        inspirations = st.population.inspirations(parent.candidate_id if parent else None, self.cfg.inspirations)
        try:
            cand = proposer.propose_candidate(st.problem, mode, parent, inspirations,
                                              self.device.get("compute_capability"))
        except NotCovered as e:
            st.finished = str(e)
            st.proposed -= 1
            return
        cid = self.store.add_candidate(self.run_id, st.problem.id, cand.to_dict(), source_key(cand.source),
                                       [parent.candidate_id] if parent else [], None, island, generation,
                                       {"mode": mode, **cand.meta})
        st.population.keys.add(source_key(cand.source))
        future: asyncio.Future[Evaluation] = asyncio.get_running_loop().create_future()
        await queue.put((st.problem, cand, future))
        ev = await future
        self._record(st, cid, cand, ev, parent, island, generation)

    async def _ask(self, st: ProblemState, proposer: Any, idx: int, mode: str, parent: Member | None) -> tuple[Any, Any]:
        """A proposal, shrinking the prompt on context-length errors; None when this try yields nothing."""
        k = self.cfg.inspirations
        prompt_dir = Path(self.cfg.prompt_dir) if self.cfg.prompt_dir else None
        while True:
            inspirations = st.population.inspirations(parent.candidate_id if parent else None, k)
            prompt = render(st.problem, mode, parent, inspirations, self.device, self.ceilings, self.cfg.baseline,
                            prompt_dir)
            try:
                proposal = await proposer.propose(prompt)
            except ContextLengthError:
                if k == 0:
                    self.store.add_llm_call(self.run_id, st.problem.id, proposer.provider, getattr(proposer, "model", ""),
                                            "context_length", prompt=None)
                    st.finished = "prompt too long even without inspirations"
                    return None, prompt
                k = 0 if k <= 1 else k // 2
                continue
            except ProviderAuthError as e:
                raise RunAborted(str(e)) from None
            except ProposerExhausted:
                self._exhausted.add(idx)
                return None, prompt
            except ProviderError as e:
                self.store.add_llm_call(self.run_id, st.problem.id, proposer.provider, getattr(proposer, "model", ""),
                                        "error", response=str(e)[:2000])
                self.stats.llm_calls += 1
                return None, prompt
            self.stats.llm_calls += 1
            self.stats.tokens_in += proposal.tokens_in
            self.stats.tokens_out += proposal.tokens_out
            self.stats.cost_usd += proposal.cost_usd
            return proposal, prompt  # the caller stores the call together with what it became

    def _record(self, st: ProblemState, cid: int, cand: Candidate, ev: Evaluation, parent: Member | None,
                island: int, generation: int) -> None:
        speedup = ev.speedup_vs(self.cfg.baseline) if ev.ok else None
        reward = self.reward(Outcome(ev.status, speedup, parent.speedup if parent else None))
        self.store.add_evaluation(cid, self.run_id, ev.to_dict(), reward)
        profile = vars(ev.profile) if ev.profile else None
        member = Member(cid, source_key(cand.source), ev.status, reward, speedup, island, generation,
                        technique_tags(cand.source) + (register_bucket(profile),),
                        (parent.candidate_id,) if parent else (), source=cand.source,
                        feedback=feedback_text(ev, self.cfg.baseline))
        st.population.add(member)
        st.evaluated += 1
        self.stats.evaluations += 1
        if speedup is not None and (st.best_speedup is None or speedup > st.best_speedup):
            st.best_speedup = speedup
            st.since_improvement = 0
        else:
            st.since_improvement += 1
        st.history.append(st.best_speedup or 0.0)
