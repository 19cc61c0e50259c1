"""What went wrong with a request to an LLM provider, and whether asking again can help.

Every failure is put in one of a few kinds; only the transient ones are retried, with exponential
backoff and full jitter, never sooner than the server's Retry-After, and never past a retry budget
shared by the whole run. The messages name the provider, the HTTP status and the cause in one line.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from dataclasses import dataclass
from typing import Any

# kind -> (retried?, what it means)
KINDS: dict[str, tuple[bool, str]] = {
    "auth": (False, "credentials missing or refused"),
    "not_found": (False, "model or endpoint not found"),
    "bad_request": (False, "request refused as invalid"),
    "context": (False, "prompt too long for the model"),
    "rate_limit": (True, "rate limited"),
    "overloaded": (True, "provider overloaded"),
    "server": (True, "provider server error"),
    "network": (True, "network error or timeout"),
    "bad_payload": (False, "reply was not a usable completion"),
}
# Kinds that end the run: nothing later will go better (a wrong key, model or endpoint).
FATAL_KINDS = frozenset({"auth", "not_found", "bad_request"})


class ProviderError(RuntimeError):
    """A request failed for good (not retryable, or retries used up). `kind` is one of KINDS."""

    def __init__(self, message: str, kind: str = "server", status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.kind, self.status, self.attempts = kind, status, attempts

    @property
    def fatal(self) -> bool:
        return self.kind in FATAL_KINDS


class ProviderAuthError(ProviderError):
    """Credentials missing or refused: the run stops, naming the variable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message, "auth", status)


class ContextLengthError(ProviderError):
    """The prompt is too long for the model: the caller shrinks it and asks again."""

    def __init__(self, message: str, status: int | None = 400) -> None:
        super().__init__(message, "context", status)


class ProposerExhausted(ProviderError):
    """A replay file has no more responses."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "exhausted")


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified."""

    kind: str
    status: int | None
    detail: str
    retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        return KINDS.get(self.kind, (False, ""))[0]

    def describe(self, provider: str) -> str:
        status = f"HTTP {self.status} " if self.status else ""
        return f"{provider}: {status}{self.kind} ({KINDS.get(self.kind, (False, self.kind))[1]}): {self.detail}"


def _context_message(text: str) -> bool:
    t = text.lower()
    return "context_length" in t or "maximum context length" in t or "prompt is too long" in t or "too many tokens" in t


def retry_after_seconds(headers: Any, now: float | None = None) -> float | None:
    """The server's wish from Retry-After (seconds or an HTTP date) or retry-after-ms; None if absent."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(float(ms) / 1000.0, 0.0)
        value = headers.get("retry-after")
    except (AttributeError, ValueError, TypeError):
        return None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (now if now is not None else time.time()), 0.0)


def _error_detail(e: Exception) -> str:
    """The server's own message where the body has one, else the exception's text; one line."""
    body = getattr(e, "body", None)
    msg = None
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    text = str(msg or e) or type(e).__name__
    return " ".join(text.split())[:300]


def classify_sdk_error(sdk: Any, e: Exception) -> Failure:
    """A Failure for an exception of the openai or anthropic SDK (they share exception names), or of
    a malformed reply the proposer could not read."""
    status = getattr(e, "status_code", None)
    detail = _error_detail(e)
    headers = getattr(getattr(e, "response", None), "headers", None)
    if isinstance(e, (sdk.AuthenticationError, sdk.PermissionDeniedError)):
        return Failure("auth", status, detail)
    if isinstance(e, sdk.NotFoundError):
        return Failure("not_found", status, detail)
    if isinstance(e, sdk.BadRequestError):
        return Failure("context" if _context_message(str(e)) else "bad_request", status, detail)
    if isinstance(e, sdk.RateLimitError):
        return Failure("rate_limit", status, detail, retry_after_seconds(headers))
    if isinstance(e, (sdk.APITimeoutError, sdk.APIConnectionError)):
        return Failure("network", None, detail)
    if isinstance(e, getattr(sdk, "APIResponseValidationError", ())):
        return Failure("bad_payload", status, detail)
    if isinstance(e, sdk.APIStatusError):
        if status in (529, 503) or "overloaded" in detail.lower():
            return Failure("overloaded", status, detail, retry_after_seconds(headers))
        if status is not None and status >= 500:
            return Failure("server", status, detail, retry_after_seconds(headers))
        if status == 408:
            return Failure("network", status, detail)
        if status == 413 or _context_message(detail):
            return Failure("context", status, detail)
        return Failure("bad_request", status, detail)
    if isinstance(e, (json.JSONDecodeError, KeyError, AttributeError, TypeError, ValueError, IndexError)):
        return Failure("bad_payload", None, f"{type(e).__name__}: {detail}")
    return Failure("server", status, f"{type(e).__name__}: {detail}")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one request: at most max_retries after the first try, each after an exponential
    backoff with full jitter, stretched to the server's Retry-After; a Retry-After longer than
    max_delay_s is not waited for (the request fails, naming the wait asked for)."""

    max_retries: int = 3
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    timeout_s: float = 600.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float | None:
        """Seconds to wait before retry number attempt+1, or None when the server asks for too long."""
        backoff = random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))
        if retry_after_s is None:
            return backoff
        if retry_after_s > self.max_delay_s:
            return None
        return max(backoff, retry_after_s)


class RetryBudget:
    """Retries the whole run may spend, shared by every proposer and request: a provider that fails
    for good cannot multiply the request count by the per-request retry limit forever."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0

    def take(self) -> bool:
        if self.used >= self.total:
            return False
        self.used += 1
        return True
