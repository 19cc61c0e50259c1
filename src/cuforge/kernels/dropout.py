"""A training-mode dropout as one stage of a staged candidate: PyTorch's own call, not a kernel.

Its mask is random. The reference draws it with PyTorch's fused dropout kernel right after the judge
reseeds the generators, so the one way to draw the same mask is to make the same call in the same
place of the same stream of random numbers; a kernel of our own with its own generator cannot. The
families before and after it (the GEMM, the softmax) are ours. Never proposed alone: a dropout by
itself would be PyTorch timed against PyTorch."""

from __future__ import annotations

import json
from typing import Any

from cuforge.kernels.base import PY_CONFIG_TAG, GraphFamily
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, TorchCall, wrap_stages


class TorchDropout(GraphFamily):
    def __init__(self) -> None:
        super().__init__("dropout_torch", {})

    def match(self, problem: Problem) -> float | str:
        """The drop probability, where the graph is one training-mode dropout of its first input."""
        graph = problem.graph
        if len(graph) != 1 or graph[0].op != "dropout":
            return "not one training-mode dropout"
        node = graph[0]
        if node.args[:1] != ("in0",) or problem.graph_outputs != (node.out,):
            return "the dropout is not of the first input, or not the output"
        if problem.meta.policy == "custom":
            return "policy 'custom' allows no PyTorch op, and only PyTorch's op draws the reference's mask"
        return float(node.args[1])

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        return [{}]

    def call(self, problem: Problem) -> TorchCall:
        return TorchCall(f"torch.dropout(in0, {self.matched(problem)!r}, True)")

    def launch(self, config: dict[str, Any], problem: Problem) -> LaunchSpec:
        raise NotImplementedError("a dropout stage is a PyTorch call, not a kernel: use call")

    def render(self, config: dict[str, Any], problem: Problem, template_text: str | None = None) -> Candidate:
        call = self.call(problem)
        header = PY_CONFIG_TAG + json.dumps({"family": self.name}) + "\n"
        return Candidate(wrap_stages([call], [None], header), "module", proposer="template",
                         meta={"family": self.name, "config": {}, "torch_call": call.expr})
