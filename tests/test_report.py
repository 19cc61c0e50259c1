"""The HTML report: self-contained, and every chart renders in a real headless Chromium."""

import re
import shutil
import subprocess

import pytest

from conftest import run_cli
from fixture_store import build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    build(d / "r.db").close()
    out = d / "report.html"
    r = run_cli("report", "--results", str(d / "r.db"), "-o", str(out), "--baseline", "cublas")
    assert r.returncode == 0, r.stderr
    return out


def test_report_is_self_contained(report_file):
    text = report_file.read_text()
    assert not re.search(r"""(src|href)=["']https?://""", text), "the report must not load anything from the network"
    for section in ("Summary", "hgemm speedup heatmaps", "Best so far", "Winners' lineage", "Roofline",
                    "Failure kinds per proposer"):
        assert section in text
    assert "hgemm/64_64_64" in text and "1.500" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (CI installs it)")
def test_report_renders_in_chromium_without_errors(report_file, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    r = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'u1'}", "--window-size=1200,2400",
                        "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", report_file.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr[-2000:]
    console_errors = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln and ("Error" in ln or "Uncaught" in ln)]
    assert not console_errors, console_errors
    img = Image.open(shot).convert("L")
    dark = sum(count for value, count in enumerate(img.histogram()) if value < 200)
    assert dark > 5000, "screenshot is (nearly) blank"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'u2'}", "--dump-dom", report_file.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    check = re.search(r'<pre id="selfcheck">([^<]*)</pre>', dom)
    assert check and check.group(1), "the page's script did not run"
    import json

    result = json.loads(check.group(1))
    assert result["charts"] >= 4 and result["rendered"] == result["charts"], result


def test_the_report_says_which_jail_confined_the_candidates():
    from cuforge.results.report import jail_line

    jailed = [{"device": {"jail": "namespaces"}}, {"device": {"jail": "namespaces"}}]
    assert jail_line(jailed) == "<p>jail: namespaces</p>"
    unjailed = jailed + [{"device": {"jail": "none (--unsafe-no-jail)"}}]
    line = jail_line(unjailed)
    assert 'class="warn"' in line and "without a jail" in line and "--unsafe-no-jail" in line
    assert "unrecorded" in jail_line([{"device": {}}])  # evaluations stored before the jail existed
