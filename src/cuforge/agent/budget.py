"""Spending limits of a run that hold even with several requests in flight.

Before a request is sent, its worst case (the prompt, counted generously, plus the reply's
max_tokens, at the model's price) is reserved; a request whose worst case does not fit in what is
left is not sent. When the reply arrives, the reservation is replaced by what it really cost. A
request that does not fit beside others in flight waits for them to settle (the run goes on at a
lower concurrency) and the run stops only when one request alone no longer fits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuforge.agent.prompts import Prompt
from cuforge.agent.providers import Proposal, cost_of, estimate_tokens


@dataclass(frozen=True)
class Reservation:
    tokens: int = 0
    usd: float = 0.0


@dataclass
class Spend:
    """What the run has spent and what requests in flight may still spend."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    estimated_calls: int = 0  # calls whose tokens were estimated locally (no usage from the server)
    reserved: list[Reservation] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


def worst_case(proposer: Any, prompt: Prompt) -> Reservation:
    """The most one request can cost: the prompt (a third more than the local estimate, which
    undercounts dense code) plus max_tokens of reply. Proposers that are not paid reserve nothing."""
    max_tokens = getattr(proposer, "max_tokens", None)
    if max_tokens is None:
        return Reservation()
    tokens_in = estimate_tokens(prompt.system + prompt.user) * 4 // 3
    usd = cost_of(getattr(proposer, "prices", {}), proposer.model, tokens_in, max_tokens, 0) or 0.0
    return Reservation(tokens_in + max_tokens, usd)


class Budget:
    """The run's limits on dollars, tokens and wall time."""

    def __init__(self, usd: float | None, tokens: int | None, wall_s: float | None) -> None:
        self.usd, self.tokens, self.wall_s = usd, tokens, wall_s
        self.started = time.monotonic()
        self.spend = Spend()
        self.on_change: Callable[[], None] = lambda: None  # a reservation settled or was released

    def exhausted(self) -> str:
        """Why no further request may start, or ''."""
        s = self.spend
        if self.usd is not None and s.cost_usd >= self.usd:
            return f"budget of ${self.usd:g} spent (${s.cost_usd:.4f})"
        if self.tokens is not None and s.tokens >= self.tokens:
            return f"budget of {self.tokens} tokens spent ({s.tokens})"
        if self.wall_s is not None and time.monotonic() - self.started >= self.wall_s:
            return f"wall time of {self.wall_s:g} s used"
        return ""

    def reserve(self, proposer: Any, prompt: Prompt) -> tuple[Reservation | None, str]:
        """(reservation, '') when the request fits in what is left, else (None, why it does not)."""
        why = self.exhausted()
        if why:
            return None, why
        r = worst_case(proposer, prompt)
        s = self.spend
        if self.usd is not None:
            left = self.usd - s.cost_usd - sum(x.usd for x in s.reserved)
            if r.usd > left:
                return None, (f"budget of ${self.usd:g} reached: the next request could cost up to ${r.usd:.4f} "
                              f"({r.tokens} tokens at {proposer.model}'s price), ${max(left, 0):.4f} left")
        if self.tokens is not None:
            left_t = self.tokens - s.tokens - sum(x.tokens for x in s.reserved)
            if r.tokens > left_t:
                return None, (f"budget of {self.tokens} tokens reached: the next request could use up to "
                              f"{r.tokens} tokens, {max(left_t, 0)} left")
        s.reserved.append(r)
        return r, ""

    def release(self, r: Reservation | None) -> None:
        if r is not None and r in self.spend.reserved:
            self.spend.reserved.remove(r)
            self.on_change()

    def settle(self, r: Reservation | None, proposal: Proposal) -> None:
        """The reply's real usage replaces its reservation."""
        s = self.spend
        if r is not None and r in s.reserved:
            s.reserved.remove(r)
        s.tokens_in += proposal.tokens_in
        s.tokens_out += proposal.tokens_out
        s.cost_usd += proposal.cost_usd
        s.estimated_calls += int(proposal.estimated)
        self.on_change()
