"""The 3xTF32 wgmma family without a GPU: what it covers, which operands get a preparing pass and
which are split in shared memory, split-K only where C is the bare product, and every seed compiling
with NVRTC for sm_90a."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.gemm_tf32 import GemmTf32x3Sm90
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec
from cuforge.runtime import compile_cuda
from template_helpers import problem_from_expr, smoke_compile

FAM = GemmTf32x3Sm90()


@pytest.mark.parametrize("expr, inputs, pre_ops, smem_descs", [
    ("a @ b", "torch.randn(300, 200), torch.randn(200, 300)", [], 2),              # B [K, N]: transposed in shared memory
    ("a @ b", "torch.randn(300, 200), torch.randn(200, 301)", ["in1"], 1),         # B's rows not 16-byte aligned: a pass
    ("a @ b.T", "torch.randn(300, 200), torch.randn(256, 200)", [], 2),            # both K-major
    ("a.T @ b", "torch.randn(200, 300), torch.randn(200, 256)", [], 2),            # both [K, rows]
    ("a.T @ b", "torch.randn(200, 301), torch.randn(200, 257)", ["in0", "in1"], 0),
    ("a @ b.T", "torch.randn(300, 201), torch.randn(256, 201)", ["in0", "in1"], 0),  # rows not 16-byte aligned
])
def test_operands_are_split_in_shared_memory_where_tma_reads_them(tmp_path, expr, inputs, pre_ops, smem_descs):
    p = problem_from_expr(tmp_path, expr, inputs)
    assert FAM.supports(p) is None and families_for(p)[0][0].name == FAM.name
    seeds = FAM.seeds(p)
    assert seeds[0]["SPLIT"] == "pass" and [c["SPLIT"] for c in seeds].count("smem") == (1 if smem_descs else 0)
    smem = {**seeds[0], "SPLIT": "smem"}
    assert not smem_descs or seeds[1] == smem  # the same tiles without the pass, tried second
    assert FAM.valid(smem, p) == bool(smem_descs)
    passed = FAM.render(seeds[0], p).launch
    assert len(passed.pre) == len(passed.scratch) == 2 and all("scratch" in a for a in passed.args[:2])
    if not smem_descs:
        return
    launch = FAM.render(smem, p).launch
    assert [args.split(",")[0].strip("( ") for _, _, _, args in launch.pre] == pre_ops
    assert len(launch.scratch) == len(pre_ops)
    assert sum("scratch" not in a for a in launch.args[:2]) == smem_descs  # descriptors over the inputs themselves
    f = FAM.matched(p)
    # An operand stored [K, rows] is read as raw [32 k][rows] tiles without a swizzle, and transposed.
    for desc, mode in zip(launch.args[:2], FAM.modes(smem, f)):
        assert desc.endswith(", 0)") == (mode == 2), (desc, mode)
    smoke_compile(FAM, p, 2)
    compile_cuda(FAM.render(smem, p).source, arch="sm_90a")


def test_a_transposing_split_of_b_is_only_for_tiles_up_to_128_columns(tmp_path):
    p = problem_from_expr(tmp_path, "a @ b", "torch.randn(300, 200), torch.randn(200, 384)")
    c = {"BN": 192, "STAGES": 2, "GROUP_M": 8, "SPLIT_K": 1}
    assert FAM.valid({**c, "SPLIT": "pass"}, p) and not FAM.valid({**c, "SPLIT": "smem"}, p)
    assert FAM.valid({**c, "BN": 128, "STAGES": 3, "SPLIT": "smem"}, p)
    assert all(s["SPLIT"] == "pass" or s["BN"] <= 128 for s in FAM.seeds(p))


def test_split_k_only_for_a_bare_product_over_a_long_k(tmp_path):
    long_k = problem_from_expr(tmp_path, "a @ b", "torch.randn(256, 65536), torch.randn(65536, 200)")
    first, second = FAM.seeds(long_k)[:2]
    # 128-wide tiles split 32 ways (4 tiles x 32 fill the GPU), first without the preparing pass.
    assert (first["BN"], first["SPLIT_K"], first["SPLIT"]) == (128, 32, "smem") and second == {**first, "SPLIT": "pass"}
    assert FAM.render(first, long_k).launch.outputs[0][2] == "zeros"  # partial sums are added into C
    with_relu = problem_from_expr(tmp_path, "torch.relu(a @ b)", "torch.randn(256, 65536), torch.randn(65536, 200)")
    assert all(c["SPLIT_K"] == 1 for c in FAM.seeds(with_relu))
    assert not FAM.valid({**first, "SPLIT_K": 4}, with_relu)


def test_small_products_are_left_to_other_families(tmp_path):
    p = problem_from_expr(tmp_path, "a @ b", "torch.randn(300, 200), torch.randn(200, 4)")
    assert "too few" in FAM.supports(p)


def test_pre_kernels_round_trip_and_change_the_id():
    spec = LaunchSpec("k", "(1,)", "(32,)", ("in0",), (("(4,)", "float32"),), pre=(("p", "(1,)", "(32,)", "(in0,)"),))
    assert LaunchSpec.from_dict({**spec.__dict__}) == spec
    plain = LaunchSpec("k", "(1,)", "(32,)", ("in0",), (("(4,)", "float32"),))
    assert Candidate("x", "kernel", plain).id != Candidate("x", "kernel", spec).id
    with pytest.raises(ValueError, match="pre kernel"):
        LaunchSpec("k", "(1,)", "(32,)", (), (("(4,)", "float32"),), pre=(("p", "(1,)"),))
