"""The LLM loop is bounded whatever the server does: real loopback servers speaking the OpenAI and
Anthropic wire formats that repeat, vary, fail, stall or send no usage; each test counts the
requests the server saw, and checks the stop reason, the exit code and the message.

No run may send more than islands x generations x (1 + retry limit) requests per problem."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from llm_servers import (
    ScriptedLLMServer,
    anthropic_error,
    anthropic_reply,
    openai_error,
    openai_reply,
    openai_reply_without_usage,
)

GOOD = "```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n```\n"
KEY = {"OPENAI_API_KEY": "sk-test-secret-123", "ANTHROPIC_API_KEY": "ak-test-secret-456"}


def varied_good(n: int) -> dict:
    return openai_reply(GOOD.replace("clamp_min(0)", f"clamp_min(0) + 0 * {n}"))


def varied_garbage(n: int) -> dict:
    return openai_reply(f"I would tile it {n} ways and use shared memory.")


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cuforge.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=dict(os.environ, **KEY, **(env or {})))


def rows(db, sql):
    c = sqlite3.connect(db)
    try:
        return c.execute(sql).fetchall()
    finally:
        c.close()


def openai_run(srv, suite_dir, db, *extra):
    return ["run", "--suite", str(suite_dir), "--provider", "openai", "--model", "test-model", "--base-url",
            srv.url + "/v1", "--cpu", "--concurrency", "1", "--results", str(db), *extra]


def test_a_server_that_repeats_itself_is_asked_islands_x_generations_times(tmp_path, suite_dir):
    db = tmp_path / "r.db"
    with ScriptedLLMServer(openai_reply(GOOD)) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "1", "--generations", "4", "--json"))
        assert r.returncode == 0, r.stderr[-3000:]
        assert len(srv.requests) == 4  # every request took a slot, duplicates included
        temps = [q["body"]["temperature"] for q in srv.requests]
        prompts = [q["body"]["messages"][1]["content"] for q in srv.requests]
    s = json.loads(r.stdout)
    assert s["evaluations"] == 1 and s["duplicates"] == 3 and s["llm_calls"] == 4
    # Each duplicate is named in the next prompt and raises the temperature.
    assert "identical to" not in prompts[1]
    assert "identical to candidate 1, evaluated as ok" in prompts[2] and "Propose something different" in prompts[2]
    assert temps[0] == temps[1] == 0.7 and temps[3] > temps[2] > temps[1]
    assert rows(db, "SELECT COUNT(*) FROM llm_calls WHERE status = 'duplicate'")[0][0] == 3


def test_replies_with_nothing_to_evaluate_end_the_problem(tmp_path, suite_dir):
    db = tmp_path / "g.db"
    with ScriptedLLMServer(varied_garbage) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "4", "--generations", "4", "--max-failures", "3", "--json"))
        assert len(srv.requests) == 3
    assert r.returncode == 1, r.stderr[-2000:]  # no evaluation succeeded
    s = json.loads(r.stdout)
    (state,) = s["problems"].values()
    assert s["parse_errors"] == 3 and "3 requests in a row gave nothing to evaluate" in state
    assert "no evaluation succeeded" in r.stderr


FATAL = [
    (openai_error(404, "The model `test-model` does not exist", "model_not_found"), "HTTP 404 not_found"),
    (openai_error(400, "max_tokens is too large", "invalid_value"), "HTTP 400 bad_request"),
    (openai_error(401, "Incorrect API key provided", "invalid_api_key"), "OPENAI_API_KEY"),
]


@pytest.mark.parametrize("step, words", FATAL)
def test_a_fatal_provider_error_stops_the_run_at_once(tmp_path, suite_dir, step, words):
    db = tmp_path / "f.db"
    with ScriptedLLMServer(step) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "2", "--generations", "3"))
        assert len(srv.requests) == 1
    assert r.returncode == 1
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]
    assert "run aborted" in last and words in last and "Traceback" not in r.stderr
    assert rows(db, "SELECT status FROM runs")[0][0] == "aborted"
    assert "sk-test-secret-123" not in r.stdout + r.stderr


TRANSIENT = [
    (openai_error(500, "boom"), "server", True),
    ((*openai_error(429, "slow down", "rate_limit_exceeded"), {"retry-after": "0"}), "rate_limit", True),
    (openai_error(529, "Overloaded", "overloaded"), "overloaded", True),
    (("raw", 200, b"<html>proxy error</html>", "text/html"), "bad_payload", False),
]


@pytest.mark.parametrize("step, kind, retried", TRANSIENT)
def test_a_failing_provider_is_retried_within_bounds_then_the_run_ends(tmp_path, suite_dir, step, kind, retried):
    db = tmp_path / "t.db"
    islands, generations, retries, failures = 2, 3, 1, 2
    with ScriptedLLMServer(step) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", str(islands), "--generations", str(generations),
                            "--max-retries", str(retries), "--max-failures", str(failures), "--json"))
        n = len(srv.requests)
    assert n == failures * ((1 + retries) if retried else 1)
    assert n <= islands * generations * (1 + retries)
    assert r.returncode == 1
    s = json.loads(r.stdout)
    assert s["errors"] == {kind: failures} and s["aborted"]
    assert f"{failures} requests in a row failed" in s["stop_reason"] and kind in s["stop_reason"]
    # Each failure was shown as it happened, retries included.
    assert r.stderr.count("error: openai: ") >= failures
    if retried:
        assert "retrying" in r.stderr
    assert rows(db, f"SELECT COUNT(*) FROM llm_calls WHERE status = 'error:{kind}'")[0][0] == failures


def test_a_server_that_is_down_ends_the_run(tmp_path, suite_dir):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "m", "--base-url",
            f"http://127.0.0.1:{port}/v1", "--cpu", "--max-retries", "1", "--max-failures", "2",
            "--results", str(tmp_path / "d.db"), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["errors"] == {"network": 2}


def test_anthropic_overloaded_then_fine(tmp_path, suite_dir):
    db = tmp_path / "a.db"
    with ScriptedLLMServer(anthropic_reply(GOOD)) as srv:
        srv.script = [anthropic_error(529, "overloaded_error", "Overloaded")]
        r = cli("run", "--suite", str(suite_dir), "--provider", "anthropic", "--model", "test-model", "--base-url",
                srv.url, "--cpu", "--islands", "1", "--generations", "1", "--max-retries", "1",
                "--results", str(db), "--json")
        assert len(srv.requests) == 2
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["evaluations"] == 1


def test_an_unknown_price_refuses_a_dollar_budget(tmp_path, suite_dir):
    with ScriptedLLMServer(openai_reply(GOOD)) as srv:
        r = cli(*openai_run(srv, suite_dir, tmp_path / "p.db", "--budget-usd", "0.01"))
        assert len(srv.requests) == 0
    assert r.returncode == 2
    assert "--budget-usd: no price for model test-model" in r.stderr and "--price-in" in r.stderr


def test_a_dollar_budget_holds_against_a_server_that_would_go_on_forever(tmp_path, suite_dir):
    db = tmp_path / "b.db"
    # $1 / M tokens in and out: a request reserves its prompt plus 1000 tokens of reply.
    with ScriptedLLMServer(varied_good) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "50", "--generations", "50", "--budget-usd", "0.005",
                            "--price-in", "1", "--price-out", "1", "--max-tokens", "1000", "--json"))
        n = len(srv.requests)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["cost_usd"] <= 0.005 and "budget of $0.005 reached" in s["stop_reason"]
    assert 1 <= n < 30 and s["llm_calls"] == n
    assert sum(c for (c,) in rows(db, "SELECT cost_usd FROM llm_calls")) <= 0.005


def test_a_budget_is_spent_not_left_when_requests_in_flight_would_not_all_fit(tmp_path, suite_dir):
    """Four requests in flight (the default concurrency), each reserving a worst case of about a sixth
    of the budget but costing far less: a request that does not fit beside the others waits for them
    to settle, so the run goes on until one request alone would not fit - at least 80% spent."""
    db = tmp_path / "s.db"
    budget = 0.05  # $1 / M tokens: each reply costs $0.0024, each request reserves ~$0.008

    def costly(n: int) -> dict:
        return openai_reply(f"I would tile it {n} ways.", prompt_tokens=1500, completion_tokens=900)

    with ScriptedLLMServer(costly) as srv:
        r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "test-model", "--base-url",
                srv.url + "/v1", "--cpu", "--results", str(db), "--islands", "50", "--generations", "50",
                "--budget-usd", str(budget), "--price-in", "1", "--price-out", "1", "--max-tokens", "6000",
                "--max-failures", "1000", "--json")
        n = len(srv.requests)
    assert r.returncode == 1, r.stderr[-2000:]  # nothing to evaluate in these replies: no evaluation succeeded
    s = json.loads(r.stdout)
    assert f"budget of ${budget:g} reached" in s["stop_reason"], s["stop_reason"]
    worst = float(s["stop_reason"].split("could cost up to $")[1].split()[0])
    assert 0.8 * budget <= s["cost_usd"] <= budget and s["cost_usd"] + worst > budget, (s["cost_usd"], worst)
    assert s["llm_calls"] == n == round(s["cost_usd"] / 0.0024)
    assert abs(sum(c for (c,) in rows(db, "SELECT cost_usd FROM llm_calls")) - s["cost_usd"]) < 1e-9


def test_a_token_budget_holds_when_the_server_sends_no_usage(tmp_path, suite_dir):
    db = tmp_path / "n.db"
    with ScriptedLLMServer(lambda n: openai_reply_without_usage(f"thinking {n}")) as srv:
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "50", "--generations", "50", "--budget-tokens", "6000",
                            "--max-tokens", "500", "--max-failures", "1000", "--json"))
        n = len(srv.requests)
    s = json.loads(r.stdout)
    assert 1 <= n < 50 and "budget of 6000 tokens reached" in s["stop_reason"]
    assert s["tokens_in"] + s["tokens_out"] <= 6000 and s["tokens_estimated_calls"] == n
    assert rows(db, "SELECT COUNT(*) FROM llm_calls WHERE estimated = 1")[0][0] == n


def test_patience_ends_a_problem_without_a_new_best(tmp_path):
    db = tmp_path / "pt.db"
    with ScriptedLLMServer(lambda n: openai_reply(GOOD.replace("x.clamp_min(0)", f"x @ x + {n}"))) as srv:
        r = cli("run", "--suite", "hgemm-small", "--problem", "hgemm/64_64_64", "--provider", "openai", "--model",
                "test-model", "--base-url", srv.url + "/v1", "--compile-only", "--islands", "5", "--generations", "5",
                "--patience", "3", "--concurrency", "1", "--results", str(db), "--json")
        n = len(srv.requests)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert n == 3 and s["problems"]["hgemm/64_64_64"] == "no new best in 3 evaluations"
    # "compiled" is not ok, and no candidate left a process behind: the candidate hosts' zygote, which the
    # first evaluation started, is the worker's own, so one worker serves all three.
    pids = {json.loads(d)["pid"] for (d,) in sqlite3.connect(db).execute("SELECT device FROM evaluations")}
    assert len(pids) == 1, pids


def test_wall_time_holds_against_a_stalled_server(tmp_path, suite_dir):
    db = tmp_path / "w.db"
    with ScriptedLLMServer(("sleep", 60, openai_reply(GOOD))) as srv:
        t0 = time.monotonic()
        r = cli(*openai_run(srv, suite_dir, db, "--wall-time", "3", "--json"))
        took = time.monotonic() - t0
        assert len(srv.requests) == 1
    assert took < 40, took
    s = json.loads(r.stdout)
    assert s["stop_reason"] == "wall time of 3 s used" and r.returncode == 1  # nothing evaluated


def test_plain_progress_lines_when_not_a_terminal_and_totals_at_the_end(tmp_path, suite_dir):
    db = tmp_path / "o.db"
    with ScriptedLLMServer(varied_good) as srv:
        srv.script = [openai_reply("no code here")]
        r = cli(*openai_run(srv, suite_dir, db, "--islands", "1", "--generations", "3"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "relu: parse_error" in r.stderr and r.stderr.count("relu: candidate") == 2
    out = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert out[-2].startswith("totals: 2 evaluations (2 succeeded)") and "parse errors 1" in out[-2]


def test_secrets_in_the_base_url_are_never_stored_or_printed(tmp_path, suite_dir):
    db = tmp_path / "s.db"
    with ScriptedLLMServer(openai_reply(GOOD)) as srv:
        url = srv.url.replace("http://", "http://alice:hunter2@") + "/v1?api_key=qwerty99&region=eu"
        r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "test-model", "--base-url", url,
                "--cpu", "--islands", "1", "--generations", "1", "--results", str(db), "--json")
        assert len(srv.requests) == 1
    assert r.returncode == 0, r.stderr[-2000:]
    stored = json.dumps(rows(db, "SELECT config FROM runs"))
    assert "hunter2" not in stored and "qwerty99" not in stored and "region=eu" in stored
    rep = cli("report", "--results", str(db), "-o", str(tmp_path / "r.html"))
    assert rep.returncode == 0
    html = (tmp_path / "r.html").read_text()
    for text in (r.stdout, r.stderr, html, rep.stdout):
        assert "hunter2" not in text and "qwerty99" not in text
    # Resuming needs the URL again: its credentials were never stored.
    again = cli("run", "--resume", json.loads(r.stdout)["run_id"], "--results", str(db))
    assert again.returncode == 2 and "pass --base-url again" in again.stderr


def _wait_for(pred, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _signal_a_waiting_run(suite_dir, db, sig):
    """A run waiting on a stalled server, sent `sig` once its first request arrived: (exit code, out, err)."""
    with ScriptedLLMServer(("sleep", 60, openai_reply(GOOD))) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli", *openai_run(srv, suite_dir, db)], cwd=ROOT,
                                env=dict(os.environ, **KEY), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert _wait_for(lambda: len(srv.requests) >= 1)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 15
    return proc.returncode, out, err


def test_first_ctrl_c_stops_and_records_the_run_second_exits_at_once(tmp_path, suite_dir):
    db = tmp_path / "c.db"
    code, out, err = _signal_a_waiting_run(suite_dir, db, signal.SIGINT)
    assert code == 130, err[-2000:]
    run_id = rows(db, "SELECT id FROM runs")[0][0]
    assert rows(db, "SELECT status FROM runs")[0][0] == "stopped"
    assert f"cuforge run --resume {run_id}" in out + err

    with ScriptedLLMServer(("sleep", 60, openai_reply(GOOD))) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli", "run", "--resume", run_id, "--base-url",
                                 srv.url + "/v1", "--results", str(db)], cwd=ROOT, env=dict(os.environ, **KEY),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert _wait_for(lambda: len(srv.requests) >= 1)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert rows(db, "SELECT status FROM runs")[0][0] == "stopped"


def test_sigterm_is_named_as_such_and_stops_the_run_like_ctrl_c(tmp_path, suite_dir):
    db = tmp_path / "t.db"
    code, out, err = _signal_a_waiting_run(suite_dir, db, signal.SIGTERM)
    assert code == 143, err[-2000:]
    assert "SIGTERM" in err and "Ctrl-C" not in out + err, err[-2000:]
    assert "terminated (SIGTERM)" in out + err
    assert rows(db, "SELECT status FROM runs")[0][0] == "stopped"


def test_a_killed_run_reads_died_and_resumes_on_a_new_server_without_asking_twice(tmp_path, suite_dir):
    db = tmp_path / "k.db"
    with ScriptedLLMServer(varied_good) as old:
        old.script = [varied_good(0), varied_good(1), ("sleep", 60, varied_good(2))]
        proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli",
                                 *openai_run(old, suite_dir, db, "--islands", "1", "--generations", "5")],
                                cwd=ROOT, env=dict(os.environ, **KEY), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        assert _wait_for(lambda: len(old.requests) >= 3)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        sent_before = len(old.requests)
    listing = cli("results", "list", "--results", str(db), "--json")
    assert json.loads(listing.stdout)[0]["status"] == "died"
    lb = cli("leaderboard", "--results", str(db))
    assert "died" in lb.stdout
    run_id = json.loads(listing.stdout)[0]["id"]
    done = rows(db, "SELECT COUNT(*) FROM llm_calls")[0][0]
    with ScriptedLLMServer(lambda n: varied_good(100 + n)) as new:
        r = cli("run", "--resume", run_id, "--base-url", new.url + "/v1", "--results", str(db), "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(new.requests) == 5 - done  # only the slots the killed run had not used
    assert len(old.requests) == sent_before
    assert rows(db, "SELECT COUNT(*) FROM llm_calls")[0][0] == 5
    assert rows(db, "SELECT status FROM runs")[0][0] == "finished"
    stored = json.loads(rows(db, "SELECT config FROM runs")[0][0])
    assert stored["proposers"][0]["base_url"] == new.url + "/v1"
    hashes = [h for (h,) in rows(db, "SELECT candidate_hash FROM candidates")]
    assert len(hashes) == len(set(hashes))


def test_a_run_still_running_cannot_be_resumed_twice(tmp_path, suite_dir):
    db = tmp_path / "twice.db"
    with ScriptedLLMServer(("sleep", 60, openai_reply(GOOD))) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli", *openai_run(srv, suite_dir, db)], cwd=ROOT,
                                env=dict(os.environ, **KEY), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert _wait_for(lambda: len(srv.requests) >= 1)
            run_id = rows(db, "SELECT id FROM runs")[0][0]
            r = cli("run", "--resume", run_id, "--results", str(db))
            assert r.returncode == 2 and "is still running" in r.stderr
        finally:
            proc.kill()
            proc.wait()


def test_the_template_search_never_reproposes_after_a_kill(tmp_path):
    db = tmp_path / "tk.db"
    args = ["run", "--suite", "hgemm-small", "--problem", "hgemm/256_256_256", "--islands", "1", "--generations", "8",
            "--compile-only", "--results", str(db)]
    proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)

    def evaluated():
        try:
            return rows(db, "SELECT COUNT(*) FROM evaluations")[0][0] >= 3
        except sqlite3.OperationalError:
            return False

    assert _wait_for(evaluated, 240)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = rows(db, "SELECT id FROM runs")[0][0]
    r = cli("run", "--resume", run_id, "--results", str(db), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    hashes = [h for (h,) in rows(db, "SELECT candidate_hash FROM candidates")]
    assert len(hashes) == len(set(hashes)) == 8


def test_resume_never_reruns_the_candidate_a_dead_driver_was_evaluating(tmp_path, suite_dir):
    """The driver dies (SIGKILL) while a worker runs a candidate: that candidate may be what killed
    it, so --resume records it as a crash (it was marked started before the worker saw it) and
    evaluates only what no worker had received."""
    db = tmp_path / "started.db"
    marker = tmp_path / "ran"
    slow = GOOD.replace("import torch\n", f"import torch, time\ntry:\n    open({str(marker)!r}, 'a').write('x')\n"
                        "except OSError:\n    pass\ntime.sleep(600)\n")
    with ScriptedLLMServer(lambda n: openai_reply(slow) if n == 1 else varied_good(n)) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli",
                                 *openai_run(srv, suite_dir, db, "--islands", "1", "--generations", "3")],
                                cwd=ROOT, env=dict(os.environ, **KEY), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

        def started() -> bool:
            try:
                return bool(rows(db, "SELECT COUNT(*) FROM candidates WHERE started_at IS NOT NULL")[0][0])
            except sqlite3.OperationalError:
                return False

        assert _wait_for(started, 120)
        time.sleep(8)  # the worker starts and imports the candidate, which sleeps
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        run_id = rows(db, "SELECT id FROM runs")[0][0]
        slow_id = rows(db, "SELECT id FROM candidates WHERE started_at IS NOT NULL")[0][0]
        r = cli("run", "--resume", run_id, "--results", str(db), "--json")
        assert r.returncode == 0, r.stderr[-2000:]
    status, message = rows(db, f"SELECT status, message FROM evaluations WHERE candidate_id = {slow_id}")[0]
    assert status == "crash" and "not run again" in message
    assert rows(db, f"SELECT COUNT(*) FROM evaluations WHERE candidate_id = {slow_id}")[0][0] == 1
    assert not marker.exists()  # and the jail kept it from writing outside its scratch
