"""Scaled dot-product attention as KernelBench writes it (level1/97: F.scaled_dot_product_attention over
(batch, heads, rows, cols) fp32 tensors), on the CPU: the traced math (q and k each scaled, a batched
q @ k^T, a softmax that writes rows of -inf as zeros, a batched product with v) becomes three kernels -
a GEMM batched over the leading dims with the scale in its epilogue, softmax_rows, a GEMM - whose stages,
run with torch as the module chains them, compute the forward; the kernels compile with NVRTC."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.op_graph import OpNode, fold_operand_scales
from graph_eval import assert_stages_compute_forward
from template_helpers import problem_from_expr, smoke_compile

QKV = "torch.randn(2, 3, 40, 24), torch.randn(2, 3, 56, 24), torch.randn(2, 3, 56, 32)"
SDPA = "F.scaled_dot_product_attention(q, k, v)"


def test_numbers_scaling_a_products_operands_move_past_its_result_views():
    nodes = (OpNode("mul", ("in0", 0.5), (), "t0", (2, 4, 8)),
             OpNode("mul", (3.0, "in1.T"), (), "t1", (2, 8, 4)),
             OpNode("view", ("t1", (2, 8, 4)), (), "t2", (2, 8, 4)),
             OpNode("bmm", ("t0", "t2"), (), "t3", (2, 4, 4)),
             OpNode("_unsafe_view", ("t3", (1, 2, 4, 4)), (), "t4", (1, 2, 4, 4)),
             OpNode("relu", ("t4",), (), "t5", (1, 2, 4, 4)))
    got, outputs = fold_operand_scales(nodes, ("t5",))
    assert [(n.op, n.args) for n in got] == [("view", ("in1.T", (2, 8, 4))), ("bmm", ("in0", "t2")),
                                            ("_unsafe_view", ("t3", (1, 2, 4, 4))), ("mul", ("t4", 1.5)),
                                            ("relu", ("t6",))]
    assert outputs == ("t5",)


def test_a_scaled_operand_that_feeds_something_else_keeps_its_scale():
    nodes = (OpNode("mul", ("in0", 0.5), (), "t0", (4, 8)),
             OpNode("mm", ("t0", "in1"), (), "t1", (4, 4)),
             OpNode("sum", ("t0", (1,)), (), "t2", (4,)))
    assert fold_operand_scales(nodes, ("t1", "t2")) == (nodes, ("t1", "t2"))


def test_a_product_that_is_the_output_is_scaled_after_it():
    nodes = (OpNode("mul", ("in0", 2.0), (), "t0", (4, 8)), OpNode("mm", ("t0", "in1.T"), (), "t1", (4, 4)))
    got, outputs = fold_operand_scales(nodes, ("t1",))
    assert [(n.op, n.args, n.out) for n in got] == [("mm", ("in0", "in1.T"), "t1"), ("mul", ("t1", 2.0), "t2")]
    assert outputs == ("t2",)


def test_attention_is_a_gemm_a_softmax_and_a_gemm_that_compute_the_forward(tmp_path):
    p = problem_from_expr(tmp_path, SDPA, QKV, args="q, k, v")
    fam = families_for(p)[0][0]
    assert fam.name == "pipeline"
    stages = fam.matched(p)
    assert [s.family.name for s in stages] == ["gemm_tf32x3_sm90", "softmax_rows", "gemm_tf32x3_sm90"]
    assert stages[0].problem.graph[-1].op == "mul"  # the scale, in the first GEMM's epilogue
    assert stages[2].feed[:2] == (("stage", 1), ("in", 2))  # softmax(q k^T) @ v
    assert_stages_compute_forward(fam, p)
    smoke_compile(fam, p, 1)


@pytest.mark.parametrize("expr, inputs", [
    ("torch.matmul(a, b.transpose(-1, -2)) * 0.5", "torch.randn(2, 3, 40, 24), torch.randn(2, 3, 56, 24)"),
    ("torch.relu(torch.matmul(a, b))", "torch.randn(2, 3, 40, 24), torch.randn(2, 3, 24, 56)"),
    ("torch.matmul(a.transpose(-1, -2), b)", "torch.randn(2, 1, 3, 24, 40), torch.randn(2, 1, 3, 24, 56)"),
])
def test_a_matmul_batched_over_several_dims_is_one_gemm(tmp_path, expr, inputs):
    from cuforge.kernels.fp32 import match_gemm

    p = problem_from_expr(tmp_path, expr, inputs)
    fams = [f.name for f in families_for(p)[0]]
    assert fams[:2] == ["gemm_tf32x3_sm90", "gemm_f32"], fams
    f = match_gemm(p)
    assert f.batched and f.batch() == 6 and f.out_shape == tuple(p.outputs[0].shape)
    smoke_compile(families_for(p)[0][0], p, 1)


def test_a_batched_matmul_that_broadcasts_an_operand_is_not_one_gemm(tmp_path):
    # b's batch is repeated for each of a's leading dims: not one dense batch of each.
    p = problem_from_expr(tmp_path, "torch.matmul(a, b)", "torch.randn(2, 3, 40, 24), torch.randn(3, 24, 56)")
    assert "gemm_tf32x3_sm90" not in [f.name for f in families_for(p)[0]]


def test_the_safe_softmax_is_softmax_rows_and_writes_rows_of_minus_infinity_as_zeros(tmp_path):
    from cuforge.kernels.softmax import SoftmaxRows, match_softmax

    p = problem_from_expr(tmp_path, "torch.ops.aten._safe_softmax(a, -1)", "torch.randn(64, 300)", args="a")
    assert [f.name for f in families_for(p)[0]][0] == "softmax_rows"
    assert match_softmax(p).safe
    long_rows = problem_from_expr(tmp_path, "torch.ops.aten._safe_softmax(a, -1)", "torch.randn(4, 2**17)", args="a")
    assert "rows_cluster" not in [f.name for f in families_for(long_rows)[0]]  # its kernel has no such rows
    smoke_compile(SoftmaxRows(), p, 1)
