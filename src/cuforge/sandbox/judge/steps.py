"""Steps both judges take the same way, whichever process runs the candidate: the output sizes, eager's
device footprint, whether the reference is stochastic, the baselines' callables, the roofline check."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from cuforge.problems.problem import Tolerance
from cuforge.sandbox.judge import baselines as bl
from cuforge.sandbox.judge import timing
from cuforge.sandbox.judge.context import Context
from cuforge.sandbox.judge.profile import peak_rates, roofline_floor_ms
from cuforge.sandbox.protocol import tensors
from cuforge.sandbox.protocol.evaluation import EvalConfig, cheat
from cuforge.sandbox.protocol.loading import problem_module, problem_tf32
from cuforge.sandbox.protocol.precision import (DEFAULT_EAGER, apply_flags, contract, flags_matter, other_compiled,
                                                other_eager, tf32_allowed)
from cuforge.sandbox.protocol.stop import Stop


def problem_setup(problem: dict[str, Any], config: EvalConfig) -> tuple[Any, Tolerance, bool]:
    """Both judges' first step: the problem's module (at its declared small sizes in the CPU test mode:
    full sizes are GPU work and can exhaust a host's memory), with the contract's precision flags set
    in this process; the tolerance it is judged by; whether its fp32 outputs may carry TF32's rounding."""
    meta = problem["meta"]
    module = problem_module(problem["source"], meta.get("small") if config.device == "cpu" else None, meta.get("cast"))
    flags = problem_tf32(module)
    apply_flags(config.precision, flags)
    return module, contract_tolerance(config.precision, meta), tf32_allowed(config.precision, meta.get("ops") or (), flags)


def contract_tolerance(precision: str, meta: dict[str, Any]) -> Tolerance:
    """The problem's own tolerance, or the contract's fixed one (KernelBench's rule: allclose at its
    dtype's atol and rtol, no error-norm bound)."""
    fixed = contract(precision).fixed_tolerance
    if fixed is None:
        return Tolerance(**meta["tolerance"])
    atol, rtol = fixed.get(meta.get("dtype") or "float32", fixed["float32"])
    return Tolerance(atol=atol, rtol=rtol, rel_norm=math.inf)


def output_specs(ctx: Context) -> list[dict[str, Any]]:
    from cuforge.problems.problem import dtype_size

    outs = ctx.problem.get("outputs") or []
    return [{"nbytes": numel(o["shape"]) * dtype_size(o["dtype"])} for o in outs]


def numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def eager_footprint(ctx: Context, model: torch.nn.Module, inputs: list[Any]) -> int:
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


def stochastic(reference: torch.nn.Module, inputs: list[Any]) -> bool:
    """Does the reference itself give other outputs under another random seed (training-mode Dropout)?"""
    with torch.no_grad():
        tensors.reseed(1)
        first = tensors.as_list(reference(*inputs))
        tensors.reseed(2)
        second = tensors.as_list(reference(*inputs))
    return any(isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(first, second))


def call_on_sets(model: Any, sets: list[list[Any]]) -> Any:
    def call(k: int) -> Any:
        with torch.no_grad():
            return model(*sets[k])

    return call


def baseline_callables(ctx: Context, reference: torch.nn.Module, sets: list[list[Any]], flush: timing.L2Flusher | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    flags = problem_tf32(ctx.module)
    matter = flags_matter(ctx.problem["meta"].get("ops") or (), ctx.problem["meta"].get("dtype"), flags)
    other_contract = "pytorch" if other_eager(ctx.config.precision) == DEFAULT_EAGER else "fp32"

    def enter_other() -> None:
        apply_flags(other_contract, flags)

    def leave_other() -> None:
        apply_flags(ctx.config.precision, flags)

    for name in ctx.config.baselines:
        try:
            if name == "torch":
                out[name] = bl.eager(reference, sets)
                if matter:  # eager under the other contract's flags, timed beside it: every result names both
                    out[other_eager(ctx.config.precision)] = bl.eager_under_flags(reference, sets, enter_other, leave_other)
            elif name == "torch.compile":
                out[name] = bl.compiled(reference, sets, ctx.config.compile_mode)
                if matter:  # and torch.compile under them, where they change what runs
                    other = other_compiled(ctx.config.precision)
                    try:
                        out[other] = bl.compiled_under_flags(reference, sets, ctx.config.compile_mode, enter_other, leave_other)
                    except bl.BaselineUnavailable as e:
                        skipped[other] = str(e)
            elif name == "cublas":
                out[name] = bl.cublas(sets)
            elif name == "cublaslt":
                if flush is None:
                    raise bl.BaselineUnavailable("cuBLASLt needs a GPU")
                fn, info = bl.cublaslt(sets, ctx.device, lambda f: quick_time(f, len(sets), flush))
                ctx.correctness["cublaslt"] = info
                out[name] = fn
            else:
                raise bl.BaselineUnavailable(f"unknown baseline {name!r}")
        except bl.BaselineUnavailable as e:
            skipped[name] = str(e)
    if skipped:
        ctx.correctness["baselines_skipped"] = skipped
    return out


def quick_time(fn: Any, n_sets: int, flush: timing.L2Flusher) -> float:
    t = timing.EventTimer(fn, n_sets, flush)
    t.samples(3)
    return statistics.median(t.samples(15))


def name_both_eagers(ctx: Context) -> None:
    """Every result names eager under both contracts' flags: where the flags cannot change what eager
    runs (no convolution, no half-precision or TF32 matmul), the other name is the same measurement of
    the same kernels, and says so."""
    other = other_eager(ctx.config.precision)
    if "torch" in ctx.timings and other not in ctx.timings and "torch" in ctx.config.baselines:
        ctx.timings[other] = ctx.timings["torch"]
        ctx.correctness["eager_flags"] = f"{other} is eager's own timing: these ops run the same kernels under both flags"


def check_roofline(ctx: Context) -> None:
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
