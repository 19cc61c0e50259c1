"""benchmarks/gpu_suite.py over a real pytest suite of its own (a pass, a failure, a skip, a test that
waits): a call cut at its limit keeps what ran, the next call runs only what is left and what failed,
and a call on a changed tree is refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_GPU, ROOT, benchmark_module

RUNNER = ROOT / "benchmarks" / "gpu_suite.py"
TESTS = '''
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sample
GO = Path(__file__).resolve().parents[1] / "go"


def test_a_passes():
    assert True


def test_b_fails():
    assert 1 + 1 == 3, "arithmetic is broken"


def test_c_skips():
    pytest.skip("not on this machine")


def test_d_waits():
    deadline = time.monotonic() + 120
    while not GO.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.other
def test_e_is_not_selected():
    assert False
'''
CONFTEST = f'''
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from outcome_log import pytest_configure, pytest_runtest_logreport  # noqa: F401
'''
PYPROJECT = '[tool.pytest.ini_options]\nmarkers = ["sample: the runner test\'s suite", "other: left out"]\n'


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "code.py").write_text("X = 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "test_sample.py").write_text(TESTS)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


def runner(root: Path, limit_s: float, processes: int = 0, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), "--name", "suite", "--root", str(root), "--results", str(root / "results"),
                           "--marker", "sample and not other", "--processes", str(processes), "--limit-s", str(limit_s), *extra,
                           "tests"], capture_output=True, text=True, timeout=300)


def outcomes(root: Path) -> dict[str, list[tuple[int, str]]]:
    record = json.loads((root / "results" / "suite.json").read_text())
    return {test.split("::")[1]: [(r["call"], r["outcome"]) for r in runs] for test, runs in record["tests"].items()}


def test_a_suite_over_calls_at_one_tree(tmp_path):
    root = project(tmp_path)
    first = runner(root, 15)  # cut while test_d waits
    assert first.returncode == 1, first.stderr[-2000:]  # a failure outranks the tests left
    assert outcomes(root) == {"test_a_passes": [(1, "passed")], "test_b_fails": [(1, "failed")], "test_c_skips": [(1, "skipped")]}
    record = json.loads((root / "results" / "suite.json").read_text())
    assert record["collected"] == 4 and record["calls"][0]["cut_at_limit"] and record["calls"][0]["asked"] == 4
    assert "arithmetic is broken" in record["tests"][next(t for t in record["tests"] if "b_fails" in t)][0]["failure"]
    assert "1 failed, 1 not run, 1 passed, 1 skipped" in first.stderr

    (root / "go").write_text("")  # outside the digested tree: test_d may finish now
    second = runner(root, 120)
    assert second.returncode == 1, second.stderr[-2000:]
    got = outcomes(root)
    assert got["test_d_waits"] == [(2, "passed")] and got["test_b_fails"] == [(1, "failed"), (2, "failed")]
    assert got["test_a_passes"] == [(1, "passed")]  # not run again
    record = json.loads((root / "results" / "suite.json").read_text())
    assert record["calls"][1]["asked"] == 2 and not record["calls"][1]["cut_at_limit"]

    # Its table for docs/benchmarks.md: by file, then the failure's last line.
    docs_tables = benchmark_module("docs_tables")
    table = docs_tables.gpu_suite_rows(record)
    assert table[0].startswith(f"tree {record['tree'][:12]}: 4 tests, 1 failed, 2 passed, 1 skipped; 2 call(s)")
    assert "| tests/test_sample.py | 2 | 1 | 0 | 1 | 0 |" in table
    assert any(line.startswith("| tests/test_sample.py::test_b_fails | 2 |") and "arithmetic is broken" in line for line in table)

    (root / "src" / "code.py").write_text("X = 2\n")
    third = runner(root, 60)
    assert third.returncode == 2 and third.stderr.strip().count("\n") == 0
    assert "the code changed, so start a new --name" in third.stderr


CROWDED = """
import pytest

pytestmark = pytest.mark.sample


def test_needs_the_machine_to_itself(request):
    # What a GPU test that runs out of memory beside other test processes looks like: it fails in a
    # pytest-xdist test process and passes alone.
    assert not hasattr(request.config, "workerinput"), "out of memory: other test processes hold it"


def test_fails_anyway():
    assert False, "broken"


def test_fine():
    pass
"""


def test_failed_tests_run_alone_first_and_the_rest_after(tmp_path):
    root = project(tmp_path)
    (root / "tests" / "test_sample.py").write_text(CROWDED)
    first = runner(root, 120, 2)
    assert first.returncode == 1, first.stderr[-2000:]
    assert outcomes(root) == {"test_needs_the_machine_to_itself": [(1, "failed")], "test_fails_anyway": [(1, "failed")],
                              "test_fine": [(1, "passed")]}
    second = runner(root, 120, 2, "--failed-alone")
    assert second.returncode == 1, second.stderr[-2000:]  # the test that fails on its own still does
    got = outcomes(root)
    assert got["test_needs_the_machine_to_itself"] == [(1, "failed"), (2, "passed")]
    assert got["test_fails_anyway"] == [(1, "failed"), (2, "failed")] and got["test_fine"] == [(1, "passed")]
    call = json.loads((root / "results" / "suite.json").read_text())["calls"][1]
    assert call["alone"] == 2 and call["asked"] == 2 and call["reported"] == 2 and not call["cut_at_limit"]


def test_a_file_that_is_not_a_record_is_refused(tmp_path):
    root = project(tmp_path)
    (root / "results").mkdir()
    (root / "results" / "suite.json").write_text('{"benchmark": "something else"}')
    r = runner(root, 30)
    assert r.returncode == 2 and "is not a GPU-suite record" in r.stderr
    assert json.loads((root / "results" / "suite.json").read_text()) == {"benchmark": "something else"}  # left as it was


def test_tests_of_an_xdist_group_are_recorded_under_their_own_ids(tmp_path):
    # Under --dist loadgroup pytest-xdist reports a grouped test as "id@group": the record keeps the id.
    root = project(tmp_path)
    (root / "pyproject.toml").write_text(PYPROJECT + 'addopts = "--dist loadgroup"\n')
    (root / "tests" / "test_sample.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.sample\n\n\n@pytest.mark.xdist_group('g')\n"
        "def test_grouped():\n    assert True\n\n\ndef test_alone():\n    assert True\n")
    r = runner(root, 120, processes=2)
    assert r.returncode == 0, r.stderr[-2000:]
    assert outcomes(root) == {"test_grouped": [(1, "passed")], "test_alone": [(1, "passed")]}


WAIT_PAST_THE_DEADLINE = """
import time

import pytest

pytestmark = pytest.mark.sample


@pytest.mark.parametrize("k", range(4))
def test_runs_past_the_last_start(request, k):
    deadline = request.config.getoption("--start-no-test-after")
    while time.time() < deadline + 0.5:
        time.sleep(0.1)
"""


def test_no_test_starts_in_the_drain_and_the_ones_running_finish(tmp_path):
    # Two test processes; each test, once started, runs past the last start. So each process finishes the
    # one test it began, starts no other, and pytest ends on its own well before the limit.
    root = project(tmp_path)
    (root / "tests" / "test_sample.py").write_text(WAIT_PAST_THE_DEADLINE)
    r = runner(root, 60, 2, "--drain-s", "50")
    assert r.returncode == 3, r.stderr[-2000:]  # tests are left
    record = json.loads((root / "results" / "suite.json").read_text())
    assert sorted(run[-1]["outcome"] for run in record["tests"].values()) == ["passed", "passed"]
    assert len(record["left"]) == 2 and record["counts"] == {"passed": 2, "not run": 2}
    call = record["calls"][0]
    assert call["drain_s"] == 50 and not call["cut_at_limit"] and call["wall_s"] < 50


def test_a_drain_as_long_as_the_limit_is_refused(tmp_path):
    r = runner(project(tmp_path), 60, 0, "--drain-s", "60")
    assert r.returncode == 2 and "--drain-s must be at least 0 and under --limit-s (60)" in r.stderr
    assert not (tmp_path / "proj" / "results").exists()


def test_a_record_of_a_few_files_at_the_same_tree_counts_toward_the_suite(tmp_path):
    root = project(tmp_path)
    few = subprocess.run([sys.executable, str(RUNNER), "--name", "few", "--root", str(root), "--results", str(root / "results"),
                          "--marker", "sample and not other", "--processes", "0", "--limit-s", "60",
                          "tests/test_sample.py::test_a_passes", "tests/test_sample.py::test_c_skips"],
                         capture_output=True, text=True, timeout=300)
    assert few.returncode == 0, few.stderr[-2000:]
    taken = runner(root, 60, 0, "--take", "few", "--no-run")
    assert taken.returncode == 3, taken.stderr[-2000:]  # tests are left: none ran here
    record = json.loads((root / "results" / "suite.json").read_text())
    few_call = json.loads((root / "results" / "few.json").read_text())["calls"][0]
    assert record["calls"] == [{"call": 1, "taken_from": "few", "tests": 2,
                                **{k: few_call[k] for k in ("date", "gpu", "torch") if k in few_call}}]
    assert outcomes(root) == {"test_a_passes": [(1, "passed")], "test_c_skips": [(1, "skipped")]}
    assert all(r["taken_from_call"] == 1 for runs in record["tests"].values() for r in runs)
    assert record["counts"] == {"passed": 1, "skipped": 1, "not run": 2}

    itself = runner(root, 60, 0, "--take", "suite", "--no-run")
    assert itself.returncode == 2 and "that is this record" in itself.stderr
    missing = runner(root, 60, 0, "--take", "nothing", "--no-run")
    assert missing.returncode == 2 and "--take: no record" in missing.stderr and missing.stderr.strip().count("\n") == 0
    (root / "src" / "code.py").write_text("X = 2\n")  # another tree: its outcomes are not this code's
    other = subprocess.run([sys.executable, str(RUNNER), "--name", "fresh", "--root", str(root), "--results", str(root / "results"),
                            "--marker", "sample and not other", "--limit-s", "60", "--take", "few", "--no-run", "tests"],
                           capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "only the same code's outcomes count" in other.stderr, other.stderr
    assert not (root / "results" / "fresh.json").exists()


def test_a_call_over_other_files_is_refused_by_the_records_scope(tmp_path):
    """A record counts what is left of the tests it was started over; a call naming other files would
    change that count and make a part of the suite look like all of it."""
    root = project(tmp_path)

    def call(*paths: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(RUNNER), "--name", "few", "--root", str(root), "--results",
                               str(root / "results"), "--marker", "sample and not other", "--processes", "0",
                               "--limit-s", "60", *paths], capture_output=True, text=True, timeout=300)

    assert call("tests/test_sample.py::test_a_passes").returncode == 0
    before = (root / "results" / "few.json").read_text()
    assert json.loads(before)["paths"] == ["tests/test_sample.py::test_a_passes"]
    wider = call("tests")
    assert wider.returncode == 2 and wider.stderr.strip().count("\n") == 0, wider.stderr
    assert "records the tests under tests/test_sample.py::test_a_passes, not tests" in wider.stderr
    assert (root / "results" / "few.json").read_text() == before


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible here")
def test_the_gpu_suite_is_not_recorded_where_no_gpu_would_run_it(tmp_path):
    root = project(tmp_path)
    r = subprocess.run([sys.executable, str(RUNNER), "--name", "suite", "--root", str(root), "--results", str(root / "results"),
                        "--marker", "gpu", "--limit-s", "60", "tests"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no GPU is visible here" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not (root / "results").exists()
