"""The hard edges a new user hit (issue #58), each through the real CLI in a subprocess: option
checks that name the option, problem files that cannot load, output that pipes whole, CPU mode
that never runs a big problem at full size, and words that say what happened."""

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, relu_problem_source

ENV = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}


def cli(cwd, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "cuforge.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**ENV, "PYTHONPATH": str(ROOT / "src")})


def one_error_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_gpus_indices_and_worker_counts_are_checked_alike(tmp_path):
    most = (os.cpu_count() or 1) * 4
    one_error_line(cli(tmp_path, "run", "--suite", "level1", "-p", "relu", "--compile-only", "--gpus", "-1"),
                   "--gpus", "-1 is not a GPU index")
    many = ",".join(str(i) for i in range(most + 1))
    one_error_line(cli(tmp_path, "run", "--suite", "level1", "-p", "relu", "--compile-only", "--gpus", many),
                   "--gpus", f"{most + 1} workers", f"from 1 to {most}")
    one_error_line(cli(tmp_path, "run", "--suite", "level1", "-p", "relu", "--compile-only", "--gpus", str(most + 1)),
                   f"from 1 to {most}")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("url", ["http://localhost:99999/v1", "http://localhost:port/v1"])
@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_a_bad_base_url_port_names_the_option_exit_2_even_under_debug(tmp_path, url, debug):
    r = cli(tmp_path, "run", "--suite", "level1", "-p", "relu", "--cpu", "--provider", "openai", "--model", "m",
            "--base-url", url, *debug)
    one_error_line(r, "--base-url", "Port")


def test_baseline_without_a_gpu_does_not_point_at_a_flag_it_lacks(tmp_path):
    if subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("a GPU machine")
    line = one_error_line(cli(tmp_path, "baseline", "--suite", "level1", "-p", "relu"), "no GPU visible", "GPU timings")
    assert "--cpu" not in line


def test_every_run_flag_is_a_config_key():
    """The config file takes the flags' names: every option of `cuforge run`, none refused as unknown."""
    import typer.main

    from cuforge.agent.config import ConfigError, settings_from_toml
    from cuforge.cli import app

    command = typer.main.get_command(app).commands["run"]
    names = [p.name for p in command.params if p.name not in ("config", "help")]
    assert len(names) > 30 and "results" in names and "resume" in names
    for name in names:
        key = {"as_json": "json"}.get(name, name).replace("_", "-")
        try:  # the key is looked up before its value's type is checked
            settings_from_toml({key: "x"})
        except ConfigError as e:
            assert "unknown setting" not in str(e), (name, e)


def test_a_config_file_sets_the_store_and_json_like_the_flags(tmp_path):
    (tmp_path / "run.toml").write_text('suite = "level1"\nproblem = ["relu"]\ncompile-only = true\nislands = 1\n'
                                       'generations = 1\nresults = "elsewhere/store.db"\njson = true\n')
    r = cli(tmp_path, "run", "--config", "run.toml")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["evaluations"] == 1 and summary["compile_only"] is True
    assert (tmp_path / "elsewhere" / "store.db").is_file() and not (tmp_path / "results").exists()
    (tmp_path / "bad.toml").write_text('config = "other.toml"\n')
    one_error_line(cli(tmp_path, "run", "--config", "bad.toml"), "cannot include")


def test_compile_only_counts_compiled_and_a_finished_run_has_no_waiting_problem(tmp_path):
    r = cli(tmp_path, "run", "--suite", "level1", "-p", "relu", "-p", "softmax", "--compile-only", "--islands", "1",
            "--generations", "2", "--wall-time", "2000")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 evaluations (4 compiled)" in r.stdout and "succeeded" not in r.stdout, r.stdout
    assert "waiting" not in r.stdout and "running" not in r.stdout
    # Ended by its wall time with problems never reached: each says why it is open, none "waiting".
    r = cli(tmp_path, "run", "--suite", "level1", "--compile-only", "--wall-time", "3", "--results", "w.db")
    table = [line for line in r.stdout.splitlines() if line.startswith("level1/")]
    assert len(table) == 22 and not any("waiting" in line for line in table), r.stdout
    assert any("open: wall time of 3 s used" in line for line in table), r.stdout


def test_piped_output_keeps_ids_and_lines_whole(tmp_path):
    r = cli(tmp_path, "problems", "list", "--suite", "level1")
    assert r.returncode == 0
    ids = [line.split("\t")[0] for line in r.stdout.splitlines()[2:]]
    assert "level1/argmax_dim" in ids and all(i.startswith("level1/") for i in ids), r.stdout[:2000]
    r = cli(tmp_path, "problems", "show", "level1/relu")
    source = (ROOT / "src/cuforge/problems/builtin/level1/relu.py").read_text().splitlines()
    longest = max(source, key=len)
    assert any(line.endswith(longest) for line in r.stdout.splitlines()), r.stdout[:3000]
    assert "offline search\telementwise" in r.stdout
    from fixture_store import build

    build(tmp_path / "r.db").close()
    r = cli(tmp_path, "leaderboard", "--results", str(tmp_path / "r.db"))
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines() if line.startswith("hgemm/")]
    assert rows and all(len(row) == 6 and row[0].count("_") == 2 for row in rows), r.stdout[:2000]


def test_an_uncovered_problem_gets_one_line_in_the_run_table_and_its_whole_reason_in_the_report(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "sort.py").write_text(textwrap.dedent("""
        import torch
        N = 64
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.sort(x, dim=1).values
        def get_inputs():
            return [torch.randn(N, N)]
        def get_init_inputs():
            return []
    """))
    r = cli(tmp_path, "run", "--suite", str(suite), "--compile-only", "--results", "r.db")
    table = [line for line in r.stdout.splitlines() if line.startswith("suite/sort")]
    assert len(table) == 1 and "not covered offline" in table[0] and len(table[0]) < 200, r.stdout
    r = cli(tmp_path, "report", "--results", "r.db", "-o", "report.html")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "report.html").read_text()
    assert "search ended" in html and html.count("supports") + html.count(": ") > 5


BIG = """
import torch
N = 16384
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
def get_inputs():
    return [torch.randn(N, N)]
def get_init_inputs():
    return []
"""


def test_cpu_mode_refuses_a_big_problem_without_small_sizes_in_one_line(tmp_path):
    (tmp_path / "big.py").write_text(BIG)
    (tmp_path / "cand.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                                      "    def forward(self, x):\n        return torch.softmax(x, dim=1)\n")
    one_error_line(cli(tmp_path, "eval", "big.py", "cand.py", "--cpu", timeout=120), "--cpu", "declares none",
                   "1024 MiB", "CUFORGE = {'small'")
    (tmp_path / "big_small.py").write_text(BIG.replace("N = 16384", "N = 16384\nCUFORGE = {'small': {'N': 32}}"))
    r = cli(tmp_path, "eval", "big_small.py", "cand.py", "--cpu", "--json", timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "ok", r.stderr[-2000:]


def test_run_names_every_problem_file_it_skips_before_starting_and_keeps_them(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "relu.py").write_text(relu_problem_source())
    os.mkfifo(suite / "evil.py")
    (suite / "broken.py").write_text("import torch\nraise RuntimeError('this file is broken')\n")
    (suite / "hangs.py").write_text("import time\ntime.sleep(3600)\n")
    for args in (["problems", "list", "--suite", str(suite), "--timeout", "5"], ["problems", "validate", str(suite), "--timeout", "5"],
                 ["problems", "validate", str(suite / "evil.py")]):
        r = cli(tmp_path, *args, timeout=120)
        assert "evil.py" in r.stdout + r.stderr and "FIFO" in r.stdout + r.stderr, (args, r.stdout, r.stderr)
    r = cli(tmp_path, "run", "--suite", str(suite), "--compile-only", "--islands", "1", "--generations", "1",
            "--inspect-timeout", "5", "--results", "r.db", timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    err = r.stderr
    assert "skipped" in err and "evil.py" in err and "FIFO" in err and "broken.py" in err and "hangs.py" in err, err
    assert "this file is broken" in err and "within 5 s" in err
    assert err.index("skipped") < err.index("candidate 1"), err
    assert "inspecting" in err and err.index("inspecting") < err.index("skipped"), err  # never silent while it waits
    c = sqlite3.connect(tmp_path / "r.db")
    kept = {Path(p).name: why for p, why in c.execute("SELECT path, reason FROM run_skipped")}
    c.close()
    assert set(kept) == {"evil.py", "broken.py", "hangs.py"}
    cli(tmp_path, "report", "--results", "r.db", "-o", "report.html")
    html = (tmp_path / "report.html").read_text()
    assert "not loaded" in html and "evil.py" in html and "this file is broken" in html

    (suite / "relu.py").unlink()
    r = cli(tmp_path, "run", "--suite", str(suite), "--compile-only", "--inspect-timeout", "5", "--results", "r2.db",
            timeout=240)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "no loadable problems" in last, r.stderr[-2000:]
    assert "evil.py" in last and "broken.py" in last and "hangs.py" in last, last
