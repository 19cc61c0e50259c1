"""Three or four kernels in a row for a graph that neither one family nor a head-and-tail pair covers: a
convolution or GEMM kernel, then other families' kernels over what it wrote (a pooling, then a mean over
the pooled values; a batch norm, then two poolings), each fusing the elementwise ops that follow it; or,
where the graph starts with neither, two to four kernels of any families (a pooling, then a convolution).
The graph is cut where each part is one family's (the longest first part first), as `staged` cuts it once.

Its configs are the stages' configs under s0., s1., ... prefixes. The stage families depend on the
problem, so its knobs do too (knobs_for): the search starts from the stages' seeds and moves their knobs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import PY_CONFIG_TAG, BadConfig, Family, GraphFamily, as_stage, could_match
from cuforge.kernels.staged import MAX_CUTS, cut_at, cut_points, first_computed
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, wrap_stages

MAX_STAGES = 4


@dataclass(frozen=True)
class Stage:
    family: Family
    problem: Problem  # the part of the graph this stage runs, over its own inputs
    feed: tuple[tuple[str, int], ...]  # where each of its inputs comes from: ("in", j) or ("stage", k)


def by_lead(families: list[Family], problem: Problem) -> list[Family]:
    """`families` with those that lead on this problem (Family.leads) first, otherwise in order."""
    return sorted(families, key=lambda f: not f.leads(problem))


def first_covering(families: list[Family], problem: Problem) -> Family | None:
    """The first of `families` that covers the problem, those that lead on it first. A family whose anchor
    ops the graph lacks is not asked (on a recurrent graph of 15k nodes, asking the attention and
    gated-cell matchers about every cut took most of a minute)."""
    ops = frozenset(problem.ops)
    asked = [f for f in families if could_match(f, ops)]
    return next((f for f in by_lead(asked, problem) if f.supports(problem) is None), None)


def split(problem: Problem, heads: list[Family], singles: list[Family], feed: tuple[tuple[str, int], ...],
          first: int, room: int) -> list[Stage] | None:
    """The problem as `first`-numbered stages, at most `room` of them, the first from `heads`, the rest from
    `singles`; None where no such cut exists."""
    for k in cut_points(problem)[:MAX_CUTS]:
        cut = cut_at(problem, k)
        if isinstance(cut, str):
            continue
        head = first_covering(heads, cut.head)
        if head is None:
            continue
        tail_feed = (("stage", first),) + tuple(feed[j] for j in cut.tail_inputs)
        last = first_covering(singles, cut.tail)
        if last is not None:
            return [Stage(head, cut.head, feed), Stage(last, cut.tail, tail_feed)]
        if room > 2:
            rest = split(cut.tail, singles, singles, tail_feed, first + 1, room - 1)
            if rest is not None:
                return [Stage(head, cut.head, feed)] + rest
    return None


def leading_choices(indices: list[list[int]]) -> list[list[int]]:
    """Per stage, which of its seeds (from `indices`, each stage's in order): every stage's first; then
    each stage's second with the others' first."""
    first = [ix[0] for ix in indices]
    return [first] + [[ix[1] if i == j else first[i] for i, ix in enumerate(indices)]
                      for j in range(len(indices)) if len(indices[j]) > 1]


@dataclass(frozen=True)
class PipelineConfig:
    """Per stage, in order, its knobs and their values (each checked by that stage's family)."""

    stages: tuple[tuple[tuple[str, Any], ...], ...]


def _stage_key(key: str) -> bool:
    stage, _, knob = key.partition(".")
    return stage.startswith("s") and stage[1:].isdigit() and bool(knob)


class Pipeline(GraphFamily):
    """`heads` start the chain of kernels; any of `singles` runs each later part."""

    def __init__(self, heads: list[Family], singles: list[Family]) -> None:
        super().__init__("pipeline", {})
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "singles", singles)

    heads: list[Family]
    singles: list[Family]

    def match(self, problem: Problem) -> list[Stage] | str:
        return self.memo_match(problem)

    @staticmethod
    def starts_with_head(problem: Problem) -> bool:
        """Whether the graph starts with a convolution or GEMM, so its first part comes from `heads`."""
        return first_computed(problem) in ("convolution", "mm", "bmm", "addmm")

    def _match(self, problem: Problem) -> list[Stage] | str:
        # A convolution or GEMM first: its kernel, then the rest; anything else first (a pooling before the
        # convolution, KernelBench level2/38): any family's kernel, then the rest - two kernels too, which
        # `staged` (a convolution or GEMM head only) does not offer.
        anchored = self.starts_with_head(problem)
        if len(problem.graph) < (3 if anchored else 2):
            return "too few ops for several kernels (one or two kernels' case)"
        feed = tuple(("in", j) for j in range(len(problem.inputs)))
        stages = split(problem, self.heads if anchored else self.singles, self.singles, feed, 0, MAX_STAGES)
        if stages is None:
            return f"no cut of the graph into {MAX_STAGES} or fewer parts, each one family's kernel"
        if anchored and len(stages) < 3:
            return "two kernels cover it (staged)"
        return stages

    def runs_on(self, compute_capability: str) -> bool:
        # Which head a problem gets is not known here: where any head is Hopper's (wgmma), all must run.
        return all(f.runs_on(compute_capability) for f in self.heads)

    def knobs_for(self, problem: Problem) -> dict[str, tuple[Any, ...]]:
        stages = self.match(problem)
        if isinstance(stages, str):
            return {}
        return {f"s{i}.{k}": v for i, s in enumerate(stages) for k, v in s.family.knobs_for(s.problem).items()}

    def stage_configs(self, config: dict[str, Any], stages: list[Stage]) -> list[dict[str, Any]]:
        return [{k[len(f"s{i}."):]: v for k, v in config.items() if k.startswith(f"s{i}.")} for i in range(len(stages))]

    def complete(self, config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in sorted(config):
            stage, _, knob = key.partition(".")
            if stage.startswith("s") and stage[1:].isdigit() and knob:
                out[key] = config[key]
        return out

    @property
    def config_type(self) -> type:
        return PipelineConfig

    def config(self, values: Mapping[str, Any]) -> Any:
        """A pipeline's config is its stages' configs, keyed s0.*, s1.*, ...: which families those are
        depends on the problem, so each stage's family checks its own when it renders (and `valid`)."""
        if values.get("family", self.name) != self.name:
            raise BadConfig(f"a config of family {values['family']!r} given to {self.name}")
        stray = sorted(k for k in values if k != "family" and not _stage_key(k))
        if stray:
            raise BadConfig(f"{self.name} has no knob {stray[0]!r} (its knobs: each stage's as s0.*, s1.*, ...)")
        stages: dict[int, dict[str, Any]] = {}
        for key, value in values.items():
            if key != "family":
                stage, _, knob = key.partition(".")
                stages.setdefault(int(stage[1:]), {})[knob] = value
        return PipelineConfig(tuple(tuple(sorted(stages[i].items())) for i in sorted(stages)))

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        stages = self.match(problem)
        if isinstance(stages, str):
            return False
        for part, stage in zip(self.stage_configs(config, stages), stages):
            if not set(part) <= set(stage.family.knobs):
                return False
            try:
                whole = stage.family.complete(part)
            except KeyError:  # a knob missing that has no default
                return False
            if not stage.family.valid(whole, stage.problem):
                return False
        return True

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        stages = self.matched(problem)
        per_stage = [s.family.seeds(s.problem) for s in stages]

        def joined(choice: list[int]) -> dict[str, Any]:
            return {f"s{i}.{k}": v for i, (seeds, j) in enumerate(zip(per_stage, choice)) for k, v in seeds[j].items()}

        # Every stage's first seed; then each stage's second seed with the others' first.
        choices = leading_choices([list(range(len(seeds))) for seeds in per_stage])
        # Where each of these computes below fp32 (a stage's one-TF32-product seeds come first where the
        # contract allows them), the same choices over the full-precision seeds after them: the judge may
        # rule TF32 out (cuDNN picks it per shape), and the search then needs configs to fall back on.
        full = [[j for j, c in enumerate(seeds) if not s.family.reduced_precision(c, s.problem)]
                for s, seeds in zip(stages, per_stage)]
        if all(self.reduced_precision(joined(c), problem) for c in choices) and all(full):
            choices += leading_choices(full)
        return [joined(c) for c in choices]

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        """Whether any stage's config computes below fp32 (which family runs a stage follows from the
        problem's cut, so the problem is needed)."""
        if problem is None:
            raise ValueError("a pipeline's stages depend on the problem: pass it to reduced_precision")
        stages = self.matched(problem)
        return any(s.family.reduced_precision(c, s.problem) for c, s in zip(self.stage_configs(config, stages), stages))

    def launch(self, config: dict[str, Any], problem: Problem) -> LaunchSpec:
        raise NotImplementedError("a pipeline candidate is a module of several launches: use render")

    def render(self, config: dict[str, Any], problem: Problem, template_text: str | None = None) -> Candidate:
        stages = self.matched(problem)
        cfg = self.complete(config)
        rendered = [s.family.render(c, s.problem) for c, s in zip(self.stage_configs(cfg, stages), stages)]
        names = "+".join(s.family.name for s in stages)
        header = PY_CONFIG_TAG + json.dumps({"family": self.name, "stages": names, **cfg}, sort_keys=True) + "\n"
        source = wrap_stages([as_stage(r) for r in rendered], [list(s.feed) for s in stages], header)
        return Candidate(source, "module", proposer="template", meta={"family": self.name, "stages": names, "config": cfg})
