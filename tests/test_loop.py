"""The search loop end to end on the CPU: replayed and HTTP-served LLM replies, real sandbox workers
(CPU harness mode or compile-only with NVRTC), the real SQLite store, resume after SIGKILL."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from llm_servers import ScriptedLLMServer, openai_error, openai_reply

GOOD = "Clamp instead.\n```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n```\n"
EDIT = "Use relu.\n<<<<<<< SEARCH\n        return x.clamp_min(0)\n=======\n        return torch.relu(x)\n>>>>>>> REPLACE\n"
WRONG = "```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n```\n"
GARBAGE = "I would use shared memory here."


def cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "cuforge.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=dict(os.environ, **(env or {})))


def replay_file(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "tokens_in": 100, "tokens_out": 20}) + "\n" for t in texts))
    return path


def rows(db: Path, sql: str) -> list[tuple]:
    c = sqlite3.connect(db)
    try:
        return c.execute(sql).fetchall()
    finally:
        c.close()


def test_replay_run_on_the_cpu_harness_records_everything(suite_dir, tmp_path):
    db = tmp_path / "r.db"
    rp = replay_file(tmp_path / "replies.jsonl", [GARBAGE, GOOD, EDIT, WRONG, GOOD])
    r = cli("run", "--suite", str(suite_dir), "--provider", "replay", "--replay", str(rp), "--islands", "1",
            "--generations", "5", "--concurrency", "1", "--cpu", "--results", str(db), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["evaluations"] == 3 and summary["parse_errors"] == 1 and summary["llm_calls"] == 5
    statuses = [s for (s,) in rows(db, "SELECT status FROM evaluations ORDER BY id")]
    assert statuses == ["parse_error", "ok", "ok", "wrong_output"]  # the 5th reply duplicates the 2nd: not re-evaluated
    edit_parent = rows(db, "SELECT parents, meta FROM candidates ORDER BY id")[2]
    assert json.loads(edit_parent[0]) == [2] and json.loads(edit_parent[1])["edit"] == "diff"
    assert rows(db, "SELECT status FROM runs")[0][0] == "finished"
    assert rows(db, "SELECT COUNT(*) FROM llm_calls WHERE tokens_in = 100")[0][0] == 5
    assert "torch.relu(x)" in rows(db, "SELECT source FROM candidates ORDER BY id")[2][0]
    lb = cli("leaderboard", "--results", str(db), "--json")
    assert lb.returncode == 0 and json.loads(lb.stdout)["fast"]["fast_0"] == 1.0
    rep = cli("report", "--results", str(db), "-o", str(tmp_path / "report.html"))
    assert rep.returncode == 0 and (tmp_path / "report.html").stat().st_size > 2000


def test_compile_only_against_an_openai_compatible_server(tmp_path, monkeypatch):
    kernel_ok = ("```python\nimport torch\nfrom cuforge.runtime import compile_cuda\n_k = compile_cuda(r'''\n"
                 "extern \"C\" __global__ void relu(const float* x, float* y, int n) {\n"
                 "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = fmaxf(x[i], 0.f); }\n"
                 "''').kernel('relu')\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                 "        y = torch.empty_like(x)\n        _k(((x.numel() + 255) // 256,), (256,), x, y, x.numel())\n"
                 "        return y\n```\n")
    kernel_bad = kernel_ok.replace("fmaxf(x[i], 0.f)", "fmaxf(x[i], zero)")
    db = tmp_path / "c.db"
    with ScriptedLLMServer(openai_reply(kernel_ok)) as srv:
        srv.script = [openai_error(429, "slow down", "rate_limit_exceeded"), openai_reply(kernel_bad), openai_reply(GARBAGE)]
        r = cli("run", "--suite", "hgemm-small", "--problem", "hgemm/64_64_64", "--provider", "openai", "--model", "test-model",
                "--base-url", srv.url + "/v1", "--islands", "1", "--generations", "3", "--concurrency", "1",
                "--compile-only", "--results", str(db), "--json", env={"OPENAI_API_KEY": "sk-test"})
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["evaluations"] == 2
    got = rows(db, "SELECT status, message FROM evaluations ORDER BY id")
    assert [s for s, _ in got] == ["compile_error", "parse_error", "compiled"]
    assert "zero" in got[0][1]
    prompts = [p for (p,) in rows(db, "SELECT prompt FROM llm_calls ORDER BY id")]
    assert "torch.matmul(A, B)" in prompts[0] and "compile-only run" in prompts[0]
    # The FIX-mode prompt that followed the compile error carries the compiler's diagnostic.
    assert any("identifier \"zero\" is undefined" in p for p in prompts[1:])


def test_auth_error_stops_the_run_naming_the_variable(tmp_path, suite_dir):
    with ScriptedLLMServer(openai_error(401, "Incorrect API key", "invalid_api_key")) as srv:
        r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "m", "--base-url", srv.url + "/v1",
                "--cpu", "--results", str(tmp_path / "a.db"), env={"OPENAI_API_KEY": "sk-wrong"})
    assert r.returncode == 1 and "OPENAI_API_KEY" in r.stdout + r.stderr
    assert rows(tmp_path / "a.db", "SELECT status FROM runs")[0][0] == "aborted"


def test_budget_stops_the_run(tmp_path, suite_dir):
    rp = replay_file(tmp_path / "r.jsonl", [GOOD, WRONG, EDIT])
    r = cli("run", "--suite", str(suite_dir), "--provider", "replay", "--replay", str(rp), "--cpu", "--concurrency", "1",
            "--budget-tokens", "150", "--results", str(tmp_path / "b.db"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert "150 tokens" in s["stop_reason"] and s["llm_calls"] == 2


def test_sigkill_then_resume_loses_and_repeats_nothing(tmp_path, suite_dir):
    variants = [GOOD.replace("clamp_min(0)", f"clamp_min(0) + 0 * {i}") for i in range(8)]
    rp = replay_file(tmp_path / "r.jsonl", variants)
    db = tmp_path / "k.db"
    args = ["run", "--suite", str(suite_dir), "--provider", "replay", "--replay", str(rp), "--islands", "2",
            "--generations", "4", "--concurrency", "1", "--cpu", "--results", str(db)]
    proc = subprocess.Popen([sys.executable, "-m", "cuforge.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if db.exists() and rows(db, "SELECT COUNT(*) FROM sqlite_master WHERE name='evaluations'")[0][0]:
            if rows(db, "SELECT COUNT(*) FROM evaluations")[0][0] >= 3:
                break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its worker, mid-way
    proc.wait()
    before = rows(db, "SELECT COUNT(*) FROM evaluations")[0][0]
    assert 3 <= before < 8
    run_id = rows(db, "SELECT id FROM runs")[0][0]
    r = cli("run", "--resume", run_id, "--results", str(db), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    evals = rows(db, "SELECT candidate_id FROM evaluations")
    cands = rows(db, "SELECT id FROM candidates")
    assert len(evals) == len(cands) == 8  # every candidate evaluated exactly once (unique index), none lost
    assert rows(db, "SELECT COUNT(*) FROM llm_calls")[0][0] == 8  # no recorded reply consumed twice
    assert rows(db, "SELECT status FROM runs")[0][0] == "finished"


def test_every_named_baseline_and_torch_compile_are_timed_on_a_gpu():
    from cuforge.agent.config import RunConfig
    from cuforge.agent.loop import eval_config
    from cuforge.problems.hgemm import hgemm_problem

    p = hgemm_problem(64, 64, 64)
    assert eval_config(RunConfig(), p).baselines == ("torch", "cublas", "cublaslt", "torch.compile")
    assert eval_config(RunConfig(device="cpu"), p).baselines == ("torch", "cublas", "cublaslt")
    assert eval_config(RunConfig(compile_only=True), p).baselines == ("torch", "cublas", "cublaslt")
    assert "torch.compile" in eval_config(RunConfig(device="cpu", baseline="torch.compile"), p).baselines


def test_template_proposer_is_the_default_and_runs_compile_only(tmp_path):
    db = tmp_path / "t.db"
    r = cli("run", "--suite", "hgemm-small", "--problem", "hgemm/64_64_64", "--islands", "1", "--generations", "3",
            "--compile-only", "--results", str(db), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["evaluations"] == 3
    got = rows(db, "SELECT e.status, c.proposer, c.format FROM evaluations e JOIN candidates c ON c.id = e.candidate_id")
    assert got == [("compiled", "template", "kernel")] * 3
    assert rows(db, "SELECT COUNT(*) FROM llm_calls")[0][0] == 0


def test_context_length_errors_shrink_the_prompt_and_the_run_goes_on(tmp_path, suite_dir):
    from llm_servers import openai_error as err

    with ScriptedLLMServer(openai_reply(GOOD)) as srv:
        srv.script = [err(400, "This model's maximum context length is 8192 tokens", "context_length_exceeded"),
                      openai_reply(GOOD)]
        r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "m", "--base-url", srv.url + "/v1",
                "--islands", "1", "--generations", "1", "--cpu", "--results", str(tmp_path), "--json",
                env={"OPENAI_API_KEY": "sk-test"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(srv.requests) == 2
    assert rows(tmp_path / "cuforge.db", "SELECT status FROM evaluations") == [("ok",)]


def test_concurrency_one_keeps_edits_sequential_beside_two_workers(tmp_path, suite_dir):
    """--concurrency 1 holds with two evaluation workers too: the second request is sent only after the
    first reply's verdict, so it is the prompt that asks to fix that wrong output."""
    db = tmp_path / "s.db"
    with ScriptedLLMServer(openai_reply(GOOD)) as srv:
        srv.script = [openai_reply(WRONG), openai_reply(GOOD)]
        r = cli("run", "--suite", str(suite_dir), "--provider", "openai", "--model", "m", "--base-url", srv.url + "/v1",
                "--islands", "1", "--generations", "2", "--concurrency", "1", "--cpu", "--gpus", "2",
                "--results", str(db), "--json", env={"OPENAI_API_KEY": "sk-test"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(srv.requests) == 2
    assert [s for (s,) in rows(db, "SELECT status FROM evaluations ORDER BY id")] == ["wrong_output", "ok"]
    prompts = [p for (p,) in rows(db, "SELECT prompt FROM llm_calls ORDER BY id")]
    assert "wrong_output" not in prompts[0] and "wrong_output" in prompts[1]


def test_proposals_in_flight_keep_a_given_number_and_feed_every_gpu_by_default():
    from cuforge.agent.config import proposals_in_flight

    assert [proposals_in_flight(1, g) for g in (1, 2, 8)] == [1, 1, 1]
    assert [proposals_in_flight(None, g) for g in (1, 2, 3, 8)] == [4, 4, 6, 16]


def test_toml_config_and_flags_win(tmp_path, suite_dir):
    from cuforge.agent.config import ConfigError, load_toml, merge

    f = tmp_path / "run.toml"
    f.write_text('suite = "level1"\nislands = 2\ngenerations = 7\n[[proposers]]\nprovider = "openai"\nmodel = "a"\n'
                 'weight = 3\n[[proposers]]\nprovider = "anthropic"\nmodel = "b"\n')
    cfg = merge(load_toml(f), {"islands": 5, "suite": None})
    assert (cfg.suite, cfg.islands, cfg.generations) == ("level1", 5, 7)
    assert [(p.provider, p.weight) for p in cfg.proposers] == [("openai", 3), ("anthropic", 1.0)]
    with pytest.raises(ConfigError, match="unknown settings: colour"):
        merge({"colour": "red"}, {})
    with pytest.raises(ConfigError, match="--model: provider openai needs a model name"):
        merge({"proposers": [{"provider": "openai"}]}, {})


@pytest.mark.gpu
def test_full_evaluation_loop_against_an_openai_compatible_server(tmp_path):
    """On a GPU: replies served over HTTP become CUDA candidates that are verified and timed."""
    kernel = (ROOT / "tests" / "gpu_candidates" / "relu_runtime.py").read_text()
    good = "float4 ReLU.\n```python\n" + kernel + "```\n"
    wrong = "```python\n" + kernel.replace("fmaxf(v.x, 0.f)", "fmaxf(v.x, 1.f)") + "```\n"
    db = tmp_path / "g.db"
    with ScriptedLLMServer(openai_reply(good)) as srv:
        srv.script = [openai_error(500, "flaky"), openai_reply(wrong), openai_reply(good)]
        r = cli("run", "--suite", "level1", "--problem", "relu", "--provider", "openai", "--model", "test-model",
                "--base-url", srv.url + "/v1", "--islands", "1", "--generations", "2", "--concurrency", "1",
                "--results", str(db), "--json", env={"OPENAI_API_KEY": "sk-test"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = rows(db, "SELECT status, speedups FROM evaluations ORDER BY id")
    assert [s for s, _ in got] == ["wrong_output", "ok"]
    assert json.loads(got[1][1])["torch"] > 0.5
    fix_prompt = rows(db, "SELECT prompt FROM llm_calls ORDER BY id")[-1][0]
    import torch

    # the hardware facts name the GPU the candidate ran on (whichever card this is)
    gpu = torch.cuda.get_device_name(0)
    assert "Fix it so it is correct" in fix_prompt and "wrong_output" in fix_prompt and gpu in fix_prompt
