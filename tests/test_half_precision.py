"""Kernels in half precision on the CPU: row norms (kernels/norms.py: LLaMA's RMSNorm as the model
writes it - `x.float()`, the norm in fp32, `.to(x.dtype)`, the weight - a layer norm of a bf16 or fp16
tensor, and the same norm after a residual add, the add PyTorch's) and pointwise chains (rotary
embeddings through a partition); each config renders and compiles with NVRTC for sm_90a. The dtypes a
partition's parts read and make follow the trace's casts (the trace records no dtypes)."""

import pytest

from cuforge.kernels.chains import compile_chain
from cuforge.kernels.families import families_for
from cuforge.kernels.norms import NormRows, match_norm
from cuforge.kernels.partition import value_dtypes
from cuforge.kernels.pointwise import PointwiseChain, match_pointwise
from template_helpers import problem_from_expr, smoke_compile

# As LLaMA writes it: h = x.float(); h * rsqrt(mean(h^2) + eps), cast back, times the weight.
LLAMA = "(lambda h: self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(a.dtype))(a.float())"
HALF = {"bf16": ("bfloat16", "torch.bfloat16"), "fp16": ("float16", "torch.float16")}


def llama(tmp_path, name: str, cols: int = 512):
    dtype, torch_dtype = HALF[name]
    return problem_from_expr(tmp_path, LLAMA, f"torch.randn(64, {cols}, dtype={torch_dtype})", args="a",
                             init=f"        self.w = nn.Parameter(torch.rand({cols}, dtype={torch_dtype}) + 0.5)")


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_llamas_rmsnorm_in_half_precision_is_one_kernel(tmp_path, name):
    p = llama(tmp_path, name)
    m = match_norm(p)
    assert not isinstance(m, str), m
    assert (m.kind, m.x, m.weight, m.dtype) == ("rmsnorm", "in0", None, HALF[name][0])
    # The cast back to the input's dtype rounds where the model does; the weight is then read as a half.
    rounding = "__float2bfloat16_rn" if name == "bf16" else "__float2half_rn"
    assert rounding in m.epilogue.body and m.epilogue.launch_args() == ("param0",)
    assert [f.name for f in families_for(p)[0]][:1] == ["norm_rows"]
    n = NormRows()
    cand = n.render(n.seeds(p)[0], p)
    assert cand.launch.outputs == (("in0.shape", HALF[name][0]),)
    smoke_compile(n, p, 4)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_a_half_precision_layer_norm_and_its_residual_form(tmp_path, name):
    dtype, torch_dtype = HALF[name]
    init = f"        self.norm = nn.LayerNorm(256).to({torch_dtype})"
    p = problem_from_expr(tmp_path, "self.norm(a)", f"torch.randn(33, 256, dtype={torch_dtype})", args="a", init=init)
    m = match_norm(p)
    assert not isinstance(m, str) and (m.kind, m.weight, m.bias, m.dtype) == ("layernorm", "param0", "param1", dtype)
    smoke_compile(NormRows(), p, 4)
    # A residual add before it: one kernel (residual_norm), the add's value never written out.
    two = problem_from_expr(tmp_path, "self.norm(a + b)", f"torch.randn(33, 256, dtype={torch_dtype}), "
                            f"torch.randn(33, 256, dtype={torch_dtype})", init=init)
    assert [f.name for f in families_for(two)[0]] == ["residual_norm"], families_for(two)[1][-300:]


def test_a_norm_whose_output_dtype_is_not_its_inputs_is_refused_with_the_reason(tmp_path):
    # A bf16 input normalised in fp32 and scaled by an fp32 weight, never cast back: an fp32 output.
    p = problem_from_expr(tmp_path, "(lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w)(a.float())",
                          "torch.randn(8, 128, dtype=torch.bfloat16)", args="a",
                          init="        self.w = nn.Parameter(torch.ones(128))")
    assert p.outputs[0].dtype == "float32"
    assert match_norm(p) == "the normalized input's dtype is not the output's"


def test_a_chain_casts_only_where_its_kernel_allows_it(tmp_path):
    p = problem_from_expr(tmp_path, "torch.relu(a).half().float() * 2", "torch.randn(16, 32)", args="a")
    assert "_to_copy" in [n.op for n in p.graph]
    anchor = p.graph[0]
    refused = compile_chain(p, p.graph[1:], anchor.out, (16, 32))
    assert isinstance(refused, str) and "_to_copy" in refused
    allowed = compile_chain(p, p.graph[1:], anchor.out, (16, 32), casts=True)
    assert not isinstance(allowed, str) and "__float2half_rn" in allowed.body
    # The pointwise family takes the round trip (fp32 in and out, rounded to fp16 between).
    m = match_pointwise(p)
    assert not isinstance(m, str) and "__float2half_rn" in m.chain.body and m.dtype == "float32"
    smoke_compile(PointwiseChain(), p, 2)
    # A cast to an integer type is no chain's.
    q = problem_from_expr(tmp_path, "torch.relu(a).long().float()", "torch.randn(16, 32)", args="a")
    assert "cast to torch.int64" in str(match_pointwise(q))


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_half_precision_pointwise_chains(tmp_path, name):
    dtype, torch_dtype = HALF[name]
    half = f"dtype={torch_dtype}"
    p = problem_from_expr(tmp_path, "torch.tanh(a) * b + 0.5", f"torch.randn(64, 1000, {half}), torch.randn(64, 1000, {half})")
    m = match_pointwise(p)
    assert not isinstance(m, str) and m.dtype == dtype and m.anchor == "in0"
    assert m.chain.ctype == ("__nv_bfloat16" if name == "bf16" else "__half")
    assert PointwiseChain().render(PointwiseChain().seeds(p)[0], p).launch.outputs == (("in0.shape", dtype),)
    smoke_compile(PointwiseChain(), p, 4)
    outer = problem_from_expr(tmp_path, "a * b", f"torch.randn(64, 1, {half}), torch.randn(1, 100, {half})")
    assert match_pointwise(outer).anchor is None  # every input read at its broadcast index
    smoke_compile(PointwiseChain(), outer, 2)
    # Operands of another dtype are refused with the reason.
    mixed = problem_from_expr(tmp_path, "a * b", f"torch.randn(64, 100, {half}), torch.randn(64, 100)")
    assert "dtype" in str(match_pointwise(mixed))


@pytest.mark.parametrize("suffix", ["@bf16", "@fp16"])
def test_rotary_embeddings_in_half_precision_are_one_kernel(suffix):
    # rotate_half (slices side by side) and the interleaved form (strided slices, stack) alike
    from cuforge.problems.suites import load_problem

    for name in ("rotary_half", "rotary_interleaved"):
        assert [f.name for f in families_for(load_problem(f"models/{name}{suffix}"))[0]] == ["pointwise"]


def test_the_dtypes_a_partition_reads_follow_the_casts(tmp_path):
    p = llama(tmp_path, "bf16")
    dtypes = value_dtypes(p)
    by_op = [(n.op, dtypes.get(n.out)) for n in p.graph]
    # x.float() and what follows are fp32; .to(a.dtype) and the weight's product are bf16 again.
    assert by_op[0] == ("_to_copy", "float32") and by_op[-1] == ("mul", "bfloat16")
    assert ("_to_copy", "bfloat16") in by_op and ("rsqrt", "float32") in by_op


HALF_REDUCTIONS = [("torch.sum(x, dim=1)", "33, 1001, 40"), ("torch.mean(x, dim=-1, keepdim=True)", "64, 4099"),
                   ("torch.amax(x, dim=(1, 2))", "8, 16, 33, 64"), ("torch.argmax(x, dim=1)", "16, 257, 96"),
                   ("torch.logsumexp(x, dim=1)", "8, 300, 64"), ("torch.tanh(torch.min(x, dim=1).values) * 2", "4, 64, 128")]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, shape", HALF_REDUCTIONS)
def test_reductions_over_a_dim_take_half_precision(tmp_path, name, expr, shape):
    # Values come back in the input's dtype, indices as int64; the sums run in fp64, the rest in fp32.
    from cuforge.kernels.reduce_dim import ReduceDim, match_dim_reduction

    p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype=torch.{name})", "x")
    found = match_dim_reduction(p)
    assert not isinstance(found, str), found
    assert found.dtype == name and families_for(p)[0][0].name == "reduce_dim"
    fam = ReduceDim()
    out_dtype = fam.render(fam.seeds(p)[0], p).launch.outputs[0][1]
    assert out_dtype == ("int64" if "argmax" in expr else name)
    smoke_compile(fam, p, 2)


HALF_POOLS = [("F.max_pool2d(x, 3, 2, 1)", "2, 8, 33, 47"), ("F.avg_pool2d(x, 4, 4)", "2, 4, 64, 64"),
              ("F.max_pool1d(x, 4, 2, 1, 2)", "4, 8, 1001"), ("F.avg_pool3d(x, 3, 2, 1)", "1, 4, 9, 17, 17")]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, shape", HALF_POOLS)
def test_pooling_takes_half_precision_one_element_a_load(tmp_path, name, expr, shape):
    from cuforge.kernels.pool import Pool

    p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype=torch.{name})", "x")
    fam = Pool()
    assert fam.supports(p) is None and families_for(p)[0][0].name == "pool"
    seeds = fam.seeds(p)
    assert seeds and all(c["VEC"] == 1 for c in seeds)  # float4 loads are fp32's
    assert not fam.valid({**seeds[0], "VEC": 4, "RW": 4}, p)
    assert fam.render(seeds[0], p).launch.outputs[0][1] == name
    smoke_compile(fam, p, 2)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, inputs, args", [
    ("torch.cumsum(x, dim=-1)", "torch.randn(8, 4099, dtype=D)", "x"),
    ("torch.cumprod(x, dim=1)", "torch.rand(4, 1000, dtype=D) + 0.5", "x"),
    ("torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])", "torch.randn(8, 4096, dtype=D)", "x"),
    ("torch.cumsum(x * m, dim=-1)", "torch.randn(8, 999, dtype=D), torch.rand(8, 999) > 0.5", "x, m")])
def test_scans_take_half_precision_one_element_a_load(tmp_path, name, expr, inputs, args):
    from cuforge.kernels.scan import ScanRows

    p = problem_from_expr(tmp_path, expr, inputs.replace("D", f"torch.{name}"), args)
    fam = ScanRows()
    assert fam.supports(p) is None and families_for(p)[0][0].name == "scan_rows", fam.supports(p)
    cand = fam.render(fam.seeds(p)[0], p)
    assert cand.launch.outputs[0][1] == name and "float4" not in cand.source.split("typedef")[-1]
    smoke_compile(fam, p, 2)


HALF_CONVS = [("nn.Conv2d(32, 32, 3, padding=1, groups=32)", "2, 32, 33, 47", "y"),
              ("nn.Conv2d(3, 16, 5, stride=2, padding=2)", "2, 3, 64, 64", "torch.relu(y + self.bias)"),
              ("nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, groups=4)", "2, 8, 17, 17", "y")]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("layer, shape, tail", HALF_CONVS)
def test_direct_convolutions_take_half_precision(tmp_path, name, layer, shape, tail):
    # Depthwise (MobileNet's), few input channels (an image's), transposed and grouped: fp32 sums, the
    # weights kept in shared memory as fp32, the output in the input's dtype.
    from cuforge.kernels.conv_direct import ConvDirect

    p = problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn({shape}, dtype=torch.{name})", "a",
                          f"        self.conv = {layer.replace(')', f', dtype=torch.{name})', 1)}\n"
                          f"        self.bias = nn.Parameter(torch.randn(16, 1, 1, dtype=torch.{name}))")
    fam = ConvDirect()
    assert fam.supports(p) is None, fam.supports(p)
    assert fam.render(fam.seeds(p)[0], p).launch.outputs[0][1] == name
    smoke_compile(fam, p, 2)


HALF_NORMS = [("F.group_norm(x, 4, self.w, self.b)", "2, 16, 17, 19", 16), ("F.layer_norm(x, (33, 40), self.w, self.b)", "4, 33, 40", (33, 40)),
              ("F.instance_norm(x)", "2, 8, 31, 31", None), ("x / torch.norm(x, p=2, dim=1, keepdim=True)", "16, 1001", None),
              ("x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", "4, 64, 9, 9", None)]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr, shape, affine", HALF_NORMS)
def test_normalizations_take_half_precision_and_the_on_chip_row_kernels_refuse_it(tmp_path, name, expr, shape, affine):
    from cuforge.kernels.normalize import Normalize
    from cuforge.kernels.rows_cluster import match_rows

    dt = f"dtype=torch.{name}"
    init = (f"        self.w = nn.Parameter(torch.rand({affine}, {dt}) + 0.5)\n        self.b = nn.Parameter(torch.randn({affine}, {dt}))"
            if affine else "        pass")
    p = problem_from_expr(tmp_path, expr, f"torch.randn({shape}, {dt})", "x", init)
    fam = Normalize()
    assert fam.supports(p) is None, fam.supports(p)
    assert [f.name for f in families_for(p)[0]][0] == "normalize"
    seeds = fam.seeds(p)
    assert all(c["VEC"] == 1 for c in seeds) and fam.render(seeds[0], p).launch.outputs[0][1] == name
    assert isinstance(match_rows(p), str)  # the cluster and team kernels keep fp32 rows only
    smoke_compile(fam, p, 2)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("expr", ["torch.softmax(a, dim=-1)", "torch.log_softmax(a * 0.125, dim=-1)"])
def test_row_softmax_takes_half_precision(tmp_path, name, expr):
    """The attention and cross-entropy blocks' softmax in bf16/fp16: vectors of the half type (whose
    header the kernel includes before it sizes them), fp32 math, stored in the input's dtype."""
    from cuforge.kernels.softmax import SoftmaxRows

    p = problem_from_expr(tmp_path, expr, f"torch.randn(48, 1000, dtype=torch.{name})", args="a")
    fam = SoftmaxRows()
    assert fam.supports(p) is None, fam.supports(p)
    assert fam.render(fam.seeds(p)[0], p).launch.outputs == (("in0.shape", name),)
    smoke_compile(fam, p, 2)


def test_a_dtype_follows_pytorch_s_promotion_or_no_kernel_reads_the_value(tmp_path):
    """SDPA's math path in fp16 as traced: the products run in fp32 after casts, the causal mask is
    where(bool, fp32 0-dim, fp32 0-dim), and a 0-dim fp32 tensor beside a half tensor keeps it half, as in
    PyTorch. Every kernel part is told the dtype of what it reads and makes; none is guessed."""
    from cuforge.kernels.families import one_kernel
    from cuforge.kernels.partition import kernel_problem, partition

    expr = ("F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(q.dtype)"
            " + a * torch.tensor(2.0)")
    half = "dtype=torch.float16"
    p = problem_from_expr(tmp_path, expr, f"torch.randn(2, 4, 64, 32, {half}), torch.randn(2, 4, 64, 32, {half}), "
                          f"torch.randn(2, 4, 64, 32, {half}), torch.randn(2, 4, 64, 32, {half})", args="q, k, v, a")
    dtypes = value_dtypes(p)
    ops = {n.op: dtypes.get(n.out) for n in p.graph}
    assert ops["where"] == "float32" and ops["bmm"] == "float32" and ops["tril"] is None
    scaled = next(n for n in p.graph if n.op == "mul" and any(r == "in3" for r in n.args))
    assert dtypes[scaled.out] == "float16"  # a half tensor times an fp32 0-dim tensor: half
    for q in partition(p, one_kernel):
        if q.family is not None:
            wanted = [dtypes[r] if not r.startswith("in") else p.inputs[int(r[2:])].dtype for r in q.reads]
            assert [s.dtype for s in q.problem.inputs] == wanted, (q.family.name, q.reads)
            assert q.problem.outputs[0].dtype == dtypes[q.makes[0]]
    mask = next(n for n in p.graph if n.op == "tril")
    after = next(i for i, n in enumerate(p.graph) if n.out == mask.out) + 1
    assert "not floating point" in kernel_problem(p, after - 1, after, [mask.args[0]], mask.out)  # the bool mask


ROTATE_HALF = "q * cos + torch.cat((-q[..., {h}:], q[..., :{h}]), dim=-1) * sin"


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_rotary_embeddings_rotate_half_is_one_pointwise_kernel(tmp_path, name):
    """LLaMA's rotate_half (cat(-x[..., h:], x[..., :h])) read in place: column c of the concatenation is
    the input at c + h (negated) or c - h, so the kernel reads q once and makes no sliced or concatenated
    copy. The fp32 chain's body, run on the CPU, is PyTorch's result; every dtype compiles."""
    import torch

    from cuforge.kernels.pointwise import PointwiseChain, match_pointwise
    from template_helpers import chain_on_host

    dt = f"dtype=torch.{name}"
    p = problem_from_expr(tmp_path, ROTATE_HALF.format(h=8), f"torch.randn(2, 3, 5, 16, {dt}), torch.randn(5, 16, {dt}), "
                          f"torch.randn(5, 16, {dt})", args="q, cos, sin")
    m = match_pointwise(p)
    assert not isinstance(m, str), m
    assert m.chain.indexed and sorted(ref for ref, _ in m.chain.tensors) == ["in0", "in1", "in2"]
    smoke_compile(PointwiseChain(), p, 1)
    if name == "float32":
        g = torch.Generator().manual_seed(0)
        q, cos, sin = torch.randn(2, 3, 5, 16, generator=g), torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)
        want = q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin
        given = {"in0": q, "in1": cos, "in2": sin}
        got = chain_on_host(tmp_path, m.chain, q, [given[ref] for ref, _ in m.chain.tensors])
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


INTERLEAVED = ("(lambda e, o: torch.stack((e * cos - o * sin, e * sin + o * cos), dim=-1).flatten(-2))"
               "(q[..., 0::2], q[..., 1::2])")
TRIPLES = "(lambda a, b: torch.stack((a * 2.0, b + w.unsqueeze(0), a - b), dim=-1).view(q.shape))(q[..., 0::3], q[..., 1::3])"


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_interleaved_pairs_are_read_in_place(tmp_path, name):
    """GPT-J/NeoX's interleaved rotary embedding (even and odd columns rotated, stacked and flattened
    back) as one pointwise kernel: column c is piece c % 2 at column c // 2 of the half grid, read from q
    at 2 (c // 2) + 0 or 1 and from the (S, D/2) tables at their own index. A stack of three pieces with
    an operand viewed to one more dim works the same. The fp32 chain, run on the CPU, is PyTorch's."""
    import torch

    from cuforge.kernels.pointwise import PointwiseChain, match_pointwise
    from template_helpers import chain_on_host

    dt = f"dtype=torch.{name}"
    p = problem_from_expr(tmp_path, INTERLEAVED, f"torch.randn(2, 3, 5, 16, {dt}), torch.randn(5, 8, {dt}), "
                          f"torch.randn(5, 8, {dt})", args="q, cos, sin")
    m = match_pointwise(p)
    assert not isinstance(m, str), m
    assert m.chain.indexed and sorted(ref for ref, _ in m.chain.tensors) == ["in0", "in1", "in2"]
    assert families_for(p)[0][0].name == "pointwise"
    smoke_compile(PointwiseChain(), p, 1)
    triples = problem_from_expr(tmp_path, TRIPLES, f"torch.randn(4, 7, 12, {dt}), torch.randn(7, 4, {dt})", args="q, w")
    t = match_pointwise(triples)
    assert not isinstance(t, str), t
    if name == "float32":
        g = torch.Generator().manual_seed(0)
        q, cos, sin = torch.randn(2, 3, 5, 16, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
        e, o = q[..., 0::2], q[..., 1::2]
        want = torch.stack((e * cos - o * sin, e * sin + o * cos), dim=-1).flatten(-2)
        given = {"in0": q, "in1": cos, "in2": sin}
        got = chain_on_host(tmp_path, m.chain, q, [given[ref] for ref, _ in m.chain.tensors])
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        x, w = torch.randn(4, 7, 12, generator=g), torch.randn(7, 4, generator=g)
        a, b = x[..., 0::3], x[..., 1::3]
        want = torch.stack((a * 2.0, b + w.unsqueeze(0), a - b), dim=-1).view(x.shape)
        given = {"in0": x, "in1": w}
        got = chain_on_host(tmp_path, t.chain, x, [given[ref] for ref, _ in t.chain.tensors])
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


@pytest.mark.parametrize("expr, why", [
    ("torch.cat((-q[..., 8:], q[..., :4]), dim=-1) * 2.0", "slice"),  # pieces narrower than the input's row
    ("torch.cat((q[..., 8:].exp(), q[..., :8]), dim=-1) + q[..., :8].sum()", "sum"),  # a piece's slice read elsewhere
    ("torch.cat((q[..., 1::2], q[..., ::2]), dim=-1) * 2.0", "slice"),  # strided slices
])
def test_concatenations_the_chain_cannot_read_in_place_are_refused(tmp_path, expr, why):
    from cuforge.kernels.pointwise import match_pointwise

    p = problem_from_expr(tmp_path, expr, "torch.randn(2, 3, 5, 16)", args="q")
    assert why in str(match_pointwise(p)), match_pointwise(p)
