"""The fp32 tolerance rule is fair to every honest summation order and still catches reduced precision.

A matrix-vector product at K up to 2^20 is summed in fp32 in the orders real kernels use (sequential,
pairwise, split-K, atomic in a random order) and with reduced-precision arithmetic (TF32-rounded
operands, fp16, bf16), then judged by verify.compare against a float64 reference with the
computation-aware scale |A| @ |x| (what verify.computation_scale computes for this model)."""

import numpy as np
import pytest
import torch

from cuforge.problems.problem import Tolerance
from cuforge.sandbox.judge import verify

TOL = Tolerance.for_dtype("float32")


def _round_mantissa(x: np.ndarray, bits: int) -> np.ndarray:
    """Round float32 values to `bits` explicit mantissa bits (TF32: 10), to nearest even."""
    i = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    drop = 23 - bits
    half = np.uint64(1 << (drop - 1))
    lsb = (i >> np.uint64(drop)) & np.uint64(1)
    i = ((i + half - np.uint64(1) + lsb) >> np.uint64(drop)) << np.uint64(drop)
    return i.astype(np.uint32).view(np.float32)


def _orders(a: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = a * x  # fp32 products, one rounding each
    k = p.shape[1]
    split = p.reshape(p.shape[0], 64, k // 64)
    perm = rng.permutation(k)
    return {
        "sequential": np.add.accumulate(p, axis=1, dtype=np.float32)[:, -1],
        "pairwise": p.sum(axis=1, dtype=np.float32),
        "split_k_64": np.add.accumulate(split.sum(axis=2, dtype=np.float32), axis=1, dtype=np.float32)[:, -1],
        "atomic_random_order": np.add.accumulate(p[:, perm], axis=1, dtype=np.float32)[:, -1],
        "fma_sequential_4_lanes": np.add.accumulate(p.reshape(p.shape[0], k // 4, 4).sum(axis=2, dtype=np.float32),
                                                    axis=1, dtype=np.float32)[:, -1],
    }


def _reduced(a: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    a16 = torch.from_numpy(a)
    x16 = torch.from_numpy(x)
    return {
        "tf32_operands": (_round_mantissa(a, 10) * _round_mantissa(x, 10)).sum(axis=1, dtype=np.float32),
        "fp16_operands": (a16.half().float() * x16.half().float()).sum(dim=1).numpy(),
        "bf16_operands": (a16.bfloat16().float() * x16.bfloat16().float()).sum(dim=1).numpy(),
        "fp16_accumulation": (a16.half() * x16.half()).float().numpy().astype(np.float16).sum(axis=1, dtype=np.float16)
        .astype(np.float32),
    }


def _judge(got: np.ndarray, ref: torch.Tensor, scale: torch.Tensor) -> verify.Comparison:
    return verify.compare(torch.from_numpy(np.ascontiguousarray(got)), ref, torch.float32, TOL, scale=scale)


@pytest.mark.parametrize("k", [4096, 65536, 2**20])
def test_every_fp32_summation_order_passes_and_reduced_precision_fails(k):
    rng = np.random.default_rng(k)
    rows = 64 if k == 2**20 else 256
    a = rng.standard_normal((rows, k), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    ref = torch.from_numpy((a.astype(np.float64) * x.astype(np.float64)).sum(axis=1))
    scale = torch.from_numpy((np.abs(a).astype(np.float64) * np.abs(x).astype(np.float64)).sum(axis=1))
    for name, got in _orders(a, x, rng).items():
        plain = verify.compare(torch.from_numpy(got), ref, torch.float32, TOL)
        cmp = _judge(got, ref, scale)
        assert cmp.ok, (k, name, cmp.reason, plain.reason)
    for name, got in _reduced(a, x).items():
        cmp = _judge(got, ref, scale)
        assert not cmp.ok and cmp.kind == "precision_downgrade", (k, name, cmp.rel_norm_err, cmp.reason)


def test_the_scale_is_the_float64_model_on_absolute_values():
    lin = torch.nn.Linear(300, 7).double()
    x = torch.randn(5, 300, dtype=torch.float64)
    (scale,) = verify.computation_scale(lin, [x])
    expected = x.abs() @ lin.weight.abs().T + lin.bias.abs()
    assert torch.allclose(scale, expected)
    assert verify.computation_scale(None, [x]) is None


def test_a_wrong_result_is_still_wrong_under_the_scaled_bound():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 4096), dtype=np.float32)
    x = rng.standard_normal((1, 4096), dtype=np.float32)
    ref = torch.from_numpy((a.astype(np.float64) * x).sum(axis=1))
    scale = torch.from_numpy((np.abs(a).astype(np.float64) * np.abs(x)).sum(axis=1))
    got = (a * x).sum(axis=1, dtype=np.float32)
    got[3] = -got[3]  # one element wrong by its own size
    cmp = _judge(got, ref, scale)
    assert not cmp.ok and cmp.kind == "wrong_output" and cmp.mismatches == 1


def _truncate_mantissa(x: np.ndarray, bits: int) -> np.ndarray:
    """Drop all but `bits` explicit mantissa bits (what a tensor core reading fp32 as TF32 may do)."""
    drop = np.uint32(23 - bits)
    return ((x.astype(np.float32).view(np.uint32) >> drop) << drop).view(np.float32)


@pytest.mark.parametrize("k", [576, 4096])
def test_under_a_tf32_reference_a_tf32_kernel_passes_and_bf16_operands_do_not(k):
    """PyTorch's default flags run a convolution on cuDNN's TF32: a candidate rounding (or truncating)
    its operands to TF32 is as accurate as that reference; one rounding them to bf16 is 8x less so."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((512, k), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    ref = torch.from_numpy((a.astype(np.float64) * x.astype(np.float64)).sum(axis=1))
    scale = torch.from_numpy((np.abs(a).astype(np.float64) * np.abs(x).astype(np.float64)).sum(axis=1))
    native = torch.from_numpy((_round_mantissa(a, 10) * _round_mantissa(x, 10)).sum(axis=1, dtype=np.float32))

    def judge(got: np.ndarray) -> verify.Comparison:
        return verify.compare(torch.from_numpy(np.ascontiguousarray(got)), ref, torch.float32, TOL,
                              native=native, scale=scale, tf32=True)

    for name, got in {"tf32_rounded": _round_mantissa(a, 10) * _round_mantissa(x, 10),
                      "tf32_truncated": _truncate_mantissa(a, 10) * _truncate_mantissa(x, 10),
                      "fp32": a * x}.items():
        cmp = judge(got.sum(axis=1, dtype=np.float32))
        assert cmp.ok, (k, name, cmp.reason)
    bf16 = _reduced(a, x)["bf16_operands"]
    cmp = judge(bf16)
    assert not cmp.ok and cmp.kind == "precision_downgrade", (k, cmp.rel_norm_err, cmp.reason)


class _Tf32Linear(torch.nn.Module):
    """A linear layer whose fp32 forward rounds its operands to TF32, as cuDNN's default convolution
    does under PyTorch's flags; its float64 copy computes exactly."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(256, k) / k ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            return x @ self.weight.T
        tf32 = lambda t: torch.from_numpy(_round_mantissa(t.detach().numpy(), 10))  # noqa: E731
        return tf32(x) @ tf32(self.weight).T


def tf32_judge(model_class: type, seed: int, k: int = 576):
    """(judge, x, weight): the whole judging path (plain bounds, then the computation-aware bound) of
    output 0 under the pytorch contract, for `model_class(k)` (a reference that rounds to TF32) on 512
    rows x, as a function of the candidate's output; the model's weight to compute candidates with."""
    import types

    from cuforge.sandbox.judge.context import Context, Models
    from cuforge.sandbox.judge.output_judge import Judge
    from cuforge.sandbox.protocol.evaluation import EvalConfig

    torch.manual_seed(seed)
    eager = model_class(k)
    x = torch.randn(512, k)
    models = Models(reference=eager, reference64=verify.float64_model(eager), candidate=None)
    module = types.SimpleNamespace(get_inputs=lambda: [torch.randn_like(x)])
    refs, native, kind = verify.reference_outputs(models.reference64, models.reference, [x])
    assert kind == "float64"

    def judge(out: torch.Tensor) -> verify.Comparison:
        ctx = Context({}, {}, EvalConfig(precision="pytorch"), torch.device("cpu"), module, TOL, 0, {}, {}, tf32=True)
        return Judge(ctx, models, [x], kind)(0, out, refs[0], native[0])

    return judge, x, eager.weight.detach()


def test_the_judge_bounds_bf16_operands_by_a_tf32_reference_s_own_error():
    """Under a contract whose reference rounds to TF32: a candidate as accurate as it passes, bf16
    operands are a downgrade."""
    judge, x, w = tf32_judge(_Tf32Linear, 0)
    trunc = lambda t: torch.from_numpy(_truncate_mantissa(t.numpy(), 10))  # noqa: E731
    assert judge(trunc(x) @ trunc(w).T).ok
    assert judge(x @ w.T).ok
    bf16 = judge((x.bfloat16().float() @ w.bfloat16().float().T))
    assert not bf16.ok and bf16.kind == "precision_downgrade", (bf16.rel_norm_err, bf16.reason)


class _Tf32LinearNorm(_Tf32Linear):
    """The TF32 linear layer, then a training-mode batch norm of its columns: the normalization divides
    by a batch statistic, so the sum of |terms| bounds nothing there (KernelBench level2's convolutions
    followed by a batch, group or layer norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _column_norm(super().forward(x))


def _column_norm(y: torch.Tensor) -> torch.Tensor:
    return (y - y.mean(0, keepdim=True)) / torch.sqrt(y.var(0, unbiased=False, keepdim=True) + 1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_after_a_normalization_a_tf32_kernel_in_another_order_passes_and_bf16_operands_do_not(seed):
    """Under a TF32 reference, a candidate rounding its operands as the reference does but summing in
    another order (or truncating to TF32) misses other elements by other amounts; judged against the
    reference's own misses one for one, it was called a downgrade."""
    judge, x, w = tf32_judge(_Tf32LinearNorm, seed)
    rounded = lambda t: torch.from_numpy(_round_mantissa(t.numpy(), 10))  # noqa: E731
    trunc = lambda t: torch.from_numpy(_truncate_mantissa(t.numpy(), 10))  # noqa: E731
    four_chunks = sum(rounded(x)[:, i::4] @ rounded(w)[:, i::4].T for i in range(4))
    for name, y in {"another_order": four_chunks, "truncated": trunc(x) @ trunc(w).T, "fp32": x @ w.T}.items():
        cmp = judge(_column_norm(y))
        assert cmp.ok, (name, cmp.reason)
    bf16 = judge(_column_norm(x.bfloat16().float() @ w.bfloat16().float().T))
    assert not bf16.ok and bf16.kind == "precision_downgrade", (bf16.rel_norm_err, bf16.reason)
    wrong = _column_norm(four_chunks).clone()
    wrong[::97, 3] += 0.05  # a few elements off by far more than TF32's rounding
    assert not judge(wrong).ok


class _NearTwins(torch.nn.Module):
    """An ill-conditioned output, as EfficientNet-B2's and the UNet's in KernelBench's level3 are: two
    nearly equal rows through a long dot product, then a training-mode batch norm over the two samples,
    which divides their tiny difference by its own size, so any summation order's rounding shows."""

    def __init__(self, k: int = 4096) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(k, 512, bias=False)
        self.bn = torch.nn.BatchNorm1d(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x[:1] + 1e-4 * x))


def test_an_ill_conditioned_output_is_judged_against_eager_s_own_misses():
    """Eager's own fp32 result misses the element bounds on such an output (its error norm against float64
    is ~1e-2), each summation order on other elements: another order than eager's passes, named ill-
    conditioned; bf16 operands and a few elements off by far more than eager's misses still fail."""
    import types

    from cuforge.sandbox.judge.context import Context, Models
    from cuforge.sandbox.judge.output_judge import Judge, Trials
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.protocol.stop import Stop

    torch.manual_seed(0)
    eager = _NearTwins()
    x = torch.rand(2, 4096)
    models = Models(reference=eager, reference64=verify.float64_model(eager), candidate=None)
    module = types.SimpleNamespace(get_inputs=lambda: [torch.rand(2, 4096)])
    refs, native, kind = verify.reference_outputs(models.reference64, models.reference, [x])
    own = verify.compare(native[0], refs[0], torch.float32, TOL, native=native[0])
    assert own.ok and own.ill_conditioned and own.native_rel_norm > 1e-3 and own.mismatches > 0

    def context() -> Context:
        return Context({}, {}, EvalConfig(), torch.device("cpu"), module, TOL, 0, {}, {})

    def normed(z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.batch_norm(z, None, None, eager.bn.weight, eager.bn.bias, True, 0.1, 1e-5).detach()

    u, w = x[:1] + 1e-4 * x, eager.lin.weight.detach()
    four_chunks = normed(sum(u[:, i::4] @ w[:, i::4].T for i in range(4)))
    ctx = context()
    verdict = Judge(ctx, models, [x], kind)(0, four_chunks, refs[0], native[0])
    assert verdict.ok and verdict.ill_conditioned, verdict.reason
    Trials().compare(ctx, models, [x], kind, [four_chunks], refs, native, 0)
    assert ctx.correctness["ill_conditioned_native_rel_norm"]["0"] == pytest.approx(own.native_rel_norm)
    bf16 = normed(u.bfloat16().float() @ w.bfloat16().float().T)
    verdict = Judge(context(), models, [x], kind)(0, bf16, refs[0], native[0])
    assert not verdict.ok and "ill-conditioned" in verdict.reason
    wrong = four_chunks.clone()
    wrong[0, ::64] += 10 * own.max_abs_err  # eight elements off by ten times eager's largest miss
    verdict = Judge(context(), models, [x], kind)(0, wrong, refs[0], native[0])
    assert not verdict.ok and verdict.mismatches >= 8
    with pytest.raises(Stop):
        Trials().compare(context(), models, [x], kind, [wrong], refs, native, 0)


def test_an_output_that_is_mostly_rounding_noise_is_bounded_by_the_count_of_misses_and_the_norm():
    """Where eager's own error norm against float64 is past NOISE_NORM (EfficientNet-B2 at batch 2:
    0.8, its batch norms over two samples flipping signs), where each element lands is chance: an honest
    candidate's largest miss was 2.3x eager's on one set. Its misses' count and the error norm still
    bound it: a constant output, and one missing more than twice as many elements, fail."""
    torch.manual_seed(5)
    ref = torch.randn(2000, dtype=torch.float64).sign()  # normalised over two samples: +-1
    flips = lambda p: torch.where(torch.rand(2000) < p, -1.0, 1.0).double()  # noqa: E731
    eager = (ref * flips(0.2) * 0.5).float()  # ~ every element off, by 0.5 or 1.5
    honest = (ref * flips(0.2) * 0.5).float()
    honest[:3] = -2.2 * ref[:3].float()  # a few elements land farther than any of eager's
    verdict = verify.compare(honest, ref, torch.float32, TOL, native=eager)
    assert verdict.ok and verdict.ill_conditioned, verdict.reason
    assert verdict.max_abs_err > 2 * float((eager.double() - ref).abs().max())  # 3.2 against eager's 1.5
    assert not verify.compare(torch.full_like(honest, 0.5), ref, torch.float32, TOL, native=eager).ok
    # eager missing a quarter of the elements (its error norm still past NOISE_NORM): missing all fails
    quarter = eager.where(torch.arange(2000) % 4 == 0, ref.float())
    verdict = verify.compare(honest, ref, torch.float32, TOL, native=quarter)
    assert not verdict.ok and verdict.native_rel_norm > verify.NOISE_NORM and "ill-conditioned" in verdict.reason
