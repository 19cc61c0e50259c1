"""The fp16/bf16 GEMM over planes (gemm_planes_sm90) on the CPU: the half products the TMA families
cannot read as they lie (batched, transposed operands, rows of no whole 16 bytes, an epilogue after
them) are covered and compile for sm_90a; a product those families read as it lies stays theirs alone;
row sums and fp32 are refused."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.gemm_planes import GemmPlanesSm90
from template_helpers import problem_from_expr, smoke_compile

FAM = GemmPlanesSm90()


@pytest.mark.parametrize("expr, inputs", [
    ("torch.bmm(a, b)", "torch.randn(8, 128, 96, dtype=D), torch.randn(8, 96, 200, dtype=D)"),
    ("a.T @ b", "torch.randn(300, 130, dtype=D), torch.randn(300, 72, dtype=D)"),
    ("a.T @ b.T", "torch.randn(77, 130, dtype=D), torch.randn(99, 77, dtype=D)"),
    ("a @ b.T", "torch.randn(100, 2949, dtype=D), torch.randn(5921, 2949, dtype=D)"),
    ("torch.relu(a @ b) + 1", "torch.randn(130, 77, dtype=D), torch.randn(77, 99, dtype=D)"),
])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_products_of_any_layout_are_covered_and_compile(tmp_path, expr, inputs, dtype):
    p = problem_from_expr(tmp_path, expr, inputs.replace("D", f"torch.{dtype}"))
    assert FAM.supports(p) is None, FAM.supports(p)
    assert families_for(p)[0][0].name == "gemm_planes_sm90"
    seeds = FAM.seeds(p)
    assert seeds and all(set(c) == {"BN", "STAGES", "GROUP_M"} for c in seeds)
    launch = FAM.launch(seeds[0], p)
    assert launch.outputs[0][1] == dtype and all(s[1] == dtype and s[0].startswith("(1 * BATCH") for s in launch.scratch)
    assert dict(launch.bindings)["KP"] == "(K + 7) // 8 * 8"  # 16-byte plane rows of half elements
    src = FAM.render(seeds[0], p).source
    assert f"k16.f32.{'bf16' if dtype == 'bfloat16' else 'f16'}" in src and "#define HALF 1" in src
    smoke_compile(FAM, p, 1)


def test_plain_aligned_products_keep_their_family_and_the_rest_is_refused(tmp_path):
    plain = problem_from_expr(tmp_path, "a @ b", "torch.randn(512, 256, dtype=torch.bfloat16), torch.randn(256, 384, dtype=torch.bfloat16)")
    names = [f.name for f in families_for(plain)[0]]
    assert names[0] == "gemm_sm90" and "gemm_planes_sm90" not in names
    assert "read them as they lie" in FAM.supports(plain)
    linear_times = problem_from_expr(tmp_path, "(a @ b.T) * c", "torch.randn(128, 256, dtype=torch.bfloat16), "
                                     "torch.randn(512, 256, dtype=torch.bfloat16), torch.randn(128, 512, dtype=torch.bfloat16)", args="a, b, c")
    assert "read them as they lie" in FAM.supports(linear_times)  # a partition's linear + pointwise, as measured
    rowsum = problem_from_expr(tmp_path, "torch.sum(a @ b, dim=1)", "torch.randn(130, 64, dtype=torch.float16), torch.randn(64, 96, dtype=torch.float16)")
    assert "row sum" in FAM.supports(rowsum)
    fp32 = problem_from_expr(tmp_path, "torch.bmm(a, b)", "torch.randn(4, 64, 32), torch.randn(4, 32, 48)")
    assert "not fp16 or bf16" in FAM.supports(fp32)
    tiny = problem_from_expr(tmp_path, "a @ b", "torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, 96, dtype=torch.bfloat16)")
    assert "too few rows" in FAM.supports(tiny)
