"""The pointwise-chain, dim-reduction and scan families on a real GPU against the float64 reference:
seeds and random configs on awkward shapes (lengths that no vector width divides, one-element
broadcasts, per-row and per-column operands), every reduction and scan variant."""

import pytest

from cuforge.kernels.pointwise import PointwiseChain
from cuforge.kernels.reduce_dim import ReduceDim
from cuforge.kernels.scan import ScanRows
from template_helpers import CFG, assert_all_ok, family_configs, problem_from_expr

pytestmark = pytest.mark.gpu


def check(sup, fam, p, n_random=2):
    assert fam.supports(p) is None, fam.supports(p)
    for c in family_configs(fam, p, n_random):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (p.graph, c, ev.status, ev.message)


@pytest.mark.parametrize("expr, inputs, args", [
    ("a / (1 + torch.abs(a))", "torch.randn(1000, 1001)", "a"),
    ("0.5 * a * (1.0 + torch.tanh(0.7978845608 * (a + 0.044715 * torch.pow(a, 3.0))))", "torch.randn(4096, 1024)", "a"),
    ("torch.selu(a) + F.elu(a, alpha=0.7) + F.hardsigmoid(a) + F.softplus(a) + F.hardtanh(a, -0.5, 2.0)", "torch.randn(77, 999)", "a"),
    ("F.leaky_relu(a, 0.2) * 3.14 - F.mish(a)", "torch.randn(3, 5, 7)", "a"),
    ("(a + b) * torch.sigmoid(b)", "torch.randn(257, 96), torch.randn(96)", "a, b"),
    ("torch.maximum(a, b) * a", "torch.randn(64, 33, 17), torch.randn(64, 33, 1)", "a, b"),
    ("a * b + 2", "torch.randn(1000, 1000), torch.randn(1)", "a, b"),
    # 0-dim constants made in the forward (KernelBench level2/31, 93) are literals; NaN wins a minimum.
    ("torch.min(a, torch.tensor(0.25)) * 2", "torch.randn(999, 1000)", "a"),
    ("torch.maximum(a + 0.5, torch.tensor(0.0, device=a.device))", "torch.randn(77, 999)", "a"),
    ("torch.minimum(a, torch.tensor(0.1))", "torch.where(torch.rand(64, 1024) < 0.01, torch.nan, torch.randn(64, 1024))", "a"),
    # Operands broadcast other than per element, row or column: their index from the flat one (level2/50).
    ("(a + b) * 0.5 - c", "torch.randn(4, 16, 6, 7, 9), torch.randn(16, 1, 1, 1), torch.randn(4, 1, 1, 7, 1)", "a, b, c"),
    # No input of the output's shape (level2/75's outer sum): every input read at its broadcast index.
    ("a + b", "torch.randn(1000, 1), torch.randn(1, 333, 1, 1)", "a, b"),
    # A vector of four crosses a row's end (rows of 1001), or spans two rows (rows of 3): the element past
    # the end takes the next row's operand.
    ("a * b - 1", "torch.randn(100, 1001), torch.randn(1001)", "a, b"),
    ("(a - b) * c", "torch.randn(1000, 3), torch.randn(1000, 1), torch.randn(3)", "a, b, c"),
])
def test_pointwise_chains(sup, tmp_path, expr, inputs, args):
    check(sup, PointwiseChain(), problem_from_expr(tmp_path, expr, inputs, args=args))


@pytest.mark.parametrize("expr, inputs, args", [
    ("F.gelu(a) * b", "torch.randn(1000, 1001), torch.randn(1001)", "a, b"),  # per-column operand
    ("a + b", "torch.randn(300, 1), torch.randn(1, 257)", "a, b"),  # no anchor: VEC 1 only
])
def test_pointwise_steps_of_several_vectors_a_thread(sup, tmp_path, expr, inputs, args):
    # A grid of one wave (128-thread blocks): the last step is partly past the vectors, and at VEC 1,
    # UNROLL 2 the first case's loop takes two steps.
    fam, p = PointwiseChain(), problem_from_expr(tmp_path, expr, inputs, args=args)
    configs = [dict(VEC=v, BLOCK=128, WAVES=1, UNROLL=u) for v in (1, 2, 4) for u in (2, 8)]
    assert_all_ok(sup, fam, p, [c for c in configs if fam.valid(c, p)], CFG)


@pytest.mark.parametrize("expr, shape", [
    ("torch.sum(a, dim=1, keepdim=True)", "(16, 4096, 255)"),
    ("torch.mean(a, dim=1)", "(7, 300, 1000)"),
    ("torch.max(a, dim=1)[0]", "(16, 512, 4095)"),
    ("torch.min(a, dim=0)[0]", "(3000, 64)"),
    ("torch.argmax(a, dim=1)", "(8, 1024, 333)"),
    ("torch.argmin(a, dim=0)", "(5, 9, 100)"),
    ("torch.sum(a, dim=(1, 2))", "(4, 32, 16, 40)"),
    # The elementwise chain on the reduced values; the last dims reduced a row a block (inner = 1), over
    # rows no float4 divides and rows it does.
    ("torch.tanh(torch.min(a, dim=1, keepdim=True)[0]) * 2 - 1", "(16, 64, 1000)"),
    ("F.gelu(torch.mean(a, dim=(2, 3)))", "(7, 13, 33, 35)"),
    ("torch.mean(a, dim=[-1, -2], keepdim=True).squeeze(-1).squeeze(-1)", "(64, 32, 64, 64)"),
    ("torch.sigmoid(torch.amax(a, dim=-1, keepdim=True))", "(333, 1001)"),
    ("torch.sum(a, dim=(1, 2)) / 7", "(10, 3, 4099)"),
    # logsumexp over channels and over the last dims (KernelBench level2/22, 42, 43, 58, 64, 92), at a scale
    # where exp overflows fp32 unless the max is taken out.
    ("torch.logsumexp(a, dim=1, keepdim=True)", "(16, 64, 1000) * 100"),
    ("F.mish(torch.logsumexp(a, dim=1))", "(512, 8192) * 30"),
    ("torch.logsumexp(a, dim=(2, 3))", "(7, 13, 33, 35)"),
])
def test_dim_reductions(sup, tmp_path, expr, shape):
    check(sup, ReduceDim(), problem_from_expr(tmp_path, expr, f"torch.randn{shape}", args="a"))


@pytest.mark.parametrize("inputs", [
    # Columns and rows of -inf (torch: -inf), one +inf (inf), one NaN (NaN), and -inf before any finite value.
    "torch.where(torch.rand(8, 40, 1, 50) < 0.5, -torch.inf, torch.randn(8, 40, 1, 50)).expand(8, 40, 3, 50).clone()",
    "torch.where(torch.rand(8, 40, 150) < 0.01, torch.inf, torch.where(torch.rand(8, 40, 150) < 0.01, torch.nan, torch.randn(8, 40, 150)))",
    "torch.cat([torch.full((6, 20, 70), -torch.inf), torch.randn(6, 20, 70)], dim=1)",
])
@pytest.mark.parametrize("dim", ["1", "(1, 2)"])
def test_logsumexp_with_infinities_and_nan(sup, tmp_path, inputs, dim):
    check(sup, ReduceDim(), problem_from_expr(tmp_path, f"torch.logsumexp(a, dim={dim})", inputs, args="a"))


def test_argmax_breaks_ties_towards_the_first_index(sup, tmp_path):
    # Integer-valued inputs: every column has repeated maxima, so any other tie rule gives other indices.
    p = problem_from_expr(tmp_path, "torch.argmax(a, dim=1)", "torch.randint(0, 3, (8, 512, 100)).float()", args="a")
    check(sup, ReduceDim(), p)


@pytest.mark.parametrize("op", ["argmin", "argmax", "max"])
def test_dim_reduction_chains_keep_the_first_index_past_the_main_loop(sup, tmp_path, op):
    # 509 rows: with TY x UNROLL x CHAINS = 4 x 4 x 4 the main loop stops short and the remainder deals the
    # last rows to the chains in the same order; a few values only, so every chain sees ties.
    expr = f"torch.{op}(a, dim=1)" + ("[0]" if op == "max" else "")
    p = problem_from_expr(tmp_path, expr, "torch.randint(0, 4, (6, 509, 130)).float()", args="a")
    fam = ReduceDim()
    for c in (dict(TX=32, TY=4, UNROLL=4, CHAINS=4), dict(TX=64, TY=2, UNROLL=8, CHAINS=2), dict(TX=32, TY=8, UNROLL=1, CHAINS=1)):
        ev = sup.evaluate(p, fam.render(c, p), CFG)
        assert ev.status == "ok", (c, ev.status, ev.message)


@pytest.mark.parametrize("expr, inputs, args", [
    ("torch.cumsum(a, dim=1)", "torch.rand(64, 32768)", "a"),
    ("torch.cumsum(a, dim=-1)", "torch.randn(3, 7, 1001)", "a"),
    ("torch.cumprod(a, dim=1)", "torch.rand(100, 2049) * 0.5 + 0.75", "a"),
    ("torch.cumsum(a.flip(1), dim=1).flip(1)", "torch.rand(33, 5000)", "a"),
    ("torch.cat((torch.zeros_like(a.select(1, 0).unsqueeze(1)), torch.cumsum(a.narrow(dim=1, start=0, length=a.size(1) - 1), dim=1)), dim=1)",
     "torch.rand(40, 4099)", "a"),
    ("torch.cumsum(a * m, dim=1)", "torch.rand(50, 3000), torch.randint(0, 2, (50, 3000)).bool()", "a, m"),
])
def test_scans(sup, tmp_path, expr, inputs, args):
    check(sup, ScanRows(), problem_from_expr(tmp_path, expr, inputs, args=args))


@pytest.mark.parametrize("expr, inputs, init", [
    ("a / torch.mean(torch.abs(a), dim=1, keepdim=True)", "torch.randn(64, 65535)", "        pass"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(100, 4096)", "        pass"),
    ("a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)", "torch.randn(8, 64, 33, 65)", "        pass"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(16, 300, 77)", "        pass"),
    ("self.inorm(a)", "torch.randn(8, 16, 33, 65)", "        self.inorm = nn.InstanceNorm2d(16)"),
    ("self.gn(a)", "torch.randn(8, 64, 32, 32)",
     "        self.gn = nn.GroupNorm(8, 64)\n        nn.init.normal_(self.gn.weight)\n        nn.init.normal_(self.gn.bias)"),
    ("self.ln(a)", "torch.randn(8, 16, 33, 65)",
     "        self.ln = nn.LayerNorm((16, 33, 65))\n        nn.init.normal_(self.ln.weight)\n        nn.init.normal_(self.ln.bias)"),
    ("F.layer_norm(a, (4099,), eps=1e-3)", "torch.randn(300, 4099) * 3 + 1", "        pass"),
])
def test_normalizations(sup, tmp_path, expr, inputs, init):
    from cuforge.kernels.normalize import Normalize

    check(sup, Normalize(), problem_from_expr(tmp_path, expr, inputs, args="a", init=init))


@pytest.mark.parametrize("expr, inputs, args", [
    ("torch.mean((a - b) ** 2)", "torch.randn(1000, 1001), torch.randn(1000, 1001)", "a, b"),
    ("F.smooth_l1_loss(a, b)", "torch.randn(4096, 4096), torch.randn(4096, 4096)", "a, b"),
    ("torch.mean(torch.clamp(1 - a * b, min=0))", "torch.randn(512, 3000), torch.randn(3000)", "a, b"),
    ("F.kl_div(torch.log(a), b, reduction='batchmean')", "torch.rand(256, 999).softmax(-1), torch.rand(256, 999).softmax(-1)", "a, b"),
    ("a.sum() * 0.5 + 1", "torch.randn(7, 9, 11)", "a"),
    ("torch.mean(torch.clamp(1 - a * b, min=0))", "torch.randn(64, 1001), torch.randn(1001)", "a, b"),
    ("torch.sum((a - b) * c)", "torch.randn(1000, 3), torch.randn(1000, 1), torch.randn(3)", "a, b, c"),
])
def test_whole_tensor_reductions(sup, tmp_path, expr, inputs, args):
    from cuforge.kernels.reduce_all import ReduceAll

    check(sup, ReduceAll(), problem_from_expr(tmp_path, expr, inputs, args=args))


@pytest.mark.parametrize("layer, shape", [
    ("nn.MaxPool1d(kernel_size=8, stride=1, padding=4, dilation=3)", "(4, 6, 3000)"),
    ("nn.MaxPool2d(kernel_size=4, stride=1, padding=1)", "(2, 3, 40, 41)"),
    ("nn.MaxPool3d(kernel_size=3, stride=2, padding=1, dilation=3)", "(2, 3, 20, 21, 22)"),
    ("nn.AvgPool1d(kernel_size=8, stride=1, padding=4)", "(4, 6, 3000)"),
    ("nn.AvgPool2d(kernel_size=11)", "(2, 3, 100, 90)"),
    ("nn.AvgPool3d(kernel_size=3, stride=2, padding=1, count_include_pad=False)", "(2, 3, 20, 21, 22)"),
    # rows of a multiple of 4: float4 loads, padding reaching into the first and last float4
    ("nn.MaxPool2d(kernel_size=4, stride=1, padding=1)", "(2, 3, 40, 44)"),
    ("nn.MaxPool3d(kernel_size=3, stride=2, padding=1, dilation=3)", "(2, 3, 20, 21, 24)"),
    ("nn.AvgPool3d(kernel_size=3, stride=2, padding=1, count_include_pad=False)", "(2, 3, 20, 21, 24)"),
    ("nn.AvgPool2d(kernel_size=11)", "(2, 3, 100, 88)"),
])
def test_pooling(sup, tmp_path, layer, shape):
    from cuforge.kernels.pool import Pool

    p = problem_from_expr(tmp_path, "self.pool(a)", f"torch.randn{shape}", args="a", init=f"        self.pool = {layer}")
    check(sup, Pool(), p)


def test_a_diagonal_matmul_written_as_a_row_scale(sup, tmp_path):
    p = problem_from_expr(tmp_path, "b.unsqueeze(1) * a", "torch.randn(500, 301), torch.randn(500)", args="a, b")
    check(sup, PointwiseChain(), p)


@pytest.mark.parametrize("expr, inputs", [
    ("torch.triu(a @ b)", "torch.randn(300, 200), torch.randn(200, 300)"),
    ("torch.tril(torch.bmm(a, b), diagonal=-1)", "torch.randn(3, 130, 64), torch.randn(3, 64, 130)"),
])
def test_triangular_matmuls(sup, tmp_path, expr, inputs):
    from cuforge.kernels.fp32 import GemmF32

    check(sup, GemmF32(), problem_from_expr(tmp_path, expr, inputs), n_random=1)


def test_a_triangular_mask_in_a_pointwise_chain(sup, tmp_path):
    check(sup, PointwiseChain(), problem_from_expr(tmp_path, "torch.tril(a * 2, 1) + b",
                                                     "torch.randn(5, 64, 67), torch.randn(5, 64, 67)"))


@pytest.mark.parametrize("expr, inputs", [
    ("F.cross_entropy(a, t)", "torch.randn(4096, 1000), torch.randint(0, 1000, (4096,))"),
    ("F.cross_entropy(a, t, reduction='sum', ignore_index=3)", "torch.randn(300, 7) * 4, torch.randint(0, 7, (300,))"),
    # Label smoothing (each row's sum of log-probabilities from the same pass), mean and sum, rows ignored.
    ("F.cross_entropy(a, t, label_smoothing=0.1, ignore_index=3)", "torch.randn(1000, 640) * 3, torch.randint(0, 640, (1000,))"),
    ("F.cross_entropy(a, t, label_smoothing=0.25, reduction='sum')", "torch.randn(77, 999), torch.randint(0, 999, (77,))"),
    # Half-precision logits: 16-byte loads of eight, the loss in the logits' dtype.
    ("F.cross_entropy(a, t, label_smoothing=0.1)", "torch.randn(512, 4000, dtype=torch.bfloat16), torch.randint(0, 4000, (512,))"),
    ("F.cross_entropy(a, t, ignore_index=5)", "torch.randn(300, 1003, dtype=torch.float16), torch.randint(0, 1003, (300,))"),
])
def test_cross_entropy(sup, tmp_path, expr, inputs):
    from cuforge.kernels.cross_entropy import CrossEntropy

    check(sup, CrossEntropy(), problem_from_expr(tmp_path, expr, inputs, args="a, t"))


@pytest.mark.parametrize("suffix", ["", "@bf16"])
def test_the_models_suite_s_smoothed_cross_entropy_is_one_kernel(sup, suffix):
    # A 32000-token vocabulary, label smoothing 0.1, padding rows ignored: two seeds at full size.
    from cuforge.kernels.cross_entropy import CrossEntropy
    from cuforge.problems.suites import load_problem

    fam, p = CrossEntropy(), load_problem(f"models/cross_entropy_smoothing{suffix}")
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, fam.seeds(p)[:2], CFG)


@pytest.mark.parametrize("expr, inputs", [
    ("torch.matmul(a, b)", "torch.randn(4, 130, 96), torch.randn(96, 200)"),
    ("torch.relu(torch.matmul(a, b)) * 2", "torch.randn(2, 3, 50, 64), torch.randn(64, 72)"),
])
def test_tensor_times_matrix_over_merged_rows(sup, tmp_path, expr, inputs):
    from cuforge.kernels.fp32 import GemmF32

    check(sup, GemmF32(), problem_from_expr(tmp_path, expr, inputs), n_random=1)


@pytest.mark.parametrize("expr, inputs", [
    ("torch.sum(torch.sigmoid(a @ b), dim=1, keepdim=True)", "torch.randn(100, 64), torch.randn(64, 3000)"),
    ("torch.sum((a @ b) / 2, dim=1, keepdim=True) * 1.5", "torch.randn(130, 96), torch.randn(96, 1000)"),
])
def test_gemm_row_sums_with_keepdim_and_scale(sup, tmp_path, expr, inputs):
    from cuforge.kernels.fp32 import GemmF32

    check(sup, GemmF32(), problem_from_expr(tmp_path, expr, inputs), n_random=1)


@pytest.mark.parametrize("expr, inputs", [
    ("a / torch.norm(a, p='fro')", "torch.randn(16, 64, 256, 256)"),
    ("a / torch.linalg.vector_norm(a)", "torch.randn(1001, 333) * 5"),
])
def test_whole_tensor_l2_normalization(sup, tmp_path, expr, inputs):
    from cuforge.kernels.norm_all import NormAll

    fam, p = NormAll(), problem_from_expr(tmp_path, expr, inputs, args="a")
    check(sup, fam, p)
    # Loads in flight a thread: steps of 8 and 2 vectors, then the vectors left past the last whole step
    # (333333 floats: no whole number of steps at any grid); a block per 4 x 256 or 2 x 1024 vectors, the
    # last block's partly past the end.
    vec = fam.seeds(p)[0]["VEC"]
    assert_all_ok(sup, fam, p, [dict(BLOCK=256, VEC=vec, WAVES=1, UNROLL=8), dict(BLOCK=1024, VEC=vec, WAVES=4, UNROLL=2),
                                dict(BLOCK=256, VEC=vec, WAVES=1, UNROLL=4, ONCE=1),
                                dict(BLOCK=1024, VEC=vec, WAVES=1, UNROLL=2, ONCE=1)], CFG)
