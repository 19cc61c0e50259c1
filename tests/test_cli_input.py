"""Every command refuses bad input with one clear line and exit code 2, touches no file it did not
create, and never replaces the results store it reads."""

import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

ENV_NO_KEYS = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}


def cli(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "cuforge.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**ENV_NO_KEYS, "PYTHONPATH": str(ROOT / "src"), **(env or {})})


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working directory with a user's files in it: a results store with a run, notes, a problem
    file, a binary file, a bad price table, bad configs, an export directory the user owns."""
    from fixture_store import build

    d = tmp_path_factory.mktemp("work")
    build(d / "store.db").close()
    (d / "notes.txt").write_text("my notes\n")
    (d / "blob.py").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (d / "latin1.py").write_bytes("class ModelNew: pass  # caf\xe9\n".encode("latin-1"))
    (d / "bad_prices.toml").write_text('["m"]\ninput = "cheap"\noutput = 1\n')
    (d / "types.toml").write_text('islands = "four"\n')
    (d / "typo.toml").write_text('wall_tme = 30\n')
    (d / "unknown_provider.toml").write_text('provider = "gemini"\nmodel = "x"\n')
    (d / "report.html").write_text("<p>my own page</p>\n")
    (d / "mine").mkdir()
    (d / "mine" / "CMakeLists.txt").write_text("project(mine)\n")
    (d / "cand.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    return d


CASES = [
    # (args, words the one line must hold)
    (["run", "--budget-usd", "-5", "--suite", "level1"], "--budget-usd"),
    (["run", "--budget-usd", "0", "--suite", "level1"], "--budget-usd"),
    (["run", "--budget-tokens", "0"], "--budget-tokens"),
    (["run", "--patience", "-1"], "--patience"),
    (["run", "--temperature", "99"], "--temperature"),
    (["run", "--max-tokens", "-1"], "--max-tokens"),
    (["run", "--islands", "0"], "--islands"),
    (["run", "--generations", "0"], "--generations"),
    (["run", "--concurrency", "0"], "--concurrency"),
    (["run", "--wall-time", "0"], "--wall-time"),
    (["run", "--max-retries", "99"], "--max-retries"),
    (["run", "--max-failures", "0"], "--max-failures"),
    (["run", "--islands", "many"], "--islands"),
    (["run", "--price-in", "1", "--compile-only"], "--price-out"),
    (["run", "--baseline", "foo", "--compile-only"], "--baseline"),
    (["run", "--provider", "gemini", "--model", "x", "--compile-only"], "--provider"),
    (["run", "--provider", "openai", "--compile-only"], "--model"),
    (["run", "--provider", "openai", "--model", "gpt-4.1", "--compile-only"], "OPENAI_API_KEY"),
    (["run", "--provider", "anthropic", "--model", "claude", "--compile-only"], "ANTHROPIC_API_KEY"),
    (["run", "--provider", "replay", "--replay", "missing.jsonl", "--compile-only"], "--replay"),
    (["run", "--provider", "replay", "--replay", "notes.txt", "--compile-only"], "notes.txt:1: not JSON"),
    (["run", "--provider", "openai", "--model", "m", "--base-url", "localhost:8000", "--compile-only"], "--base-url"),
    (["run", "--provider", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--prices",
      "bad_prices.toml", "--compile-only"], "--prices"),
    (["run", "--provider", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--budget-usd", "1",
      "--compile-only"], "--budget-usd"),
    (["run", "--config", "types.toml", "--compile-only"], "islands"),
    (["run", "--config", "typo.toml", "--compile-only"], "wall-time"),
    (["run", "--config", "unknown_provider.toml", "--compile-only"], "--provider"),
    (["run", "--config", "missing.toml"], "--config"),
    (["run", "--config", "notes.txt"], "--config"),
    (["run", "--suite", "no_such_suite", "--compile-only"], "no_such_suite"),
    (["run", "--suite", "level1", "--problem", "no_such_problem", "--compile-only"], "--problem"),
    (["run", "--executor", "slurm", "--compile-only"], "--executor"),
    (["run", "--gpus", "999", "--cpu"], "--gpus"),
    (["run", "--suite", "level1"], "--gpus"),  # no GPU here: the error comes before anything else
    (["run", "--reasoning-effort", "extreme", "--provider", "openai", "--model", "m"], "--reasoning-effort"),
    (["run", "--results", "notes.txt", "--compile-only"], "not an SQLite database"),
    (["run", "--results", "notes.txt/cuforge.db", "--compile-only"], "notes.txt"),
    (["run", "--resume", "run-nope", "--results", "store.db"], "run-nope"),
    (["run", "--resume", "run-nope", "--results", "missing.db"], "missing.db"),
    (["eval", "level1/relu", "blob.py", "--cpu"], "blob.py"),
    (["eval", "level1/relu", "latin1.py", "--cpu"], "not UTF-8"),
    (["eval", "level1/relu", "missing.py", "--cpu"], "missing.py"),
    (["eval", "level1/relu", "mine", "--cpu"], "mine"),
    (["eval", "level1/relu", "notes.txt", "--cpu"], "ModelNew"),
    (["eval", "level1/relu", "cand.py", "--trials", "3"], "--trials"),
    (["eval", "level1/relu", "cand.py", "--timeout", "0"], "--timeout"),
    (["eval", "level1/relu", "cand.py", "--gpu", "-1"], "--gpu"),
    (["eval", "level1/relu", "cand.py", "--compile-mode", "fast"], "--compile-mode"),
    (["eval", "level1/relu", "cand.py", "--cpu", "--baselines", "foo"], "--baselines"),
    (["eval", "level1/relu", "cand.py", "--cpu", "--policy", "lenient"], "--policy"),
    (["eval", "level1/no_such", "cand.py", "--cpu"], "no_such"),
    (["eval", "level1/relu", "cand.py"], "GPU"),
    (["baseline", "--suite", "no_such_suite"], "no_such_suite"),
    (["baseline", "--suite", "level1", "--baselines", "foo"], "--baselines"),
    (["leaderboard", "--baseline", "foo", "--results", "store.db"], "--baseline"),
    (["leaderboard", "--results", "notes.txt"], "not an SQLite database"),
    (["leaderboard", "--results", "missing.db"], "missing.db"),
    (["leaderboard", "--run", "run-nope", "--results", "store.db"], "run-nope"),
    (["report", "--results", "store.db", "-o", "store.db"], "results store being read"),
    (["report", "--results", "store.db", "-o", "store.db", "--force"], "results store being read"),
    (["report", "--results", "store.db", "-o", "report.html"], "--force"),
    (["report", "--results", "store.db", "--baseline", "foo"], "--baseline"),
    (["report", "--results", "store.db", "-o", "mine"], "directory"),
    (["results", "list", "--results", "notes.txt"], "not an SQLite database"),
    (["results", "export", "run-fixture", "--results", "store.db", "-o", "store.db", "--force"], "results store being read"),
    (["results", "export", "run-fixture", "--results", "store.db", "-o", "notes.txt"], "--force"),
    (["results", "export", "run-fixture", "--results", "store.db", "--format", "xml"], "--format"),
    (["export", "--to", "out", "--format", "wheel", "--results", "store.db"], "--format"),
    (["export", "--to", "out", "--min-speedup", "0", "--results", "store.db"], "--min-speedup"),
    (["export", "--to", "out", "--jobs", "0", "--results", "store.db"], "--jobs"),
    (["export", "--to", "out", "--arch", "sm_xx", "--results", "store.db"], "--arch"),
    (["export", "--to", "mine", "--results", "store.db"], "CMakeLists.txt"),
    (["export", "--to", "notes.txt", "--results", "store.db"], "notes.txt"),
    (["problems", "show", "level1/no_such"], "no_such"),
    (["problems", "list", "--suite", "no_such_dir/"], "no_such_dir"),
    (["problems", "validate", "no_such_dir/"], "no_such_dir"),
    (["no-such-command"], "no-such-command"),
]


@pytest.mark.parametrize("args, words", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_every_file_alone(work, args, words):
    before = tree_hash(work)
    r = cli(work, *args)
    # Progress a file-by-file load prints where the trace cache is cold ("inspecting PATH ...") is not
    # part of the error; which test ran first decides whether there is any.
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("inspecting ")]
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-1500:]
    assert words in lines[0], lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert tree_hash(work) == before


def test_debug_shows_the_traceback_of_an_unexpected_error(work):
    # A results path whose parent is a file: described in one line; --debug adds nothing for expected errors,
    # and the boundary's own message names the cause.
    r = cli(work, "run", "--results", "notes.txt/cuforge.db", "--compile-only", "--debug")
    assert r.returncode == 2 and "notes.txt" in r.stderr


def test_report_and_exports_never_replace_the_store_or_user_files(work, tmp_path):
    db = work / "store.db"
    store_bytes = db.read_bytes()
    ok = cli(work, "report", "--results", "store.db", "-o", str(tmp_path / "r.html"))
    assert ok.returncode == 0, ok.stderr
    again = cli(work, "report", "--results", "store.db", "-o", str(tmp_path / "r.html"))
    assert again.returncode == 2 and "--force" in again.stderr
    forced = cli(work, "report", "--results", "store.db", "-o", str(tmp_path / "r.html"), "--force")
    assert forced.returncode == 0
    # The store is read read-only: not one byte changed, no WAL file made beside it.
    assert db.read_bytes() == store_bytes and not (work / "store.db-wal").exists()
    (tmp_path / "dir").mkdir()
    r = cli(work, "report", "--results", str(work), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 2 and "cuforge.db" in r.stderr  # a directory means DIR/cuforge.db, in every command


def test_a_read_only_store_can_be_read_and_is_not_converted(tmp_path):
    from fixture_store import build

    db = tmp_path / "ro.db"
    build(db).close()
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=DELETE")
    for table, col in (("runs", "host"), ("runs", "pid"), ("runs", "pid_start"), ("runs", "heartbeat_at"),
                       ("llm_calls", "estimated"), ("candidates", "started_at")):
        c.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    c.execute("DROP TABLE run_skipped")
    c.execute("PRAGMA user_version = 3")  # as an older cuforge left it
    c.commit()
    c.close()
    before = db.read_bytes()
    os.chmod(db, 0o444)
    os.chmod(tmp_path, 0o555)
    try:
        for args in (["leaderboard", "--results", str(db), "--json"], ["results", "list", "--results", str(db)],
                     ["report", "--results", str(db), "-o", "-"]):
            r = cli(tmp_path, *args)
            assert r.returncode == 0, (args, r.stderr)
    finally:
        os.chmod(tmp_path, 0o755)
        os.chmod(db, 0o644)
    assert db.read_bytes() == before
    c = sqlite3.connect(db)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert c.execute("PRAGMA user_version").fetchone()[0] == 3
    c.close()


def test_a_foreign_sqlite_file_is_refused_and_untouched(tmp_path):
    db = tmp_path / "other.db"
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE t (x)")
    c.commit()
    c.close()
    before = db.read_bytes()
    for args in (["leaderboard", "--results", str(db)], ["run", "--results", str(db), "--compile-only",
                                                         "--suite", "hgemm-small", "--problem", "hgemm/64_64_64"]):
        r = cli(tmp_path, *args)
        assert r.returncode == 2 and "not a cuforge results store" in r.stderr, r.stderr
    assert db.read_bytes() == before and not (tmp_path / "other.db-wal").exists()


def test_export_writes_a_manifest_and_only_replaces_its_own_files(tmp_path):
    from cuforge.outputs import MANIFEST, OutputError, write_tree

    out = tmp_path / "lib"
    write_tree(out, {out / "src" / "a.cu": "A1", out / "README.md": "r1"})
    assert (out / MANIFEST).is_file()
    (out / "NOTES.md").write_text("mine")  # a user file beside the export
    write_tree(out, {out / "src" / "a.cu": "A2", out / "src" / "b.cu": "B"})  # a.cu replaced, README.md gone
    assert (out / "src" / "a.cu").read_text() == "A2" and not (out / "README.md").exists()
    assert (out / "NOTES.md").read_text() == "mine"
    (out / "src" / "b.cu").write_text("edited by the user")
    with pytest.raises(OutputError, match=r"src/b.cu \(changed since cuforge wrote it\)"):
        write_tree(out, {out / "src" / "b.cu": "B2"})
    with pytest.raises(OutputError, match=r"NOTES.md \(not written by cuforge\)"):
        write_tree(out, {out / "NOTES.md": "ours"})
    assert (out / "src" / "b.cu").read_text() == "edited by the user" and (out / "NOTES.md").read_text() == "mine"
    other = tmp_path / "user_dir"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="not empty and was not made by cuforge"):
        write_tree(other, {other / "a": "b"})


def test_the_toml_config_takes_the_flags_names(tmp_path):
    from cuforge.agent.config import ConfigError, load_toml, merge

    f = tmp_path / "run.toml"
    f.write_text('suite = "level1"\nproblem = ["relu", "gelu"]\nprovider = "openai"\nmodel = "gpt-4.1"\n'
                 'base-url = "http://127.0.0.1:8000/v1"\nwall-time = 60\nbudget_usd = 2.5\nmax-failures = 3\n'
                 'compile-only = true\nworker-memory = 8\n')
    cfg = merge(load_toml(f), {})
    assert cfg.problems == ["relu", "gelu"] and cfg.wall_time_s == 60 and cfg.budget_usd == 2.5
    assert cfg.proposers[0].base_url == "http://127.0.0.1:8000/v1" and cfg.max_failures == 3 and cfg.compile_only
    assert cfg.worker_memory_gib == 8
    f.write_text("wall_time = 30\n")
    assert merge(load_toml(f), {}).wall_time_s == 30
    f.write_text("generatoins = 3\n")
    with pytest.raises(ConfigError, match="unknown setting 'generatoins'; did you mean 'generations'"):
        load_toml(f)
    f.write_text("compile_only = 1\n")
    with pytest.raises(ConfigError, match="compile_only must be true or false"):
        load_toml(f)


def test_cpu_mode_shows_a_real_ok_for_a_pure_pytorch_candidate():
    r = cli(ROOT, "eval", "level1/relu", "tests/candidates/cpu_relu_ok.py", "--cpu", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    ev = json.loads(r.stdout)
    assert ev["status"] == "ok" and ev["correctness"]["trials_passed"] == 5
    # The problem names torch.compile; a CPU test evaluation times it only when --baselines names it.
    assert "torch" in ev["timings"] and "torch.compile" not in ev["timings"]
    r = cli(ROOT, "eval", "level1/relu", "tests/candidates/cpu_relu_ok.py", "--cpu")
    assert r.returncode == 0 and "torch.compile is not timed" in r.stderr and "--baselines" in r.stderr, r.stderr


def test_a_cpu_test_evaluation_times_torch_compile_only_where_named():
    from cuforge.cli.eval_cmd import cpu_test_baselines

    assert cpu_test_baselines(("torch", "torch.compile", "cublas"), named=False) == ("torch", "cublas")
    assert cpu_test_baselines(("torch", "torch.compile"), named=True) == ("torch", "torch.compile")
    assert cpu_test_baselines(("torch",), named=False) == ("torch",)


def test_a_runaway_cpu_candidate_is_stopped_by_its_own_limit(tmp_path):
    (tmp_path / "hog.py").write_text(
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        hog = torch.ones(64 * 2**30, dtype=torch.uint8)\n        return x.clamp_min(0) + hog[0] * 0\n")
    r = cli(ROOT, "eval", "level1/relu", str(tmp_path / "hog.py"), "--cpu", "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    import json

    ev = json.loads(r.stdout)
    assert ev["status"] in ("runtime_error", "crash") and ("memory" in ev["message"].lower()
                                                           or "alloc" in ev["message"].lower()), ev["message"]


def test_outputs_onto_devices_pipes_and_sockets_are_refused(tmp_path):
    """Every output path is a regular file the user named, or - for standard output: a device, a
    FIFO, a socket (or a link to one) is refused in one line, exit 2, and left as it was."""
    import socket

    from fixture_store import build

    build(tmp_path / "r.db").close()
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "out.sock"))
    (tmp_path / "link.html").symlink_to("/dev/null")
    targets = {"/dev/null": "character device", "/dev/full": "character device", str(fifo): "FIFO",
               str(tmp_path / "out.sock"): "socket", str(tmp_path / "link.html"): "character device"}
    try:
        for target, kind in targets.items():
            for args in (["report", "-o", target], ["report", "-o", target, "--force"],
                         ["results", "export", "run-fixture", "-o", target, "--force"], ["export", "--to", target]):
                r = cli(tmp_path, *args, "--results", str(tmp_path / "r.db"))
                lines = r.stderr.strip().splitlines()
                assert r.returncode == 2 and len(lines) == 1 and kind in lines[0] and target in lines[0], (args, r.stderr)
                assert "wrote" not in r.stdout + r.stderr
    finally:
        sock.close()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert stat.S_ISSOCK(os.stat(tmp_path / "out.sock").st_mode) and os.path.islink(tmp_path / "link.html")
    r = cli(tmp_path, "report", "-o", "-", "--results", str(tmp_path / "r.db"))
    assert r.returncode == 0 and r.stdout.startswith("<!DOCTYPE html>"), r.stderr
    r = cli(tmp_path, "results", "export", "run-fixture", "-o", "-", "--results", str(tmp_path / "r.db"))
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("candidate_id") or "problem_id" in r.stdout.splitlines()[0]


def test_a_write_that_fails_names_the_path_and_leaves_nothing_half_written(tmp_path):
    """A full disk, here a file-size limit: one line naming the output, exit 2, no file left."""
    import resource

    from fixture_store import build

    build(tmp_path / "r.db").close()

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    for args in (["report", "-o", "big.html"], ["results", "export", "run-fixture", "-o", "big.csv"]):
        r = subprocess.run([sys.executable, "-m", "cuforge.cli", *args, "--results", str(tmp_path / "r.db")],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, preexec_fn=small_files,
                           env={**ENV_NO_KEYS, "PYTHONPATH": str(ROOT / "src")})
        assert r.returncode == 2 and f"cannot write {args[-1]}" in r.stderr and "too large" in r.stderr, (args, r.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.db"], list(tmp_path.iterdir())
