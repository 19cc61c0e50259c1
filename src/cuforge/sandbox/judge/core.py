"""The judge's core: one evaluation's steps, in order, whichever runner holds the candidate.

A runner is where the candidate's code runs: `in_worker.InWorkerRunner` (in the worker's own process,
watched by host/monitor.py: the template search's own kernels) or `in_host.HostRunner` (in a candidate
host, a separate confined process that only receives inputs and returns outputs). The core draws the
seeds, sets the contract's flags, runs the steps (load, references, correctness, timing), names both
eagers, turns the first failure into the evaluation's status and measures the device memory it used;
the runner does each step its own way and says whether the worker must be replaced afterwards.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from cuforge.sandbox.judge import steps
from cuforge.sandbox.judge.context import Context, References
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import Diagnostic, EvalConfig, Evaluation
from cuforge.sandbox.protocol.stop import Stop


class Phases:
    """Wall seconds per step of an evaluation, kept in its record: where a judge's time goes."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = round(self.into.get(name, 0.0) + time.perf_counter() - t, 4)


class Runner(Protocol):
    """Where the candidate runs. Each method is one step of an evaluation; a failure raises Stop."""

    def context(self, ctx: Context) -> Context:
        """The evaluation's context, as this runner carries it (the core's, or one with more fields)."""

    def start(self, ctx: Context) -> None:
        """Ready the candidate's process before anything of the candidate loads."""

    def load(self, ctx: Context) -> tuple[str, str, list[Diagnostic]]:
        """Load (compile) the candidate: ("ok", "", diagnostics) to go on, else its status and message."""

    def references(self, ctx: Context) -> References:
        """The problem's model and its float64 copy (with the candidate's model, where it runs here)."""

    def check_correctness(self, ctx: Context, models: References) -> None: ...

    def check_rules(self) -> None:
        """Raise Stop where the candidate broke a rule of its process (a patched harness function)."""

    def time_contenders(self, ctx: Context, models: References) -> None: ...

    def failure(self, e: Exception) -> tuple[str, str] | None:
        """A status and message for an exception of this runner's own kind (None: not one)."""

    def finish(self, ctx: Context) -> bool:
        """Tear down; whether the worker must be replaced before the next evaluation."""


def seeds(config: EvalConfig) -> tuple[int, int]:
    """The input seed (never sent to a candidate's process) and the parameter seed (which a candidate may
    learn from torch.initial_seed(), so it is drawn apart from the input seed)."""
    seed = config.seed if config.seed is not None else secrets.randbits(30)
    init_seed = secrets.randbits(30) if config.seed is None else (config.seed * 2654435761 + 97) % 2**30
    return seed, init_seed


def held_bytes(device: torch.device) -> int:
    """The device memory this worker still holds as an evaluation starts (what earlier ones left
    allocated), and the peak counted from it."""
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def evaluate(problem: dict[str, Any], candidate: dict[str, Any], config: EvalConfig, device_info: dict[str, Any],
             runner: Runner) -> tuple[Evaluation, bool]:
    """One evaluation: (its record, whether the worker must be replaced afterwards)."""
    t0 = time.perf_counter()
    cand = Candidate.from_dict(candidate)
    device = torch.device(config.device)
    seed, init_seed = seeds(config)
    base = dict(problem_id=problem["id"], candidate_id=cand.id, device=device_info)
    held = held_bytes(device) if device.type == "cuda" else 0
    module, tol, tf32 = steps.problem_setup(problem, config)
    ctx = runner.context(Context(problem, candidate, config, device, module, tol, seed,
                                 {"seed": seed, "init_seed": init_seed, "precision": config.precision}, {}, tf32=tf32))
    phase = ctx.phase = Phases(ctx.correctness.setdefault("judge_phases_s", {}))
    if device.type == "cuda":
        ctx.correctness["held_device_bytes"] = held  # what the worker held before this evaluation
    status, message, restart = "ok", "", False
    diagnostics: list[Diagnostic] = []
    try:
        runner.start(ctx)
        with phase("load"):
            status, message, diagnostics = runner.load(ctx)
        if status == "ok":
            with phase("reference"):
                models = runner.references(ctx)
            with phase("correctness"):
                runner.check_correctness(ctx, models)
            runner.check_rules()
            with phase("timing"):
                runner.time_contenders(ctx, models)
                steps.name_both_eagers(ctx)
            runner.check_rules()
    except Stop as s:
        status, message, restart = s.status, s.message, s.restart
        ctx.correctness.update(s.extra)
    except torch.cuda.OutOfMemoryError as e:
        status, message, restart = "runtime_error", f"out of GPU memory: {str(e).splitlines()[0]}", True
    except Exception as e:
        named = runner.failure(e)
        if named is None:
            raise
        (status, message), restart = named, True
    finally:
        with phase("teardown"):
            restart = runner.finish(ctx) or restart
    if device.type == "cuda":
        # The judge's own peak, plus the peak a candidate host reports for itself (sizing only).
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(device)),
                                                   ctx.correctness.get("peak_device_bytes", 0)) + \
            max(int(ctx.correctness.get("host_peak_bytes", 0)), 0)
    ev = Evaluation(status=status, message=message, diagnostics=diagnostics, correctness=ctx.correctness,
                    timings=ctx.timings, profile=ctx.profile, **base)
    ev.wall_s = time.perf_counter() - t0
    return ev, restart
