"""The partition family (kernels/partition.py cuts the graph): a graph as kernel and PyTorch parts,
searched over its kernels' configs. Two are registered (families.py): PARTITION, the last resort of
the offline search, and LIBRARY_AROUND, the vendor library's products with the ops around them fused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cuforge.kernels.base import GraphFamily, as_stage
from cuforge.kernels.partition import (LIBRARY_OPS, MAX_VARIANTS, TORCH_KNOB, Cover, Part, as_pytorch, conv_bias_apart,
                                       partition, parts_module, summary)
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec


# A partition of this many kernel parts or more is a network: its library seed is tried second. Timed
# part by part on an H200 (benchmarks/partition_parts.py, five level3 CNNs at their batches), the
# 3xTF32 convolution parts beat cuDNN's fp32 in 7 of 180, and each kernel stage adds its Python launch.
NETWORK_PARTS = 8
# The partition's own knob: its forward captured in a CUDA graph and replayed (the wrapper's _Replay).
REPLAY_KNOB = "REPLAY"


class Partition(GraphFamily):
    """A graph as kernel and PyTorch parts: with `one_kernel` as its cover, the last resort of the offline
    search; with a cover that refuses GEMMs and convolutions, the vendor library's products with the
    ops around them fused (families.LIBRARY_AROUND). Its config is the kernel parts' configs under p<i>.
    prefixes (i: the part's index), seeded with each kernel's first seed."""

    def __init__(self, cover: Cover, name: str = "partition", bias_apart: bool = False) -> None:
        super().__init__(name, {})
        object.__setattr__(self, "cover", cover)
        object.__setattr__(self, "bias_apart", bias_apart)

    cover: Cover
    bias_apart: bool  # convolutions' biases added apart (conv_bias_apart), where PyTorch runs the convolutions

    def prepared(self, problem: Problem) -> Problem:
        """The problem as this family cuts it."""
        return conv_bias_apart(problem) if self.bias_apart else problem

    def match(self, problem: Problem) -> list[Part] | str:
        return self.memo_match(problem)

    def _match(self, problem: Problem) -> list[Part] | str:
        if problem.meta.policy == "custom":
            return "policy 'custom' allows no PyTorch op beside the candidate's kernels"
        return partition(self.prepared(problem), self.cover)

    def describe(self, problem: Problem) -> str:
        parts = self.match(problem)
        return parts if isinstance(parts, str) else summary(self.prepared(problem), parts)

    def runs_on(self, compute_capability: str) -> bool:
        # Which kernels its parts get is not known here, and most are Hopper's (wgmma, TMA).
        return compute_capability == "9.0"

    def knobs_for(self, problem: Problem) -> dict[str, tuple[Any, ...]]:
        parts = self.match(problem)
        if isinstance(parts, str):
            return {}
        knobs = {f"p{i}.{k}": v for i, p in enumerate(parts) if p.family is not None and p.problem is not None
                 for k, v in p.family.knobs_for(p.problem).items()}
        return {**knobs, REPLAY_KNOB: (0, 1)}

    def kernel_configs(self, config: dict[str, Any], parts: list[Part]) -> dict[int, dict[str, Any]]:
        """Each kernel part's own config (parts handed to PyTorch left out)."""
        out: dict[int, dict[str, Any]] = {i: {} for i, p in enumerate(parts) if p.family is not None}
        for key, value in config.items():
            part, _, knob = key.partition(".")
            if part.startswith("p") and part[1:].isdigit() and int(part[1:]) in out and knob:
                out[int(part[1:])][knob] = value
        return {i: c for i, c in out.items() if not c.get(TORCH_KNOB)}

    def as_run(self, config: dict[str, Any], parts: list[Part]) -> list[Part]:
        """The parts as the config runs them: a kernel part whose TORCH knob is set runs as PyTorch."""
        return [replace(p, family=None, problem=None) if config.get(f"p{i}.{TORCH_KNOB}") else p
                for i, p in enumerate(parts)]

    def complete(self, config: dict[str, Any]) -> dict[str, Any]:
        # "parts" is the rendered module's tag of which kernels it runs, not a knob: a config read back
        # from a candidate's source is the same config as the one it was rendered from.
        return {k: v for k, v in sorted(config.items()) if k not in ("family", "parts")}

    def config(self, values: dict[str, Any]) -> Any:  # type: ignore[override]
        return self.complete(dict(values))  # each part's family checks its own when it renders

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        parts = self.match(problem)
        if isinstance(parts, str):
            return False
        per = self.kernel_configs(config, parts)
        if not per:  # every kernel handed back: no kernel of its own (KernelBench's mixed rule refuses it)
            return False
        for i, c in per.items():
            fam, sub = parts[i].family, parts[i].problem
            assert fam is not None and sub is not None
            try:
                if not fam.valid(fam.complete(c), sub):
                    return False
            except KeyError:
                return False
        return True

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """Every kernel's first seed; for the kernels over the most ops first, one kernel's second seed
        with the others' first (at most MAX_VARIANTS); and the first seeds with the GEMMs and
        convolutions run by PyTorch where another kernel stays (the library's product with the fusion
        around it). That one comes second in half precision, where cuBLAS's and cuDNN's tensor-core
        kernels are hard to beat, and in a network (NETWORK_PARTS kernel parts or more), whose
        convolutions at small batches are small; last in fp32 otherwise, where the 3xTF32 kernels
        usually beat fp32's."""
        parts = self.matched(problem)
        per = {i: p.family.seeds(p.problem) for i, p in enumerate(parts) if p.family is not None and p.problem is not None}
        first = {f"p{i}.{k}": v for i, seeds in per.items() for k, v in (seeds[0] if seeds else {}).items()}
        out = [first]
        for i in sorted(per, key=lambda i: parts[i].start - parts[i].end):
            if len(out) > MAX_VARIANTS:
                break
            if len(per[i]) > 1:
                out.append({**{k: v for k, v in first.items() if not k.startswith(f"p{i}.")},
                            **{f"p{i}.{k}": v for k, v in per[i][1].items()}})
        library = {i for i in per if parts[i].family.name.startswith(LIBRARY_OPS)}  # type: ignore[union-attr]
        if library and library != set(per):
            seed = {**{k: v for k, v in first.items() if int(k.split(".")[0][1:]) not in library},
                    **{f"p{i}.{TORCH_KNOB}": 1 for i in sorted(library)}}
            second = problem.meta.dtype in ("float16", "bfloat16") or len(per) >= NETWORK_PARTS
            out.insert(1 if second else len(out), seed)
        if len(per) >= NETWORK_PARTS:  # a network's forward is bound by its launches' host time
            out = [{**c, REPLAY_KNOB: 1} for c in out[:2]] + out
        return out

    def launch(self, config: dict[str, Any], problem: Problem) -> LaunchSpec:
        raise NotImplementedError("a partition is a module of kernels and PyTorch parts: use render")

    def in_pytorch(self, problem: Problem) -> str:
        """The candidate module of this family's cut with every part run by PyTorch: what a CPU checks
        the cut and what crosses it by (the kernels' own configs are not in it)."""
        parts = self.matched(problem)
        return parts_module(self.prepared(problem), as_pytorch(parts), [None] * len(parts), {"family": self.name})

    def render(self, config: dict[str, Any], problem: Problem, template_text: str | None = None) -> Candidate:
        cfg = self.complete(config)
        parts = self.as_run(cfg, self.matched(problem))
        per = self.kernel_configs(cfg, parts)
        stages = [p.family.render(per[i], p.problem) if p.family is not None and p.problem is not None else None
                  for i, p in enumerate(parts)]
        source = parts_module(self.prepared(problem), parts, [None if c is None else as_stage(c) for c in stages],
                              {"family": self.name, **cfg}, replay=bool(cfg.get(REPLAY_KNOB)))
        names = "+".join("torch" if p.family is None else p.family.name for p in parts)
        return Candidate(source, "module", proposer="template", meta={"family": self.name, "parts": names, "config": cfg})
