"""Families that take fp16 and bf16 besides fp32, on a real GPU, judged against float64 at the bound
PyTorch's own result in that dtype sets: reductions over a dim (values in the input's dtype, indices as
int64) over rows and over middle dims, with odd sizes that leave no whole 16-byte load; 1-3d max and
average pooling with padding, dilation and partial windows; cumulative sums and products (reversed,
exclusive, masked) over rows that are not whole blocks; direct convolutions (depthwise, few input
channels, transposed and grouped, 3-d) with their chains; group, layer and instance norms and L2/RMS
normalizations over rows and over a middle dim; eval-mode batch norm as a chain op, alone and fused
into a convolution or a linear layer (fp32 too); losses summed or averaged over the whole tensor;
training-mode batch norm with its chain."""

import pytest

from cuforge.kernels.batch_norm import BatchNorm
from cuforge.kernels.conv_direct import ConvDirect
from cuforge.kernels.normalize import Normalize
from cuforge.kernels.pool import Pool
from cuforge.kernels.reduce_all import ReduceAll
from cuforge.kernels.reduce_dim import ReduceDim
from cuforge.kernels.scan import ScanRows
from template_helpers import assert_all_ok, problem_from_expr

pytestmark = pytest.mark.gpu


def judge_seeds(sup, fam, p, seeds, what):
    """The family covers `p`, and each of its first `seeds` seeds (all: None) is judged ok."""
    assert fam.supports(p) is None, (what, fam.supports(p))
    assert_all_ok(sup, fam, p, fam.seeds(p)[:seeds], what=(what,))
REDUCTIONS = [("torch.sum(x, dim=1)", "33, 1001, 40"), ("torch.mean(x, dim=-1, keepdim=True)", "64, 4099"),
              ("torch.sum(x, dim=-1, keepdim=True)", "128, 8192"), ("torch.amax(x, dim=(1, 2))", "8, 16, 33, 64"),
              ("torch.argmax(x, dim=1)", "16, 257, 96"), ("torch.argmin(x, dim=0)", "1000, 33"),
              ("torch.logsumexp(x, dim=1)", "8, 300, 64"), ("torch.tanh(torch.min(x, dim=1).values) * 2", "4, 64, 128")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reductions_over_a_dim(sup, tmp_path, dtype):
    fam = ReduceDim()
    for expr, shape in REDUCTIONS:
        p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype=torch.{dtype})", "x", prefix="gpu")
        judge_seeds(sup, fam, p, 3, (expr, shape, dtype))


POOLS = [("F.max_pool2d(x, 3, 2, 1)", "2, 8, 33, 47"), ("F.avg_pool2d(x, 4, 4)", "2, 4, 64, 64"),
         ("F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)", "2, 8, 31, 31"),
         ("F.max_pool1d(x, 4, 2, 1, 2)", "4, 8, 1001"), ("F.avg_pool3d(x, 3, 2, 1)", "1, 4, 9, 17, 17")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_pooling(sup, tmp_path, dtype):
    fam = Pool()
    for expr, shape in POOLS:
        p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype=torch.{dtype})", "x", prefix="gpu")
        judge_seeds(sup, fam, p, 3, (expr, shape, dtype))


SCANS = [("torch.cumsum(x, dim=-1)", "torch.randn(8, 4099, dtype=D)", "x"),
         ("torch.cumprod(x, dim=1)", "torch.rand(4, 1000, dtype=D) * 0.1 + 0.95", "x"),
         ("torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])", "torch.randn(8, 32768, dtype=D)", "x"),
         ("torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), torch.cumsum(x.narrow(1, 0, 999), dim=1)), dim=1)",
          "torch.randn(16, 1000, dtype=D)", "x"),
         ("torch.cumsum(x * m, dim=-1)", "torch.randn(8, 999, dtype=D), torch.rand(8, 999) > 0.5", "x, m")]


def judge_cases(sup, tmp_path, fam, cases, dtype):
    """Each (expr, inputs with D for the dtype, args) case covered by `fam`, every seed judged ok."""
    for expr, inputs, args in cases:
        p = problem_from_expr(tmp_path, expr, inputs.replace("D", f"torch.{dtype}"), args, prefix="gpu")
        judge_seeds(sup, fam, p, None, (expr, dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_scans(sup, tmp_path, dtype):
    judge_cases(sup, tmp_path, ScanRows(), SCANS, dtype)


CONVS = [("nn.Conv2d(32, 32, 3, padding=1, groups=32)", "2, 32, 33, 47", "y"),
         ("nn.Conv2d(3, 16, 5, stride=2, padding=2)", "2, 3, 64, 64", "torch.relu(y + self.bias)"),
         ("nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, groups=4)", "2, 8, 17, 17", "y"),
         ("nn.Conv3d(3, 16, 3, padding=1)", "1, 3, 9, 17, 17", "F.gelu(y)")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_direct_convolutions(sup, tmp_path, dtype):
    fam = ConvDirect()
    for layer, shape, tail in CONVS:
        p = problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                              f"        self.conv = {layer.replace(')', f', dtype=torch.{dtype})', 1)}\n"
                              f"        self.bias = nn.Parameter(torch.randn(16, 1, 1, dtype=torch.{dtype}))", prefix="gpu")
        judge_seeds(sup, fam, p, 3, (layer, dtype))


NORMS = [("F.group_norm(x, 4, self.w, self.b)", "2, 16, 17, 19", 16), ("F.layer_norm(x, (33, 40), self.w, self.b)", "4, 33, 40", (33, 40)),
         ("F.instance_norm(x)", "2, 8, 31, 31", None), ("x / torch.norm(x, p=2, dim=1, keepdim=True)", "16, 1001", None),
         ("x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", "4, 64, 9, 9", None),
         ("F.relu(F.group_norm(x, 8, self.w, self.b)) * 2", "4, 32, 64, 64", 32)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_normalizations(sup, tmp_path, dtype):
    fam = Normalize()
    dt = f"dtype=torch.{dtype}"
    for expr, shape, affine in NORMS:
        init = (f"        self.w = nn.Parameter(torch.rand({affine}, {dt}) + 0.5)\n"
                f"        self.b = nn.Parameter(torch.randn({affine}, {dt}))" if affine else "        pass")
        p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, {dt})", "x", init, prefix="gpu")
        judge_seeds(sup, fam, p, 3, (expr, dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_eval_batch_norm_in_a_chain(sup, tmp_path, dtype):
    from cuforge.kernels.families import families_for
    from test_eval_batch_norm import bn_problem

    cases = [("torch.relu(self.bn(x))", "4, 16, 9, 9", "nn.BatchNorm2d(16)", None),
             ("self.bn(x)", "4, 16, 33", "nn.BatchNorm1d(16)", None),
             ("torch.relu(self.bn(self.conv(x)))", "2, 32, 16, 16", "nn.BatchNorm2d(32)", "nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)"),
             ("torch.relu(self.bn(self.conv(x)))", "2, 64, 16, 16", "nn.BatchNorm2d(64)", "nn.Conv2d(64, 64, 3, padding=1, bias=False)")]
    if dtype == "float32":
        cases += [("self.bn(self.conv(x))", "64, 128", "nn.BatchNorm1d(96)", "nn.Linear(128, 96)")]
    for expr, shape, bn, layer in cases:
        p = bn_problem(tmp_path, expr, shape, bn, f"torch.{dtype}", layer)
        judge_seeds(sup, families_for(p)[0][0], p, 2, (expr, layer, dtype))


LOSSES = [("torch.mean((a - b) ** 2)", "torch.randn(4096, 1001, dtype=D), torch.randn(4096, 1001, dtype=D)", "a, b"),
          ("F.smooth_l1_loss(a, b)", "torch.randn(1000, 333, dtype=D), torch.randn(1000, 333, dtype=D)", "a, b"),
          ("torch.mean(torch.clamp(1 - a * b, min=0)) * 2", "torch.randn(512, 3000, dtype=D), torch.randn(3000, dtype=D)", "a, b"),
          ("a.sum()", "torch.randn(7, 9, 11, dtype=D)", "a")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_whole_tensor_losses(sup, tmp_path, dtype):
    judge_cases(sup, tmp_path, ReduceAll(), LOSSES, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_training_batch_norm(sup, tmp_path, dtype):
    from test_batch_norm import bn_problem

    fam = BatchNorm()
    for layer, shape, tail in (("nn.BatchNorm2d(64)", "(16, 64, 32, 32)", "torch.relu(y)"), ("nn.BatchNorm1d(24, eps=1e-3)", "(8, 24, 7)", "torch.tanh(y)"),
                               ("nn.BatchNorm3d(8, affine=False)", "(2, 8, 3, 4, 5)", "y * 3")):
        judge_seeds(sup, fam, bn_problem(tmp_path, layer, shape, tail, dtype=dtype), None, (layer, dtype))


@pytest.mark.parametrize("suffix", ["", "@bf16", "@fp16"])
def test_rotary_embeddings_rotate_half_in_one_kernel(sup, tmp_path, suffix):
    """LLaMA's rotary embedding (rotate_half read in place) as one pointwise kernel: the models suite's
    problem at full size, every seed (the first reads q's partner, cos and sin as vectors, OPVEC) and
    OPVEC at the narrower vectors too, and an odd head size whose halves are not 16-byte aligned (read
    element by element)."""
    from cuforge.kernels.pointwise import PointwiseChain
    from cuforge.problems.suites import load_problem

    fam, full = PointwiseChain(), load_problem(f"models/rotary_half{suffix}")
    judge_seeds(sup, fam, full, None, suffix)
    first = fam.seeds(full)[0]
    assert first["OPVEC"] == 1
    narrower = [dict(first, VEC=v) for v in (2, 4) if v < first["VEC"]]
    assert narrower and all(fam.valid(c, full) for c in narrower)
    assert_all_ok(sup, fam, full, narrower, what=(suffix,))
    dt = {"": "torch.float32", "@bf16": "torch.bfloat16", "@fp16": "torch.float16"}[suffix]
    p = problem_from_expr(tmp_path, "q * cos + torch.cat((-q[..., 37:], q[..., :37]), dim=-1) * sin",
                          f"torch.randn(3, 4, 33, 74, dtype={dt}), torch.randn(33, 74, dtype={dt}), "
                          f"torch.randn(33, 74, dtype={dt})", args="q, cos, sin", prefix="gpu")
    judge_seeds(sup, PointwiseChain(), p, None, suffix)


@pytest.mark.parametrize("suffix", ["", "@bf16", "@fp16"])
def test_rotary_embeddings_interleaved_in_one_kernel(sup, tmp_path, suffix):
    """The interleaved rotary embedding (even and odd columns rotated, stacked and flattened back) as
    one pointwise kernel: the models suite's problem at full size, every seed, and a stack of three
    pieces whose rows are no whole 16-byte vectors."""
    from cuforge.kernels.pointwise import PointwiseChain
    from cuforge.problems.suites import load_problem

    judge_seeds(sup, PointwiseChain(), load_problem(f"models/rotary_interleaved{suffix}"), None, suffix)
    dt = {"": "torch.float32", "@bf16": "torch.bfloat16", "@fp16": "torch.float16"}[suffix]
    p = problem_from_expr(tmp_path, "(lambda a, b: torch.stack((a * 2.0, b + w.unsqueeze(0), a - b), dim=-1)"
                          ".view(q.shape))(q[..., 0::3], q[..., 1::3])",
                          f"torch.randn(3, 33, 21, dtype={dt}), torch.randn(33, 7, dtype={dt})", args="q, w", prefix="gpu")
    judge_seeds(sup, PointwiseChain(), p, None, suffix)
