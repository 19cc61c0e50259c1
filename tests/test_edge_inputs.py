"""Inputs off the common path: transposed and expanded views, broadcasting, zero-size dims, mixed dtypes,
NaN and inf. The template search answers each with a correct kernel or a named refusal, never a kernel
that misreads its inputs; the judge holds PyTorch itself correct on them and a candidate that changes
a NaN wrong."""

import textwrap

import pytest

from cuforge.kernels.families import families_for
from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig

CASES = {
    # name: (forward args, forward body, get_inputs body)
    "transposed": ("x", "torch.relu(x)", "[torch.randn(256, 512).t()]"),
    "expanded": ("x", "torch.relu(x)", "[torch.randn(1, 512).expand(256, 512)]"),
    "transposed_mm": ("a, b", "a @ b", "[torch.randn(128, 64).t(), torch.randn(128, 96)]"),
    "broadcast_add": ("a, b", "a + b", "[torch.randn(256, 512), torch.randn(512)]"),
    "zero_rows": ("x", "torch.relu(x)", "[torch.randn(0, 512)]"),
    "zero_k": ("a, b", "a @ b", "[torch.randn(64, 0), torch.randn(0, 32)]"),
    "mixed_dtypes": ("a, b", "a + b", "[torch.randn(256, 512), torch.randn(256, 512).half()]"),
    "nan_inf": ("x", "torch.relu(x) * 2", "[torch.tensor([float('nan'), float('inf'), -float('inf'), 1.0, -1.0] * 64)]"),
}


def _source(args: str, body: str, inputs: str) -> str:
    return (f"import torch\nclass Model(torch.nn.Module):\n    def forward(self, {args}):\n        return {body}\n"
            f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    d = tmp_path_factory.mktemp("edge")
    for name, case in CASES.items():
        (d / f"{name}.py").write_text(_source(*case))
    loaded, skipped = load_files([d / f"{name}.py" for name in CASES])
    assert not skipped, skipped
    return {p.name: p for p in loaded}


@pytest.mark.parametrize("name, reason", [
    ("transposed", "input 0 (float32[512, 256]) is a transposed or expanded view"),
    ("expanded", "input 0 (float32[256, 512]) is a transposed or expanded view"),
    ("transposed_mm", "input 0 (float32[64, 128]) is a transposed or expanded view"),
    ("zero_rows", "input 0 (float32[0, 512]) has a dim of size zero"),
    ("zero_k", "input 0 (float32[64, 0]) has a dim of size zero"),
])
def test_inputs_no_kernel_reads_as_given_are_refused_by_name(problems, name, reason):
    fams, why = families_for(problems[name])
    assert fams == [] and reason in why, why
    assert not problems[name].inputs[0].contiguous or "zero" in reason


def test_a_broadcast_operand_is_still_covered_and_mixed_dtypes_are_not(problems):
    assert families_for(problems["broadcast_add"])[0]
    fams, why = families_for(problems["mixed_dtypes"])
    assert fams == [] and why.startswith("not covered offline")


def test_the_judge_holds_pytorch_correct_on_these_inputs_and_a_changed_nan_wrong(problems, cpu_sup):
    cfg = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=120)
    itself = Candidate("import torch\nclass ModelNew(__cuforge_problem__.Model):\n    pass\n")
    for name in ("transposed", "expanded", "transposed_mm", "broadcast_add", "zero_rows", "zero_k", "mixed_dtypes",
                 "nan_inf"):
        ev = cpu_sup.evaluate(problems[name].for_cpu_test_mode(), itself, cfg)
        assert ev.ok, (name, ev.status, ev.message)
    zeroed = Candidate("import torch\n" + textwrap.dedent("""
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return torch.nan_to_num(torch.relu(x) * 2, nan=0.0)
    """))
    ev = cpu_sup.evaluate(problems["nan_inf"].for_cpu_test_mode(), zeroed, cfg)
    assert not ev.ok and "NaN/Inf" in ev.message, (ev.status, ev.message)


def test_non_finite_values_must_stand_where_the_reference_has_its_own():
    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.judge.verify import compare

    tol = Tolerance.for_dtype("float32")
    ref = torch.tensor([float("nan"), float("inf"), 1.0, 2.0], dtype=torch.float64)
    same = torch.tensor([float("nan"), float("inf"), 1.0, 2.0])
    assert compare(same, ref, torch.float32, tol).ok
    made_up = torch.tensor([0.0, 3.0e38, 1.0, 2.0])  # finite stand-ins where the reference has none
    verdict = compare(made_up, ref, torch.float32, tol)
    assert not verdict.ok and "2 elements are NaN/Inf where the reference is finite, or finite where it is NaN/Inf" in verdict.reason
    stray = torch.tensor([float("nan"), float("inf"), float("nan"), 2.0])
    assert not compare(stray, ref, torch.float32, tol).ok
