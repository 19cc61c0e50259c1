"""Run settings: defaults, a TOML file, then command-line flags (flags win).

A TOML file takes exactly the flags' names (`wall-time` or `wall_time`, `problem`, `provider`,
`model`, ...), plus `[[proposers]]` tables for several weighted proposers. Every value is checked
for type and range, and every message names the flag, the value and what is allowed."""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cuforge.tomlfile import TomlFileError, read_toml

PROVIDERS = ("openai", "anthropic", "template", "replay")
BASELINE_NAMES = ("torch", "torch.compile", "cublas", "cublaslt")
REDACTED = "REDACTED"


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


@dataclass(frozen=True)
class Bound:
    """What a numeric setting allows: a type, an inclusive range and the flag that sets it."""

    flag: str
    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the low end itself is not allowed (a budget of 0, say)

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        want = "a whole number" if self.kind is int else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.kind is int and not isinstance(value, int)):
            raise ConfigError(f"{self.flag}: {value!r} is not {want}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.flag}: {value!r} is not a finite number")
        below = self.low is not None and (value < self.low or (self.low_open and value == self.low))
        above = self.high is not None and value > self.high
        if below or above:
            lo = "" if self.low is None else (f"more than {self.low:g}" if self.low_open else f"at least {self.low:g}")
            hi = "" if self.high is None else f"at most {self.high:g}"
            raise ConfigError(f"{self.flag}: {value:g} is out of range; it must be {' and '.join(x for x in (lo, hi) if x)}")
        return self.kind(value)


# RunConfig field -> the bound its flag enforces
BOUNDS: dict[str, Bound] = {
    "islands": Bound("--islands", int, 1, 1000),
    "generations": Bound("--generations", int, 1, 100_000),
    "patience": Bound("--patience", int, 0, 100_000),
    "concurrency": Bound("--concurrency", int, 1, 64),
    "temperature": Bound("--temperature", float, 0, 2),
    "max_tokens": Bound("--max-tokens", int, 1, 1_000_000),
    "budget_usd": Bound("--budget-usd", float, 0, 1_000_000, low_open=True),
    "budget_tokens": Bound("--budget-tokens", int, 1, 10**12),
    "wall_time_s": Bound("--wall-time", float, 0, 30 * 86400, low_open=True),
    "inspirations": Bound("--inspirations", int, 0, 16),
    "seed": Bound("--seed", int, 0, 2**63 - 1),
    "eval_timeout_s": Bound("--eval-timeout", float, 1, 24 * 3600),
    "max_timing_s": Bound("--max-timing", float, 0.1, 3600),
    "max_retries": Bound("--max-retries", int, 0, 20),
    "retry_budget": Bound("--retry-budget", int, 0, 100_000),
    "retry_base_s": Bound("--retry-base", float, 0, 60),
    "retry_max_wait_s": Bound("--retry-max-wait", float, 0, 3600),
    "request_timeout_s": Bound("--request-timeout", float, 0, 24 * 3600, low_open=True),
    "max_failures": Bound("--max-failures", int, 1, 10_000),
    "price_in": Bound("--price-in", float, 0, 10_000),
    "price_out": Bound("--price-out", float, 0, 10_000),
    "worker_memory_gib": Bound("--worker-memory", float, 0.5, 4096),
    "inspect_timeout_s": Bound("--inspect-timeout", float, 1, 3600),
}


@dataclass
class RunConfig:
    suite: str = "hgemm-small"
    problems: list[str] = field(default_factory=list)  # ids or names within the suite; empty = all
    proposers: list[ProposerSpec] = field(default_factory=lambda: [ProposerSpec("template")])
    islands: int = 4
    generations: int = 4  # proposals per island per problem
    patience: int = 0  # stop a problem after this many evaluations without a new best (0 = never)
    # Proposals (and so LLM requests) in flight. None: 4, or twice the GPUs where that is more, so each
    # GPU has its next candidate waiting; a number given is kept exactly (1: strictly sequential edits).
    concurrency: int | None = None
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
    price_in: float | None = None  # USD per million input tokens, for models the price table lacks
    price_out: float | None = None
    eval_timeout_s: float = 300.0
    max_timing_s: float = 20.0
    max_retries: int = 3  # retries of one request, for transient provider failures only
    retry_budget: int = 50  # retries the whole run may spend
    retry_base_s: float = 1.0  # first backoff (doubling, full jitter)
    retry_max_wait_s: float = 60.0  # longest wait between tries; a longer Retry-After fails the request
    request_timeout_s: float = 600.0
    max_failures: int = 5  # requests in a row with nothing to evaluate end a problem (provider errors: the run)
    worker_memory_gib: float | None = None  # one worker's host memory; None: half the machine's, at most 64 GiB
    inspect_timeout_s: float = 180.0  # one problem file's import and trace; a file past it is skipped, named
    # The precision contract (fp32, pytorch, kernelbench); None: each problem's own CUFORGE precision, else fp32
    precision: str | None = None
    # Run every fp32 problem in this dtype (bf16, fp16: inputs and weights cast); None: each problem's own
    dtype: str | None = None

    @property
    def max_candidates_per_problem(self) -> int:
        return self.islands * self.generations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_stored_dict(self) -> dict[str, Any]:
        """What the results store keeps: credentials inside base URLs removed."""
        d = self.to_dict()
        d["proposers"] = [{**p, "base_url": redact_url(p["base_url"])} for p in d["proposers"]]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunConfig:
        """From field names (a stored run's config, or merged settings)."""
        known = {f.name for f in fields(RunConfig)} | {"gpu"}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        d = dict(d)
        if "gpu" in d:  # runs stored before the executor existed named one GPU index
            d["gpus"] = str(d.pop("gpu"))
        if "proposers" in d:
            d["proposers"] = [_proposer_spec(p) for p in d["proposers"]]
        cfg = RunConfig(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for name, bound in BOUNDS.items():
            setattr(self, name, bound.check(getattr(self, name)))
        for p in self.proposers:
            if p.provider not in PROVIDERS:
                raise ConfigError(f"--provider: unknown provider {p.provider!r}; choose from {', '.join(PROVIDERS)}")
            if p.provider in ("openai", "anthropic") and not p.model:
                raise ConfigError(f"--model: provider {p.provider} needs a model name")
            if p.provider == "replay" and not p.replay_file:
                raise ConfigError("--replay: provider replay needs a JSONL file of replies")
            if isinstance(p.weight, bool) or not isinstance(p.weight, (int, float)) or not p.weight > 0:
                raise ConfigError(f"proposers: weight {p.weight!r} must be a positive number")
            if p.reasoning_effort not in (None, "low", "medium", "high", "minimal"):
                raise ConfigError(f"--reasoning-effort: {p.reasoning_effort!r}; choose low, medium or high")
            if p.base_url is not None:
                check_url(p.base_url)
        if self.baseline not in BASELINE_NAMES:
            raise ConfigError(f"--baseline: unknown baseline {self.baseline!r}; choose from {', '.join(BASELINE_NAMES)}")
        from cuforge.rewards import REWARDS

        if self.reward not in REWARDS:
            raise ConfigError(f"--reward: unknown reward {self.reward!r}; choose from {', '.join(REWARDS)}")
        if self.precision is not None:
            from cuforge.sandbox.protocol.precision import UnknownContract, contract

            try:
                contract(self.precision)
            except UnknownContract as e:
                raise ConfigError(f"--precision: {e}") from None
        if self.dtype is not None:
            from cuforge.problems.problem import ProblemError, cast_dtype

            try:
                cast_dtype(self.dtype)
            except ProblemError as e:
                raise ConfigError(f"--dtype: {e}") from None
        if self.device not in ("cuda", "cpu"):
            raise ConfigError("device must be cuda or cpu")
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"--executor: unknown executor {self.executor!r}; choose local or ray")
        if (self.price_in is None) != (self.price_out is None):
            raise ConfigError("--price-in and --price-out go together (USD per million input and output tokens)")
        if not isinstance(self.suite, str) or not self.suite:
            raise ConfigError("--suite: needs a suite name or a directory of problem files")
        if not isinstance(self.gpus, str) or not self.gpus.strip():
            raise ConfigError("--gpus: takes all, a count, or indices like 0,1")


DEFAULT_CONCURRENCY = 4


def proposals_in_flight(concurrency: int | None, gpus: int) -> int:
    """How many proposals the loop keeps in flight: the number a user gave, exactly (a bound they may
    rely on, e.g. 1 so that each LLM edit sees the verdict of the one before); else the default, or
    two per GPU where there are more GPUs, so each has its next candidate waiting when it frees up."""
    return concurrency if concurrency is not None else max(DEFAULT_CONCURRENCY, 2 * max(1, gpus))


def _proposer_spec(p: Any) -> ProposerSpec:
    if isinstance(p, ProposerSpec):
        return p
    if not isinstance(p, dict):
        raise ConfigError(f"proposers: each entry must be a table, not {p!r}")
    names = {f.name for f in fields(ProposerSpec)} | {"replay"}
    unknown = sorted(set(p) - names)
    if unknown:
        raise ConfigError(f"proposers: unknown key {unknown[0]!r}" + _closest(unknown[0], names))
    p = dict(p)
    if "replay" in p:
        p["replay_file"] = p.pop("replay")
    for key in ("provider", "model", "base_url", "replay_file", "reasoning_effort"):
        if p.get(key) is not None and not isinstance(p[key], str):
            raise ConfigError(f"proposers: {key} must be a string, not {p[key]!r}")
    if "provider" not in p:
        raise ConfigError("proposers: each entry needs a provider")
    return ProposerSpec(**p)


def check_url(url: str) -> None:
    """An http(s) URL with a host and, if it names one, a port in range: the SDKs would otherwise
    fail at the first request with an error that names no option."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"--base-url: {redact_url(url)!r} is not a usable URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--base-url: {redact_url(url)!r} is not an http(s) URL")
    if port == 0:
        raise ConfigError(f"--base-url: {redact_url(url)!r} names port 0")


_SECRET_QUERY = ("key", "token", "secret", "password", "passwd", "auth", "sig", "signature", "credential")


def redact_url(url: str | None) -> str | None:
    """The URL without user:password@ and without query values that look like credentials."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if any(s in k.lower() for s in _SECRET_QUERY) else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_redactions(url: str | None) -> bool:
    return bool(url) and REDACTED in url


# --------------------------------------------------------------------------- TOML files

# TOML key (a flag's name, - or _) -> RunConfig field; keys not listed map to themselves.
_TOML_TO_FIELD = {"wall_time": "wall_time_s", "problem": "problems", "eval_timeout": "eval_timeout_s",
                  "max_timing": "max_timing_s", "retry_base": "retry_base_s", "worker_memory": "worker_memory_gib", "retry_max_wait": "retry_max_wait_s",
                  "inspect_timeout": "inspect_timeout_s",
                  "request_timeout": "request_timeout_s"}
_PROPOSER_KEYS = ("provider", "model", "base_url", "replay", "reasoning_effort")
_STRING_KEYS = ("suite", "baseline", "reward", "executor", "gpus", "ray_address", "ray_resource", "prompt_dir", "prices",
                "precision", "dtype")
# Flags of the command rather than of the search: returned under "cli" for the command to apply.
CLI_KEYS = {"results": str, "resume": str, "json": bool, "unsafe_no_jail": bool}
_TOML_KEYS = sorted(set(_TOML_TO_FIELD) | set(BOUNDS) - set(_TOML_TO_FIELD.values()) | set(_PROPOSER_KEYS)
                    | set(_STRING_KEYS) | set(CLI_KEYS) | {"compile_only", "cpu", "proposers", "config"})


def _closest(key: str, choices: Any) -> str:
    near = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {near[0].replace('_', '-')!r}?" if near else ""


def settings_from_toml(data: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """TOML keys (the flags' names) -> RunConfig field settings, types checked."""
    out: dict[str, Any] = {}
    single: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key not in _TOML_KEYS:
            raise ConfigError(f"{source}: unknown setting {raw_key!r}" + _closest(key, _TOML_KEYS))
        if key == "config":
            raise ConfigError(f"{source}: config names another file; a config file cannot include one")
        if key in CLI_KEYS:
            if not isinstance(value, CLI_KEYS[key]):
                want = "true or false" if CLI_KEYS[key] is bool else "a string"
                raise ConfigError(f"{source}: {raw_key} must be {want}, not {value!r}")
            out.setdefault("cli", {})[key] = value
        elif key in _PROPOSER_KEYS:
            if not isinstance(value, str):
                raise ConfigError(f"{source}: {raw_key} must be a string, not {value!r}")
            single["replay_file" if key == "replay" else key] = value
        elif key == "proposers":
            if not isinstance(value, list):
                raise ConfigError(f"{source}: proposers must be an array of tables ([[proposers]])")
            out["proposers"] = [_proposer_spec(p) for p in value]
        elif key == "problem":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
                raise ConfigError(f"{source}: problem must be a string or a list of strings")
            out["problems"] = list(items)
        elif key in ("compile_only", "cpu"):
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {raw_key} must be true or false, not {value!r}")
            if key == "cpu":
                out["device"] = "cpu" if value else "cuda"
            else:
                out["compile_only"] = value
        elif key in _STRING_KEYS:
            if key == "gpus" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                raise ConfigError(f"{source}: {raw_key} must be a string, not {value!r}")
            out[key] = value
        else:
            fld = _TOML_TO_FIELD.get(key, key)
            bound = BOUNDS[fld]
            try:
                out[fld] = bound.check(value)
            except ConfigError as e:
                raise ConfigError(f"{source}: {str(e).replace(bound.flag, raw_key, 1)}") from None
    if single:
        if "proposers" in out:
            raise ConfigError(f"{source}: give either provider/model or [[proposers]] tables, not both")
        if "provider" not in single:
            raise ConfigError(f"{source}: model/base_url/replay given without a provider")
        out["proposers"] = [ProposerSpec(**single)]
    return out


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML config file as RunConfig field settings."""
    try:
        data = read_toml(path)
    except TomlFileError as e:
        raise ConfigError(f"--config: {path}: {e}") from None
    return settings_from_toml(data, str(path))


def merge(file_settings: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Defaults < file < flags; flags that were not given (None) do not override."""
    merged = dict(file_settings)
    merged.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig.from_dict(merged)
