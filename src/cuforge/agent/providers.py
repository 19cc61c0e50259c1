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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuforge.agent.llm_errors import (  # noqa: F401 - re-exported: the proposers' error vocabulary
    ContextLengthError,
    Failure,
    ProposerExhausted,
    ProviderAuthError,
    ProviderError,
    RetryBudget,
    RetryPolicy,
    classify_sdk_error,
)
from cuforge.agent.prompts import Prompt
from cuforge.tomlfile import TomlFileError, read_toml

PRICES_PATH = Path(__file__).resolve().parents[1] / "data" / "prices.toml"


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
    estimated: bool = False  # token counts estimated locally: the server sent no usage


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cached: float


class PriceError(ValueError):
    """A price table that cannot be used; the message names the file and the entry."""


def load_prices(path: Path | None = None) -> dict[str, Price]:
    """model -> Price (USD per million tokens) from a TOML table of [model] input/output/cached."""
    path = path or PRICES_PATH
    try:
        data = read_toml(path)
    except TomlFileError as e:
        raise PriceError(f"prices file {path}: {e}") from None
    prices = {}
    for model, v in data.items():
        try:
            values = [float(v[k]) for k in ("input", "output")] + [float(v.get("cached", v["input"]))]
        except (TypeError, KeyError, ValueError, AttributeError):
            raise PriceError(f"prices file {path}: [{model!r}] needs numbers 'input' and 'output' "
                             "(USD per million tokens; 'cached' optional)") from None
        if any(x < 0 or x != x for x in values):
            raise PriceError(f"prices file {path}: [{model!r}] has a negative or NaN price")
        prices[model] = Price(*values)
    return prices


def cost_of(prices: dict[str, Price], model: str, tokens_in: int, tokens_out: int, tokens_cached: int) -> float | None:
    """USD for one call; None when the model has no price (the run reports that)."""
    price = prices.get(model)
    if price is None:
        return None
    fresh = max(tokens_in - tokens_cached, 0)
    return (fresh * price.input + tokens_cached * price.cached + tokens_out * price.output) / 1e6


def estimate_tokens(text: str) -> int:
    """A local token count for servers that report no usage: about four bytes of English or code a
    token for the BPE vocabularies of current models (no vocabulary file to download)."""
    return max(1, -(-len(text.encode("utf-8", "replace")) // 4)) if text else 0


class LLMProposer:
    """Shared machinery of the SDK-backed proposers: concurrency cap, classified retries, pricing,
    a count of every HTTP request made, and a report of every failed attempt."""

    provider = "llm"
    key_env = ""

    def __init__(self, model: str, temperature: float = 0.7, max_tokens: int = 8192, concurrency: int = 4,
                 retry: RetryPolicy | None = None, prices: dict[str, Price] | None = None,
                 retry_budget: RetryBudget | None = None,
                 on_failure: Callable[[str, Failure, bool], None] | None = None) -> None:
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self.retry = retry or RetryPolicy()
        self.retry_budget = retry_budget or RetryBudget(10**9)
        self.prices = prices if prices is not None else load_prices()
        self.on_failure = on_failure or (lambda name, failure, retrying: None)
        self.requests = 0  # HTTP requests sent, retries included
        self._semaphore = asyncio.Semaphore(concurrency)

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    @property
    def price(self) -> Price | None:
        return self.prices.get(self.model)

    async def propose(self, prompt: Prompt, temperature: float | None = None) -> Proposal:
        """One proposal: the first try and at most retry.max_retries more, for transient failures only."""
        async with self._semaphore:
            attempt = 0
            while True:
                t0 = time.monotonic()
                self.requests += 1
                try:
                    return await self._call(prompt, t0, self.temperature if temperature is None else temperature)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - classified below
                    failure = self._classify(e)
                wait = self.retry.delay(attempt, failure.retry_after_s) if failure.retryable else None
                retrying = (wait is not None and attempt < self.retry.max_retries and self.retry_budget.take())
                self.on_failure(self.name, failure, retrying)
                if not retrying:
                    raise self._final_error(failure, prompt, attempt + 1, wait is None and failure.retryable)
                await asyncio.sleep(wait)
                attempt += 1

    def _final_error(self, failure: Failure, prompt: Prompt, attempts: int, wait_too_long: bool) -> ProviderError:
        if failure.kind == "auth":
            hint = f": check {self.key_env}" if self.key_env else ""
            return ProviderAuthError(f"{self.provider} refused the credentials{hint} ({failure.describe(self.provider)})",
                                     failure.status)
        if failure.kind == "context":
            return ContextLengthError(f"{self.name}: prompt too long ({prompt.chars} characters)", failure.status)
        why = failure.describe(self.provider)
        if wait_too_long:
            why += f" (asked to retry after {failure.retry_after_s:g} s, over the {self.retry.max_delay_s:g} s limit)"
        elif failure.retryable:
            why += f" (after {attempts} attempts)"
        return ProviderError(why, failure.kind, failure.status, attempts)

    def _usage(self, prompt: Prompt, text: str, tokens_in: int, tokens_out: int, cached: int,
               t0: float) -> Proposal:
        """A Proposal with the server's token counts, or local estimates (marked) where it sent none."""
        estimated = not tokens_in and not tokens_out
        if estimated:
            tokens_in, tokens_out = estimate_tokens(prompt.system + prompt.user), estimate_tokens(text)
        cost = cost_of(self.prices, self.model, tokens_in, tokens_out, cached) or 0.0
        return Proposal(text, self.provider, self.model, tokens_in, tokens_out, cached, cost, time.monotonic() - t0,
                        estimated)

    async def _call(self, prompt: Prompt, t0: float, temperature: float) -> Proposal:  # pragma: no cover - abstract
        raise NotImplementedError

    def _classify(self, e: Exception) -> Failure:  # pragma: no cover - abstract
        raise NotImplementedError


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

    async def _call(self, prompt: Prompt, t0: float, temperature: float) -> Proposal:
        extra: dict[str, Any] = {}
        if self.reasoning_effort:
            extra["reasoning_effort"] = self.reasoning_effort
        resp = await self.client.chat.completions.create(
            model=self.model, temperature=temperature, max_tokens=self.max_tokens,
            messages=[{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}], **extra)
        if not getattr(resp, "choices", None):
            raise ValueError("the reply has no choices")
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        tin = getattr(usage, "prompt_tokens", 0) or 0
        tout = getattr(usage, "completion_tokens", 0) or 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
        return self._usage(prompt, text, tin, tout, cached, t0)

    def _classify(self, e: Exception) -> Failure:
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

    async def _call(self, prompt: Prompt, t0: float, temperature: float) -> Proposal:
        cache = {"type": "ephemeral"}
        extra: dict[str, Any] = {}
        if self._accepts_temperature:
            extra["temperature"] = temperature
        resp = await self.client.messages.create(
            model=self.model, max_tokens=self.max_tokens, **extra,
            system=[{"type": "text", "text": prompt.system, "cache_control": cache}],
            messages=[{"role": "user", "content": [
                {"type": "text", "text": prompt.stable, "cache_control": cache},
                {"type": "text", "text": prompt.volatile or "(no feedback yet)"},
            ]}])
        if not isinstance(getattr(resp, "content", None), list):
            raise ValueError("the reply has no content blocks")
        text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
        u = getattr(resp, "usage", None)
        cached = (getattr(u, "cache_read_input_tokens", 0) or 0)
        created = (getattr(u, "cache_creation_input_tokens", 0) or 0)
        tin = (getattr(u, "input_tokens", 0) or 0) + cached + created
        return self._usage(prompt, text, tin, getattr(u, "output_tokens", 0) or 0, cached, t0)

    def _classify(self, e: Exception) -> Failure:
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

    async def propose(self, prompt: Prompt, temperature: float | None = None) -> Proposal:
        if self.position >= len(self.records):
            raise ProposerExhausted(f"{self.path.name}: all {len(self.records)} recorded replies used")
        rec = self.records[self.position]
        self.position += 1
        return Proposal(rec["text"], self.provider, rec.get("model", self.model), int(rec.get("tokens_in", 0)),
                        int(rec.get("tokens_out", 0)), int(rec.get("tokens_cached", 0)), float(rec.get("cost_usd", 0.0)))
