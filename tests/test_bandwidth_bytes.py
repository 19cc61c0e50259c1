"""The least traffic that benchmarks/kernelbench_bandwidth.py divides by a kernel's time (issue #23): every
input and output once, and the module's parameters and buffers once too (a layer norm's weight and bias
are as long as its rows, so leaving them out flattered nothing but understated the kernel's bandwidth);
numbers passed to forward as they are move no bytes."""

from conftest import benchmark_module
from template_helpers import problem_from_expr


def problem_bytes(problem):
    return benchmark_module("kernelbench_bandwidth").problem_bytes(problem)


def test_parameters_and_buffers_count_once(tmp_path):
    ln = problem_from_expr(tmp_path, "self.ln(a)", "torch.randn(4, 8, 16, 16)", args="a",
                           init="        self.ln = nn.LayerNorm((8, 16, 16))")
    row = 8 * 16 * 16 * 4
    assert problem_bytes(ln) == 2 * 4 * row + 2 * row  # x in, y out, weight and bias
    bn = problem_from_expr(tmp_path, "self.bn(a)", "torch.randn(2, 3, 5, 5)", args="a",
                           init="        self.bn = nn.BatchNorm2d(3)")
    # weight, bias, running mean and variance (3 floats each) and the int64 count of batches seen
    assert problem_bytes(bn) == 2 * 2 * 3 * 5 * 5 * 4 + 4 * 3 * 4 + 8


def test_numbers_passed_to_forward_move_no_bytes(tmp_path):
    p = problem_from_expr(tmp_path, "a * b", "torch.randn(16, 16), 2.5", args="a, b")
    assert p.inputs[1].is_scalar
    assert problem_bytes(p) == 2 * 16 * 16 * 4  # a in, the product out
