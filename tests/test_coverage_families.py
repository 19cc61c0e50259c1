"""The pointwise-chain, dim-reduction and scan families on the CPU: which traced forwards they match
(activations spelled as one op or written out, per-row/column operands, reductions over middle
dims, inclusive/reversed/exclusive/masked scans), clear refusals, and NVRTC compiles of their seeds and
random configs."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.norm_all import NormAll, match_norm_all
from cuforge.kernels.pointwise import PointwiseChain, match_pointwise
from cuforge.kernels.reduce_dim import ReduceDim, match_dim_reduction
from cuforge.kernels.scan import ScanRows, match_scan
from template_helpers import problem_from_expr, smoke_compile

X = "torch.randn(8, 96)"

POINTWISE = [
    ("a / (1 + torch.abs(a))", X, "a"),                                       # softsign, written out
    ("a * torch.sigmoid(a)", X, "a"),                                          # swish
    ("0.5 * a * (1.0 + torch.tanh(0.7978845608 * (a + 0.044715 * torch.pow(a, 3.0))))", X, "a"),  # MinGPT GELU
    ("torch.selu(a)", X, "a"),
    ("F.elu(a, alpha=0.7)", X, "a"),
    ("F.hardsigmoid(a)", X, "a"),
    ("F.softplus(a)", X, "a"),
    ("F.hardtanh(a, -0.5, 2.0)", X, "a"),
    ("F.leaky_relu(a, 0.2)", X, "a"),
    ("torch.tanh(a) * 2.5 - 1", X, "a"),
    ("F.mish(a) + torch.log1p(torch.exp(a))", X, "a"),
    ("torch.maximum(a, b) * a", f"{X}, {X}", "a, b"),
    ("(a + b) * torch.sigmoid(b)", "torch.randn(8, 96), torch.randn(96)", "a, b"),  # a per-column operand
    ("a * b", "torch.randn(4, 8, 96), torch.randn(4, 8, 1)", "a, b"),             # a per-row operand
    ("b.unsqueeze(1) * a", "torch.randn(96, 50), torch.randn(96)", "a, b"),        # diag(b) @ a, as it is written
    ("a + b.view(1, -1) * 2", "torch.randn(8, 96), torch.randn(96)", "a, b"),       # a per-column view
]


@pytest.mark.parametrize("expr, inputs, args", POINTWISE)
def test_pointwise_chains_match_and_compile(tmp_path, expr, inputs, args):
    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    m = match_pointwise(p)
    assert not isinstance(m, str), m
    assert "pointwise" in [f.name for f in families_for(p)[0]]
    smoke_compile(PointwiseChain(), p, 2)


def test_views_of_leaves_are_read_through_the_leaf(tmp_path):
    m = match_pointwise(problem_from_expr(tmp_path, "b.unsqueeze(1) * a", "torch.randn(96, 50), torch.randn(96)"))
    assert m.chain.tensors == (("in1", "r"),) and m.chain.indexed
    # A view that reorders elements (not just size-1 dims) is not a leaf view: refused, not misread.
    found = match_pointwise(problem_from_expr(tmp_path, "b.reshape(96, 50) * a", "torch.randn(96, 50), torch.randn(50, 96)"))
    assert isinstance(found, str)


def test_pointwise_indexes_rows_and_columns_only_when_an_operand_needs_them(tmp_path):
    flat = match_pointwise(problem_from_expr(tmp_path, "a * b + 1", f"{X}, {X}"))
    per_col = match_pointwise(problem_from_expr(tmp_path, "a * b + 1", "torch.randn(8, 96), torch.randn(96)"))
    assert not flat.chain.indexed and per_col.chain.indexed
    assert per_col.chain.tensors == (("in1", "c"),)


@pytest.mark.parametrize("expr, inputs", [
    ("a + b", "torch.randn(16, 1), torch.randn(1, 32, 1, 1)"),  # KernelBench level2/75's end: (1, 32, 16, 1)
    ("torch.maximum(a, b) * 2", "torch.randn(8, 96), torch.randn(8, 1, 96)"),
])
def test_an_output_no_input_has_the_shape_of_reads_every_input_broadcast(tmp_path, expr, inputs):
    import math

    p = problem_from_expr(tmp_path, expr, inputs)
    m = match_pointwise(p)
    assert not isinstance(m, str), m
    assert m.anchor is None and m.shape == tuple(p.outputs[0].shape)
    assert [kind[0] for _, kind in m.chain.tensors] == ["b", "b"]  # both at an index computed from the flat one
    fam = PointwiseChain()
    assert {c["VEC"] for c in fam.seeds(p)} == {1} and not fam.valid(dict(VEC=4, BLOCK=256, WAVES=0), p)
    launch = fam.render(fam.seeds(p)[0], p).launch
    assert launch.outputs == ((repr(m.shape), "float32"),) and ("n", str(math.prod(m.shape))) in launch.bindings
    smoke_compile(fam, p, 2)


@pytest.mark.parametrize("expr, inputs, why", [
    ("a.sum(dim=0)", X, "not only elementwise ops"),
    ("a.int() + 1", X, "not only elementwise ops"),
    ("a", X, "no traced graph"),
])
def test_pointwise_refusals_say_why(tmp_path, expr, inputs, why):
    p = problem_from_expr(tmp_path, expr, inputs, args="a, b" if "b" in expr else "a")
    found = match_pointwise(p)
    assert isinstance(found, str)
    assert PointwiseChain().supports(p) is not None


@pytest.mark.parametrize("expr, op, outer, reduced, inner", [
    ("torch.sum(a, dim=1, keepdim=True)", "sum", 4, 16, 40),
    ("torch.mean(a, dim=(1,))", "mean", 4, 16, 40),
    ("torch.max(a, dim=1)[0]", "max", 4, 16, 40),
    ("torch.min(a, dim=0)[0]", "min", 1, 4, 640),
    ("torch.amax(a, dim=(0, 1))", "max", 1, 64, 40),
    ("torch.argmax(a, dim=1)", "argmax", 4, 16, 40),
    ("torch.argmin(a, dim=0)", "argmin", 1, 4, 640),
    ("torch.logsumexp(a, dim=1)", "logsumexp", 4, 16, 40),
    ("torch.logsumexp(a, dim=(1, 2), keepdim=True)", "logsumexp", 4, 640, 1),
])
def test_dim_reductions_match_and_compile(tmp_path, expr, op, outer, reduced, inner):
    p = problem_from_expr(tmp_path, expr, "torch.randn(4, 16, 40)", args="a")
    m = match_dim_reduction(p)
    assert not isinstance(m, str), m
    assert (m.op, m.outer, m.reduced, m.inner) == (op, outer, reduced, inner)
    smoke_compile(ReduceDim(), p, 2)


@pytest.mark.parametrize("expr, op, outer, reduced, inner, chain", [
    ("torch.tanh(torch.tanh(torch.min(a, dim=1, keepdim=True)[0]))", "min", 4, 16, 40, "x1 = tanhf(x0)"),
    ("torch.sum(a, dim=1) * 2", "sum", 4, 16, 40, "v * 2.0f"),
    ("torch.mean(a, dim=[1, 2], keepdim=True).squeeze(-1).squeeze(-1)", "mean", 4, 640, 1, ""),
    ("F.gelu(torch.amax(a, dim=-1, keepdim=True)) + b", "max", 64, 40, 1, "x1 = x0 + e0[0]"),
])
def test_dim_reductions_with_a_chain_after_them(tmp_path, expr, op, outer, reduced, inner, chain):
    # The chain runs on each reduced value before the store; views after it only regroup the output;
    # the last dims reduced (inner = 1) are a row a block.
    p = problem_from_expr(tmp_path, expr, "torch.randn(4, 16, 40), torch.randn(1)", args="a, b")
    m = match_dim_reduction(p)
    assert not isinstance(m, str), m
    assert (m.op, m.outer, m.reduced, m.inner) == (op, outer, reduced, inner)
    assert chain in m.chain.body and bool(chain) == bool(m.chain.body), m.chain.body
    smoke_compile(ReduceDim(), p, 2)


@pytest.mark.parametrize("expr, why", [
    ("torch.sum(a, dim=-1)", "not a single"),  # traced as sum_lastdim: reduce_rows covers it
    ("torch.sum(a, dim=(0, 2))", "not adjacent"),
    ("torch.sum(a)", "no constant dim"),
    ("torch.sum(a * 2, dim=1)", "not a single"),
    ("torch.argmax(a, dim=1).float() + 1", "after argmax"),
    ("torch.argmax(a, dim=-1, keepdim=True)", "argmax over the last dims"),
    ("torch.mean(a, dim=1) + torch.mean(a, dim=1).sum()", "not an elementwise epilogue op"),
    ("torch.sum(a, dim=2, keepdim=True).squeeze(2) + 1", "not an elementwise epilogue op"),
])
def test_dim_reduction_refusals(tmp_path, expr, why):
    found = match_dim_reduction(problem_from_expr(tmp_path, expr, "torch.randn(4, 16, 40)", args="a"))
    assert isinstance(found, str) and why in found, found


@pytest.mark.parametrize("expr, inputs, args, want", [
    ("torch.cumsum(a, dim=1)", "torch.rand(6, 300)", "a", ("sum", False, False, None)),
    ("torch.cumprod(a, dim=-1)", "torch.rand(6, 300)", "a", ("prod", False, False, None)),
    ("torch.cumsum(a.flip(1), dim=1).flip(1)", "torch.rand(6, 300)", "a", ("sum", True, False, None)),
    ("torch.cat((torch.zeros_like(a.select(1, 0).unsqueeze(1)), torch.cumsum(a.narrow(dim=1, start=0, length=a.size(1) - 1), dim=1)), dim=1)",
     "torch.rand(6, 300)", "a", ("sum", False, True, None)),
    ("torch.cumsum(a * m, dim=1)", "torch.rand(6, 300), torch.randint(0, 2, (6, 300)).bool()", "a, m", ("sum", False, False, "in1")),
])
def test_scans_match_and_compile(tmp_path, expr, inputs, args, want):
    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    m = match_scan(p)
    assert not isinstance(m, str), m
    assert (m.op, m.reverse, m.exclusive, m.mask) == want
    smoke_compile(ScanRows(), p, 2)


@pytest.mark.parametrize("matcher, expr, inputs, why", [
    (match_scan, "torch.cumsum(a, dim=0)", "torch.rand(6, 300)", "not a cumsum or cumprod over the last dim"),
    (match_scan, "torch.cumsum(a, dim=1) * 2", "torch.rand(6, 300)", "not a cumsum"),
    (match_scan, "torch.cumsum(a.flip(0), dim=1).flip(1)", "torch.rand(6, 300)", "flip"),
    (match_norm_all, "a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(4, 16, 8, 8)", "not x / (the L2 norm of all of x)"),
    (match_norm_all, "a / torch.norm(a, p=1)", "torch.randn(4, 16, 8, 8)", "not x / (the L2 norm of all of x)"),
    (match_norm_all, "a * torch.norm(a)", "torch.randn(4, 16, 8, 8)", "not x / (the L2 norm of all of x)"),
])
def test_scan_and_whole_tensor_norm_refusals(tmp_path, matcher, expr, inputs, why):
    found = matcher(problem_from_expr(tmp_path, expr, inputs, args="a"))
    assert isinstance(found, str) and why in found, found


GN_INIT = "        self.gn = nn.GroupNorm(4, 16)"
IN_INIT = "        self.inorm = nn.InstanceNorm2d(16)"


@pytest.mark.parametrize("expr, inputs, init, kind, rows", [
    ("a / torch.mean(torch.abs(a), dim=1, keepdim=True)", "torch.randn(8, 300)", "        pass", "l1", True),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(8, 300)", "        pass", "l2", True),
    ("a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)", "torch.randn(4, 16, 8, 8)", "        pass", "rms", False),
    ("self.inorm(a)", "torch.randn(4, 16, 8, 8)", IN_INIT, "instance", True),
    ("self.gn(a)", "torch.randn(4, 16, 8, 8)", GN_INIT, "group", True),
    ("self.ln(a)", "torch.randn(4, 16, 8, 8)", "        self.ln = nn.LayerNorm((16, 8, 8))", "layer", True),
    ("F.layer_norm(a, (8,))", "torch.randn(4, 16, 8, 8)", "        pass", "layer", True),
])
def test_normalizations_match_and_compile(tmp_path, expr, inputs, init, kind, rows):
    from cuforge.kernels.normalize import Normalize, match_normalize

    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    m = match_normalize(p)
    assert not isinstance(m, str), m
    assert m.kind == kind and (m.inner == 1) == rows
    if kind == "group":
        assert (m.outer, m.reduced, m.groups, m.channel_span) == (16, 256, 4, 64) and m.weight and m.bias
    if kind == "layer":
        assert (m.outer, m.reduced) == ((4, 1024) if "self.ln" in expr else (512, 8))
        assert bool(m.weight) == bool(m.bias) == ("self.ln" in expr)
    smoke_compile(Normalize(), p, 2)


@pytest.mark.parametrize("expr, init, why", [
    ("a / torch.mean(torch.abs(a), dim=(1, 2), keepdim=True)", "        pass", "more than one dim"),
    ("a / torch.mean(a, dim=1, keepdim=True)", "        pass", "not an L1, L2 or RMS"),
    ("self.bn(a)", "        self.bn = nn.BatchNorm2d(16)", "not an instance, group or layer norm"),
    ("F.layer_norm(a.transpose(1, 3), (16,)).transpose(1, 3)", "        pass", "not an instance, group or layer norm"),
])
def test_normalization_refusals(tmp_path, expr, init, why):
    from cuforge.kernels.normalize import match_normalize

    found = match_normalize(problem_from_expr(tmp_path, expr, "torch.randn(4, 16, 8, 8)", args="a", init=init))
    assert isinstance(found, str) and why in found, found


@pytest.mark.parametrize("expr, inputs, args, mean, post", [
    ("torch.mean((a - b) ** 2)", "torch.randn(64, 100), torch.randn(64, 100)", "a, b", True, ""),
    ("F.smooth_l1_loss(a, b)", "torch.randn(64, 100), torch.randn(64, 100)", "a, b", True, ""),
    ("F.smooth_l1_loss(a, b, reduction='sum', beta=0.5)", "torch.randn(64, 100), torch.randn(64, 100)", "a, b", False, ""),
    ("torch.mean(torch.clamp(1 - a * b, min=0))", "torch.randn(64, 100), torch.randn(100)", "a, b", True, ""),
    ("F.kl_div(torch.log(a), b, reduction='batchmean')", "torch.rand(64, 100) + 0.1, torch.rand(64, 100)", "a, b", False, "s = s / 64.0f;"),
    ("a.sum() * 0.5 + 1", "torch.randn(7, 9, 11)", "a", False, "s = s * 0.5f;\ns = s + 1.0f;"),
])
def test_whole_tensor_reductions_match_and_compile(tmp_path, expr, inputs, args, mean, post):
    from cuforge.kernels.reduce_all import ReduceAll, match_reduce_all

    p = problem_from_expr(tmp_path, expr, inputs, args=args)
    m = match_reduce_all(p)
    assert not isinstance(m, str), m
    assert (m.mean, m.post) == (mean, post)
    smoke_compile(ReduceAll(), p, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, inputs, args", [
    ("torch.mean((a - b) ** 2)", "torch.randn(64, 100, dtype=D), torch.randn(64, 100, dtype=D)", "a, b"),
    ("F.smooth_l1_loss(a, b)", "torch.randn(64, 100, dtype=D), torch.randn(64, 100, dtype=D)", "a, b"),
    ("torch.mean(torch.clamp(1 - a * b, min=0)) * 2", "torch.randn(64, 100, dtype=D), torch.randn(100, dtype=D)", "a, b"),
    ("a.sum()", "torch.randn(7, 9, 11, dtype=D)", "a"),
])
def test_half_whole_tensor_reductions_match_and_compile(tmp_path, dtype, expr, inputs, args):
    """In fp16/bf16: 16-byte loads of 8 elements, fp32 chains and double sums, one value in the inputs' dtype."""
    from cuforge.kernels.reduce_all import ReduceAll

    p = problem_from_expr(tmp_path, expr, inputs.replace("D", f"torch.{dtype}"), args=args)
    fam = ReduceAll()
    assert fam.supports(p) is None, fam.supports(p)
    assert [c["VEC"] for c in fam.seeds(p)] == [8, 8, 8] and not fam.valid({"VEC": 4, "BLOCK": 256, "WAVES": 1}, p)
    assert fam.launch(fam.seeds(p)[0], p).outputs == (("()", dtype),)
    source = fam.render(fam.seeds(p)[0], p).source
    ctype = '__nv_bfloat16' if dtype == 'bfloat16' else '__half'
    assert f"typedef {ctype} T;" in source
    # every other operand (smooth_l1_loss's target, the hinge's labels) is read as the half it is
    assert "const float* __restrict__ e" not in source
    assert ("b" not in args) or f"const {ctype}* __restrict__ e0" in source
    smoke_compile(fam, p, 1)


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.mean(a, dim=0)", "torch.randn(64, 100)", "scalar output"),
    ("torch.norm(a - 1, dim=1).mean()", "torch.randn(64, 100)", "not only elementwise"),
    ("torch.sqrt(a.sum())", "torch.rand(64, 100)", "more than scalar ops by constants"),
])
def test_whole_tensor_reduction_refusals(tmp_path, expr, inputs, why):
    from cuforge.kernels.reduce_all import match_reduce_all

    found = match_reduce_all(problem_from_expr(tmp_path, expr, inputs, args="a"))
    assert isinstance(found, str) and why in found, found


@pytest.mark.parametrize("layer, shape, kind, nd", [
    ("nn.MaxPool1d(kernel_size=8, stride=1, padding=4, dilation=3)", "(4, 6, 300)", "max", 1),
    ("nn.MaxPool2d(kernel_size=4, stride=1, padding=1)", "(2, 3, 40, 41)", "max", 2),
    ("nn.MaxPool3d(kernel_size=3, stride=2, padding=1, dilation=3)", "(2, 3, 20, 21, 22)", "max", 3),
    ("nn.AvgPool1d(kernel_size=8, stride=1, padding=4)", "(4, 6, 300)", "avg", 1),
    ("nn.AvgPool2d(kernel_size=11)", "(2, 3, 100, 90)", "avg", 2),
    ("nn.AvgPool3d(kernel_size=3, stride=2, padding=1, count_include_pad=False)", "(2, 3, 20, 21, 22)", "avg", 3),
])
def test_pooling_matches_and_compiles(tmp_path, layer, shape, kind, nd):
    from cuforge.kernels.pool import Pool, match_pool

    p = problem_from_expr(tmp_path, "self.pool(a)", f"torch.randn{shape}", args="a", init=f"        self.pool = {layer}")
    m = match_pool(p)
    assert not isinstance(m, str), m
    # The output size computed from the traced sizes is the one PyTorch produced; unit dims lead.
    assert m.kind == kind and m.out[3 - nd:] == tuple(p.outputs[0].shape[2:]) and m.out[:3 - nd] == (1,) * (3 - nd)
    assert m.count_pad == ("count_include_pad=False" not in layer)
    smoke_compile(Pool(), p, 1)


def test_pooling_of_unit_dims_added_and_dropped_around_it(tmp_path):
    # KernelBench level2/55 pools a GEMM's features: (N, F) -> unsqueeze(1) -> max_pool1d (traced as a 2-d pool
    # of one more unsqueeze) -> squeeze(1). Inserting and dropping unit dims moves no memory.
    from cuforge.kernels.pool import Pool, match_pool

    p = problem_from_expr(tmp_path, "F.max_pool1d(a.unsqueeze(1), 4).squeeze(1)", "torch.randn(16, 1000)", args="a")
    m = match_pool(p)
    assert not isinstance(m, str), m
    assert (m.planes, m.size, m.out, m.kernel) == (16, (1, 1, 1000), (1, 1, 250), (1, 1, 4))
    assert Pool().render(Pool().seeds(p)[0], p).launch.outputs == ((repr((16, 250)), "float32"),)
    smoke_compile(Pool(), p, 1)
    # Anything else after the pooling is another kernel's.
    assert "other than squeezes" in match_pool(problem_from_expr(tmp_path, "F.max_pool1d(a.unsqueeze(1), 4).squeeze(1) * 2",
                                                                 "torch.randn(16, 1000)", args="a"))
    assert "not the input" in match_pool(problem_from_expr(tmp_path, "F.max_pool1d(a.transpose(0, 1).unsqueeze(1), 4)",
                                                           "torch.randn(16, 1000)", args="a"))


def test_pooling_rows_are_read_once_for_the_output_rows_that_share_them():
    """Which of a thread's output rows each input row of their windows feeds: a 4-tap stride-1 window
    over 4 output rows reads 7 rows, not 16; a stride-2, dilation-3 window leaves rows no one uses."""
    from cuforge.kernels.pool import row_users

    assert row_users(4, 1, 4, 1) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3], [2, 3], [3]]
    assert row_users(2, 2, 3, 3) == [[0], [], [1], [0], [], [1], [0], [], [1]]
    assert row_users(1, 11, 11, 1) == [[0]] * 11
    # Every (output row, tap) pair appears exactly once.
    for rh, st, k, d in [(4, 1, 4, 1), (2, 2, 3, 3), (4, 2, 3, 1), (2, 1, 8, 3)]:
        pairs = sorted((j, r - j * st) for r, users in enumerate(row_users(rh, st, k, d)) for j in users)
        assert pairs == sorted((j, t * d) for j in range(rh) for t in range(k))


def test_pooling_seeds_fit_kernelbench_shapes(tmp_path):
    """Seeds leave few columns idle and keep rows that neighbouring windows share (at small sizes of
    KernelBench's 2-d max pooling: a 4x4 stride-1 window)."""
    from cuforge.kernels.pool import Pool

    p = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 64, 512)", args="a",
                          init="        self.pool = nn.MaxPool2d(kernel_size=4, stride=1, padding=1)")
    seeds = Pool().seeds(p)
    # 511 columns: 128 threads x 4 consecutive ones (float4 loads), one idle; 4 output rows a thread.
    assert seeds[0] == dict(BX=128, TY=1, RW=4, RH=4, VEC=4)
    assert dict(BX=128, TY=2, RW=4, RH=4, VEC=1) in seeds  # and the same with columns 128 apart
    assert all(Pool().valid(c, p) for c in seeds) and len({tuple(sorted(c.items())) for c in seeds}) == len(seeds)
    # float4 loads need rows of a multiple of 4 and every thread's first column equally aligned.
    odd = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 64, 510)", args="a",
                            init="        self.pool = nn.MaxPool2d(kernel_size=4, stride=1, padding=1)")
    assert all(c["VEC"] == 1 for c in Pool().seeds(odd)) and not Pool().valid(dict(seeds[0]), odd)
    assert not Pool().valid(dict(BX=128, TY=1, RW=2, RH=1, VEC=4), p)  # 2 columns of stride 1: 8-byte steps
    # Windows side by side along the row (KernelBench's 11 x 11 stride-11 average pool): one column a
    # thread first, float4s after; overlapping windows (the 3-d pools' 3 wide, stride 2) keep float4s first.
    apart = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 64, 2048)", args="a",
                              init="        self.pool = nn.AvgPool2d(kernel_size=11)")
    seeds = Pool().seeds(apart)
    assert [c["VEC"] for c in seeds[:2]] == [1, 1] and any(c["VEC"] == 4 for c in seeds)
    near = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 64, 2048)", args="a",
                             init="        self.pool = nn.AvgPool2d(kernel_size=3, stride=2, padding=1)")
    assert Pool().seeds(near)[0]["VEC"] == 4
    # 3-d windows: a float4 of outputs a thread, 16 threads a row, first (KernelBench's two 3-d files)
    cube = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 16, 16, 64)", args="a",
                             init="        self.pool = nn.MaxPool3d(kernel_size=3, stride=2, padding=1)")
    assert Pool().seeds(cube)[0] == dict(BX=16, TY=8, RW=4, RH=1, VEC=4)


@pytest.mark.parametrize("layer, why", [
    ("nn.MaxPool2d(kernel_size=3, ceil_mode=True)", "ceil_mode"),
    ("nn.AvgPool2d(kernel_size=3, divisor_override=2)", "divisor_override"),
])
def test_pooling_refusals(tmp_path, layer, why):
    from cuforge.kernels.pool import match_pool

    p = problem_from_expr(tmp_path, "self.pool(a)", "torch.randn(2, 3, 40, 41)", args="a", init=f"        self.pool = {layer}")
    found = match_pool(p)
    assert isinstance(found, str) and why in found, found


@pytest.mark.parametrize("expr, inputs, fam", [
    ("torch.triu(a @ b)", "torch.randn(64, 32), torch.randn(32, 64)", "gemm_f32"),
    ("torch.tril(torch.bmm(a, b), diagonal=-1)", "torch.randn(3, 40, 16), torch.randn(3, 16, 40)", "gemm_f32"),
    ("torch.tril(a * 2, 1) + b", "torch.randn(5, 64, 64), torch.randn(5, 64, 64)", "pointwise"),
])
def test_triangular_masks_fuse_as_epilogues(tmp_path, expr, inputs, fam):
    from cuforge.kernels.fp32 import GemmF32

    p = problem_from_expr(tmp_path, expr, inputs)
    assert fam in [f.name for f in families_for(p)[0]]
    smoke_compile(GemmF32() if fam == "gemm_f32" else PointwiseChain(), p, 1)
    if fam == "pointwise":
        assert match_pointwise(p).chain.indexed  # the mask needs each element's row and column


@pytest.mark.parametrize("expr, mean, ignore, smoothing, dtype", [
    ("F.cross_entropy(a, t)", True, -100, None, "float32"),
    ("F.cross_entropy(a, t, reduction='sum', ignore_index=3)", False, 3, None, "float32"),
    # Label smoothing: PyTorch traces the rows' sums of log-probabilities after nll_loss, scaled and added.
    ("F.cross_entropy(a, t, label_smoothing=0.1, ignore_index=3)", True, 3, (0.9, 0.1 / 1000), "float32"),
    ("F.cross_entropy(a, t, label_smoothing=0.2, reduction='sum')", False, -100, (0.8, 0.2 / 1000), "float32"),
    ("F.cross_entropy(a, t, label_smoothing=0.1)", True, -100, (0.9, 0.1 / 1000), "bfloat16"),
    ("F.cross_entropy(a, t)", True, -100, None, "float16"),
])
def test_cross_entropy_matches_and_compiles(tmp_path, expr, mean, ignore, smoothing, dtype):
    from cuforge.kernels.cross_entropy import CrossEntropy, match_cross_entropy

    p = problem_from_expr(tmp_path, expr, f"torch.randn(64, 1000, dtype=torch.{dtype}), torch.randint(0, 1000, (64,))",
                          args="a, t")
    m = match_cross_entropy(p)
    assert not isinstance(m, str), m
    assert (m.rows, m.classes, m.mean, m.ignore_index, m.dtype) == (64, 1000, mean, ignore, dtype)
    assert (m.smoothing is None) == (smoothing is None)
    if smoothing:
        assert m.smoothing == pytest.approx(smoothing, rel=1e-6)
    fam = CrossEntropy()
    assert fam.seeds(p)[0]["VEC"] == (4 if dtype == "float32" else 8)  # 16-byte loads
    smoke_compile(fam, p, 2)


def test_cross_entropy_with_class_weights_is_refused(tmp_path):
    from cuforge.kernels.cross_entropy import match_cross_entropy

    p = problem_from_expr(tmp_path, "F.cross_entropy(a, t, weight=w)", "torch.randn(64, 10), torch.randint(0, 10, (64,)), torch.rand(10)",
                          args="a, t, w")
    assert isinstance(match_cross_entropy(p), str)
    # Something after the smoothed loss, and a loss per row: neither is the tail PyTorch traces for smoothing.
    for expr, why in (("F.cross_entropy(a, t, label_smoothing=0.1) * 2", "ops after nll_loss other than label smoothing's"),
                      ("F.cross_entropy(a, t, label_smoothing=0.1, reduction='none')", "nll_loss without a mean or sum reduction")):
        p = problem_from_expr(tmp_path, expr, "torch.randn(64, 10), torch.randint(0, 10, (64,))", args="a, t")
        got = match_cross_entropy(p)
        assert isinstance(got, str) and why in got, got


def test_a_3d_tensor_times_a_matrix_is_one_gemm_over_merged_rows(tmp_path):
    from cuforge.kernels.fp32 import GemmF32, Gemv, match_gemm

    p = problem_from_expr(tmp_path, "torch.relu(torch.matmul(a, b))", "torch.randn(4, 50, 64), torch.randn(64, 72)")
    m = match_gemm(p)
    assert not isinstance(m, str), m
    assert (m.a, m.a_merged, m.m, m.k, m.n, m.out_shape) == ("in0", True, 200, 64, 72, (4, 50, 72))
    assert "relu" in m.epilogue.body or "fmaxf" in m.epilogue.body
    cand = GemmF32().render(GemmF32().seeds(p)[0], p)
    assert "in0.numel() // in0.shape[-1]" in repr(cand.launch.bindings) and "(4, 50, 72)" in repr(cand.launch.outputs)
    assert isinstance(Gemv.match(p), str)  # the GEMV family reads A's first dim as M: not for merged rows
    smoke_compile(GemmF32(), p, 1)


@pytest.mark.parametrize("expr, keepdim, scale", [
    ("torch.sum(torch.sigmoid(a @ b), dim=1, keepdim=True)", True, ""),
    ("torch.sum((a @ b) / 2, dim=1, keepdim=True) * 1.5", True, "* 1.5f"),
    ("torch.sum(torch.relu(a @ b), dim=-1) / 4", False, "* 0.25f"),
])
def test_row_sums_keep_their_dim_and_fold_constant_scales(tmp_path, expr, keepdim, scale):
    from cuforge.kernels.fp32 import GemmF32, match_gemm

    p = problem_from_expr(tmp_path, expr, "torch.randn(64, 32), torch.randn(32, 48)")
    m = match_gemm(p)
    assert not isinstance(m, str), m
    assert m.epilogue.rowsum and m.epilogue.keepdim == keepdim and scale in m.epilogue.body
    assert m.out_shape == ((64, 1) if keepdim else (64,))
    smoke_compile(GemmF32(), p, 1)


def test_a_row_sum_followed_by_other_than_a_constant_scale_is_refused(tmp_path):
    from cuforge.kernels.fp32 import match_gemm

    found = match_gemm(problem_from_expr(tmp_path, "torch.sum(a @ b, dim=1, keepdim=True) + 1", "torch.randn(64, 32), torch.randn(32, 48)"))
    assert isinstance(found, str) and "not a scale by a constant" in found


@pytest.mark.parametrize("expr, inputs", [
    ("a / torch.norm(a, p='fro')", "torch.randn(4, 16, 8, 8)"),
    ("a / torch.linalg.vector_norm(a)", "torch.randn(33, 7)"),
])
def test_whole_tensor_l2_normalization_matches_and_compiles(tmp_path, expr, inputs):
    p = problem_from_expr(tmp_path, expr, inputs, args="a")
    m = match_norm_all(p)
    assert not isinstance(m, str), m
    fam = NormAll()
    seeds = fam.seeds(p)
    assert all(c["VEC"] == (4 if m.numel % 4 == 0 else 1) for c in seeds)
    launch = fam.render(seeds[0], p).launch
    assert [k[0] for k in launch.pre] == ["norm_all_sumsq"] and launch.scratch[0] == ("(PARTS,)", "float64", "empty")
    assert launch.scratch[1] == ("(1,)", "int32", "zeros")  # the count of blocks done starts from zero every call
    smoke_compile(fam, p, 2)
