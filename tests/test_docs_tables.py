"""docs/benchmarks.md's tables are what their commands print from benchmarks/results/: a result file
changed without its table (or a table edited by hand) fails here, naming the command to run."""

import subprocess
import sys

from conftest import ROOT, benchmark_module


def test_every_table_of_the_benchmarks_page_is_what_its_command_prints():
    done = subprocess.run([sys.executable, "benchmarks/docs_tables.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr + "\n(run: python benchmarks/docs_tables.py)"


def test_a_stale_table_is_named(tmp_path, monkeypatch):
    docs_tables = benchmark_module("docs_tables")
    page = ("intro\n<!-- table: python benchmarks/docs_tables.py compile compile_latency -->\n| stale |\n"
            "<!-- /table -->\nend\n")
    new, changed = docs_tables.regenerate(page)
    assert changed == ["python benchmarks/docs_tables.py compile compile_latency"]
    assert "| stale |" not in new and "NVRTC" in new and new.startswith("intro\n") and new.endswith("end\n")
    assert docs_tables.regenerate(new)[1] == []


def test_a_torch_compile_ratio_the_search_disagreed_with_shows_both():
    docs_tables = benchmark_module("docs_tables")
    assert docs_tables.compile_cell({"vs_torch_compile": 1.22, "search_vs_torch_compile": 0.79}) == "1.22x (search: 0.79x)"
    assert docs_tables.compile_cell({"vs_torch_compile": 1.05, "search_vs_torch_compile": 0.95}) == "1.05x"
    assert docs_tables.compile_cell({"vs_torch_compile": 0.9}) == "0.90x"  # a record from before the field
    assert docs_tables.compile_cell({"vs_torch_compile": None, "search_vs_torch_compile": 0.8}) == "-"
