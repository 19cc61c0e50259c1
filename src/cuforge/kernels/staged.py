"""Two kernels for a graph no one family covers: an anchor family's kernel (a convolution or GEMM with
its elementwise chain) writes the tensor where the graph is cut, and another family's kernel runs the
rest (a group norm, a pooling, a softmax or a reduction over channels) on it. The cut is found on the
traced graph: the longest head the anchor family matches whose remainder some family matches."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, make_dataclass, replace
from typing import Any

from cuforge.kernels.base import PY_CONFIG_TAG, BadConfig, Family, GraphFamily, as_stage
from cuforge.op_graph import OpNode, is_ref, rename_refs, renamed_node
from cuforge.problems.problem import Problem, TensorSpec
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, wrap_stages

_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "permute", "transpose"})


@dataclass(frozen=True)
class Cut:
    """The problem as head then tail: the tail's in0 is the head's output, its in1, ... the forward's
    inputs listed in `tail_inputs` (by index)."""

    head: Problem
    tail: Problem
    tail_inputs: tuple[int, ...]


def cut_at(problem: Problem, k: int) -> Cut | str:
    """The problem cut after its first k graph nodes, or why it cannot be cut there."""
    graph = problem.graph
    if not 0 < k < len(graph):
        return "no node to cut after"
    # The value handed from head to tail is an fp32 buffer: a graph over other floating dtypes is a
    # partition's to cut, which follows each value's dtype through the casts (index and mask inputs
    # are read as they are).
    if any(not t.is_scalar and t.dtype in ("float16", "bfloat16", "float64") for t in problem.inputs):
        return "floating-point inputs other than fp32 (a partition cuts such graphs)"
    cut = graph[k - 1]
    # Unit dims dropped or added keep a fresh tensor's memory as it is: a head may end in them (a pooling
    # of a GEMM's features as (N, 1, 1, F), squeezed back); other views are left to the tail.
    if cut.op in _VIEWS and not _unit_dims_only(graph[:k]):
        return "the head would end in a view"
    head_refs = {n.out for n in graph[:k - 1]}
    tail_nodes = graph[k:]
    used = {a.partition(".")[0] for n in tail_nodes for a in _flat(n.args) + _flat(tuple(v for _, v in n.kwargs)) if is_ref(a)}
    if used & head_refs or any(o is not None and o.partition(".")[0] in head_refs for o in problem.graph_outputs):
        return "the rest reads a value from inside the head"
    if cut.out not in used:
        return "the rest does not read the head's result"
    dtype = "float32"
    inputs = sorted(int(r[2:]) for r in used if r.startswith("in"))
    alias = {cut.out: "in0", **{f"in{i}": f"in{j + 1}" for j, i in enumerate(inputs)}}
    tail_graph = tuple(renamed_node(n, alias) for n in tail_nodes)
    tail = replace(problem, id=problem.id + "#tail", inputs=(TensorSpec(tuple(cut.shape), dtype),) + tuple(problem.inputs[i] for i in inputs),
                   graph=tail_graph, graph_outputs=tuple(rename_refs(o, alias) for o in problem.graph_outputs),
                   ops=tuple(n.op for n in tail_graph if n.op not in _VIEWS))
    head = replace(problem, id=problem.id + "#head", graph=graph[:k], graph_outputs=(cut.out,),
                   outputs=(TensorSpec(tuple(cut.shape), dtype),), ops=tuple(n.op for n in graph[:k] if n.op not in _VIEWS))
    return Cut(head, tail, tuple(inputs))


# Cuts tried per split, the longest heads first. Each try asks families about a head and a tail as
# long as the graph, so a graph with thousands of places to cut (a recurrent model traced step by
# step) would cost hours; a graph a few kernels cover has far fewer (KernelBench level1/level2: at
# most a few dozen nodes).
MAX_CUTS = 48


def cut_points(problem: Problem) -> list[int]:
    """Every k, longest head first, at which cut_at's reads allow a cut: nothing after the k-th node
    reads a value made before it, and something after it reads the k-th node's own. One pass over the
    graph (a traced RNN has 40k nodes: cutting at each k in turn and checking took minutes)."""
    graph = problem.graph
    where = {n.out: i for i, n in enumerate(graph)}
    read = [-1] * len(graph)  # the last node reading each node's value
    for j, n in enumerate(graph):
        for a in _flat(n.args) + _flat(tuple(v for _, v in n.kwargs)):
            if is_ref(a):
                i = where.get(a.partition(".")[0])
                if i is not None and i != j:
                    read[i] = max(read[i], j)
    kept = list(read)  # and a graph output is kept to the end
    for o in problem.graph_outputs:
        i = where.get(o.partition(".")[0]) if o is not None else None
        if i is not None:
            kept[i] = len(graph)
    points, reach = [], -1  # reach: how far any value made before the k-th node is kept
    for k in range(1, len(graph)):
        if reach < k and read[k - 1] >= k:
            points.append(k)
        reach = max(reach, kept[k - 1])
    return points[::-1]


def first_computed(problem: Problem) -> str | None:
    """The first op that computes something (views of the inputs before it only name their memory)."""
    return next((n.op for n in problem.graph if n.op not in _VIEWS), None)


def _unit_dims_only(head: tuple[OpNode, ...]) -> bool:
    """Whether the views the head ends in only drop or add unit dims, after a computed value."""
    views = 0
    for n in reversed(head):
        if n.op not in _VIEWS:
            return views < len(head)
        if n.op not in ("squeeze", "unsqueeze"):
            return False
        views += 1
    return False  # views of an input alone


def _flat(args: tuple[Any, ...]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, tuple) else [a])
    return out


# What every staged family of a problem asks the same way, made once and shared: each head has a
# staged family per tail (28), and each of them walked the same cuts of a 40k-node graph again.
_CUTS: dict[int, tuple[Problem, list[Cut]]] = {}
_HEAD_COVERS: dict[tuple[str, int], tuple[Problem, bool]] = {}


def cuts_of(problem: Problem) -> list[Cut]:
    """The graph's cuts (cut_points, at most MAX_CUTS), longest head first, for every staged family."""
    hit = _CUTS.get(id(problem))
    if hit is None or hit[0] is not problem:
        if len(_CUTS) > 256:
            _CUTS.clear()
        cuts = [c for c in (cut_at(problem, k) for k in cut_points(problem)[:MAX_CUTS]) if not isinstance(c, str)]
        hit = _CUTS[id(problem)] = (problem, cuts)  # the entry keeps the problem alive: its id is not reused
    return hit[1]


def head_covers(head: Family, problem: Problem) -> bool:
    """Whether `head` covers `problem` (a whole graph or a cut's head), asked once per head and problem."""
    key = (head.name, id(problem))
    hit = _HEAD_COVERS.get(key)
    if hit is None or hit[0] is not problem:
        if len(_HEAD_COVERS) > 4096:
            _HEAD_COVERS.clear()
        hit = _HEAD_COVERS[key] = (problem, head.supports(problem) is None)
    return hit[1]


class Staged(GraphFamily):
    """`head`'s kernel, then `tail`'s, over one cut of the graph. Knobs are both families' knobs,
    prefixed "h." and "t."; a candidate is a Python module that launches the two kernels."""

    def __init__(self, head: Family, tail: Family) -> None:
        knobs = {f"h.{k}": v for k, v in head.knobs.items()} | {f"t.{k}": v for k, v in tail.knobs.items()}
        super().__init__(f"staged:{head.name}+{tail.name}", knobs)
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "anchors", head.anchors)  # the head's kernel starts the graph
        object.__setattr__(self, "tail", tail)

    head: Family
    tail: Family

    def runs_on(self, compute_capability: str) -> bool:
        return self.head.runs_on(compute_capability) and self.tail.runs_on(compute_capability)

    def leads(self, problem: Problem) -> bool:
        cut = self.match(problem)
        return not isinstance(cut, str) and self.head.leads(cut.head)

    def match(self, problem: Problem) -> Cut | str:
        return self.memo_match(problem)

    def _match(self, problem: Problem) -> Cut | str:
        if first_computed(problem) not in ("convolution", "mm", "bmm", "addmm"):
            return "does not start with a convolution or a GEMM"
        if head_covers(self.head, problem):
            return f"{self.head.name} covers it in one kernel"
        for cut in cuts_of(problem):  # the longest head first: the most fused into it
            if head_covers(self.head, cut.head) and self.tail.supports(cut.tail) is None:
                return cut
        return "no cut of the graph splits it into the head family's kernel and the tail family's"

    def split(self, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({k[2:]: v for k, v in config.items() if k.startswith("h.")},
                {k[2:]: v for k, v in config.items() if k.startswith("t.")})

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        h, t = self.split(config)
        cut = None if problem is None else self.matched(problem)
        return (self.head.reduced_precision(h, cut and cut.head)
                or self.tail.reduced_precision(t, cut and cut.tail))

    def complete(self, config: dict[str, Any]) -> dict[str, Any]:
        h, t = self.split(config)
        return {f"h.{k}": v for k, v in self.head.complete(h).items()} | {f"t.{k}": v for k, v in self.tail.complete(t).items()}

    @property
    def config_type(self) -> type:
        """The head's config and the tail's, as two fields."""
        return staged_config_type(self.head.config_type, self.tail.config_type)

    def config(self, values: Mapping[str, Any]) -> Any:
        """`values` (the head's knobs as h.*, the tail's as t.*) checked by each family and typed."""
        if values.get("family", self.name) != self.name:
            raise BadConfig(f"a config of family {values['family']!r} given to {self.name}")
        unknown = sorted(k for k in values if k != "family" and not k.startswith(("h.", "t.")))
        if unknown:
            raise BadConfig(f"{self.name} has no knob {unknown[0]!r} (its knobs: the head's as h.*, the tail's as t.*)")
        h, t = self.split(dict(values))
        return self.config_type(head=self.head.config(h), tail=self.tail.config(t))

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        cut = self.match(problem)
        if isinstance(cut, str):
            return False
        h, t = self.split(config)
        return self.head.valid(h, cut.head) and self.tail.valid(t, cut.tail)

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        cut = self.matched(problem)
        heads, tails = self.head.seeds(cut.head), self.tail.seeds(cut.tail)
        out = [pair_config(h, t) for h, t in leading_pairs(heads, tails)]
        # Where each of these computes below fp32 (one TF32 product, first where the contract allows it), the
        # same pairs of full-precision seeds after them: the judge may still rule TF32 out (cuDNN picks it
        # per shape), and the search then needs configs to fall back on.
        if all(self.reduced_precision(c, problem) for c in out):
            out += [pair_config(h, t) for h, t in leading_pairs(
                [h for h in heads if not self.head.reduced_precision(h, cut.head)],
                [t for t in tails if not self.tail.reduced_precision(t, cut.tail)])]
        return out

    def launch(self, config: dict[str, Any], problem: Problem) -> LaunchSpec:
        raise NotImplementedError("a staged candidate is a module of two launches: use render")

    def render(self, config: dict[str, Any], problem: Problem, template_text: str | None = None) -> Candidate:
        cut = self.matched(problem)
        self.config(config)  # both halves checked before either renders
        cfg = self.complete(config)
        h, t = self.split(cfg)
        head, tail = self.head.render(h, cut.head), self.tail.render(t, cut.tail)
        feeds = [[("in", i) for i in range(len(problem.inputs))], [("stage", 0)] + [("in", i) for i in cut.tail_inputs]]
        header = PY_CONFIG_TAG + json.dumps({"family": self.name, **cfg}, sort_keys=True) + "\n"
        source = wrap_stages([as_stage(head), as_stage(tail)], feeds, header)
        return Candidate(source, "module", proposer="template", meta={"family": self.name, "config": cfg})


_STAGED_TYPES: dict[tuple[type, type], type] = {}


def staged_config_type(head: type, tail: type) -> type:
    """The frozen dataclass of a staged family's configs: its head family's config, then its tail's."""
    cls = _STAGED_TYPES.get((head, tail))
    if cls is None:
        name = head.__name__.removesuffix("Config") + "Then" + tail.__name__
        cls = _STAGED_TYPES[(head, tail)] = make_dataclass(name, [("head", head), ("tail", tail)], frozen=True)
    return cls


def staged_families(heads: list[Family], tails: list[Family]) -> list[Family]:
    """A staged family for every head and tail pair (a family is never its own tail)."""
    return [Staged(h, t) for h in heads for t in tails if t is not h]


def pair_config(head: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """A staged config from the head's and the tail's: their knobs as h.* and t.*."""
    return {f"h.{k}": v for k, v in head.items()} | {f"t.{k}": v for k, v in tail.items()}


def leading_pairs(heads: list[dict[str, Any]], tails: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The head's first two seeds with the tail's first, then the head's first with the tail's second."""
    return [(h, t) for h in heads[:2] for t in tails[:1]] + [(h, t) for h in heads[:1] for t in tails[1:2]]
