"""A pytest plugin: with CUFORGE_TEST_LOG=path, each test's outcome is appended to path as one JSON line
the moment it is known, its failure text with it. pytest prints failures only at the end of a session,
so a GPU run cut short by its time limit used to lose why its tests failed."""

import json
import os

MAX_TEXT = 6000  # characters of a failure kept: the assertion and the frames nearest it


def pytest_runtest_logreport(report):  # noqa: ANN001
    path = os.environ.get("CUFORGE_TEST_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # with xdist, the controller logs each report once
        return
    if report.when != "call" and not report.failed and not report.skipped:
        return
    entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "seconds": round(report.duration, 2)}
    if report.failed:
        entry["failure"] = str(report.longrepr)[-MAX_TEXT:]
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
