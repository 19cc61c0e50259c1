"""A problem as the driver sends it to a worker: its source and the metadata the judge needs, as JSON."""

from __future__ import annotations

from typing import Any

from cuforge.problems.problem import Problem


def problem_payload(problem: Problem) -> dict[str, Any]:
    """The request's problem: what a worker rebuilds it from, its tolerance and sizes among it."""
    m = problem.meta
    return {
        "id": problem.id,
        "source": problem.source,
        "meta": {"tolerance": {"atol": m.tolerance.atol, "rtol": m.tolerance.rtol, "rel_norm": m.tolerance.rel_norm},
                 "flops": m.flops, "bytes": m.bytes, "dtype": m.dtype, "policy": m.policy, "small": dict(m.small),
                 "ops": list(problem.ops),  # which flags can matter to the reference (protocol/precision.py)
                 "cast": m.cast},  # an fp32 problem run in another dtype (--dtype)
        "outputs": [{"shape": list(t.shape), "dtype": t.dtype} for t in problem.outputs or ()],
    }
