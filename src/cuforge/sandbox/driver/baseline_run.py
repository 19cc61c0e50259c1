"""Measuring baselines alone: the problem's own Model is evaluated as the candidate, so every
baseline is timed interleaved with eager PyTorch by the same harness, and the result is stored."""

from __future__ import annotations

from dataclasses import replace

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.driver.supervisor import Supervisor

REFERENCE_AS_CANDIDATE = (
    "import torch\n\n\n"
    "class ModelNew(__cuforge_problem__.Model):\n"
    "    \"\"\"The reference itself, so baselines are timed by the candidate path of the harness.\"\"\"\n"
)


def measure_baselines(sup: Supervisor, problem: Problem, config: EvalConfig) -> Evaluation:
    """timings['candidate'] is eager PyTorch; the others are the baselines named in config."""
    any_policy = replace(problem, meta=replace(problem.meta, policy="any"))
    return sup.evaluate(any_policy, Candidate(REFERENCE_AS_CANDIDATE, proposer="reference"), config)


def software_tag(info: dict) -> str:
    return f"torch {info.get('torch')} cuda {info.get('cuda')}"
