"""Run settings: defaults, a TOML file, then command-line flags (flags win)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROVIDERS = ("openai", "anthropic", "template", "replay")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ProposerSpec:
    provider: str
    model: str = ""
    base_url: str | None = None
    weight: float = 1.0
    replay_file: str | None = None
    reasoning_effort: str | None = None


@dataclass
class RunConfig:
    suite: str = "hgemm-small"
    problems: list[str] = field(default_factory=list)  # ids or names within the suite; empty = all
    proposers: list[ProposerSpec] = field(default_factory=lambda: [ProposerSpec("template")])
    islands: int = 4
    generations: int = 4  # proposals per island per problem
    patience: int = 0  # stop a problem after this many evaluations without a new best (0 = never)
    concurrency: int = 4  # LLM requests in flight
    temperature: float = 0.7
    max_tokens: int = 8192
    budget_usd: float | None = None
    budget_tokens: int | None = None
    wall_time_s: float | None = None
    baseline: str = "torch"
    reward: str = "speedup"
    inspirations: int = 3
    compile_only: bool = False
    device: str = "cuda"  # "cpu": the harness's CPU test mode
    executor: str = "local"  # local: one worker per GPU of this host; ray: actors on a Ray cluster
    gpus: str = "all"  # local: "all", a count of workers in CPU modes, or indices "0,1"; ray: a worker count
    ray_address: str | None = None  # "auto", "ray://host:port"; None: the running or a new local instance
    ray_resource: str = "GPU"  # the Ray resource one evaluation worker takes (a custom one for CPU tests)
    seed: int = 0
    prompt_dir: str | None = None
    prices: str | None = None
    eval_timeout_s: float = 300.0
    max_timing_s: float = 20.0

    @property
    def max_candidates_per_problem(self) -> int:
        return self.islands * self.generations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(RunConfig)} | {"gpu"}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        d = dict(d)
        if "gpu" in d:  # runs stored before the executor existed named one GPU index
            d["gpus"] = str(d.pop("gpu"))
        if "proposers" in d:
            d["proposers"] = [p if isinstance(p, ProposerSpec) else ProposerSpec(**p) for p in d["proposers"]]
        cfg = RunConfig(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.islands < 1 or self.generations < 1:
            raise ConfigError("islands and generations must be at least 1")
        for p in self.proposers:
            if p.provider not in PROVIDERS:
                raise ConfigError(f"unknown provider {p.provider!r}; choose from {', '.join(PROVIDERS)}")
            if p.provider in ("openai", "anthropic") and not p.model:
                raise ConfigError(f"provider {p.provider} needs --model")
            if p.provider == "replay" and not p.replay_file:
                raise ConfigError("provider replay needs --replay FILE")
            if p.weight <= 0:
                raise ConfigError("proposer weights must be positive")
        if self.device not in ("cuda", "cpu"):
            raise ConfigError("device must be cuda or cpu")
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"unknown executor {self.executor!r}; choose local or ray")


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from None


def merge(file_settings: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Defaults < file < flags; flags that were not given (None) do not override."""
    merged = dict(file_settings)
    merged.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig.from_dict(merged)
