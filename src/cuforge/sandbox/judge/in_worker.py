"""The in-worker runner: the candidate runs in the worker's own process (the template search's own
kernels, where evaluations per GPU-minute are the GPU's). `core.evaluate` runs the steps; this runner
loads the candidate here, verifies it over fresh trials, times it interleaved with the baselines,
re-verifies what was timed, checks for escaped work and impossible speed, and profiles. Its other
runner, `in_host.py`, holds the candidate in a separate confined process instead.

The candidate's calls go through host/monitor.py, the code that runs beside a candidate wherever it
runs; its Guard names any harness function the candidate replaced. Nothing here runs in the driver.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import torch

from cuforge.sandbox.host import monitor
from cuforge.sandbox.protocol.loading import CandidateLoadError, cast_module, load_candidate
from cuforge.sandbox.protocol.prebuilt import pack
from cuforge.sandbox.judge import cheats, core, steps, timing, verify
from cuforge.sandbox.judge.context import Context, Models, References
from cuforge.sandbox.judge.output_judge import Judge, Trials
from cuforge.sandbox.judge.profile import build_profile, ceilings_for
from cuforge.sandbox.protocol import tensors
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import Diagnostic, EvalConfig, Evaluation, cheat
from cuforge.sandbox.protocol.stop import Stop


class InWorkerRunner:
    """The candidate in this process. A candidate that patched anything leaves a worker nobody should
    trust again: the guard's findings stop the evaluation and replace the worker."""

    def __init__(self) -> None:
        self.guard: monitor.Guard | None = None
        self.cls: type | None = None

    def context(self, ctx: Context) -> Context:
        return ctx

    def start(self, ctx: Context) -> None:
        # After the problem loaded and the contract set its flags: from here on, any change is the candidate's.
        # The candidate shares this process with eager's baselines: their backend switches are guarded too.
        self.guard = monitor.Guard.snapshot(switches=True)

    def load(self, ctx: Context) -> tuple[str, str, list[Diagnostic]]:
        cand = Candidate.from_dict(ctx.candidate)
        record = ctx.config.compile_only and ctx.config.prebuild
        try:
            self.cls, extensions = load_candidate(cand.module_source(), ctx.module, cand.id,
                                                  ctx.candidate.get("prebuilt"), record)
        except CandidateLoadError as e:
            if e.extensions is not None and e.extensions.cubins:
                ctx.correctness["prebuilt_cubins"] = e.extensions.cubins
            return e.status, str(e), e.diagnostics
        self.check_rules()
        if extensions.used:
            ctx.correctness["prebuilt_extensions"] = len(extensions.used)
        if extensions.cubins:
            ctx.correctness["prebuilt_cubins"] = extensions.cubins
        if record:  # handed to the supervisor beside the evaluation (worker.py), never stored with it
            ctx.correctness["prebuilt"] = pack(extensions.built)
        if ctx.config.compile_only:
            return "compiled", "loaded and compiled; nothing run (compile-only)", []
        return "ok", "", []

    def references(self, ctx: Context) -> Models:
        assert self.cls is not None
        return build_models(ctx, self.cls, self.reference_built)

    def reference_built(self) -> None:
        """The problem's own Model() may set a backend switch (cuDNN's autotuning, as training scripts
        do): its reference and baselines keep it, and the guard compares the candidate's calls with it.
        What the candidate's import changed was judged before (load's check)."""
        if self.guard is not None and self.guard.switches is not None:
            self.guard.switches = monitor.backend_switches()

    def check_correctness(self, ctx: Context, models: References) -> None:
        assert isinstance(models, Models)
        check_correctness(ctx, models)

    def time_contenders(self, ctx: Context, models: References) -> None:
        assert isinstance(models, Models)
        time_contenders(ctx, models)

    def check_rules(self) -> None:
        found = self.guard.violations() if self.guard is not None else []
        if found:
            kind, msg = found[0]
            raise Stop(cheat(kind), msg, restart=True)

    def failure(self, e: Exception) -> tuple[str, str] | None:
        return None  # anything else is the worker's to report (it replaces itself)

    def finish(self, ctx: Context) -> bool:
        return self.guard is not None and bool(self.guard.violations())


def evaluate_request(problem: dict[str, Any], candidate: dict[str, Any], config: EvalConfig,
                     device_info: dict[str, Any]) -> tuple[Evaluation, bool]:
    """One evaluation with the candidate in this process: (evaluation, whether to replace the worker)."""
    return core.evaluate(problem, candidate, config, device_info, InWorkerRunner())


def build_models(ctx: Context, cls: type, reference_built: Callable[[], None] | None = None) -> Models:
    """The reference, its float64 copy and the candidate's model; `reference_built()` is called between
    the problem's Model() and the candidate's ModelNew()."""
    with tensors.on_device(ctx.device):
        init = list(ctx.module.get_init_inputs())
        torch.manual_seed(ctx.correctness["init_seed"])
        # The reference stays in the mode a new Model is in (training, unless its __init__ says
        # otherwise), as KernelBench runs it and as the candidate's ModelNew is: a BatchNorm of an eval()
        # reference would normalise by running statistics while the candidate's uses the batch's.
        reference = ctx.module.Model(*init).to(ctx.device)
        if reference_built is not None:
            reference_built()
        torch.manual_seed(ctx.correctness["init_seed"])
        candidate = monitor.run_candidate(lambda: cls(*init), ctx.device, "ModelNew(*get_init_inputs())")
    if isinstance(candidate, torch.nn.Module):
        candidate = monitor.run_candidate(lambda: candidate.to(ctx.device), ctx.device, "ModelNew.to(device)")
    cast = ctx.problem["meta"].get("cast")
    if cast:  # the problem runs in another dtype: the candidate's model is cast as the reference is
        candidate = monitor.run_candidate(lambda: cast_module(candidate, getattr(torch, cast)), ctx.device,
                                          "ModelNew.to(dtype)")
    return Models(reference, verify.float64_model(reference), candidate)


# ---------------------------------------------------------------------------------- correctness

def check_correctness(ctx: Context, models: Models) -> None:
    policy = ctx.problem["meta"]["policy"]
    record = Trials()
    for trial in range(ctx.config.trials):
        inputs = tensors.make_inputs(ctx.module, ctx.seed + 1000 * (trial + 1), ctx.device, gaussian=trial % 2 == 1)
        seed = ctx.seed + 17 * trial
        remembered = [verify.Remembered(x, seed) for x in inputs]
        _poison(ctx)
        # Candidate and reference draw their random numbers (Dropout in training mode) from one
        # reseed, unrelated to the input seeds, as PyTorch's own implementation of the problem would.
        rng_seed = secrets.randbits(31)
        tensors.reseed(rng_seed)
        outs = monitor.run_monitored(ctx.device, ctx.correctness, models.candidate, inputs, policy, first=trial == 0)
        returned = [verify.Remembered(o, seed + 1) for o in outs]  # before any reference runs
        for i, r in enumerate(remembered):
            if not r.unchanged():
                raise Stop(cheat("input_mutation"), f"input {i} was modified by the candidate")
        snapshots = [r.value for r in remembered]  # the inputs as drawn (checked unchanged)
        refs, native, ref_kind = verify.reference_outputs(models.reference64, models.reference, snapshots, rng_seed)
        monitor.sync(ctx.device)
        v = cheats.alias_violation(outs, inputs, native, _reference_aliases_input(native, snapshots))
        if v:
            raise Stop(cheat(v[0]), v[1])
        if not all(r.unchanged() for r in returned):
            raise Stop(cheat("aliasing"), "the candidate's output changed after it returned (it does not own its memory)")
        outs_snap = [r.value for r in returned]
        if len(outs_snap) != len(refs):
            raise Stop("wrong_output", f"returned {len(outs_snap)} outputs, expected {len(refs)}")
        record.compare(ctx, models, snapshots, ref_kind, outs_snap, refs, native, trial)
        if trial == 0 and "no_own_kernel" in ctx.correctness:
            raise Stop(cheat("library_call"), "no kernel of its own: under policy 'mixed' (KernelBench's rule) PyTorch "
                       "and library calls may compute beside the candidate's own kernels, not instead of them "
                       f"(kernels seen: {ctx.correctness.pop('no_own_kernel')})")
        record.passed(ctx, outs_snap, refs, ref_kind, trial)
        del outs, native, refs
        # Measured after the candidate's trial, never before it: a reference output computed on these
        # inputs and freed ahead of the candidate is what a result-reuse kernel hopes to be handed.
        if trial == 0 and ctx.device.type == "cuda":
            ctx.correctness["eager_footprint_bytes"] = steps.eager_footprint(ctx, models.reference, snapshots)
    ctx.correctness["trials"] = ctx.config.trials


def _poison(ctx: Context) -> None:
    """Poison freed memory; the fill itself is not the evaluation's need, so the peak is read before
    it and counted from after it."""
    if ctx.device.type == "cuda":
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(ctx.device)),
                                                   ctx.correctness.get("peak_device_bytes", 0))
    tensors.poison_free_memory(ctx.device)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _reference_aliases_input(native: list[torch.Tensor], inputs: list[Any]) -> bool:
    return any(cheats.overlaps(cheats.span(o), cheats.span(x)) for o in native for x in inputs if isinstance(x, torch.Tensor))


# ---------------------------------------------------------------------------------- timing

def timing_sets(ctx: Context, count: int) -> list[list[Any]]:
    return [tensors.make_inputs(ctx.module, ctx.seed + 7 + 31 * k, ctx.device, gaussian=False) for k in range(count)]


def time_contenders(ctx: Context, models: Models) -> None:
    cfg = ctx.config
    tcfg = timing.TimingConfig(min_samples=cfg.min_samples, max_samples=cfg.max_samples,
                               target_rse=cfg.target_rse, max_seconds=cfg.max_timing_s)
    timers: dict[str, Any]
    if ctx.device.type != "cuda":
        sets = timing_sets(ctx, 2)
        timers = {"candidate": timing.WallTimer(steps.call_on_sets(models.candidate, sets), 2)}
        timers.update({name: timing.WallTimer(fn, 2) for name, fn in steps.baseline_callables(ctx, models.reference, sets, None).items()})
        ctx.timings = timing.measure_interleaved(timers, tcfg)
        _verify_timed_outputs(ctx, models, sets, timers)
        return
    # Sub-steps of "timing" in the record: where a whole network's evaluation spends its time.
    phase = ctx.phase or core.Phases({})
    with phase("timing.inputs"):
        flush = timing.L2Flusher(ctx.device)
        # Inputs bigger than the L2 cannot be served from it: one set suffices and saves device memory.
        first = timing_sets(ctx, 1)
        per_set = sum(x.nbytes for x in first[0] if isinstance(x, torch.Tensor))
        sets = first if per_set > flush.nbytes // 2 else first + [tensors.make_inputs(
            ctx.module, ctx.seed + 7 + 31 * k, ctx.device, gaussian=False) for k in (1, 2)]
    ctx.correctness["timing_input_sets"] = len(sets)
    cand_fn = steps.call_on_sets(models.candidate, sets)
    with phase("timing.estimate"):
        estimate = timing.estimate_ms(cand_fn, len(sets), flush)
    with phase("timing.escape"):
        escape, msg, runs = timing.confirmed_escape(lambda: timing.escape_check(cand_fn, len(sets), estimate),
                                                    int(ctx.correctness.get("kernels_per_call", 0)))
    if msg:
        raise Stop(cheat("escaped_work"), f"{msg} (in each of {runs} checks)")
    ctx.correctness["escape_check"] = {**vars(escape), "runs": runs}
    # Event times of short kernels include host launch gaps; the profiler's device time of the first
    # call decides instead when it is known.
    device_ms = ctx.correctness.get("device_us_first_call", estimate * 1e3) / 1e3
    if min(estimate, device_ms) < timing.GRAPH_THRESHOLD_MS:
        with phase("timing.graph"):
            timers = graph_timers(ctx, models, flush)
    else:
        with phase("timing.baselines"):
            timers = {"candidate": timing.EventTimer(cand_fn, len(sets), flush)}
            for name, fn in steps.baseline_callables(ctx, models.reference, sets, flush).items():
                timers[name] = timing.EventTimer(fn, len(sets), flush)
        with phase("timing.measure"):
            # Poison between batches: no contender may find another's freed results.
            ctx.timings = timing.measure_interleaved(timers, tcfg, _between_batches(ctx, tcfg))
        with phase("timing.verify"):
            _verify_timed_outputs(ctx, models, sets, timers)
    steps.check_roofline(ctx)
    if cfg.profile:
        ceilings = ceilings_for(ctx.device)
        meta = ctx.problem["meta"]
        ctx.profile = build_profile(ctx.timings["candidate"].median_ms, meta.get("flops"), meta.get("bytes"),
                                    meta.get("dtype"), ceilings)


def graph_timers(ctx: Context, models: Models, flush: timing.L2Flusher) -> dict[str, Any]:
    """Short kernels: every contender replayed in a graph over enough rotating input sets."""
    l2 = flush.nbytes // 2
    per_set = sum(x.nbytes for x in timing_sets(ctx, 1)[0] if isinstance(x, torch.Tensor))
    per_set += sum(t["nbytes"] for t in steps.output_specs(ctx))
    sets = timing_sets(ctx, timing.sets_for_graph(per_set, l2))
    cfg = ctx.config
    tcfg = timing.TimingConfig(min_samples=cfg.min_samples, max_samples=cfg.max_samples,
                               target_rse=cfg.target_rse, max_seconds=cfg.max_timing_s)
    try:
        timers: dict[str, Any] = {"candidate": timing.GraphTimer(steps.call_on_sets(models.candidate, sets), len(sets))}
        for name, fn in steps.baseline_callables(ctx, models.reference, sets, flush).items():
            timers[name] = timing.GraphTimer(fn, len(sets))
        for name, t in timers.items():
            if not t.replays_recompute(_poison_outputs, _outputs_poisoned):
                raise GraphUnfaithful(f"{name}: a replay does not recompute the outputs (work outside the capture stream)")
        # A kernel launched on the legacy default stream (<<<grid, block>>> in load_inline code, as
        # KernelBench's examples do) is not captured; an output the graph itself fills (zeros_like)
        # then passes the poison check with the wrong values. Such a candidate is timed with events,
        # as KernelBench times it, and not accused.
        wrong = _first_wrong_output(ctx, models, sets, timers["candidate"].outputs)
        if wrong:
            raise GraphUnfaithful(f"candidate: replayed outputs do not match the reference ({wrong})")
    except Stop:
        raise
    except Exception as e:  # noqa: BLE001 - not capturable: time everyone with events instead
        ctx.correctness["graph_fallback"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        monitor.sync(ctx.device)
        sets = sets[:3]
        timers = {"candidate": timing.EventTimer(steps.call_on_sets(models.candidate, sets), len(sets), flush)}
        for name, fn in steps.baseline_callables(ctx, models.reference, sets, flush).items():
            timers[name] = timing.EventTimer(fn, len(sets), flush)
        ctx.timings = timing.measure_interleaved(timers, tcfg, _between_batches(ctx, tcfg))
        _verify_timed_outputs(ctx, models, sets, timers)
        return timers
    ctx.timings = timing.measure_interleaved(timers, tcfg)
    _verify_timed_outputs(ctx, models, sets, timers)
    return timers


def _between_batches(ctx: Context, tcfg: timing.TimingConfig) -> Any:
    out_bytes = sum(t["nbytes"] for t in steps.output_specs(ctx))
    count = max(1, min(tcfg.batch + 2, (8 * 2**30) // max(out_bytes, 1)))  # at most 8 GiB held at once

    def between() -> None:
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(ctx.device)),
                                                   ctx.correctness.get("peak_device_bytes", 0))
        tensors.poison_cached_blocks(ctx.device, out_bytes, count)
        torch.cuda.reset_peak_memory_stats(ctx.device)  # the poison blocks are not the evaluation's need

    return between


class GraphUnfaithful(RuntimeError):
    pass


def _poison_outputs(out: Any) -> None:
    for t in tensors.as_list(out):
        if isinstance(t, torch.Tensor):
            if not t.is_contiguous():
                raise GraphUnfaithful("a non-contiguous output cannot be checked for replay")
            t.view(torch.uint8).fill_(tensors.POISON_BYTE)


def _outputs_poisoned(out: Any) -> bool:
    outs = [t for t in tensors.as_list(out) if isinstance(t, torch.Tensor) and t.numel()]
    return any(float((t.view(torch.uint8) == tensors.POISON_BYTE).float().mean()) > 0.9 for t in outs)


def _first_wrong_output(ctx: Context, models: Models, sets: list[list[Any]], outputs: dict[int, Any]) -> str:
    """'' when the outputs of timed calls match the reference for their own inputs, else what is wrong."""
    for k in sorted(outputs)[:2]:
        refs, native, ref_kind = verify.reference_outputs(models.reference64, models.reference, sets[k])
        judge = Judge(ctx, models, sets[k], ref_kind)
        for i, (o, r, n) in enumerate(zip(tensors.as_list(outputs[k]), refs, native)):
            cmp = judge(i, o, r, n)
            if not cmp.ok:
                if steps.stochastic(models.reference, sets[k]):
                    # Its random draws during timing are not reproducible: correctness was checked
                    # on reseeded trials; the timed outputs cannot be.
                    ctx.correctness["stochastic_reference"] = True
                    return ""
                return f"output {i} of a timed call on input set {k} is wrong ({cmp.reason})"
    return ""


def _verify_timed_outputs(ctx: Context, models: Models, sets: list[list[Any]], timers: dict[str, Any]) -> None:
    """The candidate's outputs produced while being timed must still match the reference for their own
    inputs. The baselines' last outputs go first: the float64 reference made for the check needs their
    room (on level1/87, 8 GiB each of four baselines beside a 16 GiB float64 result ran out of memory)."""
    for name, t in timers.items():
        if name != "candidate":
            t.outputs.clear()
    wrong = _first_wrong_output(ctx, models, sets, timers["candidate"].outputs)
    if wrong:
        raise Stop(cheat("result_caching"), f"{wrong}: results during timing do not follow the inputs")


