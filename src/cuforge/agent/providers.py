"""Proposers behind one interface: an LLM (OpenAI chat completions, any OpenAI-compatible server,
Anthropic messages) or a file of recorded replies. Each turns a Prompt into a Proposal (the raw
text, token usage, cost, latency). Retries, backoff, concurrency caps and error mapping live here.

Secrets come only from environment variables and never leave this module: not to the store, not
to logs, not to prompts, not to sandbox workers (their environment is scrubbed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuforge.agent.prompts import Prompt

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PRICES_PATH = Path(__file__).resolve().parents[1] / "data" / "prices.toml"


class ProviderError(RuntimeError):
    """A request failed for good (after retries, or not retryable)."""


class ProviderAuthError(ProviderError):
    """Credentials missing or refused: the run stops, naming the variable."""


class ContextLengthError(ProviderError):
    """The prompt is too long for the model: the caller shrinks it and asks again."""


class ProposerExhausted(ProviderError):
    """A replay file has no more responses."""


@dataclass(frozen=True)
class Proposal:
    text: str
    provider: str
    model: str
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cached: float


def load_prices(path: Path | None = None) -> dict[str, Price]:
    with open(path or PRICES_PATH, "rb") as f:
        data = tomllib.load(f)
    return {model: Price(float(v["input"]), float(v["output"]), float(v.get("cached", v["input"]))) for model, v in data.items()}


def cost_of(prices: dict[str, Price], model: str, tokens_in: int, tokens_out: int, tokens_cached: int) -> float | None:
    """USD for one call; None when the model has no price (the run reports that)."""
    price = prices.get(model)
    if price is None:
        return None
    fresh = max(tokens_in - tokens_cached, 0)
    return (fresh * price.input + tokens_cached * price.cached + tokens_out * price.output) / 1e6


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    timeout_s: float = 600.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff with full jitter."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


class LLMProposer:
    """Shared machinery of the SDK-backed proposers: concurrency cap, retries, pricing."""

    provider = "llm"
    key_env = ""

    def __init__(self, model: str, temperature: float = 0.7, max_tokens: int = 8192, concurrency: int = 4,
                 retry: RetryPolicy | None = None, prices: dict[str, Price] | None = None) -> None:
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self.retry = retry or RetryPolicy()
        self.prices = prices if prices is not None else load_prices()
        self._semaphore = asyncio.Semaphore(concurrency)

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    async def propose(self, prompt: Prompt) -> Proposal:
        async with self._semaphore:
            attempt = 0
            while True:
                t0 = time.monotonic()
                try:
                    return await self._call(prompt, t0)
                except Exception as e:  # noqa: BLE001 - classified below
                    kind = self._classify(e)
                    if kind == "auth":
                        raise ProviderAuthError(
                            f"{self.provider} refused the credentials: check {self.key_env}" if self.key_env
                            else f"{self.provider} refused the credentials") from None
                    if kind == "context":
                        raise ContextLengthError(f"{self.name}: prompt too long ({prompt.chars} characters)") from None
                    if kind != "retry" or attempt >= self.retry.max_retries:
                        raise ProviderError(f"{self.name}: {type(e).__name__}: {str(e)[:300]}") from None
                    await asyncio.sleep(self.retry.delay(attempt))
                    attempt += 1

    def _price(self, tokens_in: int, tokens_out: int, cached: int) -> float:
        return cost_of(self.prices, self.model, tokens_in, tokens_out, cached) or 0.0

    async def _call(self, prompt: Prompt, t0: float) -> Proposal:  # pragma: no cover - abstract
        raise NotImplementedError

    def _classify(self, e: Exception) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


def _context_message(text: str) -> bool:
    t = text.lower()
    return "context_length" in t or "maximum context length" in t or "prompt is too long" in t or "too many tokens" in t


def classify_sdk_error(sdk: Any, e: Exception) -> str:
    """auth, context, retry or fatal, for the openai and anthropic SDKs (they share exception names;
    Anthropic's 529 'overloaded' is a server error like any 5xx)."""
    if isinstance(e, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        return "auth"
    if isinstance(e, sdk.BadRequestError) and _context_message(str(e)):
        return "context"
    if isinstance(e, (sdk.RateLimitError, sdk.APITimeoutError, sdk.APIConnectionError, sdk.InternalServerError)):
        return "retry"
    if isinstance(e, sdk.APIStatusError) and e.status_code >= 500:
        return "retry"
    return "fatal"


class OpenAIProposer(LLMProposer):
    """Chat completions through the official SDK; --base-url points it at any OpenAI-compatible
    server (vLLM, SGLang, Ollama, llama.cpp), which may need no key."""

    provider = "openai"
    key_env = "OPENAI_API_KEY"

    def __init__(self, model: str, base_url: str | None = None, reasoning_effort: str | None = None, **kw: Any) -> None:
        super().__init__(model, **kw)
        import openai

        key = os.environ.get("OPENAI_API_KEY")
        if not key and base_url is None:
            raise ProviderAuthError("OPENAI_API_KEY is not set (or pass --base-url for a local server)")
        self.reasoning_effort = reasoning_effort
        self._openai = openai
        self.client = openai.AsyncOpenAI(api_key=key or "not-needed", base_url=base_url, max_retries=0,
                                         timeout=self.retry.timeout_s)

    async def _call(self, prompt: Prompt, t0: float) -> Proposal:
        extra: dict[str, Any] = {}
        if self.reasoning_effort:
            extra["reasoning_effort"] = self.reasoning_effort
        resp = await self.client.chat.completions.create(
            model=self.model, temperature=self.temperature, max_tokens=self.max_tokens,
            messages=[{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}], **extra)
        text = resp.choices[0].message.content or "" if resp.choices else ""
        usage = resp.usage
        tin = getattr(usage, "prompt_tokens", 0) or 0
        tout = getattr(usage, "completion_tokens", 0) or 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
        return Proposal(text, self.provider, self.model, tin, tout, cached, self._price(tin, tout, cached),
                        time.monotonic() - t0)

    def _classify(self, e: Exception) -> str:
        return classify_sdk_error(self._openai, e)


class AnthropicProposer(LLMProposer):
    """Messages API through the official SDK, with the stable prefix (system prompt, reference and
    hardware) marked for prompt caching."""

    provider = "anthropic"
    key_env = "ANTHROPIC_API_KEY"

    def __init__(self, model: str, base_url: str | None = None, **kw: Any) -> None:
        super().__init__(model, **kw)
        import anthropic

        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ProviderAuthError("ANTHROPIC_API_KEY is not set")
        self._anthropic = anthropic
        self.client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0, timeout=self.retry.timeout_s)
        # Newer SDKs dropped the temperature parameter; send it only where the SDK still takes it.
        import inspect

        self._accepts_temperature = "temperature" in inspect.signature(self.client.messages.create).parameters

    async def _call(self, prompt: Prompt, t0: float) -> Proposal:
        cache = {"type": "ephemeral"}
        extra: dict[str, Any] = {}
        if self._accepts_temperature:
            extra["temperature"] = self.temperature
        resp = await self.client.messages.create(
            model=self.model, max_tokens=self.max_tokens, **extra,
            system=[{"type": "text", "text": prompt.system, "cache_control": cache}],
            messages=[{"role": "user", "content": [
                {"type": "text", "text": prompt.stable, "cache_control": cache},
                {"type": "text", "text": prompt.volatile or "(no feedback yet)"},
            ]}])
        text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
        u = resp.usage
        cached = (getattr(u, "cache_read_input_tokens", 0) or 0)
        created = (getattr(u, "cache_creation_input_tokens", 0) or 0)
        tin = (u.input_tokens or 0) + cached + created
        return Proposal(text, self.provider, self.model, tin, u.output_tokens or 0, cached,
                        self._price(tin, u.output_tokens or 0, cached), time.monotonic() - t0)

    def _classify(self, e: Exception) -> str:
        return classify_sdk_error(self._anthropic, e)


class ReplayProposer:
    """Replays a JSONL file of recorded replies ({"text": ...} per line, token fields optional), in
    order: reproducible demos and tests."""

    provider = "replay"

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ProviderError(f"replay file {path} not found")
        self.path = path
        self.records: list[dict[str, Any]] = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ProviderError(f"{path}:{i}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise ProviderError(f"{path}:{i}: each line needs a string field 'text'")
            self.records.append(rec)
        self.position = 0
        self.model = path.name

    @property
    def name(self) -> str:
        return f"replay:{self.path.name}"

    def skip(self, n: int) -> None:
        """On resume: replies already consumed by the killed run are not replayed twice."""
        self.position = min(self.position + n, len(self.records))

    async def propose(self, prompt: Prompt) -> Proposal:
        if self.position >= len(self.records):
            raise ProposerExhausted(f"{self.path.name}: all {len(self.records)} recorded replies used")
        rec = self.records[self.position]
        self.position += 1
        return Proposal(rec["text"], self.provider, rec.get("model", self.model), int(rec.get("tokens_in", 0)),
                        int(rec.get("tokens_out", 0)), int(rec.get("tokens_cached", 0)), float(rec.get("cost_usd", 0.0)))
