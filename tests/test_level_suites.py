"""benchmarks/level_suites.py, compile-only on the CPU from a copy of the benchmarks folder (so its record
lands in the copy): the search's store is kept where --store-dir says, its record names it and keeps the
search's own torch.compile ratio field, and a second run under the same name is refused, the store left
as it was."""

import json
import shutil
import sqlite3
import subprocess
import sys

from conftest import ROOT


def run(bench, *args):
    return subprocess.run([sys.executable, str(bench / "level_suites.py"), "--suite", "models", "--compile-only",
                           "--generations", "1", "--problem", "models/rotary_half", *args],
                          capture_output=True, text=True, timeout=600)


def test_the_search_store_is_kept_and_never_overwritten(tmp_path):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name in ("level_suites.py", "_common.py"):
        shutil.copy(ROOT / "benchmarks" / name, bench / name)
    store = tmp_path / "stores"
    done = run(bench, "--store-dir", str(store), "--name", "kept")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    db = store / "kept-models.db"
    record = json.loads((bench / "results" / "kept.json").read_text())
    suite = record["suites"]["models"]
    assert suite["store"] == str(db) and f"results store {db}" in done.stdout
    assert [r["problem"] for r in suite["rows"]] == ["models/rotary_half"] and "search_vs_torch_compile" in suite["rows"][0]
    with sqlite3.connect(db) as conn:
        assert conn.execute("select problem_id, status from evaluations").fetchall() == [("models/rotary_half", "compiled")]
    before = db.read_bytes()
    again = run(bench, "--store-dir", str(store), "--name", "kept")
    assert again.returncode != 0 and f"{db} exists; pick another --name or --store-dir" in again.stderr
    assert db.read_bytes() == before
