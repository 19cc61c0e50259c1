"""Operand layouts through views: the strides `restride` computes agree with torch's own view (and it
refuses where torch's view does), and GEMMs written through views alone (einsum, one-batch bmm of
reshaped operands) are matched as plain, transposed or merged-rows GEMMs."""

import random

import pytest
import torch

from cuforge.kernels.fp32 import match_gemm
from cuforge.kernels.layouts import restride
from template_helpers import problem_from_expr


def _factorizations(n, rng, dims):
    out = []
    for _ in range(dims - 1):
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        d = rng.choice(divisors)
        out.append(d)
        n //= d
    return tuple(out + [n])


def test_restride_agrees_with_torch_view():
    rng = random.Random(0)
    agreed = refused = 0
    for _ in range(400):
        shape = _factorizations(rng.choice([24, 36, 60, 64, 96]), rng, rng.randint(1, 4))
        t = torch.empty(shape)
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        t = t.permute(perm)
        new = _factorizations(t.numel(), rng, rng.randint(1, 4))
        try:
            want = t.view(new).stride()
        except RuntimeError:
            want = None
        got = restride(tuple(t.shape), tuple(t.stride()), new)
        if want is None:
            assert got is None, (tuple(t.shape), t.stride(), new, got)
            refused += 1
        else:
            assert got == tuple(want) or all(g == w for g, w, d in zip(got, want, new) if d != 1), (t.shape, t.stride(), new, got, want)
            agreed += 1
    assert agreed > 100 and refused > 20


@pytest.mark.parametrize("expr, inputs, want", [
    ('torch.einsum("bijl,lk->bijk", a, b)', "torch.randn(2, 3, 4, 8), torch.randn(8, 5)", ("in0", False, "in1", False, 24, 8, 5, True)),
    ('torch.einsum("ik,kj->ij", a, b)', "torch.randn(6, 8), torch.randn(8, 5)", ("in0", False, "in1", False, 6, 8, 5, False)),
    ('torch.einsum("ki,kj->ij", a, b)', "torch.randn(8, 6), torch.randn(8, 5)", ("in0", True, "in1", False, 6, 8, 5, False)),
    ('torch.einsum("bik,jk->bij", a, b)', "torch.randn(3, 4, 8), torch.randn(5, 8)", ("in0", False, "in1", True, 12, 8, 5, True)),
])
def test_gemms_written_through_views_are_matched(tmp_path, expr, inputs, want):
    f = match_gemm(problem_from_expr(tmp_path, expr, inputs))
    assert not isinstance(f, str), f
    assert (f.a, f.ta, f.b, f.tb, f.m, f.k, f.n, f.a_merged) == want


def test_a_transposed_result_is_not_a_viewed_gemm(tmp_path):
    # the product read column-major: no kernel writing the product row-major returns this tensor
    p = problem_from_expr(tmp_path, "torch.einsum('ik,kj->ij', a, b).t()", "torch.randn(6, 8), torch.randn(8, 5)")
    assert p.graph_outputs[0].endswith(".T")
    assert isinstance(match_gemm(p), str)
