"""Proposers against real local servers speaking the OpenAI and Anthropic wire formats."""

import asyncio
import json

import pytest

from llm_servers import ScriptedLLMServer, anthropic_error, anthropic_reply, openai_error, openai_reply
from cuforge.agent.prompts import Prompt
from cuforge.agent.providers import (
    AnthropicProposer,
    ContextLengthError,
    OpenAIProposer,
    Price,
    ProposerExhausted,
    ProviderAuthError,
    ProviderError,
    ReplayProposer,
    RetryPolicy,
    cost_of,
    load_prices,
)

PROMPT = Prompt("system rules", "# Reference operator\nstable part\n", "# Task\nvolatile part\n")
FAST = RetryPolicy(max_retries=3, base_delay_s=0.01, max_delay_s=0.02, timeout_s=2.0)
PRICES = {"test-model": Price(input=1.0, output=2.0, cached=0.5)}
CODE = "Idea: fuse.\n```python\nclass ModelNew:\n    pass\n```\n"


def run(coro):
    return asyncio.run(coro)


def test_openai_reply_usage_and_cost(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    with ScriptedLLMServer(openai_reply(CODE)) as srv:
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices=PRICES, temperature=0.3)
        out = run(p.propose(PROMPT))
        assert out.text == CODE and (out.tokens_in, out.tokens_out, out.tokens_cached) == (120, 60, 20)
        assert out.cost_usd == pytest.approx((100 * 1.0 + 20 * 0.5 + 60 * 2.0) / 1e6)
        req = srv.requests[0]
        assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "test-model"
        assert req["body"]["messages"][0] == {"role": "system", "content": "system rules"}
        assert req["body"]["temperature"] == 0.3
        assert "sk-test-secret" not in json.dumps(req["body"])  # the key travels only as a header


def test_openai_retries_429_500_and_slow_replies_then_succeeds(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(openai_reply(CODE)) as srv:
        srv.script = [openai_error(429, "slow down", "rate_limit_exceeded"), openai_error(500, "boom"),
                      ("sleep", 3.0, openai_reply("late"))]
        out = run(OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices=PRICES).propose(PROMPT))
        assert out.text == CODE and len(srv.requests) == 4


def test_openai_gives_up_auth_and_context_errors(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(openai_error(500, "down")) as srv:
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices=PRICES)
        with pytest.raises(ProviderError, match="InternalServerError"):
            run(p.propose(PROMPT))
        assert len(srv.requests) == 4  # first try + 3 retries
        srv.script = [openai_error(401, "Incorrect API key provided", "invalid_api_key")]
        with pytest.raises(ProviderAuthError, match="OPENAI_API_KEY"):
            run(p.propose(PROMPT))
        srv.script = [openai_error(400, "This model's maximum context length is 8192 tokens", "context_length_exceeded")]
        with pytest.raises(ContextLengthError):
            run(p.propose(PROMPT))


def test_openai_local_server_needs_no_key_but_the_cloud_does(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderAuthError, match="OPENAI_API_KEY is not set"):
        OpenAIProposer("gpt-4.1")
    with ScriptedLLMServer(openai_reply("ok")) as srv:
        assert run(OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices={}).propose(PROMPT)).text == "ok"


def test_anthropic_caches_the_stable_prefix_and_maps_errors(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-test-secret")
    with ScriptedLLMServer(anthropic_reply(CODE)) as srv:
        srv.script = [anthropic_error(529, "overloaded_error", "Overloaded"), anthropic_error(429, "rate_limit_error", "slow")]
        p = AnthropicProposer("test-model", base_url=srv.url, retry=FAST, prices=PRICES)
        out = run(p.propose(PROMPT))
        assert out.text == CODE and out.tokens_in == 140 and out.tokens_cached == 60 and out.tokens_out == 40
        body = srv.requests[-1]["body"]
        assert srv.requests[-1]["path"] == "/v1/messages"
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        blocks = body["messages"][0]["content"]
        assert blocks[0]["text"] == PROMPT.stable and blocks[0]["cache_control"] == {"type": "ephemeral"}
        assert blocks[1]["text"] == PROMPT.volatile and "cache_control" not in blocks[1]
        assert "ak-test-secret" not in json.dumps(body)
        srv.script = [anthropic_error(401, "authentication_error", "invalid x-api-key")]
        with pytest.raises(ProviderAuthError, match="ANTHROPIC_API_KEY"):
            run(p.propose(PROMPT))
        srv.script = [anthropic_error(400, "invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum")]
        with pytest.raises(ContextLengthError):
            run(p.propose(PROMPT))


def test_concurrency_is_capped(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(("sleep", 0.3, openai_reply("x"))) as srv:
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices={}, concurrency=2)

        async def six():
            import time

            t0 = time.monotonic()
            await asyncio.gather(*(p.propose(PROMPT) for _ in range(6)))
            return time.monotonic() - t0

        assert run(six()) >= 0.85  # 6 requests, 2 at a time, 0.3 s each


def test_replay(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"text": "one", "tokens_in": 5}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    r = ReplayProposer(f)
    assert run(r.propose(PROMPT)).text == "one"
    assert run(r.propose(PROMPT)).text == "two"
    with pytest.raises(ProposerExhausted):
        run(r.propose(PROMPT))
    r2 = ReplayProposer(f)
    r2.skip(1)
    assert run(r2.propose(PROMPT)).text == "two"
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ProviderError, match="bad.jsonl:1: not JSON"):
        ReplayProposer(tmp_path / "bad.jsonl")


def test_price_table():
    prices = load_prices()
    assert "gpt-4.1" in prices and "claude-sonnet-4-5" in prices
    assert cost_of(prices, "unknown-model", 10, 10, 0) is None
