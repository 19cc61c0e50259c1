"""A pytest plugin: with CUFORGE_TEST_LOG=path, each test's outcome is appended to path as one JSON line
the moment it is known, its failure text with it. pytest prints failures only at the end of a session,
so a GPU run cut short by its time limit used to lose why its tests failed."""

import json
import os

MAX_TEXT = 6000  # characters of a failure kept: the assertion and the frames nearest it
_XDIST_WORKER = False  # with xdist, the controller logs each report once; its workers do not


def pytest_configure(config):  # noqa: ANN001
    # Asked of this session's config, not of the environment: a pytest that a test starts inherits an
    # xdist worker's environment variables without being one.
    global _XDIST_WORKER
    _XDIST_WORKER = hasattr(config, "workerinput")


def pytest_runtest_logreport(report):  # noqa: ANN001
    path = os.environ.get("CUFORGE_TEST_LOG")
    if not path or _XDIST_WORKER:
        return
    if report.when != "call" and not report.failed and not report.skipped:
        return
    entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "seconds": round(report.duration, 2)}
    if report.failed:
        entry["failure"] = str(report.longrepr)[-MAX_TEXT:]
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
