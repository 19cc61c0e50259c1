"""benchmarks/partition_parts.py: the values a part reads are gathered as the candidate module feeds them,
each call gets fresh copies (a PyTorch part's in-place op writes its input), errors are norms against
float64, and a record prints as docs/benchmarks.md's tables. Its GPU probe runs on the device."""

import json

import torch

from conftest import benchmark_module

pp = benchmark_module("partition_parts")


def test_a_part_reads_inputs_stage_outputs_and_a_pytorch_part_s_kth_value():
    x, y = torch.ones(2), torch.zeros(3)
    results = [torch.full((1,), 5.0), (torch.full((1,), 6.0), torch.full((1,), 7.0))]
    got = pp.gather(results, [("in", 1), ("stage", 0), ("stage", 1, 1)], [x, y])
    assert got[0] is y and got[1] is results[0] and got[2] is results[1][1]
    assert pp.gather(results, None, [x, y]) == [x, y]
    fresh = pp.copies([x, 3])
    fresh[0].add_(1)
    assert float(x.sum()) == 2.0 and fresh[1] == 3  # the original untouched; non-tensors as they are
    assert pp.rel_err(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 2.0], dtype=torch.float64)) == 1 / 5 ** 0.5
    assert pp.rel_err(torch.ones(2), torch.ones(3)) is None


def test_a_record_prints_as_the_docs_tables(tmp_path, monkeypatch, capsys):
    row = lambda fam, k, t: {"family": fam, "ms_kernel": k, "ms_torch": t}  # noqa: E731
    record = {"gpu": "NVIDIA H200", "torch": "2.11", "precision": "fp32", "files": [
        {"file": "9_ResNet18.py", "outcome": "probed", "kernel_parts": 2, "parts_slower_than_torch": 1,
         "forward": {"eager": {"ms": 1.5, "err": 1e-6}, "kernels": {"ms": 6.0, "err": 1e-6}, "faster_parts": {"ms": 2.5, "err": 1e-6}},
         "rows": [row("batch_norm", 0.2, 0.1), row("conv_direct", 0.1, 0.3)]},
        {"file": "35_LSTM.py", "outcome": "error", "why": "RuntimeError: dtypes"}]}
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "probe.json").write_text(json.dumps(record))
    monkeypatch.setattr(pp, "ROOT", tmp_path)
    pp.table("probe")
    out = capsys.readouterr().out
    assert "| 9_ResNet18.py | 2 | 1 | 1.50 | 6.00 | 2.50 | 1e-06 |" in out and "35_LSTM" not in out
    assert "| batch_norm | 1 | 0 | 0.20 | 0.10 |" in out and "| conv_direct | 1 | 1 | 0.10 | 0.30 |" in out
