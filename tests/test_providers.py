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
        with pytest.raises(ProviderError, match=r"openai: HTTP 500 server .*down \(after 4 attempts\)") as info:
            run(p.propose(PROMPT))
        assert info.value.kind == "server" and info.value.status == 500
        assert len(srv.requests) == 4 and p.requests == 4  # first try + 3 retries
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


# ---------------------------------------------------------------- failure classification, retries


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("step, kind, status, sent", [
    (openai_error(404, "The model `nope` does not exist", "model_not_found"), "not_found", 404, 1),
    (openai_error(400, "temperature: must be at most 2", "invalid_value"), "bad_request", 400, 1),
    (openai_error(429, "slow down", "rate_limit_exceeded"), "rate_limit", 429, 4),
    (openai_error(529, "Overloaded", "overloaded"), "overloaded", 529, 4),
    (openai_error(500, "boom"), "server", 500, 4),
    (("raw", 200, b"<html>gateway says hi</html>", "text/html"), "bad_payload", None, 1),
    (("raw", 200, b"{not json", "application/json"), "bad_payload", None, 1),
    ({"id": "x", "object": "chat.completion", "choices": []}, "bad_payload", None, 1),
    (("hangup",), "network", None, 4),
    (("sleep", 3.0, openai_reply("late")), "network", None, 4),
])
def test_openai_failures_are_classified_and_retried_only_when_it_can_help(monkeypatch, step, kind, status, sent):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    seen = []
    with ScriptedLLMServer(step) as srv:
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=RetryPolicy(3, 0.01, 0.02, 0.5),
                           prices=PRICES, on_failure=lambda name, f, retrying: seen.append((f.kind, retrying)))
        with pytest.raises(ProviderError) as info:
            run(p.propose(PROMPT))
        assert (info.value.kind, info.value.status) == (kind, status)
        assert srv.received(sent) == sent == p.requests
    msg = str(info.value)
    assert msg.startswith("openai: ") and kind in msg and "\n" not in msg
    assert [k for k, _ in seen] == [kind] * sent and [r for _, r in seen] == [True] * (sent - 1) + [False]


def test_a_server_that_is_down_is_a_network_failure(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    p = OpenAIProposer("m", base_url=f"http://127.0.0.1:{_free_port()}/v1", retry=RetryPolicy(2, 0.01, 0.02, 1.0),
                       prices={})
    with pytest.raises(ProviderError, match="network") as info:
        run(p.propose(PROMPT))
    assert info.value.kind == "network" and p.requests == 3


@pytest.mark.parametrize("step, kind", [
    (anthropic_error(404, "not_found_error", "model: nope"), "not_found"),
    (anthropic_error(400, "invalid_request_error", "max_tokens: too large"), "bad_request"),
    (anthropic_error(529, "overloaded_error", "Overloaded"), "overloaded"),
    (anthropic_error(500, "api_error", "Internal server error"), "server"),
    (("raw", 200, b"not json at all", "text/plain"), "bad_payload"),
])
def test_anthropic_failures_are_classified(monkeypatch, step, kind):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-test")
    with ScriptedLLMServer(step) as srv:
        p = AnthropicProposer("test-model", base_url=srv.url, retry=RetryPolicy(1, 0.01, 0.02, 2.0), prices=PRICES)
        with pytest.raises(ProviderError) as info:
            run(p.propose(PROMPT))
    assert info.value.kind == kind and str(info.value).startswith("anthropic: ")


def test_retry_after_is_honoured_and_a_long_one_is_not_waited_for(monkeypatch):
    import time

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    status, body = openai_error(429, "slow down", "rate_limit_exceeded")
    with ScriptedLLMServer(openai_reply(CODE)) as srv:
        srv.script = [(status, body, {"retry-after": "1"})]
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=RetryPolicy(3, 0.01, 5.0, 5.0), prices=PRICES)
        assert run(p.propose(PROMPT)).text == CODE
        assert srv.times[1] - srv.times[0] >= 0.95  # waited as asked, not the 10 ms backoff
        srv.script = [(status, body, {"retry-after": "3600"})]
        t0 = time.monotonic()
        with pytest.raises(ProviderError, match="asked to retry after 3600 s") as info:
            run(p.propose(PROMPT))
        assert time.monotonic() - t0 < 2 and info.value.kind == "rate_limit"
    assert len(srv.requests) == 3


def test_the_run_wide_retry_budget_bounds_retries(monkeypatch):
    from cuforge.agent.providers import RetryBudget

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(openai_error(500, "down")) as srv:
        budget = RetryBudget(2)
        p = OpenAIProposer("m", base_url=srv.url + "/v1", retry=RetryPolicy(5, 0.0, 0.0, 2.0), prices={},
                           retry_budget=budget)
        for _ in range(3):
            with pytest.raises(ProviderError):
                run(p.propose(PROMPT))
    assert len(srv.requests) == 3 + 2 and budget.used == 2


def test_a_reply_without_usage_is_counted_by_a_local_estimate(monkeypatch):
    from llm_servers import openai_reply_without_usage

    from cuforge.agent.providers import estimate_tokens

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(openai_reply_without_usage(CODE)) as srv:
        out = run(OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices=PRICES).propose(PROMPT))
    assert out.estimated and out.tokens_out == estimate_tokens(CODE) > 0
    assert out.tokens_in == estimate_tokens(PROMPT.system + PROMPT.user) and out.cost_usd > 0


def test_temperature_can_be_raised_per_request(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedLLMServer(openai_reply(CODE)) as srv:
        p = OpenAIProposer("test-model", base_url=srv.url + "/v1", retry=FAST, prices=PRICES, temperature=0.5)
        run(p.propose(PROMPT, temperature=0.9))
    assert srv.requests[0]["body"]["temperature"] == 0.9


def test_bad_price_tables_are_one_line_errors(tmp_path):
    from cuforge.agent.providers import PriceError

    (tmp_path / "p.toml").write_text('["m"]\ninput = "cheap"\noutput = 1\n')
    with pytest.raises(PriceError, match=r"\['m'\] needs numbers"):
        load_prices(tmp_path / "p.toml")
    (tmp_path / "q.toml").write_text("not = [toml")
    with pytest.raises(PriceError, match="not valid TOML"):
        load_prices(tmp_path / "q.toml")
    with pytest.raises(PriceError, match="not found"):
        load_prices(tmp_path / "missing.toml")
