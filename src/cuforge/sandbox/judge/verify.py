"""Correctness: fresh inputs per trial, float64 references, per-dtype comparisons, poisoned memory."""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from cuforge.problems.problem import Tolerance
from cuforge.sandbox.judge.random_tape import RandomTape
from cuforge.sandbox.protocol.tensors import as_list, reseed, same_bits

_PRECISION_RANK = {torch.float64: 3, torch.float32: 2, torch.float16: 1, torch.bfloat16: 1}


@dataclass
class Comparison:
    ok: bool
    reason: str = ""
    kind: str = "wrong_output"  # or "precision_downgrade" when the error is that of reduced precision
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_norm_err: float = 0.0
    mismatches: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    # allclose failed only where, and by no more than, the eager reference in its own dtype fails too
    within_reference: bool = False
    on_tolerance: bool = False  # failed on the error bounds only (not shape, dtype, NaN or a constant output)
    scaled: bool = False  # judged with the computation-aware bound (see compare)
    native_rel_norm: float = 0.0  # eager's own relative error norm against the float64 reference (0: not known)
    norm_only: bool = False  # allclose passed; the relative error norm alone exceeded its bound
    ill_conditioned: bool = False  # eager's own output misses the element bounds widely: judged by error norm

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Tensors above this size are remembered by a digest of their bits, not by a copy: KernelBench's
# biggest inputs and outputs are 6 GiB each, and two copies of each would not fit beside the rest.
COPY_LIMIT_BYTES = 256 * 2**20


def bits_digest(t: torch.Tensor, seed: int) -> tuple[int, int]:
    """(sum, randomly weighted sum) of a tensor's bits as integers, chunk by chunk: equal for equal
    bits; for any change, equal only by a 1 in 2^64 chance (the weights are drawn per evaluation)."""
    flat = t.detach().reshape(-1)
    ints = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[flat.element_size()])
    gen = torch.Generator(device=flat.device).manual_seed(seed)
    plain = weighted = 0
    for i in range(0, ints.numel(), CHUNK_ELEMENTS):
        c = ints[i:i + CHUNK_ELEMENTS].to(torch.int64)
        w = torch.randint(-(2**31), 2**31, c.shape, generator=gen, device=c.device, dtype=torch.int64)
        plain += int(c.sum())
        weighted += int((c * w).sum())
    return plain, weighted


class Remembered:
    """What a tensor held at one moment: a copy when small (or not contiguous), a digest when big.
    `value` is the copy where one was made, else the tensor itself (to be used only after
    `unchanged` confirmed it still holds those bits)."""

    def __init__(self, t: Any, seed: int) -> None:
        self.live = t
        self.copy: Any = None
        self.digest: tuple[int, int] | None = None
        self.seed = seed
        if not isinstance(t, torch.Tensor):
            self.copy = t
        elif t.is_contiguous() and t.nbytes > COPY_LIMIT_BYTES:
            self.digest = bits_digest(t, seed)
        else:
            self.copy = t.clone()

    def unchanged(self) -> bool:
        if self.digest is not None:
            return bits_digest(self.live, self.seed) == self.digest
        if isinstance(self.live, torch.Tensor):
            return same_bits(self.live, self.copy)
        return True

    @property
    def value(self) -> Any:
        return self.copy if self.digest is None else self.live


FINGERPRINT_ELEMENTS = 1 << 20


def fingerprint(t: Any) -> Any:
    """Up to 2^20 evenly strided elements of a tensor (all of a smaller one), copied: enough to tell
    a remembered result from a fresh one without keeping a second copy of a big output."""
    if not isinstance(t, torch.Tensor):
        return t
    flat = t.reshape(-1)
    step = max(1, flat.numel() // FINGERPRINT_ELEMENTS)
    return flat[::step][:FINGERPRINT_ELEMENTS].clone()


def float64_model(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001
        return None


def reference_outputs(
    model64: torch.nn.Module | None, model: torch.nn.Module, inputs: list[Any], rng_seed: int | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], str]:
    """(outputs to compare against, the native model's live outputs, reference kind).

    Floating outputs come from the float64 model on float64 inputs where that runs, else from the
    native model upcast; integer outputs (indices) always from the native model. `rng_seed`, when
    given, reseeds torch's generators before the native model runs, so a stochastic reference (a
    training-mode Dropout) draws the same random numbers the candidate drew after the same reseed; the
    float64 model replays the native model's draws (random_tape: a float64 dropout draws another mask).
    """
    tape = RandomTape() if rng_seed is not None else None
    with torch.no_grad():
        reseed(rng_seed)
        with tape.recording() if tape is not None else contextlib.nullcontext():
            native = as_list(model(*inputs))
        if model64 is not None:
            try:
                ins64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                reseed(rng_seed)
                with tape.replaying() if tape is not None and tape.draws else contextlib.nullcontext():
                    out64 = as_list(model64(*ins64))
                del ins64
                merged = [o64 if n.is_floating_point() else n for o64, n in zip(out64, native)]
                return merged, native, "float64"
            except Exception as e:  # noqa: BLE001 - no float64 kernel for some op, or float64 does not fit
                if isinstance(e, torch.OutOfMemoryError) and torch.cuda.is_available():
                    del e
                    torch.cuda.empty_cache()
    # compare() upcasts chunk by chunk: no float64 copy of a big output is made here.
    return list(native), native, "native"


# The computation-aware bound (see compare): an element may be off by ELEMENT_ULPS units of rounding
# times the sum of absolute values of the terms that formed it, and the relative error norm may reach
# NORM_ULPS units of rounding times ||S|| / ||ref||. Correct code in the output's precision stays
# under both whatever its summation order (sequential, pairwise, split, atomic: measured in
# tests/test_tolerance.py at K up to 2^20); one rounding to fewer mantissa bits (TF32, fp16, bf16)
# in the products or the sum does not.
ELEMENT_ULPS = 8.0
NORM_ULPS = 4.0
# A correct implementation in the problem's precision may be this many times less accurate, in
# error norm, than the problem's own eager output; TF32, fp16 and bf16 arithmetic are 2^13 to 2^16
# times coarser than fp32, so calibrating against eager still names them.
NATIVE_NORM_FACTOR = 16.0
# An ill-conditioned output: eager's own result misses the element bounds and its error norm against
# float64 exceeds this many units of its own arithmetic's rounding (a normal fp32 network stays under
# 2^7). Rounding there is amplified past any per-element bound (a batch norm over two samples whose
# values nearly agree, stacked block after block), so every implementation in that precision, eager's
# own included, misses them, each on other elements; such an output may miss up to ILL_CONDITIONED_SLACK
# times as many elements as eager's, by up to that many times eager's largest miss, and its error norm
# is bounded by eager's as usual (which still separates coarser arithmetic: TF32 rounds 2^13 times
# coarser than fp32).
ILL_CONDITIONED_ULPS = 2.0 ** 10
ILL_CONDITIONED_SLACK = 2.0
# Past this error norm eager's own output is mostly rounding noise (EfficientNet-B2 at batch 2: 0.8):
# where each element lands is chance, so the size of a candidate's largest miss says nothing either;
# the count of misses and the error norm still bound it, and the evaluation records the output as
# ill-conditioned so a reader knows how little its correctness says.
NOISE_NORM = 0.1


# TF32's unit roundoff: 10 explicit mantissa bits, as cuDNN's and cuBLAS's TF32 products round to.
TF32_UNIT = 2.0 ** -11
# Where the reference's own computation rounds to TF32 (a default-flags contract), a correct TF32 kernel
# is as accurate as it within a factor of 2 (truncating to TF32 rather than rounding to nearest), while
# bf16 operands are 8x coarser: the error norm may reach this many times the reference's own, and the
# bound from the sum of |terms| (a worst case, loose by sqrt(K)) does not apply.
TF32_NATIVE_NORM_FACTOR = 4.0


def accumulation_unit(dtype: torch.dtype, tf32: bool = False) -> float:
    """The unit roundoff sums are expected to be accumulated in: the output's own, but never coarser
    than fp32's (fp16 and bf16 problems accumulate in fp32, as cuBLAS and PyTorch do; accumulating in
    fp16 is the precision downgrade the bound must still catch). With `tf32` (a default-flags contract
    where the reference's own computation uses TF32), an fp32 output's products may round to TF32."""
    if tf32 and dtype == torch.float32:
        return TF32_UNIT
    return min(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps) / 2


def computation_scale(model64: torch.nn.Module | None, inputs: list[Any]) -> list[torch.Tensor] | None:
    """Per output element, the sum of the absolute values of the terms that formed it: the float64
    model run on |inputs| with |parameters|. Exact for sums, products, matmuls and convolutions
    (|A| @ |B|), an estimate through other ops; None where that run fails or is not finite."""
    if model64 is None:
        return None
    try:
        absolute = copy.deepcopy(model64)
        with torch.no_grad():
            for t in list(absolute.parameters()) + list(absolute.buffers()):
                if t.is_floating_point():
                    t.abs_()
            ins = [x.double().abs() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            outs = as_list(absolute(*ins))
    except Exception:  # noqa: BLE001 - an estimate only; the plain bounds still apply
        return None
    scales = [o.abs() if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    if any(sc is not None and not bool(torch.isfinite(sc).all()) for sc in scales):
        return None
    return scales  # type: ignore[return-value]


# Comparisons run over flat chunks of this many elements, so that the float64 temporaries of a
# multi-gigabyte output never exist at once (KernelBench's elementwise problems have 1.6e9 elements).
CHUNK_ELEMENTS = 1 << 25


def _chunks(n: int) -> range:
    return range(0, n, CHUNK_ELEMENTS)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(flat_index % dim if dim else 0)
        flat_index //= max(dim, 1)
    return list(reversed(out))


def compare(out: Any, ref: torch.Tensor, expected_dtype: torch.dtype, tol: Tolerance,
            native: torch.Tensor | None = None, scale: torch.Tensor | None = None,
            native_floor: float = 0.0, tf32: bool = False) -> Comparison:
    """Shape, dtype, finiteness, non-degeneracy, allclose and relative Frobenius error, against a
    reference in float64 (or, where float64 did not fit, in the problem's own dtype), chunk by chunk.

    `native` is the eager reference's own output (its dtype) when `ref` is the float64 one: a candidate
    whose allclose misses are no more, and no larger, than that output's own misses against `ref` is
    as accurate as the operator it replaces (cuBLAS's fp32 GEMM misses 1e-4 on ~0.01% of a 4096^3
    product's elements) and passes on to the error-norm bound, which still catches reduced precision.
    `scale` (the sum of |terms| per element, see computation_scale) selects the computation-aware
    bound instead. `native_floor`: eager's relative error norm on other input sets of the same output
    (the largest seen), which the error-norm bound takes where it exceeds this set's. `tf32` (the
    reference's own computation rounds to TF32): the computation-aware bound counts TF32's rounding for
    fp32 outputs (accumulation_unit), and the error norm, the count of misses and their size may reach
    TF32_NATIVE_NORM_FACTOR times the reference's own."""
    if not isinstance(out, torch.Tensor):
        return Comparison(False, f"output is a {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    if out.dtype != expected_dtype:
        lower = _PRECISION_RANK.get(out.dtype, 0) < _PRECISION_RANK.get(expected_dtype, 0)
        return Comparison(False, f"dtype {out.dtype} != expected {expected_dtype}",
                          kind="precision_downgrade" if lower else "wrong_output")
    shape = tuple(out.shape)
    of, rf = _flat(out), _flat(ref)
    numel = of.numel()
    if not expected_dtype.is_floating_point:
        wrong = 0
        wrong_sample: list[dict[str, Any]] = []
        for i in _chunks(numel):
            differ = of[i:i + CHUNK_ELEMENTS] != rf[i:i + CHUNK_ELEMENTS].to(of.dtype)
            n = int(differ.sum())
            if n and len(wrong_sample) < 5:
                for j in torch.nonzero(differ)[:5 - len(wrong_sample)].flatten().tolist():
                    wrong_sample.append({"index": _index(i + j, shape), "got": of[i + j].item(), "expected": rf[i + j].item()})
            wrong += n
        if wrong:
            return Comparison(False, f"{wrong} of {numel} elements differ", mismatches=wrong, sample=wrong_sample)
        return Comparison(True)
    nf = _flat(native) if native is not None and native.is_floating_point() and native.shape == ref.shape else None
    sf = _flat(scale) if scale is not None else None
    unit = accumulation_unit(expected_dtype, tf32)
    bad = ref_bad = apart = 0
    max_abs = max_rel = 0.0
    err_sq = ref_sq = scale_sq = 0.0
    o_lo = r_lo = math.inf
    o_hi = r_hi = -math.inf
    mismatches = native_misses = 0
    native_max_abs = native_err_sq = 0.0
    sample: list[dict[str, Any]] = []
    for i in _chunks(numel):
        o = of[i:i + CHUNK_ELEMENTS].double()
        r = rf[i:i + CHUNK_ELEMENTS].double()
        o_fin, finite = torch.isfinite(o), torch.isfinite(r)
        bad += int((~o_fin).sum())
        ref_bad += int((~finite).sum())
        apart += int((o_fin != finite).sum())
        o, r = torch.where(finite, o, 0.0), torch.where(finite, r, 0.0)
        if o.numel():
            o_lo, o_hi = min(o_lo, float(o.min())), max(o_hi, float(o.max()))
            r_lo, r_hi = min(r_lo, float(r.min())), max(r_hi, float(r.max()))
        diff = (o - r).abs()
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float((diff / r.abs().clamp_min(1e-12)).max()))
        err_sq += float((diff * diff).sum())
        ref_sq += float((r * r).sum())
        allowed = tol.atol + tol.rtol * r.abs()
        if sf is not None:
            sc = torch.where(finite, sf[i:i + CHUNK_ELEMENTS].double().abs(), 0.0)
            allowed = allowed + ELEMENT_ULPS * unit * sc
            scale_sq += float((sc * sc).sum())
        far = diff > allowed
        n = int(far.sum())
        if n and len(sample) < 5:
            for j in torch.nonzero(far)[:5 - len(sample)].flatten().tolist():
                sample.append({"index": _index(i + j, shape), "got": float(o[j]), "expected": float(r[j])})
        mismatches += n
        if nf is not None:
            nd = (torch.where(finite, nf[i:i + CHUNK_ELEMENTS].double(), 0.0) - r).abs()
            native_err_sq += float((nd * nd).sum())
            native_misses += int((nd > allowed).sum())
            if nd.numel():
                native_max_abs = max(native_max_abs, float(nd.max()))
        del o, r, diff, allowed, far
    if apart:
        # Finite where the reference is NaN/Inf counts as much as the reverse: a value made up where the
        # reference has none (nan_to_num's finite stand-ins) is no more the operator's result.
        return Comparison(False, f"{apart} elements are NaN/Inf where the reference is finite, or finite where it is "
                          f"NaN/Inf ({bad} NaN/Inf elements; the reference has {ref_bad})", mismatches=apart)
    ref_norm = math.sqrt(ref_sq)
    err_norm = math.sqrt(err_sq)
    rel_norm = err_norm / ref_norm if ref_norm > 0 else err_norm
    base: dict[str, Any] = dict(max_abs_err=max_abs, max_rel_err=max_rel, rel_norm_err=rel_norm)
    if numel > 1 and r_hi > r_lo and o_hi == o_lo:
        return Comparison(False, "output is constant while the reference is not", **base)
    norm_bound = tol.rel_norm
    native_rel = math.sqrt(native_err_sq) / ref_norm if ref_norm > 0 and native_err_sq > 0 else 0.0
    base["native_rel_norm"] = native_rel
    tf32_native = tf32 and expected_dtype == torch.float32 and nf is not None and max(native_rel, native_floor) > 0
    if tf32_native:
        # The reference itself computed at TF32's rounding: its error is the scale, closely.
        norm_bound = max(norm_bound, TF32_NATIVE_NORM_FACTOR * max(native_rel, native_floor))
    elif nf is not None and max(native_rel, native_floor) > 0:
        # The problem's own eager result against float64: an output that cancels (a mean of a
        # normalised tensor is ~0) makes any relative norm large, the eager op's too.
        norm_bound = max(norm_bound, NATIVE_NORM_FACTOR * max(native_rel, native_floor))
    if sf is None:
        bound = f"atol={tol.atol:g}, rtol={tol.rtol:g}"
    else:
        # Rounding in the output's precision grows with the terms summed, not with the result.
        if ref_norm > 0 and not tf32_native:
            norm_bound = max(norm_bound, NORM_ULPS * unit * math.sqrt(scale_sq) / ref_norm)
        bound = (f"atol={tol.atol:g} + rtol={tol.rtol:g} + {ELEMENT_ULPS:g} ulp x the sum of |terms| per element "
                 f"(rounding grows with the terms summed)")
    # As accurate as the reference: no more misses, none larger. Where the reference itself computed at
    # TF32's rounding, another summation order (or truncating rather than rounding to TF32) moves which
    # elements miss and by how much, so the same factor as its error norm's applies (an output that a
    # normalization divides by a batch statistic has no sum-of-terms bound to fall back on).
    slack = TF32_NATIVE_NORM_FACTOR if tf32_native else 1.0
    own_unit = TF32_UNIT if tf32_native else torch.finfo(expected_dtype).eps / 2
    ill = nf is not None and native_misses > 0 and max(native_rel, native_floor) > ILL_CONDITIONED_ULPS * own_unit
    if ill:
        slack = max(slack, ILL_CONDITIONED_SLACK)
    noise = ill and max(native_rel, native_floor) >= NOISE_NORM
    within = (mismatches > 0 and nf is not None and (sf is None or ill)
              and mismatches <= slack * native_misses and (noise or max_abs <= slack * native_max_abs))
    base["ill_conditioned"] = ill
    scaled = sf is not None
    if mismatches and not within and ill:
        reason = (f"{mismatches} of {numel} elements miss (max abs err {max_abs:.3g}); the output is ill-conditioned "
                  f"in {expected_dtype} (eager's own result misses {native_misses}, by up to {native_max_abs:.3g}, "
                  f"and is {max(native_rel, native_floor):.3g} off float64 in error norm), and this is more than "
                  f"{slack:g}x eager's misses or their size")
        return Comparison(False, reason, kind=_error_kind(rel_norm, max_abs, ref_norm, numel), mismatches=mismatches,
                          sample=sample, on_tolerance=True, scaled=scaled, **base)
    if mismatches and not within:
        reason = (f"{mismatches} of {numel} elements outside {bound} "
                  f"(max abs err {max_abs:.3g}, relative error norm {rel_norm:.3g})")
        return Comparison(False, reason, kind=_error_kind(rel_norm, max_abs, ref_norm, numel),
                          mismatches=mismatches, sample=sample, on_tolerance=True, scaled=scaled, **base)
    if rel_norm > norm_bound:
        # allclose passed but the error norm is too large: the signature of lower-precision arithmetic
        # (TF32 on fp32 problems, fp16/bf16 accumulation), which is a precision downgrade.
        return Comparison(False, f"relative error norm {rel_norm:.3g} exceeds the {expected_dtype} bound "
                          f"{norm_bound:.3g}: consistent with reduced-precision arithmetic",
                          kind="precision_downgrade", on_tolerance=True, scaled=scaled, norm_only=True, **base)
    return Comparison(True, mismatches=mismatches, within_reference=within, scaled=scaled, **base)


def _error_kind(rel_norm: float, max_abs: float, ref_norm: float, numel: int) -> str:
    """Errors spread thin over the whole output, every one small against the output's scale, are the
    signature of reduced-precision arithmetic (fp16/bf16 accumulation, TF32); a logic bug leaves
    errors as large as the values themselves somewhere."""
    ref_rms = ref_norm / max(numel, 1) ** 0.5
    if 0 < rel_norm < 0.05 and max_abs < 0.25 * ref_rms:
        return "precision_downgrade"
    return "wrong_output"


# ---------------------------------------------------------------------------------- poison


