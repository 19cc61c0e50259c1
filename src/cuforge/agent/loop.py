"""The search loop: concurrent proposal requests feed one evaluation queue drained by one consumer
per executor slot (one evaluation at a time per GPU, so timings never interfere); rewards update each
problem's population; everything is written to the results store as it happens, so a killed run
resumes without losing or repeating a finished evaluation.

Every paid request is bounded: each one takes a proposal slot of its problem (islands x generations),
whatever comes back; a problem whose requests keep yielding nothing to evaluate ends; a provider that
keeps failing ends the run; budgets reserve a request's worst case before it is sent."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuforge.agent.budget import Budget
from cuforge.agent.config import RunConfig, proposals_in_flight
from cuforge.agent.parse import ParseError, parse_response
from cuforge.agent.population import Member, Population, register_bucket, source_key, technique_tags
from cuforge.agent.prompts import render
from cuforge.agent.partial import partial_cover
from cuforge.agent.providers import ContextLengthError, ProposerExhausted, ProviderError
from cuforge.problems.problem import Problem
from cuforge.results.store import Store
from cuforge.rewards import Outcome, get_reward
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.protocol.prebuilt import builds_ahead
from cuforge.sandbox.protocol.prebuilt_cubins import kernel_sources

# How far repeated duplicates push the sampling temperature up (per duplicate in a row), and the cap.
DUPLICATE_TEMPERATURE_STEP = 0.25
MAX_TEMPERATURE = {"anthropic": 1.0}
DEFAULT_MAX_TEMPERATURE = 1.5


class RunAborted(RuntimeError):
    """The run cannot go on (credentials refused, model not found, provider failing); the message
    names the provider, the status and the cause."""


@dataclass
class ProblemState:
    problem: Problem
    population: Population
    proposed: int = 0  # proposal slots used: requests sent (whatever came back) and template proposals
    evaluated: int = 0
    in_flight: int = 0
    best_speedup: float | None = None
    since_improvement: int = 0
    failures_in_row: int = 0  # requests in a row that gave nothing to evaluate
    duplicates_in_row: int = 0
    notice: str = ""  # said in the next prompt (a duplicate reply, say)
    finished: str = ""  # why this problem stopped, once it has
    history: list[float] = field(default_factory=list)  # best speedup so far after each evaluation
    partial: Any = None  # agent.partial.PartialCover for the prompt; False: none (asked once)


@dataclass
class RunStats:
    started: float = field(default_factory=time.monotonic)
    evaluations: int = 0
    succeeded: int = 0  # evaluations that came out ok (compiled, in a compile-only run)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    llm_calls: int = 0  # proposal requests, each counted once whatever came back
    http_requests: int = 0  # requests on the wire, retries included
    estimated_calls: int = 0  # calls whose token counts were estimated (the server sent no usage)
    parse_errors: int = 0
    duplicates: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # provider failures by kind
    stop_reason: str = ""

    @property
    def evals_per_minute(self) -> float:
        minutes = (time.monotonic() - self.started) / 60
        return self.evaluations / minutes if minutes > 0 else 0.0

    @property
    def failed_requests(self) -> int:
        return sum(self.errors.values())


def eval_config(cfg: RunConfig, problem: Problem) -> EvalConfig:
    """Every baseline the problem names is timed beside each candidate (the leaderboard's per-shape
    table needs cuBLAS and cuBLASLt), and on a GPU torch.compile too, so that every run's leaderboard
    can be read against it (the worker compiles once per problem; later evaluations only time it).
    CPU test and compile-only runs skip it unless it is the run's baseline: inductor's C++ build
    would dominate them."""
    gpu = cfg.device == "cuda" and not cfg.compile_only
    wanted = [b for b in problem.meta.baselines if b != "torch.compile"]
    if gpu or cfg.baseline == "torch.compile":
        wanted.append("torch.compile")
    baselines = tuple(dict.fromkeys(["torch", *wanted]))
    memory = {"max_host_memory_gib": cfg.worker_memory_gib} if cfg.worker_memory_gib else {}
    return EvalConfig(device="cpu" if cfg.compile_only else cfg.device, baselines=baselines, compile_only=cfg.compile_only,
                      timeout_s=cfg.eval_timeout_s, max_timing_s=cfg.max_timing_s,
                      precision=problem.contract(cfg.precision), **memory)


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
                 on_update: Callable[[Search], None] | None = None,
                 on_event: Callable[[str, str], None] | None = None) -> None:
        self.cfg, self.store, self.run_id = cfg, store, run_id
        self.proposers = proposers
        # An executor (sandbox/executor.py) or any callable; one evaluation per slot at a time.
        self.executor = evaluate
        self.evaluate_blocking = getattr(evaluate, "evaluate", evaluate)
        self.slots = max(1, int(getattr(evaluate, "slots", 1)))
        # An executor that builds module candidates' extensions before they wait for a GPU (executor.py).
        self.build_ahead = getattr(evaluate, "build_ahead", None)
        self.on_update = on_update or (lambda s: None)
        self.on_event = on_event or (lambda level, text: None)  # level: "eval", "error", "warn", "info"
        self.rng = random.Random(cfg.seed)
        self.states = {p.id: ProblemState(p, Population(cfg.islands, seed=cfg.seed)) for p in problems}
        self.stats = RunStats()
        self.budget = Budget(cfg.budget_usd, cfg.budget_tokens, cfg.wall_time_s)
        self.budget.on_change = self._budget_changed
        self._budget_event: asyncio.Event | None = None
        self.stop = asyncio.Event()
        self.aborted = False  # ended by an error, not by a budget or the user
        self.abandoned = False  # work in flight was cancelled: what it would return is not recorded
        self.device: dict[str, Any] = {}
        self.ceilings: dict[str, Any] | None = None  # measured by the worker; quoted in prompts
        self.reward = get_reward(cfg.reward)
        self._exhausted: set[int] = set()
        self._provider_failures_in_row = 0
        self._tasks: list[asyncio.Task[Any]] = []

    # -------------------------------------------------------------- budgets and stopping

    def budget_left(self) -> str:
        """Empty while the run may go on, else the reason it must stop."""
        if self.stop.is_set():
            return self.stats.stop_reason or "stopped"
        why = self.budget.exhausted()
        if why:
            return why
        if len(self._exhausted) == len(self.proposers):
            return "every proposer is exhausted"
        return ""

    def problem_done(self, st: ProblemState) -> str:
        if st.finished:
            return st.finished
        if st.proposed >= self.cfg.max_candidates_per_problem:
            return "generations done"
        if self.cfg.patience and st.since_improvement >= self.cfg.patience:
            return f"no new best in {self.cfg.patience} evaluations"
        return ""

    def next_problem(self) -> ProblemState | None:
        open_states = [s for s in self.states.values() if not self.problem_done(s)]
        if not open_states:
            return None
        return min(open_states, key=lambda s: (s.in_flight, s.proposed))

    def request_stop(self, reason: str, abandon: bool = True, aborted: bool = False) -> None:
        """Stop proposing. With abandon, requests in flight are cancelled and evaluations in progress
        abandoned (their candidates stay stored, unevaluated, for --resume)."""
        if not self.stop.is_set():
            self.stats.stop_reason = reason
        self.aborted = self.aborted or aborted
        self.stop.set()
        if abandon:
            self.abandoned = True
            for t in self._tasks:
                t.cancel()
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()  # ends the worker processes, so blocked evaluations return at once

    def _budget_changed(self) -> None:
        if self._budget_event is not None:
            self._budget_event.set()
            self._budget_event = None

    async def _reserve(self, proposer: Any, prompt: Any) -> tuple[Any, str]:
        """A reservation for the request's worst case. One that does not fit beside the requests in
        flight waits for them to settle (each settles at its real cost, usually far under its worst
        case) and tries again; (None, why) only when nothing else is in flight or the run stops."""
        while True:
            reservation, why = self.budget.reserve(proposer, prompt)
            if reservation is not None or not self.budget.spend.reserved or self.budget.exhausted() or self.stop.is_set():
                return reservation, why
            if self._budget_event is None:
                self._budget_event = asyncio.Event()
            changed, stopped = (asyncio.ensure_future(e.wait()) for e in (self._budget_event, self.stop))
            try:
                await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                stopped.cancel()

    async def _watch_wall_time(self) -> None:
        """Wall time holds even while every task waits on a stalled server or a long evaluation."""
        assert self.cfg.wall_time_s is not None
        await asyncio.sleep(max(self.cfg.wall_time_s - (time.monotonic() - self.budget.started), 0))
        self.request_stop(f"wall time of {self.cfg.wall_time_s:g} s used")

    # -------------------------------------------------------------- the loop

    async def run(self) -> RunStats:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        consumers = [asyncio.create_task(self._gpu_consumer(queue)) for _ in range(self.slots)]
        n_workers = proposals_in_flight(self.cfg.concurrency, self.slots)
        workers = [asyncio.create_task(self._proposal_worker(queue)) for _ in range(n_workers)]
        self._tasks = workers + consumers
        watchdog = asyncio.create_task(self._watch_wall_time()) if self.cfg.wall_time_s is not None else None
        try:
            results = await asyncio.gather(*workers, return_exceptions=True)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            for _ in consumers:
                queue.put_nowait(None)
            await asyncio.gather(*consumers, return_exceptions=True)
            self._sync_requests()
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, (RunAborted, asyncio.CancelledError)):
                raise r
        self.stats.stop_reason = self.stats.stop_reason or self.budget_left() or "all problems done"
        return self.stats

    async def resume_pending(self, pending: list[tuple[int, Problem, Candidate, Member | None, float | None]]) -> None:
        """Candidates a killed run stored but never finished evaluating: evaluate them first, one per
        slot; except one a worker had already received when the driver died, which may be what
        killed it: that one is recorded as a crash, never run again."""
        slots = asyncio.Semaphore(self.slots)

        async def one(cid: int, problem: Problem, cand: Candidate, parent: Member | None, started_at: float | None) -> None:
            st = self.states[problem.id]
            if started_at is not None:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at))
                ev = Evaluation(problem_id=problem.id, candidate_id=cand.id, status="crash",
                                message=f"the run's driver died while this candidate was being evaluated (started "
                                        f"{when}); it is not run again")
                self._record(st, cid, cand, ev, parent, island=0, generation=st.proposed)
                st.proposed += 1
                return
            async with slots:
                if self.stop.is_set():
                    return
                self.store.mark_started(cid)
                ev = await asyncio.to_thread(self.evaluate_blocking, problem, cand, eval_config(self.cfg, problem))
            if self.abandoned:
                self.store.mark_started(cid, False)
                return  # stays pending for the next resume
            self._record(st, cid, cand, ev, parent, island=0, generation=st.proposed)
            st.proposed += 1

        tasks = [asyncio.create_task(one(*p)) for p in pending]
        self._tasks = tasks
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _gpu_consumer(self, queue: asyncio.Queue[Any]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            problem, cand, future, cid, prebuilt = item
            if future.done():  # its proposal was cancelled while it waited
                continue
            try:
                self.store.mark_started(cid)  # before the worker sees it: see resume_pending
                args = (problem, cand, eval_config(self.cfg, problem)) + (() if prebuilt is None else (prebuilt,))
                ev = await asyncio.to_thread(self.evaluate_blocking, *args)
                if ev.device.get("name"):
                    self.device = ev.device
                if ev.profile and ev.profile.ceilings:
                    self.ceilings = ev.profile.ceilings
                if not future.done():
                    future.set_result(ev)
            except Exception as e:  # noqa: BLE001 - surfaced to the waiting proposal
                if not future.done():
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
                self.request_stop(str(e), aborted=True)
                raise
            finally:
                st.in_flight -= 1
                self._sync_requests()
                self.on_update(self)

    def _sync_requests(self) -> None:
        self.stats.http_requests = sum(int(getattr(p, "requests", 0)) for p, _ in self.proposers)

    def _pick_proposer(self) -> tuple[int, Any]:
        live = [(i, p, w) for i, (p, w) in enumerate(self.proposers) if i not in self._exhausted]
        i, p, _ = self.rng.choices(live, weights=[w for _, _, w in live], k=1)[0]
        return i, p

    def _nothing_to_evaluate(self, st: ProblemState, why: str) -> None:
        """A request that yielded no candidate; enough of them in a row end the problem."""
        st.failures_in_row += 1
        st.since_improvement += 1
        if self.cfg.max_failures and st.failures_in_row >= self.cfg.max_failures and not st.finished:
            st.finished = f"{st.failures_in_row} requests in a row gave nothing to evaluate (last: {why})"
            self.on_event("warn", f"{st.problem.id}: {st.finished}")

    def _temperature(self, st: ProblemState, proposer: Any) -> float | None:
        """The configured temperature, raised after duplicate replies so that the next one differs."""
        if not st.duplicates_in_row:
            return None
        base = getattr(proposer, "temperature", self.cfg.temperature)
        cap = max(base, MAX_TEMPERATURE.get(getattr(proposer, "provider", ""), DEFAULT_MAX_TEMPERATURE))
        return min(cap, base + DUPLICATE_TEMPERATURE_STEP * st.duplicates_in_row)

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
            return
        call = dict(provider=proposal.provider, model=proposal.model, status="ok", tokens_in=proposal.tokens_in,
                    tokens_out=proposal.tokens_out, tokens_cached=proposal.tokens_cached, cost_usd=proposal.cost_usd,
                    latency_s=proposal.latency_s, prompt=prompt.user, response=proposal.text,
                    estimated=proposal.estimated)
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
            st.duplicates_in_row, st.notice = 0, ""
            self.on_event("eval", f"{st.problem.id}: parse_error - {e}")
            self._nothing_to_evaluate(st, f"unparsable reply: {e}")
            return
        key = source_key(parsed.source)
        if key in pop.keys:
            self.stats.duplicates += 1
            self.store.record_proposal(self.run_id, st.problem.id, {**call, "status": "duplicate"})
            st.duplicates_in_row += 1
            st.notice = self._duplicate_notice(pop, key)
            self.on_event("warn", f"{st.problem.id}: duplicate reply ({st.notice.split(';')[0]})")
            self._nothing_to_evaluate(st, "duplicate of an earlier candidate")
            return
        st.duplicates_in_row, st.notice = 0, ""
        cand = Candidate(parsed.source, "module", proposer=proposer.name, meta={"mode": mode, "edit": parsed.kind})
        cid = self.store.record_proposal(
            self.run_id, st.problem.id, call,
            dict(candidate=cand.to_dict(), candidate_hash=key, meta={"mode": mode, "edit": parsed.kind}, **lineage))
        assert cid is not None
        pop.keys.add(key)  # no second copy while this one is in flight
        await self._evaluate(st, queue, cid, cand, parent, island, generation)

    @staticmethod
    def _duplicate_notice(pop: Population, key: str) -> str:
        twin = next((m for m in pop.members.values() if m.key == key), None)
        if twin is None:
            seen = "a candidate still being evaluated"
        else:
            speed = f", {twin.speedup:.3f}x" if twin.speedup else ""
            seen = f"candidate {twin.candidate_id}, evaluated as {twin.status}{speed}"
        return (f"Your last reply was identical to {seen}; it was not evaluated again. "
                "Propose something different: another approach, tiling or memory layout.")

    async def _evaluate(self, st: ProblemState, queue: asyncio.Queue[Any], cid: int, cand: Candidate,
                        parent: Member | None, island: int, generation: int) -> None:
        future: asyncio.Future[Evaluation] = asyncio.get_running_loop().create_future()
        prebuilt = None
        if self.build_ahead is not None and (builds_ahead(cand) or kernel_sources(cand)):
            # Built on the CPU before it queues for a GPU (not yet started: a resume builds it again);
            # the executor says None where its GPU's supervisor builds it instead.
            prebuilt = await asyncio.to_thread(self.build_ahead, st.problem, cand, eval_config(self.cfg, st.problem))
        await queue.put((st.problem, cand, future, cid, prebuilt))
        try:
            ev = await future
        except asyncio.CancelledError:
            future.cancel()
            self.store.mark_started(cid, False)  # the run stopped it, not the candidate: --resume runs it
            raise
        if self.abandoned:
            self.store.mark_started(cid, False)  # the user stopped it, not the candidate: --resume runs it
            return  # the worker was ended under it: the candidate stays pending for --resume
        self._record(st, cid, cand, ev, parent, island, generation)

    async def _template_step(self, st: ProblemState, queue: asyncio.Queue[Any], proposer: Any, mode: str,
                             parent: Member | None, island: int, generation: int) -> None:
        from cuforge.agent.template_proposer import NotCovered

        inspirations = st.population.inspirations(parent.candidate_id if parent else None, self.cfg.inspirations)
        try:
            for _ in range(50):  # a config already evaluated (before a resume, say) is never proposed again
                cand = proposer.propose_candidate(st.problem, mode, parent, inspirations,
                                                  self.device.get("compute_capability"))
                if source_key(cand.source) not in st.population.keys:
                    break
            else:
                raise NotCovered("no config left that was not already evaluated")
        except NotCovered as e:
            st.finished = str(e)
            st.proposed -= 1
            return
        cid = self.store.add_candidate(self.run_id, st.problem.id, cand.to_dict(), source_key(cand.source),
                                       [parent.candidate_id] if parent else [], None, island, generation,
                                       {"mode": mode, **cand.meta})
        st.population.keys.add(source_key(cand.source))
        await self._evaluate(st, queue, cid, cand, parent, island, generation)

    async def _ask(self, st: ProblemState, proposer: Any, idx: int, mode: str, parent: Member | None) -> tuple[Any, Any]:
        """A proposal, shrinking the prompt on context-length errors (each shrink is a retry of the
        same request); None when this request yields nothing (recorded, counted and reported)."""
        k = self.cfg.inspirations
        prompt_dir = Path(self.cfg.prompt_dir) if self.cfg.prompt_dir else None
        provider, model = getattr(proposer, "provider", "?"), getattr(proposer, "model", "")
        for attempt in range(1 + self.cfg.max_retries):
            inspirations = st.population.inspirations(parent.candidate_id if parent else None, k)
            if st.partial is None:  # asked once per problem: the kernel cuforge has for part of it, if any
                st.partial = partial_cover(st.problem, self.device.get("compute_capability")) or False
            prompt = render(st.problem, mode, parent, inspirations, self.device, self.ceilings, self.cfg.baseline,
                            prompt_dir, notice=st.notice, partial=st.partial or None)
            reservation, why = await self._reserve(proposer, prompt)
            if reservation is None:
                st.proposed -= 1  # not sent: the slot is not used
                self.request_stop(why, abandon=False)
                return None, prompt
            try:
                proposal = await proposer.propose(prompt, temperature=self._temperature(st, proposer))
            except ContextLengthError:
                self.budget.release(reservation)
                if k == 0 or attempt == self.cfg.max_retries:
                    self.store.add_llm_call(self.run_id, st.problem.id, provider, model, "error:context", prompt=None)
                    self.stats.llm_calls += 1
                    st.finished = "prompt too long even without inspirations"
                    self.on_event("warn", f"{st.problem.id}: {st.finished}")
                    return None, prompt
                k = 0 if k <= 1 else k // 2
                continue
            except ProposerExhausted:
                self.budget.release(reservation)
                self._exhausted.add(idx)
                st.proposed -= 1
                return None, prompt
            except ProviderError as e:
                self.budget.release(reservation)
                self._provider_failed(st, proposer, e)
                return None, prompt
            except BaseException:
                self.budget.release(reservation)
                raise
            self.budget.settle(reservation, proposal)
            self._provider_failures_in_row = 0
            s, spend = self.stats, self.budget.spend
            s.llm_calls += 1
            s.tokens_in, s.tokens_out, s.cost_usd = spend.tokens_in, spend.tokens_out, spend.cost_usd
            s.estimated_calls = spend.estimated_calls
            return proposal, prompt  # the caller stores the call together with what it became
        raise AssertionError("unreachable: the last attempt returns")

    def _provider_failed(self, st: ProblemState, proposer: Any, e: ProviderError) -> None:
        """A request that failed for good: recorded, shown, counted; fatal kinds and a provider that
        keeps failing end the run."""
        kind = getattr(e, "kind", "server")
        self.store.add_llm_call(self.run_id, st.problem.id, getattr(proposer, "provider", "?"),
                                getattr(proposer, "model", ""), f"error:{kind}", response=str(e)[:2000])
        self.stats.llm_calls += 1
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
        self.on_event("error", str(e))
        if e.fatal:
            raise RunAborted(str(e))
        self._provider_failures_in_row += 1
        if self.cfg.max_failures and self._provider_failures_in_row >= self.cfg.max_failures:
            raise RunAborted(f"{self._provider_failures_in_row} requests in a row failed; last: {e}")
        self._nothing_to_evaluate(st, str(e))

    def _record(self, st: ProblemState, cid: int, cand: Candidate, ev: Evaluation, parent: Member | None,
                island: int, generation: int) -> None:
        speedup = ev.speedup_vs(self.cfg.baseline) if ev.ok else None
        reward = self.reward(Outcome(ev.status, speedup, parent.speedup if parent else None))
        self.store.add_evaluation(cid, self.run_id, ev.to_dict(), reward)
        for proposer, _ in self.proposers:  # the template search learns where TF32 cannot pass
            learn = getattr(proposer, "learn", None)
            if learn is not None and cand.proposer == getattr(proposer, "name", None):
                learn(st.problem, cand.source, ev.status)
        profile = vars(ev.profile) if ev.profile else None
        member = Member(cid, source_key(cand.source), ev.status, reward, speedup, island, generation,
                        technique_tags(cand.source) + (register_bucket(profile),),
                        (parent.candidate_id,) if parent else (), source=cand.source,
                        feedback=feedback_text(ev, self.cfg.baseline))
        st.population.add(member)
        st.evaluated += 1
        st.failures_in_row = 0
        self.stats.evaluations += 1
        self.stats.succeeded += ev.status in ("ok", "compiled")
        if speedup is not None and (st.best_speedup is None or speedup > st.best_speedup):
            st.best_speedup = speedup
            st.since_improvement = 0
        else:
            st.since_improvement += 1
        st.history.append(st.best_speedup or 0.0)
        shown = f", {speedup:.3f}x vs {self.cfg.baseline}" if speedup else ""
        msg = f" - {ev.message}" if ev.message and not ev.ok else ""
        self.on_event("eval", f"{st.problem.id}: candidate {cid} {ev.status}{shown}{msg}"[:300])
