"""Judging one call's outputs against the reference, shared by both runners (in_worker.py,
in_host.py): `Judge` applies the bounds (the plain ones, the error-norm floor from eager's own error,
calibrated on fresh sets before an accusation rests on it, the computation-aware bound), `Trials` keeps
what the correctness trials showed and names their first failure as precisely as it can."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from cuforge.sandbox.judge import cheats, verify
from cuforge.sandbox.protocol import tensors
from cuforge.sandbox.protocol.evaluation import cheat
from cuforge.sandbox.protocol.precision import contract
from cuforge.sandbox.protocol.stop import Stop

if TYPE_CHECKING:
    from cuforge.sandbox.judge.context import Context, References


class Judge:
    """Compares one call's outputs with the reference: the plain bounds first; where only they fail
    and a float64 reference exists, the computation-aware bound (another summation order than
    eager's is judged by how rounding grows with the terms summed, not accused)."""

    def __init__(self, ctx: Context, models: References, inputs: list[Any], ref_kind: str) -> None:
        self.ctx, self.models, self.inputs, self.ref_kind = ctx, models, inputs, ref_kind
        self._scales: list[Any] | None = None

    def __call__(self, i: int, o: Any, r: torch.Tensor, n: torch.Tensor) -> verify.Comparison:
        float64 = self.ref_kind == "float64"
        # Eager's error on an output that cancels (a mean of a normalised tensor) is rounding noise over
        # a tiny norm, and varies set to set; the bound rests on the largest seen in this evaluation, not
        # on the one set's draw (an honest pipeline was once called a cheat on a set where eager was lucky).
        floor = self.ctx.native_rel.get(i, 0.0)
        cmp = verify.compare(o, r, n.dtype, self.ctx.tol, native=n if float64 else None, native_floor=floor,
                             tf32=self.ctx.tf32)
        self.ctx.native_rel[i] = max(floor, cmp.native_rel_norm)
        if not cmp.ok and cmp.norm_only and float64 and i not in self.ctx.calibrated:
            # Before an accusation rests on the error norm alone, the floor comes from more than the sets
            # judged so far (on the first set, from none but its own draw).
            self.ctx.calibrated.add(i)
            self.ctx.native_rel[i] = max(self.ctx.native_rel[i], self.calibrate(i))
            cmp = verify.compare(o, r, n.dtype, self.ctx.tol, native=n, native_floor=self.ctx.native_rel[i],
                                 tf32=self.ctx.tf32)
        if cmp.ok or not cmp.on_tolerance or not float64 or contract(self.ctx.config.precision).fixed_tolerance:
            return cmp  # a fixed-tolerance contract (KernelBench's rule) is allclose alone
        if self._scales is None:
            self._scales = verify.computation_scale(self.models.reference64, self.inputs) or []
        if i < len(self._scales) and self._scales[i] is not None:
            # Eager's own error stays the norm's floor (and, where eager itself computed at TF32's rounding,
            # its scale: see verify.TF32_NATIVE_NORM_FACTOR).
            cmp = verify.compare(o, r, n.dtype, self.ctx.tol, native=n, native_floor=self.ctx.native_rel.get(i, 0.0),
                                 scale=self._scales[i], tf32=self.ctx.tf32)
        return cmp

    CALIBRATION_SETS = 3

    def calibrate(self, i: int) -> float:
        """Eager's largest relative error norm of output i against float64 over fresh input sets that only
        eager and the float64 reference see (nothing of the candidate's runs on them); 0 where they do
        not fit or give no float64 output."""
        worst = 0.0
        for k in range(self.CALIBRATION_SETS):
            try:
                inputs = tensors.make_inputs(self.ctx.module, self.ctx.seed + 7_000_003 + 101 * k, self.ctx.device, gaussian=k % 2 == 1)
                refs, native, kind = verify.reference_outputs(self.models.reference64, self.models.reference, inputs, rng_seed=k)
            except torch.OutOfMemoryError:
                if self.ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
                break
            if kind != "float64" or i >= len(refs) or not native[i].is_floating_point():
                break
            own = verify.compare(native[i], refs[i], native[i].dtype, self.ctx.tol, native=native[i])
            worst = max(worst, own.native_rel_norm)
            del inputs, refs, native
        self.ctx.correctness.setdefault("calibrated_native_rel_norm", {})[str(i)] = worst
        return worst


@dataclass
class Trials:
    """What the trials so far showed: the worst errors, allclose misses shared with eager, and a
    sample of the last outputs and references (the caching check). Shared by both judges."""

    worst: dict[str, float] = field(default_factory=lambda: {"max_abs_err": 0.0, "max_rel_err": 0.0,
                                                             "rel_norm_err": 0.0})
    shared_misses: int = 0
    previous: list[torch.Tensor] | None = None
    previous_ref: list[torch.Tensor] | None = None

    def compare(self, ctx: Context, models: Any, inputs: list[Any], ref_kind: str, outs: list[Any],
                refs: list[Any], native: list[Any], trial: int, handed_back: Any = None) -> None:
        """Judge one trial's outputs; the first failure raises Stop, named as precisely as it can be.
        `handed_back(output)`: whether a wrong output is an input given back."""
        judge = Judge(ctx, models, inputs, ref_kind)
        for i, (o, r, n) in enumerate(zip(outs, refs, native)):
            cmp = judge(i, o, r, n)
            for k in self.worst:
                self.worst[k] = max(self.worst[k], getattr(cmp, k))
            if cmp.ok and cmp.scaled:
                ctx.correctness["computation_aware_bound"] = True
            if cmp.ok and cmp.within_reference:  # recorded: allclose misses the eager reference shares
                self.shared_misses = max(self.shared_misses, cmp.mismatches)
            if cmp.ok and cmp.ill_conditioned:  # recorded: judged by error norm, as eager's own result misses
                worst = ctx.correctness.setdefault("ill_conditioned_native_rel_norm", {})
                worst[str(i)] = max(worst.get(str(i), 0.0), cmp.native_rel_norm)
            if cmp.ok:
                continue
            if handed_back is not None and handed_back(o):
                raise Stop(cheat("aliasing"), f"output {i} shares memory with an input")
            if tensors.poison_fraction(o) > 0.5:
                raise Stop(cheat("aliasing"), f"trial {trial}, output {i}: holds never-written memory (the poison "
                           "pattern): the output was allocated but not computed, hoping to read a freed result")
            if self.previous is not None and self.previous_ref is not None and i < len(self.previous):
                v = cheats.caching_violation(verify.fingerprint(o), self.previous[i],
                                             not torch.equal(verify.fingerprint(r), self.previous_ref[i]))
                if v:
                    raise Stop(cheat(v[0]), f"trial {trial}: {v[1]}")
            status = cheat("precision_downgrade") if cmp.kind == "precision_downgrade" else "wrong_output"
            raise Stop(status, f"trial {trial} ({'gaussian' if trial % 2 else 'problem'} inputs), output {i}: {cmp.reason}",
                       failed_trial=trial, comparison=cmp.to_dict(), reference=ref_kind)

    def passed(self, ctx: Context, outs: list[Any], refs: list[Any], ref_kind: str, trial: int) -> None:
        # A sample of each output, not the outputs: the caching check needs no second full copy.
        self.previous = [verify.fingerprint(o) for o in outs]
        self.previous_ref = [verify.fingerprint(r) for r in refs]
        ctx.correctness.update(trials_passed=trial + 1, reference=ref_kind, **self.worst)
        if self.shared_misses:
            ctx.correctness["misses_within_reference"] = self.shared_misses
