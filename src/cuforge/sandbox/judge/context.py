"""What one evaluation carries through the judge's steps (both judges: the candidate in the worker or
in a candidate host)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cuforge.problems.problem import Tolerance
from cuforge.sandbox.protocol.evaluation import EvalConfig, Profile, TimingStats


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
    # Under a default-flags contract, where the reference's own computation uses TF32 (a convolution
    # under cuDNN's default): fp32 outputs are judged at TF32's rounding, as PyTorch's are.
    tf32: bool = False
    phase: Any = None  # core.Phases: wall seconds per step, kept in the record


@dataclass
class References:
    """The problem's own model and its float64 copy (None where it does not fit or has no float64)."""

    reference: torch.nn.Module
    reference64: torch.nn.Module | None


@dataclass
class Models(References):
    """The in-process judge's: the references and the candidate's model, in this process."""

    candidate: torch.nn.Module
