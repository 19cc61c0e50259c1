"""Precision contracts on a GPU, where the flags change what runs: a convolution in TF32 (as cuDNN runs
it under PyTorch's defaults) passes the `pytorch` contract and is a precision downgrade under `fp32`; one
less accurate than TF32 (bf16 operands) fails both; eager under both flags is timed beside every
convolution. Skips without a GPU."""

import textwrap

import pytest

from conftest import conv_problem_source

from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol import precision as pr
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig

pytestmark = pytest.mark.gpu

# The convolution with TF32 products, as cuDNN computes it under PyTorch's default flags. The flag is
# set and put back inside the call, so the guard sees no global change: only the result can tell.
TF32_CONV = """
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 128, 3, padding=1)

    def forward(self, x):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
            return self.conv(x)
"""

FP32_CONV = """
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 128, 3, padding=1)

    def forward(self, x):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            return self.conv(x)
"""

BF16_CONV = """
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 128, 3, padding=1)

    def forward(self, x):
        w, b = self.conv.weight.bfloat16(), self.conv.bias.bfloat16()
        return torch.nn.functional.conv2d(x.bfloat16(), w, b, padding=1).float()
"""


@pytest.fixture(scope="module")
def conv_problem(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_contracts")
    # The candidates here are PyTorch under other flags: policy 'any' lets their accuracy alone decide.
    (d / "conv.py").write_text(conv_problem_source(64, 128, 8, 56) + '\nCUFORGE = {"policy": "any"}\n')
    loaded, skipped = load_files([d / "conv.py"])
    assert not skipped, skipped
    return loaded[0]


def evaluate(sup, problem, body, precision):
    config = EvalConfig(precision=precision, max_timing_s=1.0, profile=False)
    return sup.evaluate(problem, Candidate("import torch\n" + textwrap.dedent(body)), config)


def test_a_tf32_convolution_passes_under_pytorch_and_is_a_downgrade_under_fp32(sup, conv_problem):
    ev = evaluate(sup, conv_problem, TF32_CONV, "pytorch")
    assert ev.ok, ev.message
    # Both eagers were timed as contenders of their own: under PyTorch's defaults cuDNN runs TF32.
    assert pr.STRICT_EAGER in ev.timings and "eager_flags" not in ev.correctness
    # Under fp32 the same kernel is a downgrade (and, as every cheat, not timed).
    strict = evaluate(sup, conv_problem, TF32_CONV, "fp32")
    assert strict.status == "cheat:precision_downgrade", strict.message
    # An honest fp32 convolution under fp32 has eager under PyTorch's defaults timed beside it.
    fp32 = evaluate(sup, conv_problem, FP32_CONV, "fp32")
    assert fp32.ok and pr.DEFAULT_EAGER in fp32.timings, fp32.message


def test_a_convolution_less_accurate_than_tf32_fails_under_fp32_and_pytorch(sup, conv_problem):
    for name in ("fp32", "pytorch"):
        ev = evaluate(sup, conv_problem, BF16_CONV, name)
        assert not ev.ok and ev.status in ("cheat:precision_downgrade", "wrong_output"), (name, ev.status, ev.message)
