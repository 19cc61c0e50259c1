"""One evaluation inside the worker, the candidate in the worker's own process (the default,
`CUFORGE_JUDGE=inprocess`): load, verify over fresh trials, time interleaved with the baselines,
re-verify what was timed, check for escaped work and impossible speed, profile. `judge.py` is the
same evaluation with the candidate in a separate process (`CUFORGE_JUDGE=split`).

Each step returns early with an Evaluation naming the first failure. Nothing here runs in the
driver process.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cuforge.op_trace import OpRecorder
from cuforge.problems.problem import Tolerance
from cuforge.sandbox import baselines as bl
from cuforge.sandbox import cheats, timing, verify
from cuforge.sandbox.evaluation import (
    EvalConfig,
    Evaluation,
    Profile,
    TimingStats,
    cheat,
)
from cuforge.sandbox.loading import CandidateLoadError, candidate_class, problem_module
from cuforge.sandbox.profile import (
    build_profile,
    ceilings_for,
    peak_rates,
    roofline_floor_ms,
)
from cuforge.sandbox.output_judge import Judge, Trials
from cuforge.sandbox.stop import Stop, is_sticky


@dataclass
class Context:
    problem: dict[str, Any]
    candidate: dict[str, Any]
    config: EvalConfig
    device: torch.device
    module: Any
    tol: Tolerance
    seed: int
    correctness: dict[str, Any]
    timings: dict[str, TimingStats]
    profile: Profile | None = None
    # Per output, the largest relative error norm of eager's own output against float64 over the sets
    # judged so far: the error-norm bound's floor (see Judge).
    native_rel: dict[int, float] = field(default_factory=dict)
    # Outputs whose floor was also measured on fresh sets of eager and float64 alone (Judge.calibrate).
    calibrated: set[int] = field(default_factory=set)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        timing._synchronize(device)


def run_candidate(fn: Any, device: torch.device, what: str) -> Any:
    """Call candidate code; any exception is a runtime error (sticky CUDA errors restart the worker)."""
    try:
        with torch.no_grad():
            out = fn()
        sync(device)
        return out
    except Stop:
        raise
    except Exception as e:  # noqa: BLE001 - user code
        sticky = is_sticky(e)
        if not sticky and device.type == "cuda":
            try:
                torch.cuda.synchronize(device)
            except Exception:  # noqa: BLE001
                sticky = True
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise Stop("runtime_error", f"{what} raised {type(e).__name__}: {first}"[:2000], restart=sticky) from None


def evaluate_request(problem: dict[str, Any], candidate: dict[str, Any], config: EvalConfig,
                     device_info: dict[str, Any]) -> tuple[Evaluation, bool]:
    """The worker's entry point: (evaluation, whether the worker must be replaced afterwards)."""
    t0 = time.perf_counter()
    from cuforge.sandbox.candidate import Candidate

    cand = Candidate.from_dict(candidate)
    device = torch.device(config.device)
    seed = config.seed if config.seed is not None else secrets.randbits(30)
    base = dict(problem_id=problem["id"], candidate_id=cand.id, device=device_info)
    cheats.set_strict_precision()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    guard = cheats.Guard.snapshot()
    meta = problem["meta"]
    # The CPU test mode runs a problem at its declared small sizes (CUFORGE['small']): full sizes are
    # GPU work and can exhaust a host's memory.
    scale = meta.get("small") if config.device == "cpu" else None
    ctx = Context(problem, candidate, config, device, problem_module(problem["source"], scale),
                  Tolerance(**meta["tolerance"]), seed, {"seed": seed}, {})
    restart = False
    try:
        try:
            cls = candidate_class(cand.module_source(), ctx.module, cand.id)
        except CandidateLoadError as e:
            ev = Evaluation(status=e.status, message=str(e), diagnostics=e.diagnostics, **base)
            ev.wall_s = time.perf_counter() - t0
            return ev, _tainted(guard)
        _raise_guard(guard)
        if config.compile_only:
            ev = Evaluation(status="compiled", message="loaded and compiled; nothing run (compile-only)", **base)
            ev.wall_s = time.perf_counter() - t0
            return ev, _tainted(guard)
        models = build_models(ctx, cls)
        check_correctness(ctx, models)
        _raise_guard(guard)
        time_contenders(ctx, models)
        _raise_guard(guard)
        status, message = "ok", ""
    except Stop as s:
        status, message, restart = s.status, s.message, s.restart
        ctx.correctness.update(s.extra)
    except torch.cuda.OutOfMemoryError as e:
        status, message, restart = "runtime_error", f"out of GPU memory: {str(e).splitlines()[0]}", True
    if device.type == "cuda":
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(device)),
                                                   ctx.correctness.get("peak_device_bytes", 0))
    ev = Evaluation(status=status, message=message, correctness=ctx.correctness, timings=ctx.timings,
                    profile=ctx.profile, **base)
    ev.wall_s = time.perf_counter() - t0
    return ev, restart or _tainted(guard)


def _raise_guard(guard: cheats.Guard) -> None:
    found = guard.violations()
    if found:
        kind, msg = found[0]
        raise Stop(cheat(kind), msg, restart=True)


def _tainted(guard: cheats.Guard) -> bool:
    """A candidate that patched anything leaves a worker nobody should trust again."""
    return bool(guard.violations())


@dataclass
class Models:
    reference: torch.nn.Module
    reference64: torch.nn.Module | None
    candidate: torch.nn.Module


def build_models(ctx: Context, cls: type) -> Models:
    with verify.on_device(ctx.device):
        init = list(ctx.module.get_init_inputs())
        torch.manual_seed(ctx.seed)
        # The reference stays in the mode a new Model is in (training, unless its __init__ says
        # otherwise), as KernelBench runs it and as the candidate's ModelNew is: a BatchNorm of an eval()
        # reference would normalise by running statistics while the candidate's uses the batch's.
        reference = ctx.module.Model(*init).to(ctx.device)
        torch.manual_seed(ctx.seed)
        candidate = run_candidate(lambda: cls(*init), ctx.device, "ModelNew(*get_init_inputs())")
    if isinstance(candidate, torch.nn.Module):
        candidate = run_candidate(lambda: candidate.to(ctx.device), ctx.device, "ModelNew.to(device)")
    return Models(reference, verify.float64_model(reference), candidate)


# ---------------------------------------------------------------------------------- correctness

def check_correctness(ctx: Context, models: Models) -> None:
    policy = ctx.problem["meta"]["policy"]
    record = Trials()
    for trial in range(ctx.config.trials):
        inputs = verify.make_inputs(ctx.module, ctx.seed + 1000 * (trial + 1), ctx.device, gaussian=trial % 2 == 1)
        seed = ctx.seed + 17 * trial
        remembered = [verify.Remembered(x, seed) for x in inputs]
        _poison(ctx)
        # Candidate and reference draw their random numbers (Dropout in training mode) from one
        # reseed, unrelated to the input seeds, as PyTorch's own implementation of the problem would.
        rng_seed = secrets.randbits(31)
        verify.reseed(rng_seed)
        outs = run_monitored(ctx, models.candidate, inputs, policy, first=trial == 0)
        returned = [verify.Remembered(o, seed + 1) for o in outs]  # before any reference runs
        for i, r in enumerate(remembered):
            if not r.unchanged():
                raise Stop(cheat("input_mutation"), f"input {i} was modified by the candidate")
        snapshots = [r.value for r in remembered]  # the inputs as drawn (checked unchanged)
        refs, native, ref_kind = verify.reference_outputs(models.reference64, models.reference, snapshots, rng_seed)
        sync(ctx.device)
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
            ctx.correctness["eager_footprint_bytes"] = _eager_footprint(ctx, models.reference, snapshots)
    ctx.correctness["trials"] = ctx.config.trials


def _poison(ctx: Context) -> None:
    """Poison freed memory; the fill itself is not the evaluation's need, so the peak is read before
    it and counted from after it."""
    if ctx.device.type == "cuda":
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(ctx.device)),
                                                   ctx.correctness.get("peak_device_bytes", 0))
    verify.poison_free_memory(ctx.device)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _eager_footprint(ctx: Context, model: torch.nn.Module, inputs: list[Any]) -> int:
    """Device bytes eager PyTorch needs for one forward: inputs, parameters, and the peak of what the
    forward allocates (activations, outputs). The evaluation's running peak is kept across the reset."""
    dev = ctx.device
    torch.cuda.synchronize(dev)
    ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(dev)),
                                               ctx.correctness.get("peak_device_bytes", 0))
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    with torch.no_grad():
        out = model(*inputs)
    torch.cuda.synchronize(dev)
    extra = int(torch.cuda.max_memory_allocated(dev)) - before
    del out
    held = sum(t.nbytes for t in list(model.parameters()) + list(model.buffers()))
    held += sum(x.nbytes for x in inputs if isinstance(x, torch.Tensor))
    return held + max(extra, 0)


def _reference_aliases_input(native: list[torch.Tensor], inputs: list[Any]) -> bool:
    return any(cheats.overlaps(cheats.span(o), cheats.span(x)) for o in native for x in inputs if isinstance(x, torch.Tensor))


def run_monitored(ctx: Context, model: Any, inputs: list[Any], policy: str, first: bool) -> list[torch.Tensor]:
    """Run the candidate; on the first trial also watch threads, aten ops, kernels and streams."""
    if not first:
        outs = verify.as_list(run_candidate(lambda: model(*inputs), ctx.device, "forward"))
        _check_outputs(ctx, outs)
        return outs
    threads_before, children_before = cheats.thread_census(), cheats.child_processes()
    recorder = OpRecorder()
    trace = None
    timed_stream = -1

    def forward() -> Any:
        with recorder:
            return model(*inputs)

    if ctx.device.type == "cuda":
        out, trace, timed_stream = run_candidate(lambda: cheats.trace_kernels(forward), ctx.device, "forward")
    else:
        out = run_candidate(forward, ctx.device, "forward")
    v = cheats.thread_violation(threads_before, children_before)
    if v:
        raise Stop(cheat(v[0]), v[1], restart=True)
    if trace is not None:
        v = cheats.stream_violation(trace, timed_stream)
        if v:
            raise Stop(cheat(v[0]), v[1])
        ctx.correctness["kernels"] = sorted(set(trace.names))[:20]
        ctx.correctness["kernels_per_call"] = len(trace.names)
        ctx.correctness["device_us_first_call"] = trace.device_us
    if policy == "custom":
        lib = cheats.library_ops(recorder.ops)
        if lib:
            raise Stop(cheat("library_call"), f"library compute under policy 'custom': aten ops {', '.join(lib[:8])}")
        if trace is not None:
            v = cheats.library_kernel_violation(trace)
            if v:
                raise Stop(cheat(v[0]), v[1])
    elif policy == "mixed" and trace is not None and not cheats.own_kernels(trace):
        # Raised once the first trial's other checks pass, so a more specific cheat is named first.
        ctx.correctness["no_own_kernel"] = ', '.join(sorted(set(trace.names))[:4]) or 'none'
    outs = verify.as_list(out)
    _check_outputs(ctx, outs)
    return outs


def _check_outputs(ctx: Context, outs: list[Any]) -> None:
    v = cheats.output_violation(outs, ctx.device)
    if v:
        raise Stop(cheat(v[0]), v[1])


# ---------------------------------------------------------------------------------- timing

def timing_sets(ctx: Context, count: int) -> list[list[Any]]:
    return [verify.make_inputs(ctx.module, ctx.seed + 7 + 31 * k, ctx.device, gaussian=False) for k in range(count)]


def time_contenders(ctx: Context, models: Models) -> None:
    cfg = ctx.config
    tcfg = timing.TimingConfig(min_samples=cfg.min_samples, max_samples=cfg.max_samples,
                               target_rse=cfg.target_rse, max_seconds=cfg.max_timing_s)
    if ctx.device.type != "cuda":
        sets = timing_sets(ctx, 2)
        timers = {"candidate": timing.WallTimer(_call(models.candidate, sets), 2)}
        timers.update({name: timing.WallTimer(fn, 2) for name, fn in baseline_callables(ctx, models, sets, None).items()})
        ctx.timings = timing.measure_interleaved(timers, tcfg)
        _verify_timed_outputs(ctx, models, sets, timers["candidate"].outputs)
        return
    flush = timing.L2Flusher(ctx.device)
    # Inputs bigger than the L2 cannot be served from it: one set suffices and saves device memory.
    first = timing_sets(ctx, 1)
    per_set = sum(x.nbytes for x in first[0] if isinstance(x, torch.Tensor))
    sets = first if per_set > flush.nbytes // 2 else first + [verify.make_inputs(
        ctx.module, ctx.seed + 7 + 31 * k, ctx.device, gaussian=False) for k in (1, 2)]
    ctx.correctness["timing_input_sets"] = len(sets)
    cand_fn = _call(models.candidate, sets)
    estimate = timing.estimate_ms(cand_fn, len(sets), flush)
    escape, msg, runs = timing.confirmed_escape(lambda: timing.escape_check(cand_fn, len(sets), estimate),
                                                int(ctx.correctness.get("kernels_per_call", 0)))
    if msg:
        raise Stop(cheat("escaped_work"), f"{msg} (in each of {runs} checks)")
    ctx.correctness["escape_check"] = {**vars(escape), "runs": runs}
    # Event times of short kernels include host launch gaps; the profiler's device time of the first
    # call decides instead when it is known.
    device_ms = ctx.correctness.get("device_us_first_call", estimate * 1e3) / 1e3
    if min(estimate, device_ms) < timing.GRAPH_THRESHOLD_MS:
        timers = graph_timers(ctx, models, flush)
    else:
        timers = {"candidate": timing.EventTimer(cand_fn, len(sets), flush)}
        for name, fn in baseline_callables(ctx, models, sets, flush).items():
            timers[name] = timing.EventTimer(fn, len(sets), flush)
        # Poison between batches: no contender may find another's freed results.
        ctx.timings = timing.measure_interleaved(timers, tcfg, _between_batches(ctx, tcfg))
        _verify_timed_outputs(ctx, models, sets, timers["candidate"].outputs)
    _check_roofline(ctx)
    if cfg.profile:
        ceilings = ceilings_for(ctx.device)
        meta = ctx.problem["meta"]
        ctx.profile = build_profile(ctx.timings["candidate"].median_ms, meta.get("flops"), meta.get("bytes"),
                                    meta.get("dtype"), ceilings)


def graph_timers(ctx: Context, models: Models, flush: timing.L2Flusher) -> dict[str, Any]:
    """Short kernels: every contender replayed in a graph over enough rotating input sets."""
    l2 = flush.nbytes // 2
    per_set = sum(x.nbytes for x in timing_sets(ctx, 1)[0] if isinstance(x, torch.Tensor))
    per_set += sum(t["nbytes"] for t in _output_specs(ctx))
    sets = timing_sets(ctx, timing.sets_for_graph(per_set, l2))
    cfg = ctx.config
    tcfg = timing.TimingConfig(min_samples=cfg.min_samples, max_samples=cfg.max_samples,
                               target_rse=cfg.target_rse, max_seconds=cfg.max_timing_s)
    try:
        timers: dict[str, Any] = {"candidate": timing.GraphTimer(_call(models.candidate, sets), len(sets))}
        for name, fn in baseline_callables(ctx, models, sets, flush).items():
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
        sync(ctx.device)
        sets = sets[:3]
        timers = {"candidate": timing.EventTimer(_call(models.candidate, sets), len(sets), flush)}
        for name, fn in baseline_callables(ctx, models, sets, flush).items():
            timers[name] = timing.EventTimer(fn, len(sets), flush)
        ctx.timings = timing.measure_interleaved(timers, tcfg, _between_batches(ctx, tcfg))
        _verify_timed_outputs(ctx, models, sets, timers["candidate"].outputs)
        return timers
    ctx.timings = timing.measure_interleaved(timers, tcfg)
    _verify_timed_outputs(ctx, models, sets, timers["candidate"].outputs)
    return timers


def _between_batches(ctx: Context, tcfg: timing.TimingConfig) -> Any:
    out_bytes = sum(t["nbytes"] for t in _output_specs(ctx))
    count = max(1, min(tcfg.batch + 2, (8 * 2**30) // max(out_bytes, 1)))  # at most 8 GiB held at once

    def between() -> None:
        ctx.correctness["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(ctx.device)),
                                                   ctx.correctness.get("peak_device_bytes", 0))
        verify.poison_cached_blocks(ctx.device, out_bytes, count)
        torch.cuda.reset_peak_memory_stats(ctx.device)  # the poison blocks are not the evaluation's need

    return between


class GraphUnfaithful(RuntimeError):
    pass


def _poison_outputs(out: Any) -> None:
    for t in verify.as_list(out):
        if isinstance(t, torch.Tensor):
            if not t.is_contiguous():
                raise GraphUnfaithful("a non-contiguous output cannot be checked for replay")
            t.view(torch.uint8).fill_(verify.POISON_BYTE)


def _outputs_poisoned(out: Any) -> bool:
    tensors = [t for t in verify.as_list(out) if isinstance(t, torch.Tensor) and t.numel()]
    return any(float((t.view(torch.uint8) == verify.POISON_BYTE).float().mean()) > 0.9 for t in tensors)


def _output_specs(ctx: Context) -> list[dict[str, Any]]:
    from cuforge.problems.problem import dtype_size

    outs = ctx.problem.get("outputs") or []
    return [{"nbytes": _numel(o["shape"]) * dtype_size(o["dtype"])} for o in outs]


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _call(model: Any, sets: list[list[Any]]) -> Any:
    def call(k: int) -> Any:
        with torch.no_grad():
            return model(*sets[k])

    return call


def baseline_callables(ctx: Context, models: Models, sets: list[list[Any]], flush: timing.L2Flusher | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in ctx.config.baselines:
        try:
            if name == "torch":
                out[name] = bl.eager(models.reference, sets)
            elif name == "torch.compile":
                out[name] = bl.compiled(models.reference, sets, ctx.config.compile_mode)
            elif name == "cublas":
                out[name] = bl.cublas(sets)
            elif name == "cublaslt":
                if flush is None:
                    raise bl.BaselineUnavailable("cuBLASLt needs a GPU")
                fn, info = bl.cublaslt(sets, ctx.device, lambda f: _quick_time(f, len(sets), flush))
                ctx.correctness["cublaslt"] = info
                out[name] = fn
            else:
                raise bl.BaselineUnavailable(f"unknown baseline {name!r}")
        except bl.BaselineUnavailable as e:
            skipped[name] = str(e)
    if skipped:
        ctx.correctness["baselines_skipped"] = skipped
    return out


def _quick_time(fn: Any, n_sets: int, flush: timing.L2Flusher) -> float:
    t = timing.EventTimer(fn, n_sets, flush)
    t.samples(3)
    import statistics

    return statistics.median(t.samples(15))


def _first_wrong_output(ctx: Context, models: Models, sets: list[list[Any]], outputs: dict[int, Any]) -> str:
    """'' when the outputs of timed calls match the reference for their own inputs, else what is wrong."""
    for k in sorted(outputs)[:2]:
        refs, native, ref_kind = verify.reference_outputs(models.reference64, models.reference, sets[k])
        judge = Judge(ctx, models, sets[k], ref_kind)
        for i, (o, r, n) in enumerate(zip(verify.as_list(outputs[k]), refs, native)):
            cmp = judge(i, o, r, n)
            if not cmp.ok:
                if _stochastic(models.reference, sets[k]):
                    # Its random draws during timing are not reproducible: correctness was checked
                    # on reseeded trials; the timed outputs cannot be.
                    ctx.correctness["stochastic_reference"] = True
                    return ""
                return f"output {i} of a timed call on input set {k} is wrong ({cmp.reason})"
    return ""


def _stochastic(reference: torch.nn.Module, inputs: list[Any]) -> bool:
    """Does the reference itself give other outputs under another random seed (training-mode Dropout)?"""
    with torch.no_grad():
        verify.reseed(1)
        first = verify.as_list(reference(*inputs))
        verify.reseed(2)
        second = verify.as_list(reference(*inputs))
    return any(isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(first, second))


def _verify_timed_outputs(ctx: Context, models: Models, sets: list[list[Any]], outputs: dict[int, Any]) -> None:
    """Outputs produced while being timed must still match the reference for their own inputs."""
    wrong = _first_wrong_output(ctx, models, sets, outputs)
    if wrong:
        raise Stop(cheat("result_caching"), f"{wrong}: results during timing do not follow the inputs")


def _check_roofline(ctx: Context) -> None:
    meta = ctx.problem["meta"]
    rates = peak_rates(torch.cuda.get_device_name(ctx.device), None)
    floor = roofline_floor_ms(meta.get("flops"), meta.get("bytes"), meta.get("dtype"), rates)
    cand = ctx.timings["candidate"].median_ms
    if floor is not None:
        ctx.correctness["roofline_floor_ms"] = floor
        if cand < floor:
            raise Stop(cheat("impossible_speedup"),
                       f"{cand:.4g} ms is below the roofline floor {floor:.4g} ms ({meta.get('flops') or 0:.3g} FLOP, "
                       f"{meta.get('bytes') or 0:.3g} B at datasheet peaks): not physically possible")
