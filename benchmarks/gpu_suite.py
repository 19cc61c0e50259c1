"""The GPU test suite (`pytest -m gpu`) at one tree of the code, run over as many calls as it takes.

The whole suite needs more GPU time than one device call allows (10 minutes). Each call runs the tests
this tree has not yet passed or skipped (failed ones again), records each outcome the moment pytest
knows it (tests/outcome_log.py, which the suite's conftest loads), starts no test in the last
--drain-s seconds so that the tests running may finish (gpu_suite_deadline.py), and stops its pytest at
--limit-s, so a call cut short keeps everything that ran. The record, benchmarks/results/NAME.json, names the
tree by a digest of src/, tests/ and pyproject.toml; a call on another tree is refused, so "every GPU
test passed" in one record means at one tree of the code.

    python benchmarks/gpu_suite.py --name gpu_suite_s53 --processes 12 --limit-s 540
    python benchmarks/gpu_suite.py --name gpu_suite_s53 --processes 12 --limit-s 540   # the tests left
    python benchmarks/gpu_suite.py --name gpu_suite_s53 --take gpu_owed_s53 --no-run    # a call over a few files

--failed-alone runs the tests whose last run failed first, each alone (one test process), then the
rest: a test that failed for want of the GPU memory other test processes held is told from one that
fails on its own.

A record keeps the test paths it was started over, and a call over other paths under its name is
refused: counting against fewer tests would make part of the suite read as all of it. A call over a few
files gets its own --name, and --take counts it toward the whole suite's record.

--take NAME counts the outcomes of another record of the same tree (a call over a few test files) in
this one, as a call of its own whose runs name the call they came from.

The test processes take turns on each GPU, so a test's wall time grows with their number: beside 11
others on one H200, single tests ran 2-6 minutes. A call interrupted with all of them in flight loses
that work, which is why the drain: the tests still running when starts stop have its length to finish,
and as they finish the rest get the GPU more often.

Exit status: 0 every collected test has run and none failed; 1 a test's last run failed; 3 tests are
left to run; 2 bad input (another tree's record, a file that is not one, nothing collected).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from _common import ROOT, stamp, write_result

DONE = ("passed", "skipped")
DEADLINE_PLUGIN = "gpu_suite_deadline"  # benchmarks/gpu_suite_deadline.py
DRAIN_SHARE = 1 / 3  # of --limit-s, where --drain-s is not given
TREE_PARTS = ("src", "tests", "pyproject.toml")


def refuse(why: str) -> NoReturn:
    """Bad input: one line naming the cause, exit status 2."""
    print(f"gpu_suite: {why}", file=sys.stderr)
    raise SystemExit(2)


def tree_digest(root: Path) -> str:
    """SHA-256 over the path and bytes of every file under src/ and tests/ and of pyproject.toml, in
    path order; left out: what a local install or run makes there and a copy of the tree lacks
    (compiled Python, the editable install's egg-info)."""
    h = hashlib.sha256()
    for part in TREE_PARTS:
        base = root / part
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc" or any(p.endswith(".egg-info") for p in f.parts):
                continue
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\1")
    return h.hexdigest()


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU here."""
    import torch

    return torch.cuda.is_available()


def collect(root: Path, marker: str, paths: list[str]) -> list[str]:
    """Node ids of the tests the marker selects, in pytest's order."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker, *paths],
                       cwd=root, capture_output=True, text=True)
    if r.returncode not in (0, 5):  # 5: nothing collected, said below
        refuse(f"collecting the tests failed (pytest exit {r.returncode}): "
                         f"{(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    ids = []
    for line in r.stdout.splitlines():  # the ids, then a blank line and the count
        if not line.strip():
            break
        if "::" in line:
            ids.append(line)
    return ids


def run_tests(root: Path, marker: str, ids: list[str], processes: int, limit_s: float, drain_s: float,
              log: Path) -> tuple[float, bool]:
    """Run `ids` (an argument file, one id a line), starting none in the last `drain_s` seconds;
    interrupt pytest at `limit_s`. (wall s, cut short)."""
    with tempfile.NamedTemporaryFile("w", suffix=".args", delete=False) as f:
        f.write("\n".join(ids) + "\n")
        args_file = f.name
    start_no_test_after = time.time() + limit_s - drain_s
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", DEADLINE_PLUGIN,
           f"--start-no-test-after={start_no_test_after:.3f}", "-m", marker, f"@{args_file}"]
    if processes > 0:
        cmd += ["-n", str(processes)]
    # The plugin is found after the project's own modules: it lies beside this runner, not in the tree tested.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(Path(__file__).resolve().parent)) if p)
    env = dict(os.environ, CUFORGE_TEST_LOG=str(log), PYTHONPATH=path)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, start_new_session=True)
    cut = False
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        cut = True
        os.killpg(proc.pid, signal.SIGINT)  # pytest ends its session and its test processes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        os.unlink(args_file)
    return time.monotonic() - t0, cut


def read_log(log: Path) -> list[dict[str, Any]]:
    """The outcome log's entries; a setup or teardown failure counts as an error."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        outcome = "error" if e.get("outcome") == "failed" and e.get("when") != "call" else e.get("outcome")
        out.append({"test": e["test"], "outcome": outcome, "seconds": e.get("seconds"), **({"failure": e["failure"]} if "failure" in e else {})})
    return out


def read_record(path: Path, tree: str, said: str, foreign: str, other_tree: str) -> dict[str, Any]:
    """A record of `tree` at `path`; else one line (`said` first) naming what is wrong and, after it,
    what to do about a foreign file or another tree's record; SystemExit(2)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        refuse(f"{said}{path} is not a GPU-suite record ({e})")
    if not isinstance(record, dict) or "tree" not in record or "tests" not in record:
        refuse(f"{said}{path} is not a GPU-suite record (no tree and tests){foreign}")
    if record["tree"] != tree:
        refuse(f"{said}{path} records tree {record['tree'][:12]}, this tree is {tree[:12]}: {other_tree}")
    return record


def load_record(path: Path, tree: str) -> dict[str, Any]:
    """This tree's record so far ({} for none); SystemExit(2) for another tree's or a foreign file."""
    if not path.exists():
        return {}
    return read_record(path, tree, "", ": choose another --name", "the code changed, so start a new --name")


def take(path: Path, tree: str, tests: dict[str, list[dict[str, Any]]], wanted: set[str], call: int) -> dict[str, Any]:
    """Another record's outcomes, of this tree and of tests this suite collects, added to `tests` as
    call `call` (each run naming the call it came from) where this record has none that passed or
    skipped: a call over a few test files at the same tree counts toward the whole suite. What the
    taken call ran on (date, GPU, torch, how many tests)."""
    if not path.exists():
        refuse(f"--take: no record {path}")
    other = read_record(path, tree, "--take: ", "", "only the same code's outcomes count")
    mine = last_outcomes({"tests": tests})
    n = 0
    for test, runs in other["tests"].items():
        if test in wanted and runs and mine.get(test) not in DONE:
            tests.setdefault(test, []).extend({**r, "call": call, "taken_from_call": r.get("call")} for r in runs)
            n += 1
    last_call = (other.get("calls") or [{}])[-1]
    return {"tests": n, **{k: last_call[k] for k in ("date", "gpu", "torch") if k in last_call}}


def last_outcomes(record: dict[str, Any]) -> dict[str, str]:
    return {test: runs[-1]["outcome"] for test, runs in record.get("tests", {}).items() if runs}


def summary(record: dict[str, Any], collected: list[str]) -> tuple[dict[str, int], int]:
    """Counts by last outcome (and not yet run), and the exit status they make."""
    last = last_outcomes(record)
    counts: dict[str, int] = {}
    for test in collected:
        key = last.get(test, "not run")
        counts[key] = counts.get(key, 0) + 1
    status = 1 if counts.get("failed") or counts.get("error") else 3 if counts.get("not run") else 0
    return counts, status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the record: benchmarks/results/NAME.json (kept across calls)")
    ap.add_argument("--processes", type=int, default=8, help="pytest-xdist test processes (0: none)")
    ap.add_argument("--limit-s", type=float, default=540.0, help="interrupt the tests after this many seconds")
    ap.add_argument("--drain-s", type=float, help="start no test in the last this many seconds of the limit "
                    "(default: a third of it)")
    ap.add_argument("--marker", default="gpu", help="the pytest marker expression that selects the suite")
    ap.add_argument("--root", default=str(ROOT), help="the project whose tree is digested and tested")
    ap.add_argument("--results", help="where the record lies (default ROOT/benchmarks/results)")
    ap.add_argument("--take", action="append", default=[], metavar="NAME",
                    help="count the outcomes of another record of this tree (a call over a few test files) here")
    ap.add_argument("--no-run", action="store_true", help="only take (--take) and write the record: run no test")
    ap.add_argument("--failed-alone", action="store_true",
                    help="first run the tests whose last run failed, one at a time in a pytest of their own, then "
                    "the rest: tells a failure the other test processes' load caused (GPU memory) from the test's own")
    ap.add_argument("paths", nargs="*", default=["tests"], help="test paths under the root")
    a = ap.parse_args(argv)
    root = Path(a.root).resolve()
    if a.limit_s <= 0 or a.processes < 0:
        refuse("--limit-s must be positive and --processes at least 0")
    drain_s = a.limit_s * DRAIN_SHARE if a.drain_s is None else a.drain_s
    if not 0 <= drain_s < a.limit_s:
        refuse(f"--drain-s must be at least 0 and under --limit-s ({a.limit_s:g}), not {drain_s:g}")
    if not a.no_run and "gpu" in re.findall(r"\w+", a.marker) and not gpu_visible():
        refuse("no GPU is visible here: the GPU tests would all skip, and a skip counts as done in the record")
    results = Path(a.results) if a.results else root / "benchmarks" / "results"
    path = results / f"{a.name}.json"
    tree = tree_digest(root)
    record = load_record(path, tree)
    if record and record.get("paths", ["tests"]) != a.paths:
        refuse(f"{path.name} records the tests under {' '.join(record.get('paths', ['tests']))}, not "
               f"{' '.join(a.paths)}: a call over other files gets its own --name, and --take counts it here")
    collected = collect(root, a.marker, a.paths)
    if not collected:
        refuse(f"no test under {', '.join(a.paths)} is marked {a.marker!r}")
    calls = list(record.get("calls", []))
    tests: dict[str, list[dict[str, Any]]] = dict(record.get("tests", {}))
    for name in a.take:
        if name == a.name:
            refuse(f"--take {name}: that is this record; name another record of the same tree")
        taken = take(results / f"{name}.json", tree, tests, set(collected), call=len(calls) + 1)
        calls.append({"call": len(calls) + 1, "taken_from": name, **taken})
    last = last_outcomes({"tests": tests})
    todo = [t for t in collected if last.get(t) not in DONE]
    if todo and not a.no_run:
        call = len(calls) + 1
        alone = [t for t in todo if last.get(t) in ("failed", "error")] if a.failed_alone else []
        rest = [t for t in todo if t not in alone]
        wall, cut, entries = 0.0, False, []
        with tempfile.TemporaryDirectory() as tmp:
            for i, (ids, processes) in enumerate(((alone, 0), (rest, a.processes))):
                left_s = a.limit_s - wall
                if not ids or cut or left_s <= drain_s:
                    continue
                log = Path(tmp) / f"outcomes{i}.jsonl"
                took, cut = run_tests(root, a.marker, ids, processes, left_s, drain_s, log)
                wall += took
                entries += read_log(log)
        wanted = set(collected)
        for e in entries:
            test = e.pop("test")
            # pytest-xdist's --dist loadgroup reports a grouped test as "id@group".
            bare = re.sub(r"@[^@\[\]/:]+$", "", test)
            tests.setdefault(bare if test not in wanted and bare in wanted else test, []).append({"call": call, **e})
        machine = {k: v for k, v in stamp().items() if k in ("date", "gpu", "torch")}
        calls.append({"call": call, **machine, "asked": len(todo), "reported": len(entries), "processes": a.processes,
                      **({"alone": len(alone)} if alone else {}),
                      "drain_s": round(drain_s, 1), "wall_s": round(wall, 1), "cut_at_limit": cut})
    done = {t for t, runs in tests.items() if runs}
    merged = {"tree": tree, "marker": a.marker, "paths": a.paths, "collected": len(collected), "calls": calls, "tests": tests,
              "left": [t for t in collected if t not in done]}
    counts, status = summary(merged, collected)
    merged["counts"] = counts
    results.mkdir(parents=True, exist_ok=True)
    ran = bool(todo and not a.no_run)
    if ran and results.resolve() == (ROOT / "benchmarks" / "results").resolve():
        write_result(a.name, merged, echo=False)  # the summary line below says what a call did
    else:  # another project's record (the runner's own tests), or no test run here: no new machine stamp
        kept = {k: v for k, v in record.items() if k not in merged and k != "benchmark"}
        path.write_text(json.dumps({"benchmark": a.name, **kept, **merged}, indent=2))
    print(f"tree {tree[:12]}: {len(collected)} tests; " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
          + f" (call {len(calls)})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
