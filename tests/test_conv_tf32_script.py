"""benchmarks/conv_tf32.py's choice of kernels and of each file's best: every covering family's first
one-TF32-product seeds (its first seeds where it has none: a 3-channel convolution, which cuDNN keeps in
fp32), the implicit GEMM's first 3xTF32 seed once; the fastest correct kernel and the fastest correct
one-product kernel, failed ones never."""

from conftest import benchmark_module
from template_helpers import conv_problem

from cuforge.kernels.families import families_for

ct = benchmark_module("conv_tf32")


def chosen(p, n=2):
    fams, why = families_for(p, several=False)
    assert fams, why
    return [(f.name, f.reduced_precision(c)) for f, c in ct.chosen_seeds(fams, p, n)]


def test_one_product_seeds_of_each_family_and_three_products_once(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(16, 128, 3)", "(2, 16, 66, 130)").under("pytorch")
    got = chosen(p)
    assert got[:2] == [("conv_rows_f32", True)] * 2  # it leads this one (W's rows fit 64 at a time)
    assert got.count(("conv_tf32x3_sm90", True)) == 2 and got.count(("conv_tf32x3_sm90", False)) == 1


def test_a_three_channel_convolution_gets_each_family_s_first_seeds(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv3d(3, 64, 3)", "(2, 3, 10, 18, 18)").under("pytorch")
    got = chosen(p)
    assert got and not any(one for _, one in got)
    assert {name for name, _ in got} == {f.name for f in families_for(p, several=False)[0]}


def kernel(family, ms, one, status="ok", cudnn=2.0):
    return {"family": family, "one_product": one, "status": status, "ms": ms, "cudnn_tf32_ms": cudnn, "eager_strict_ms": 8.0}


def test_the_best_correct_kernel_and_the_best_one_product_kernel():
    row = {"kernels": [kernel("conv_tf32x3_sm90", 1.0, True, status="mismatch"),  # fastest, wrong: never the best
                       kernel("conv_rows_f32", 2.5, True), kernel("conv_tf32x3_sm90", 5.0, False),
                       kernel("conv_direct", 1.6, False)]}
    ct.summarize(row)
    assert (row["best_family"], row["best_ms"], row["best_one_product"], row["vs_cudnn_tf32"]) == ("conv_direct", 1.6, False, 1.25)
    assert (row["one_product_family"], row["one_product_vs_cudnn_tf32"], row["one_pass_vs_three"]) == ("conv_rows_f32", 0.8, 2.0)
    none_ok = {"kernels": [kernel("conv_direct", 1.0, False, status="compile_error")]}
    ct.summarize(none_ok)
    assert "best_ms" not in none_ok and "one_product_ms" not in none_ok
