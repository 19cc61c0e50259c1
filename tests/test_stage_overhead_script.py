"""benchmarks/stage_overhead.py: a forward's issue time is never more than its wall time, the profile
names the functions a forward runs with their calls per forward, and records print as
docs/benchmarks.md's table. Its GPU probe runs on the device."""

import json

import torch

from conftest import benchmark_module

so = benchmark_module("stage_overhead")


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_issue_wall_and_the_profile_of_a_forward():
    model, x = TwoLayers(), torch.randn(4, 8)
    t = so.issue_and_wall(model, [x])
    assert 0 < t["issue_ms"] <= t["wall_ms"]
    rows = so.profile_rows(model, [x])
    assert len(rows) <= so.TOP and all(r["self_us"] >= 0 and r["cumulative_us"] >= r["self_us"] for r in rows)
    linear = next(r for r in rows if "linear" in r["function"] and "built-in" in r["function"])
    assert linear["calls"] == 2.0  # two Linear layers: two calls a forward, averaged over the profiled ones


def test_records_print_as_the_docs_table(tmp_path, monkeypatch, capsys):
    row = {"file": "9_ResNet18.py", "outcome": "probed", "eager": {"issue_ms": 1.0, "wall_ms": 2.0},
           "kernels": {"issue_ms": 5.0, "wall_ms": 5.0}, "launches": 100, "host_us_per_launch": 50.0}
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for name in ("a", "b"):
        (tmp_path / "benchmarks" / "results" / f"{name}.json").write_text(json.dumps(
            {"gpu": "NVIDIA H200", "files": [row, {"file": "35_LSTM.py", "outcome": "error", "why": "x"}]}))
    monkeypatch.setattr(so, "ROOT", tmp_path)
    so.table(["a", "b"])
    out = capsys.readouterr().out
    assert "| 9_ResNet18.py | a | 1.00 | 2.00 | 5.00 | 5.00 | 100 | 50.0 | 2.50 |" in out
    assert "| 9_ResNet18.py | b |" in out and "35_LSTM" not in out and "NVIDIA H200" in out
