"""What every kernel family shares: the jinja2 environment (CUDA-friendly delimiters), the config tag
a rendered candidate starts with, the Family interface, and the seeds' notion of the GPU's size."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, ClassVar

import jinja2

from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, TorchCall

# CUDA's inline assembly uses {%, {{ and [%, so the kernel templates use [[ ]] and {| |} instead.
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)), undefined=jinja2.StrictUndefined,
                          variable_start_string="[[", variable_end_string="]]", block_start_string="{|",
                          block_end_string="|}", comment_start_string="{#|", comment_end_string="|#}",
                          keep_trailing_newline=True)
CONFIG_TAG = "// cuforge-config: "
SMEM_LIMIT = 227 * 1024  # Hopper's per-block opt-in maximum; checked against the device at launch


PY_CONFIG_TAG = "# cuforge-config: "  # the same tag on a Python module (a staged candidate's)


def as_stage(candidate: Candidate) -> tuple[str, LaunchSpec] | TorchCall:
    """A rendered stage as `wrap_stages` takes it: a kernel and its launch, or a PyTorch call."""
    if "torch_call" in candidate.meta:
        return TorchCall(candidate.meta["torch_call"])
    if candidate.launch is None:
        raise ValueError("a stage is a format-B kernel or a PyTorch call")
    return candidate.source, candidate.launch


def config_of(source: str) -> dict[str, Any] | None:
    """The config a template candidate was rendered from (its first line)."""
    first = source.split("\n", 1)[0]
    for tag in (CONFIG_TAG, PY_CONFIG_TAG):
        if first.startswith(tag):
            try:
                return json.loads(first[len(tag):])
            except json.JSONDecodeError:
                return None
    return None


class BadConfig(ValueError):
    """A config that is not a point of its family's knob space; the message is one line naming why."""


# A family's config type per (family name, knob space): made once, shared by the family's instances.
_CONFIG_TYPES: dict[tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]], type] = {}


def config_type_for(name: str, knobs: Mapping[str, tuple[Any, ...]]) -> type:
    """The frozen dataclass of one family's configs: a field per knob, typed by its values, with the
    values it may take as the field's `choices`."""
    key = (name, tuple((k, tuple(v)) for k, v in knobs.items()))
    cls = _CONFIG_TYPES.get(key)
    if cls is None:
        title = "".join(part.capitalize() for part in name.replace(":", "_").replace("+", "_").split("_")) or "Family"
        fields = [(k, type(v[0]) if v else Any, field(metadata={"choices": tuple(v)})) for k, v in knobs.items()]
        cls = _CONFIG_TYPES[key] = make_dataclass(f"{title}Config", fields, frozen=True)
    return cls


def _one_of(value: Any, choices: tuple[Any, ...]) -> bool:
    """`value` is one of `choices` with its own type too (True is not the knob value 1)."""
    return any(value == c and type(value) is type(c) for c in choices)


@dataclass(frozen=True)
class Family:
    name: str
    knobs: dict[str, tuple[Any, ...]]

    # The aten ops the family's kernel is built around, one of which a graph must contain for it to
    # match (families_for asks only those); None: it may match a graph of any ops.
    anchors: ClassVar[frozenset[str] | None] = None

    def supports(self, problem: Problem) -> str | None:  # None: covered; else why not
        raise NotImplementedError

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        raise NotImplementedError

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        raise NotImplementedError

    def knobs_for(self, problem: Problem) -> dict[str, tuple[Any, ...]]:
        """The knobs the search mutates for this problem: the family's own; a family of several kernels
        (a pipeline, a partition) has its kernels' knobs, which families those are following from the
        problem's cut."""
        return self.knobs

    def leads(self, problem: Problem) -> bool:
        """Whether this family goes ahead of those listed before it where both cover the problem
        (measured faster there)."""
        return False

    def launch(self, config: dict[str, Any], problem: Problem) -> LaunchSpec:
        raise NotImplementedError

    # Values of knobs added after configs were stored (in a results database, a sweep file): a config
    # without one means what it meant before the knob existed.
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def complete(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config's knobs, the later-added ones at their defaults where it lacks them."""
        return {k: config[k] if k in config else self.DEFAULTS[k] for k in self.knobs}

    @property
    def config_type(self) -> type:
        """This family's config class (see config_type_for)."""
        return config_type_for(self.name, self.knobs)

    def config(self, values: Mapping[str, Any]) -> Any:
        """`values` as this family's typed config: every knob set (a later-added one at its default),
        each to one of its values; anything else is BadConfig in one line. A "family" key (the tag a
        rendered candidate's config carries) names this family or none."""
        if values.get("family", self.name) != self.name:
            raise BadConfig(f"a config of family {values['family']!r} given to {self.name}")
        unknown = sorted(set(values) - set(self.knobs) - {"family"})
        if unknown:
            raise BadConfig(f"{self.name} has no knob {unknown[0]!r} (its knobs: {', '.join(self.knobs)})")
        missing = [k for k in self.knobs if k not in values and k not in self.DEFAULTS]
        if missing:
            raise BadConfig(f"{self.name}: the config sets no {missing[0]!r}")
        full = self.complete(dict(values))
        for k, v in full.items():
            if not _one_of(v, self.knobs[k]):
                raise BadConfig(f"{self.name}: knob {k} = {v!r} is not one of {', '.join(map(repr, self.knobs[k]))}")
        return self.config_type(**full)

    def render(self, config: dict[str, Any], problem: Problem, template_text: str | None = None) -> Candidate:
        """The config's kernel for this problem; `template_text` renders it from another version of the
        family's template instead (an A/B benchmark of a template change). The config must be a point
        of the family's knob space (BadConfig otherwise)."""
        cfg = asdict(self.config(config))
        template = (_ENV.from_string(template_text) if template_text is not None
                    else _ENV.get_template(f"{getattr(self, 'template', self.name)}.cu.j2"))
        source = template.render(ENTRY=self.name, **cfg, **self.extra(problem), **self.derived(cfg))
        header = CONFIG_TAG + json.dumps({"family": self.name, **cfg}, sort_keys=True) + "\n"
        return Candidate(header + source, "kernel", self.launch(cfg, problem), proposer="template",
                         meta={"family": self.name, "config": cfg})

    def extra(self, problem: Problem) -> dict[str, Any]:
        return {}

    def derived(self, config: dict[str, Any]) -> dict[str, Any]:
        """Template values that follow from the config (not knobs of their own)."""
        return {}

    def reduced_precision(self, config: dict[str, Any], problem: Problem | None = None) -> bool:
        """Whether the config computes below fp32 accuracy where the precision contract allows it (one
        TF32 product): the search stops proposing such configs for a problem once one was judged a
        precision downgrade there (PyTorch's own default computation of it stayed fp32). `problem`: the
        one the config is for, which composite families need to know which family runs each part."""
        return False

    def runs_on(self, compute_capability: str) -> bool:
        """Whether this family's kernels compile and run on a GPU of this compute capability."""
        return tuple(int(x) for x in compute_capability.split(".")) >= (8, 0)


def grid_stride_grid(vectors: str, block: int, waves: int) -> str:
    """The 1-D grid of a grid-stride loop over `vectors` units: one block per `block` units (waves 0),
    or at most `waves` times a full GPU (2048 resident threads per SM; needs the SMS binding)."""
    blocks = f"cdiv({vectors}, {block})"
    return f"(max(1, {blocks}),)" if waves == 0 else f"(max(1, min({blocks}, SMS * {waves * 2048 // block})),)"


def sm_count(tensor: str) -> tuple[str, str]:
    """The SMS binding: the multiprocessors of the GPU `tensor` lives on."""
    return ("SMS", f"torch.cuda.get_device_properties({tensor}.device).multi_processor_count")


class GraphFamily(Family):
    """A family whose coverage is one function of the traced graph: `match` returns what the kernel
    needs to know (a match) or why it does not cover the problem (a string)."""

    def match(self, problem: Problem) -> Any:
        raise NotImplementedError

    def supports(self, problem: Problem) -> str | None:
        found = self.match(problem)
        return found if isinstance(found, str) else None

    def memo_match(self, problem: Problem) -> Any:
        """`_match(problem)`, remembered for the last problems asked about (a search asks for the same
        match of one problem many times). Keyed by the problem object, which the entry keeps alive so
        its id is never reused while cached: hashing a traced graph of 40k nodes for each of the staged
        families cost seconds."""
        cache: dict[int, tuple[Problem, Any]] = self.__dict__.setdefault("_matches", {})
        hit = cache.get(id(problem))
        if hit is None or hit[0] is not problem:
            if len(cache) > 256:
                cache.clear()
            hit = cache[id(problem)] = (problem, self._match(problem))  # type: ignore[attr-defined]
        return hit[1]

    def matched(self, problem: Problem) -> Any:
        """The match, for rendering and launching a problem `supports` accepted."""
        found = self.match(problem)
        if isinstance(found, str):
            raise ValueError(f"{self.name} does not cover {problem.id}: {found}")
        return found

    def valid(self, config: dict[str, Any], problem: Problem) -> bool:
        return True


SEED_SMS = 132  # an H100's multiprocessors: the seeds' notion of "fills the GPU"; the search corrects it


def cdiv(a: int, b: int) -> int:
    """a / b rounded up (positive b)."""
    return -(-a // b)


def tiles(m: int, n: int, bm: int, bn: int) -> int:
    return cdiv(m, bm) * cdiv(n, bn)


def could_match(fam: Family, ops: frozenset[str]) -> bool:
    """The index: a family built around some aten ops is asked only about graphs that contain one."""
    return fam.anchors is None or bool(fam.anchors & ops)


def fills_gpu(tile_count: int) -> bool:
    """Enough output tiles for (nearly) one block per multiprocessor."""
    return tile_count >= 0.9 * SEED_SMS
