"""The skinny GEMM families on the CPU: which products they take (1-16 rows of activations through a
weight stored [N, K], fp32/bf16/fp16 on CUDA cores, fp16/bf16 on tensor cores, with the traced
epilogue) and which they refuse and why, and that every seed compiles for sm_90a with NVRTC. Their
results on a GPU: tests/test_gpu_gemm_skinny.py."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.gemm_skinny import GemmSkinny, GemmSkinnyTC
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
    # One row: the CUDA-core family first (measured ahead of eager); eight half-precision rows: the
    # tensor-core one (the CUDA-core one lost to cuBLAS there), the others beside it.
    suite = {p.id: p for p in load_suite("models").problems}
    for name in ("models/decode_gemv", "models/skinny_gemm"):
        for variant in ("", "@bf16", "@fp16"):
            names = [f.name for f in families_for(suite[name + variant])[0]]
            first = "gemm_skinny_tc" if name.endswith("skinny_gemm") and variant else "gemm_skinny"
            assert names[0] == first and "gemm_skinny" in names, (name + variant, names)
            assert ("gemm_skinny_tc" in names) == bool(variant), (name + variant, names)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_matrix_vector_product_is_one_row_through_the_matrix(tmp_path, dtype):
    """A @ v with v [K, 1]: v is the row, A the weight, the [M, 1] output the [1, M] row in memory; an fp32
    one stays gemv_f32's, and one with a per-row operand after it is refused (its index would be the column)."""
    fam = GemmSkinny()
    p = problem_from_expr(tmp_path, "torch.relu(a @ b) * 2", f"torch.rand(1000, 1003, dtype=torch.{dtype}), torch.rand(1003, 1, dtype=torch.{dtype})")
    assert fam.supports(p) is None and families_for(p)[0][0].name == "gemm_skinny"
    launch = fam.launch(fam.seeds(p)[0], p)
    assert launch.args[:2] == ("in1", "in0") and launch.outputs == (("(1000, 1)", dtype),)
    assert dict(launch.bindings) == {"K": "in0.shape[1]", "N": "in0.shape[0]", "M": "in1.numel() // K"}
    cubin, _, _ = compile_to_cubin(fam.render(fam.seeds(p)[0], p).source, "sm_90a", launch.options)
    assert cubin
    fp32 = problem_from_expr(tmp_path, "a @ b", "torch.rand(1000, 1003), torch.rand(1003, 1)")
    assert "[N, K]" in fam.supports(fp32)
    per_row = problem_from_expr(tmp_path, "a @ b + c", f"torch.rand(64, 256, dtype=torch.{dtype}), torch.rand(256, 1, dtype=torch.{dtype}), "
                                f"torch.rand(64, 1, dtype=torch.{dtype})", args="a, b, c")
    assert fam.supports(per_row) is not None


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16"])
def test_tensor_core_family_takes_half_rows_and_compiles_every_seed(tmp_path, dtype):
    fam = GemmSkinnyTC()
    for rows, k, n, expr, lead in ((8, 4096, 1000, "self.linear(x)", ""), (16, 1000, 90, "F.gelu(self.linear(x))", ""),
                                   (3, 64, 40, "self.linear(x) * 0.5", "2, "), (1, 72, 17, "self.linear(x)", "")):
        p = linear(tmp_path, rows, k, n, dtype, expr, lead=lead)
        assert fam.supports(p) is None, (rows, k, n, expr, fam.supports(p))
        assert fam.leads(p) == (rows * (2 if lead else 1) > 1)
        seeds = fam.seeds(p)
        assert len(seeds) >= 4 and all(fam.valid(c, p) for c in seeds)
        for c in seeds:
            cand = fam.render(c, p)
            assert cand.launch.outputs[0][1] == dtype.split(".")[1]
            assert cand.launch.block == f"({32 * c['KSPLIT']},)" and cand.launch.grid == f"(cdiv(N, {16 * c['WT']}),)"
            cubin, _, _ = compile_to_cubin(cand.source, "sm_90a", cand.launch.options)
            assert len(cubin) > 0


def test_tensor_core_family_refuses_fp32_and_ragged_k_naming_why(tmp_path):
    fam = GemmSkinnyTC()
    assert "fp16 or bf16" in fam.supports(linear(tmp_path, 8, 64, 32, "torch.float32"))
    assert "not a multiple of 8" in fam.supports(linear(tmp_path, 8, 1003, 32, "torch.bfloat16"))
    assert "17 rows" in fam.supports(linear(tmp_path, 17, 64, 32, "torch.float16"))
