"""The skinny GEMM family on the CPU: which products it takes (1-16 rows of activations through a
weight stored [N, K], fp32/bf16/fp16, with the traced epilogue) and which it refuses and why, and that
every seed compiles for sm_90a with NVRTC. Its results on a GPU: tests/test_gpu_gemm_skinny.py."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.gemm_skinny import GemmSkinny
from cuforge.problems.suites import load_suite
from cuforge.runtime import compile_to_cubin
from template_helpers import problem_from_expr

DTYPES = ["torch.float32", "torch.bfloat16", "torch.float16"]


def linear(tmp_path, rows, k, n, dtype, expr="self.linear(x)", bias=True, lead=""):
    init = f"        self.linear = nn.Linear({k}, {n}, bias={bias}).to({dtype})"
    return problem_from_expr(tmp_path, expr, f"torch.randn({lead}{rows}, {k}, dtype={dtype})", "x", init)


@pytest.mark.parametrize("dtype", DTYPES)
def test_takes_decode_and_verify_products_with_their_epilogue(tmp_path, dtype):
    fam = GemmSkinny()
    for rows, k, n, expr, lead in ((1, 4096, 1000, "self.linear(x)", ""), (16, 1003, 96, "F.gelu(self.linear(x))", ""),
                                   (3, 64, 40, "self.linear(x) * 0.5", "2, ")):
        p = linear(tmp_path, rows, k, n, dtype, expr, lead=lead)
        assert fam.supports(p) is None, (rows, k, n, expr, fam.supports(p))
        seeds = fam.seeds(p)
        assert seeds and all(fam.valid(c, p) for c in seeds)
        for c in seeds:
            cand = fam.render(c, p)
            assert cand.launch.outputs[0][1] == dtype.split(".")[1]
            cubin, _, _ = compile_to_cubin(cand.source, "sm_90a", cand.launch.options)
            assert len(cubin) > 0


def test_refuses_what_it_cannot_compute_naming_why(tmp_path):
    fam = GemmSkinny()
    many = linear(tmp_path, 17, 64, 32, "torch.bfloat16")
    assert "17 rows" in fam.supports(many)
    stored_k_by_n = problem_from_expr(tmp_path, "a @ b", "torch.randn(4, 64), torch.randn(64, 32)")
    assert "[N, K]" in fam.supports(stored_k_by_n)
    mixed = problem_from_expr(tmp_path, "a @ b.T", "torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(32, 64)")
    assert "bf16" in fam.supports(mixed)
    integers = problem_from_expr(tmp_path, "a @ b.T", "torch.randint(0, 9, (4, 64)), torch.randint(0, 9, (32, 64))")
    assert fam.supports(integers) is not None


def test_the_models_suites_decode_products_are_covered_in_every_dtype():
    # One row: this family first (measured ahead of eager); eight half-precision rows: the wgmma linear
    # family first (this one lost to cuBLAS there), this one beside it.
    suite = {p.id: p for p in load_suite("models").problems}
    for name in ("models/decode_gemv", "models/skinny_gemm"):
        for variant in ("", "@bf16", "@fp16"):
            names = [f.name for f in families_for(suite[name + variant])[0]]
            first = "linear_sm90" if name.endswith("skinny_gemm") and variant else "gemm_skinny"
            assert names[0] == first and "gemm_skinny" in names, (name + variant, names)
