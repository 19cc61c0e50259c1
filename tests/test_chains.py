"""The traced op graph and what the fp32 / norm families read off it, on the CPU: operand layouts,
constants (scales, eps), fused epilogues, refusals with reasons, and every new family's configs
compiling with NVRTC."""

import pytest

from cuforge.kernels.chains import literal
from cuforge.kernels.families import families_for, family_for
from cuforge.kernels.fp32 import GemmF32, Gemv, match_gemm
from cuforge.kernels.norms import NormRows, match_norm
from cuforge.problems.suites import load_problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from template_helpers import problem_from_expr, smoke_compile

def problem(tmp_path, expr, inputs, args="a, b", init="        pass"):
    return problem_from_expr(tmp_path, expr, inputs, args, init)


def test_graph_records_operand_layouts_constants_and_outputs():
    ta = load_problem("level1/matmul_transposed_a").graph
    assert [(n.op, n.args) for n in ta] == [("mm", ("in0.T", "in1"))]
    lin = load_problem("level2/gemm_scale_residual")
    assert [(n.op, n.args) for n in lin.graph] == [("addmm", ("param1", "in0", "param0.T")), ("mul", ("t0", 0.5)),
                                                   ("add", ("t1", "in1"))]
    assert lin.graph_outputs == ("t2",)
    ln = load_problem("level1/layernorm").graph[0]
    assert ln.op == "native_layer_norm" and ln.args[1:] == ((8192,), "param0", "param1", 1e-05)
    rms = load_problem("level1/rmsnorm").graph
    assert rms[2].op == "add" and rms[2].args == ("t1", 1e-06)  # eps, straight from the trace


def test_zero_dim_constants_made_in_the_forward_are_literals(tmp_path):
    # torch.tensor(number) is traced on the meta device, where its value exists nowhere but in the call:
    # the graph takes it as the number (KernelBench level2/31 and 93), with or without a device.
    p = problem(tmp_path, "torch.min(a, torch.tensor(0.5)) + torch.maximum(a, torch.tensor(-1.0, device=a.device)) * torch.tensor(3)",
                "torch.randn(8, 16)", args="a")
    assert [(n.op, n.args) for n in p.graph] == [("minimum", ("in0", 0.5)), ("maximum", ("in0", -1.0)), ("mul", ("t1", 3)),
                                                 ("add", ("t0", "t2"))]
    assert "lift_fresh" not in p.ops
    assert families_for(p)[0][0].name == "pointwise"
    # A constant the forward changes in place is a result from then on.
    inplace = problem(tmp_path, "a * torch.tensor(2.0).add_(a.sum())", "torch.randn(8, 16)", args="a")
    assert inplace.graph[-1].op == "mul" and inplace.graph[-1].args == ("in0", inplace.graph[-2].out), inplace.graph


def test_reductions_over_kept_size_one_dims_drop_out_of_the_graph(tmp_path):
    # A row sum, then max / mean / logsumexp over the summed (now size-1) dim: a row sum.
    p = problem(tmp_path, "torch.logsumexp(torch.mean(torch.max(torch.sum(a @ b, dim=1, keepdim=True), dim=1, "
                          "keepdim=True)[0], dim=1, keepdim=True), dim=1, keepdim=True) * 2",
                "torch.randn(64, 32), torch.randn(32, 48)")
    assert [n.op for n in p.graph] == ["mm", "sum", "mul"] and p.graph[2].args == ("t1", 2)
    assert families_for(p)[0][0].name == "gemm_tf32x3_sm90"
    # Reductions that do reduce, and a max whose indices are used, stay.
    kept = problem(tmp_path, "torch.max(torch.sum(a, dim=1, keepdim=True), dim=1, keepdim=True)[1].float() + "
                             "torch.amax(a, dim=0, keepdim=True).sum()", "torch.randn(6, 5), torch.randn(1)")
    assert [n.op for n in kept.graph].count("max") == 1 and "amax" in [n.op for n in kept.graph]


def covering(problem_id: str, fam: str) -> bool:
    """`fam` covers the problem and is preferred, or - for fp32 GEMMs - second to the wgmma 3xTF32 family
    (gemm_f32 is what runs off Hopper)."""
    names = [f.name for f in families_for(load_problem(problem_id))[0]]
    if fam == "gemm_f32":
        return names[0] == "gemm_tf32x3_sm90" and fam in names
    return names[0] == fam


def test_fp32_problems_match_their_families():
    for name, fam in (("matmul_square", "gemm_f32"), ("matmul_rect", "gemm_f32"), ("matmul_transposed_a", "gemm_f32"),
                      ("matmul_transposed_b", "gemm_f32"), ("matmul_batched", "gemm_f32"), ("matvec", "gemv_f32"),
                      ("layernorm", "norm_rows"), ("rmsnorm", "norm_rows")):
        assert covering(f"level1/{name}", fam), name
    for name, fam in (("gemm_bias_gelu", "gemm_f32"), ("gemm_scale_residual", "gemm_f32"), ("gemm_sigmoid_sum", "gemm_f32"),
                      ("layernorm_gelu_residual", "norm_rows"), ("rmsnorm_silu_gate", "norm_rows")):
        assert covering(f"level2/{name}", fam), name
    ta = match_gemm(load_problem("level1/matmul_transposed_a"))
    assert (ta.a, ta.ta, ta.b, ta.tb) == ("in0", True, "in1", False)
    tb = match_gemm(load_problem("level1/matmul_transposed_b"))
    assert (tb.ta, tb.tb, tb.m, tb.k, tb.n) == (False, True, 4096, 4096, 4096)
    assert match_gemm(load_problem("level1/matmul_batched")).batched
    # The transposed fp32 operands keep the fp16 families away from a transposed fp16 problem too.
    assert GemmF32().supports(load_problem("level1/matmul_fp16")) is not None


def test_epilogues_compile_the_traced_chain():
    scale = match_gemm(load_problem("level2/gemm_scale_residual")).epilogue
    assert scale.tensors == (("param1", "c"), ("in1", "rc"))  # bias per column, residual per element
    assert scale.body.splitlines() == ["v = v + e0[c];", "const float x0 = v * 0.5f;",
                                       "const float x1 = x0 + e1[r * (long long)cols + c];", "v = x1;"]
    rowsum = match_gemm(load_problem("level2/gemm_sigmoid_sum"))
    assert rowsum.epilogue.rowsum and rowsum.out_shape == (8192,)
    spec = GemmF32().launch(GemmF32.PRESETS[0], load_problem("level2/gemm_sigmoid_sum"))
    assert spec.outputs == (("(M,)", "float32", "zeros"),)  # atomics accumulate into a zeroed output
    gate = match_norm(load_problem("level2/rmsnorm_silu_gate"))
    assert (gate.kind, gate.eps, gate.weight) == ("rmsnorm", 1e-06, "param0")
    assert gate.epilogue.tensors == (("in1", "rc"),) and "expf(-e0[" in gate.epilogue.body
    res = match_norm(load_problem("level2/layernorm_gelu_residual"))
    assert (res.kind, res.eps, res.weight, res.bias) == ("layernorm", 1e-05, "param0", "param1")
    assert literal(float("-inf")) == "__int_as_float(0xff800000)" and literal(0.125) == "0.125f"


def test_chains_that_cannot_fuse_say_why(tmp_path):
    norm = load_problem("level2/linear_layernorm")
    assert "native_layer_norm after the anchor is not an elementwise epilogue op" in match_gemm(norm)
    assert family_for(norm)[0].name == "staged:gemm_tf32x3_sm90+norm_rows"  # so: the GEMM, then the norm
    p = problem(tmp_path, "(a @ b).sum(dim=0)", "torch.randn(8, 16), torch.randn(16, 24)")
    assert "sum" in match_gemm(p)  # a column sum is no epilogue
    p = problem(tmp_path, "a @ b + torch.ones(8, 24, device=a.device)", "torch.randn(8, 16), torch.randn(16, 24)")
    assert "ones after the anchor is not an elementwise epilogue op" in match_gemm(p)  # made inside forward
    p = problem(tmp_path, "(lambda c: (c, torch.relu(c)))(a @ b)", "torch.randn(8, 16), torch.randn(16, 24)")
    assert "output is not the end of the chain" in match_gemm(p)
    p = problem(tmp_path, "a @ b", "torch.randn(8, 16, dtype=torch.float64), torch.randn(16, 24, dtype=torch.float64)")
    assert "fp32" in match_gemm(p)
    p = problem(tmp_path, "F.layer_norm(a, (4, 8))", "torch.randn(3, 4, 8)", args="a")
    assert "last dim" in match_norm(p)
    p = problem(tmp_path, "a * torch.rsqrt(a.pow(2).mean(dim=0, keepdim=True) + 1e-6)", "torch.randn(3, 8)", args="a")
    assert "mean of the squares over the last dim" in match_norm(p)


def test_norm_and_gemm_variants_match(tmp_path):
    p = problem(tmp_path, "a / torch.sqrt((a * a).mean(-1, keepdim=True) + 1e-5)", "torch.randn(3, 8)", args="a")
    m = match_norm(p)
    assert (m.kind, m.eps, m.weight) == ("rmsnorm", 1e-05, None)
    p = problem(tmp_path, "F.layer_norm(a, (8,))", "torch.randn(3, 8)", args="a")
    m = match_norm(p)
    assert (m.kind, m.weight, m.bias) == ("layernorm", None, None)
    p = problem(tmp_path, "torch.clamp(a @ b.T, min=-1.0, max=2.0) - b.sum()", "torch.randn(8, 16), torch.randn(24, 16)")
    assert "sum" in match_gemm(p)
    p = problem(tmp_path, "F.leaky_relu(a @ b, 0.2) * a[:, :1]", "torch.randn(8, 16), torch.randn(16, 16)")
    assert isinstance(match_gemm(p), str)  # a slice of an input is not a leaf tensor
    p = problem(tmp_path, "torch.mv(a, v) * 2.0", "torch.randn(8, 16), torch.randn(16)", args="a, v")
    assert Gemv().supports(p) is None and Gemv.match(p).out_shape == (8,)


def test_an_rmsnorm_of_one_column_matches_without_its_mean(tmp_path):
    # The mean over a last dim of size 1 leaves the graph at load (an identity reduction); the
    # rmsnorm is still one, weight and fused gate included.
    p = problem(tmp_path, "a * torch.rsqrt(a.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * self.w * F.silu(g)",
                "torch.randn(7, 1), torch.randn(7, 1)", args="a, g",
                init="        self.w = nn.Parameter(torch.rand(1) + 0.5)")
    assert "mean" not in [n.op for n in p.graph]
    m = match_norm(p)
    assert (m.kind, m.eps, m.weight, m.rows, m.cols) == ("rmsnorm", 1e-05, "param0", 7, 1)
    assert NormRows().supports(p) is None
    smoke_compile(NormRows(), p, 2)
    p = problem(tmp_path, "a * torch.rsqrt(a.pow(2) + 1e-6)", "torch.randn(7, 2)", args="a")
    assert "mean of the squares" in match_norm(p)  # without the mean, only one column is an rmsnorm


def test_gemv_rows_a_warp(tmp_path):
    """ROWS: a warp's rows share its loads of x. One row a warp keeps the launch it always had (old
    candidates' ids), two rows a warp lead the seeds, and every rows count compiles."""
    from cuforge.runtime import compile_cuda

    p = problem(tmp_path, "torch.mv(a, v) * 2.0", "torch.randn(9, 30), torch.randn(30)", args="a, v")
    g = Gemv()
    assert g.launch(g.complete(dict(BLOCK=256, VEC=4, UNROLL=4)), p).grid == "(cdiv(M * 32, 256),)"
    assert g.launch(g.complete(dict(BLOCK=256, VEC=4, UNROLL=4, ROWS=4)), p).grid == "(cdiv(cdiv(M, 4) * 32, 256),)"
    assert g.seeds(p)[0]["ROWS"] == 2 and all(g.valid(c, p) for c in g.seeds(p))
    assert not g.valid(dict(BLOCK=256, VEC=4, UNROLL=8, ROWS=4), p)  # 32 float4s in flight a lane
    for rows in (1, 2, 4):
        cand = g.render(dict(BLOCK=128, VEC=4, UNROLL=2, ROWS=rows), p)
        assert g.name in compile_cuda(cand.source, arch="sm_90a", options=cand.launch.options).signatures


def test_zeroed_outputs_are_validated():
    with pytest.raises(ValueError, match="zeros"):
        LaunchSpec(entry="k", grid="(1,)", block="(32,)", args=(), outputs=(("(4,)", "float32", "ones"),))


@pytest.mark.parametrize("problem_ref", ["level1/matmul_transposed_a", "level1/matmul_batched", "level1/matvec",
                                         "level2/gemm_sigmoid_sum", "level2/gemm_scale_residual", "level1/layernorm",
                                         "level2/rmsnorm_silu_gate"])
def test_fp32_and_norm_configs_compile_with_nvrtc(problem_ref):
    p = load_problem(problem_ref)
    for fam in families_for(p)[0]:
        smoke_compile(fam, p, 3)


def test_constraints_of_the_new_families():
    g, p = GemmF32(), load_problem("level1/matmul_square")
    ok = dict(BM=128, BN=128, BK=32, WM=2, WN=4, STAGES=3, GROUP_M=8, MATH="tf32x3", PROMOTE=1)
    assert g.valid(ok, p) and g.valid({**ok, "PROMOTE": 2}, p)
    assert not g.valid({**ok, "WM": 1, "WN": 2}, p)  # 256 accumulators
    assert not g.valid({**ok, "BM": 256, "BN": 256, "WM": 4, "WN": 2, "STAGES": 5}, p)  # shared memory
    assert not g.valid({**ok, "MATH": "ffma", "PROMOTE": 2}, p)  # a tf32x3 knob
    assert [s["PROMOTE"] for s in g.seeds(p)][:3] == [1, 1, 2]  # the paired-step variant of the first seed
    n = NormRows()
    assert n.valid(dict(BLOCK=256, VEC=4, CACHE="smem"), load_problem("level1/layernorm"))
    seeds = n.seeds(load_problem("level1/rmsnorm"))  # half the block first, then the block cached and re-read
    assert [c["CACHE"] for c in seeds][:3] == ["smem", "smem", "global"] and seeds[0]["BLOCK"] == max(128, seeds[1]["BLOCK"] // 2)


@pytest.mark.parametrize("shape, full", [
    ((64, 1, 1), (2, 64, 5, 7)), ((1, 64, 1, 1, 1), (3, 64, 4, 5, 6)), ((5, 1), (2, 3, 5, 7)), ((7,), (2, 3, 5, 7)),
    ((3, 1, 7), (2, 3, 5, 7)), ((2, 1, 1, 1), (2, 3, 5, 7)), ((1,), (4, 9)), ((), (4, 9)), ((4, 9), (4, 9)),
    # full's trailing dims (a causal mask under batch and heads): one modulo
    ((5, 7), (2, 3, 5, 7)), ((1, 3, 5, 7), (2, 3, 5, 7)), ((3, 5, 7), (2, 3, 5, 7)),
])
def test_the_general_broadcast_index_reads_what_torch_broadcasts(shape, full):
    # The C expression, evaluated here at every flat index (r = 0, c = the index, as unindexed kernels pass
    # them; an indexed kernel's r * cols + c is the same number), against torch's own broadcast.
    import torch

    from cuforge.kernels.leaves import broadcast_index

    expr = broadcast_index(shape, full).replace("(long long)", "").replace("LL", "").replace("/", "//")
    want = torch.arange(max(1, torch.Size(shape).numel())).reshape(shape).expand(full).flatten().tolist()
    got = [eval(expr, {"r": 0, "cols": full[-1], "c": i}) for i in range(torch.Size(full).numel())]
    assert got == want
    assert broadcast_index((3,), (4, 9)) is None and broadcast_index((2, 4, 9), (4, 9)) is None


def test_an_operand_broadcast_per_channel_after_a_pooling_is_read_by_its_index(tmp_path):
    # KernelBench level2/50's tail: a (C, 1, 1, 1) bias after a 3-D average pooling, where only per-element,
    # per-row and per-column operands were read before.
    from cuforge.kernels.pointwise import PointwiseChain

    p = problem(tmp_path, "(a + b) * 0.5", "torch.randn(2, 16, 4, 5, 6), torch.randn(16, 1, 1, 1)")
    assert PointwiseChain().supports(p) is None, PointwiseChain().supports(p)
    smoke_compile(PointwiseChain(), p, 2)


def test_a_negated_mask_that_is_also_read_as_a_value_is_refused_with_the_reason(tmp_path):
    # ~mask multiplies the output too: the negation is a bool value, which no chain computes
    from cuforge.kernels.softmax import SoftmaxRows

    p = problem_from_expr(tmp_path, "(lambda x, m: torch.softmax(x.masked_fill(m, 0.0), -1) * m)(a * 2.0, ~self.mask)",
                          "torch.randn(2, 3, 24, 24)", args="a",
                          init="        self.register_buffer('mask', torch.rand(24, 24) > 0.5)")
    assert "bitwise_not after the anchor is not an elementwise" in (SoftmaxRows().supports(p) or ""), SoftmaxRows().supports(p)


def test_a_product_viewed_with_its_leading_dims_regrouped_keeps_the_view_outside_the_kernel(tmp_path):
    """A bmm's [8, S, D] viewed as [2, 4, S, D] is the forward's output: a GEMM kernel may not declare
    its output in the view's shape, so no family takes the view, and the partition leaves it to PyTorch."""
    from cuforge.kernels.families import one_kernel
    from cuforge.kernels.partition import partition

    p = problem_from_expr(tmp_path, "torch.bmm(a, b).view(2, 4, 32, 16) * 2.0",
                          "torch.randn(8, 32, 64), torch.randn(8, 64, 16)", cuforge='CUFORGE = {"policy": "any"}')
    parts = partition(p, one_kernel)
    assert not isinstance(parts, str), parts
    for q in parts:
        if q.family is not None:
            assert tuple(q.problem.outputs[0].shape) == tuple(q.problem.graph[-1].shape)
            assert q.problem.graph[-1].op not in ("view", "_unsafe_view")
