"""The template proposer: the same evolutionary loop as the LLM path, over kernel-family configs.
Seeds come from per-shape heuristics; mutation moves one or two knobs to neighbouring values;
crossover mixes two parents' knobs; constraints prune invalid configs before anything compiles."""

from __future__ import annotations

import random
from typing import Any

from cuforge.kernels.base import BadConfig
from cuforge.kernels.families import Family, config_of, families_for
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate


class NotCovered(RuntimeError):
    """No family covers this problem; the message says why."""


class TemplateProposer:
    provider = "template"
    model = "families"
    name = "template"

    def __init__(self, seed: int = 0, seeds_first: int = 4) -> None:
        self.rng = random.Random(seed)
        self.tried: dict[str, set[str]] = {}
        # The first proposals for a problem are its heuristic seeds, whatever the population's mode:
        # one correct seed must not end the seeding (its mutations are often worse than the next seed).
        self.seeds_first = seeds_first
        self.seeded: dict[str, int] = {}
        # Per problem, the judge's ruling on reduced-precision configs (one TF32 product), once one has
        # come back: False where one was judged a downgrade (PyTorch's own default computation there is
        # fp32: cuDNN picks TF32 per shape), so no such config can pass; True where one passed.
        self.tf32_ruling: dict[str, bool] = {}
        # Reduced-precision candidates proposed and not yet judged, and the problems that have had a
        # full-precision candidate proposed: until the ruling comes back, a second reduced-precision
        # config waits behind one full-precision config, so that a short search (its proposals run
        # ahead of the verdicts) still gets a candidate that can pass where TF32 cannot.
        self.awaiting: dict[str, int] = {}
        self.hedged: set[str] = set()

    def propose_candidate(self, problem: Problem, mode: str, parent: Any, inspirations: list[Any],
                          compute_capability: str | None = None) -> Candidate:
        """compute_capability ("9.0"): the evaluating GPU's, once known; families built for another
        architecture (gemm_sm90 on an A100) are then left out."""
        families, why = families_for(problem)
        if compute_capability:
            fitting = [f for f in families if f.runs_on(compute_capability)]
            if families and not fitting:
                raise NotCovered(f"{', '.join(f.name for f in families)}: not for compute capability {compute_capability}")
            families = fitting
        if not families:
            raise NotCovered(why)
        tried = self.tried.setdefault(problem.id, set())
        parent_cfg = config_of(parent.source) if parent is not None else None
        by_name = {f.name: f for f in families}
        if mode == "IMPROVE" and self.seeded.get(problem.id, 0) < self.seeds_first:
            family, cfg = self._next_seed(families, problem, tried)
            if cfg is not None:
                return self._take(family, cfg, problem, tried)
        for _ in range(200):
            if mode == "IMPROVE" and parent_cfg and parent_cfg.get("family") in by_name:
                family = by_name[parent_cfg["family"]]
                other = self._inspiration_config(inspirations, family)
                cfg = self.crossover(parent_cfg, other, family, problem) if other and self.rng.random() < 0.3 else parent_cfg
                cfg = self.mutate(cfg, family, problem)
            else:
                family, cfg = self._next_seed(families, problem, tried)
                if cfg is None:  # seeds spent: a random point of a family that has knobs (the others only seed)
                    family = self.rng.choice([f for f in families if f.knobs_for(problem)] or families)
                    cfg = self.random_config(family, problem)
            if (self._key(family, cfg) in tried or not _in_space(family, cfg) or not family.valid(cfg, problem)
                    or not self._allowed(family, cfg, problem)):
                continue
            return self._take(family, cfg, problem, tried)
        raise NotCovered(f"{'/'.join(by_name)}: no untried valid config left for {problem.id}")

    def learn(self, problem: Problem, source: str, status: str) -> None:
        """An evaluation's verdict on one of this proposer's candidates: for a reduced-precision config,
        whether TF32 can pass on this problem (a downgrade says no, for good; a pass says yes)."""
        cfg = config_of(source)
        family = next((f for f in families_for(problem)[0] if f.name == cfg.get("family")), None) if cfg else None
        if family is None or not family.reduced_precision(cfg, problem):
            return
        self.awaiting[problem.id] = max(self.awaiting.get(problem.id, 0) - 1, 0)
        if status == "cheat:precision_downgrade":
            self.tf32_ruling[problem.id] = False
        elif status == "ok":
            self.tf32_ruling.setdefault(problem.id, True)

    def _allowed(self, family: Family, cfg: dict[str, Any], problem: Problem) -> bool:
        if not family.reduced_precision(cfg, problem):
            return True
        ruling = self.tf32_ruling.get(problem.id)
        if ruling is None:  # not judged yet: one full-precision config before a second reduced one
            return not self.awaiting.get(problem.id) or problem.id in self.hedged
        return ruling

    def remember(self, problem: Problem, source: str) -> None:
        """A candidate the run already has (restored on --resume): its config is not proposed again,
        and a seed among them counts as seeded."""
        cfg = config_of(source)
        if not cfg:
            return
        families, _ = families_for(problem)
        family = next((f for f in families if f.name == cfg.get("family")), None)
        if family is None:
            return
        key = self._key(family, {k: v for k, v in cfg.items() if k != "family"})  # complete() keeps the knobs
        tried = self.tried.setdefault(problem.id, set())
        if key not in tried:
            tried.add(key)
            if any(key == self._key(family, s) for s in family.seeds(problem)):
                self.seeded[problem.id] = self.seeded.get(problem.id, 0) + 1

    @staticmethod
    def _key(family: Family, cfg: dict[str, Any]) -> str:
        return family.name + repr(sorted(family.complete(cfg).items()))

    def _take(self, family: Family, cfg: dict[str, Any], problem: Problem, tried: set[str]) -> Candidate:
        tried.add(self._key(family, cfg))
        if family.reduced_precision(cfg, problem):
            self.awaiting[problem.id] = self.awaiting.get(problem.id, 0) + 1
        else:
            self.hedged.add(problem.id)
        if any(self._key(family, cfg) == self._key(family, s) for s in family.seeds(problem)):
            self.seeded[problem.id] = self.seeded.get(problem.id, 0) + 1
        return family.render(cfg, problem)

    def _next_seed(self, families: list[Family], problem: Problem, tried: set[str]) -> tuple[Family, dict[str, Any] | None]:
        """Seeds of every covering family: the preferred family's three best guesses, then each other
        family's next guess followed by the preferred family's next, in rounds."""
        seeds = [fam.seeds(problem) for fam in families]
        first = 3
        order = [(families[0], c) for c in seeds[0][:first]]
        for i in range(max(len(s) for s in seeds)):
            order += [(fam, fam_seeds[i]) for fam, fam_seeds in zip(families[1:], seeds[1:]) if i < len(fam_seeds)]
            if i + first < len(seeds[0]):
                order.append((families[0], seeds[0][i + first]))
        for fam, cfg in order:
            if (self._key(fam, cfg) not in tried and _in_space(fam, cfg) and fam.valid(cfg, problem)
                    and self._allowed(fam, cfg, problem)):
                return fam, cfg
        return families[0], None

    def _inspiration_config(self, inspirations: list[Any], family: Family) -> dict[str, Any] | None:
        for better, _ in inspirations:
            cfg = config_of(better.source)
            if cfg and cfg.get("family") == family.name:
                return cfg
        return None

    def random_config(self, family: Family, problem: Problem) -> dict[str, Any]:
        return {k: self.rng.choice(v) for k, v in family.knobs_for(problem).items()}

    def mutate(self, cfg: dict[str, Any], family: Family, problem: Problem) -> dict[str, Any]:
        """One or two knobs moved one step. A family of several kernels mutates its kernels' knobs; a knob
        the config lacks (a kernel's later-added one) starts from its first value."""
        out = family.complete(cfg)
        knobs = family.knobs_for(problem)
        if not knobs:
            return out
        for knob, values in knobs.items():
            if knob in out and out[knob] not in values:  # a parent stored by an older version: today's nearest value
                out[knob] = _nearest(out[knob], values)
        for knob in self.rng.sample(list(knobs), k=min(len(knobs), self.rng.choice((1, 1, 2)))):
            values = knobs[knob]
            i = values.index(out[knob]) if out.get(knob) in values else 0
            j = min(max(i + self.rng.choice((-1, 1)), 0), len(values) - 1)
            out[knob] = values[j if j != i else (i + 1) % len(values)]
        return out

    def crossover(self, a: dict[str, Any], b: dict[str, Any], family: Family, problem: Problem) -> dict[str, Any]:
        a, b = family.complete(a), family.complete(b)
        out = {**a}
        for k in family.knobs_for(problem):
            pick = a if self.rng.random() < 0.5 else b
            if k in pick:
                out[k] = pick[k]
        return out


def _in_space(family: Family, cfg: dict[str, Any]) -> bool:
    """Whether a config is a point of the family's knob space today: a parent stored by an older
    version (a knob's values since changed) is not proposed again, nor are its mutations that keep
    the old value."""
    try:
        family.config(cfg)
    except BadConfig:
        return False
    return True


def _nearest(value: Any, values: tuple[Any, ...]) -> Any:
    """The knob value closest to `value` (a number), else the knob's first."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return min(values, key=lambda v: abs(v - value))
    return values[0]
