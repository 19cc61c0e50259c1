"""The outcome log (outcome_log.py) of a real pytest run that is killed mid-way: the failure before the
kill is on disk with its message, the test after it never started."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = '''
import time

def test_passes():
    assert True

def test_fails():
    assert 1 + 1 == 3, "arithmetic is broken"

def test_hangs():
    time.sleep(120)
'''


def test_a_killed_run_keeps_the_outcomes_it_had(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    log = tmp_path / "outcomes.jsonl"
    env = dict(os.environ, CUFORGE_TEST_LOG=str(log), PYTHONPATH=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "outcome_log", "-p", "no:cacheprovider",
                             str(tmp_path / "test_sample.py")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not log.exists() or "test_fails" not in log.read_text()):
            time.sleep(0.1)
        time.sleep(0.5)  # into test_hangs
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["test"].split("::")[1], e["outcome"]) for e in entries] == [("test_passes", "passed"), ("test_fails", "failed")]
    assert "arithmetic is broken" in entries[1]["failure"]
