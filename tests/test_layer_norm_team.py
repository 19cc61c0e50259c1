"""The whole-GPU layer norm family on the CPU: it takes layer norms whose rows are too long for a cluster and
whose weight or bias is as long as a row (KernelBench's LayerNorm), leaves the others to the row families
(naming why), is preferred there, launches cooperatively with one block an SM and shared memory for the
bias and the kept part of a row, sizes the weight's registers for the smallest Hopper part, and every
valid config compiles with NVRTC without spilling (with and without a bias, with a chain, as a staged tail)."""

import re
import shutil
import subprocess

import pytest

from cuforge.kernels.base import SMEM_LIMIT
from cuforge.kernels.families import families_for
from cuforge.kernels.layer_norm_team import HOLD_LIMIT, LayerNormTeam, vectors_a_thread
from template_helpers import problem_from_expr, smoke_compile

FAM = LayerNormTeam()
LN = "        self.ln = nn.LayerNorm({shape}{extra})"


def ln_problem(tmp_path, shape, x_shape, extra="", tail="y"):
    expr = tail.replace("y", "self.ln(a)")
    return problem_from_expr(tmp_path, expr, f"torch.randn{x_shape}", args="a", init=LN.format(shape=shape, extra=extra))


def test_long_rows_with_row_long_affine_go_to_the_family(tmp_path):
    kb = ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)")  # KernelBench's level1/40
    assert FAM.supports(kb) is None
    names = [f.name for f in families_for(kb)[0]]
    assert names[0] == "layer_norm_team" and "rows_cluster" in names and "rows_team" not in names
    short = ln_problem(tmp_path, "(4, 256, 256)", "(8, 4, 256, 256)")  # 1 MiB rows fit a cluster
    assert FAM.supports(short) == "rows of 262144 fit a cluster's shared memory (rows_cluster's)"
    plain = ln_problem(tmp_path, "(64, 256, 256)", "(2, 64, 256, 256)", extra=", elementwise_affine=False")
    assert "not a layer norm with row-long affine" in FAM.supports(plain)
    assert families_for(plain)[0][0].name == "rows_team"
    odd = ln_problem(tmp_path, "(3, 511, 683)", "(2, 3, 511, 683)")
    assert FAM.supports(odd) == "rows of 1047039 values: whole float4s needed"
    huge = ln_problem(tmp_path, "(2, 1024, 4096)", "(2, 2, 1024, 4096)")  # 32 MiB rows
    assert FAM.supports(huge) == "rows of 8388608 values: a block's share of the weight exceeds its registers"


def test_launch_shares_shared_memory_between_bias_and_row(tmp_path):
    p = ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)")
    launch = FAM.render(dict(BLOCK=512), p).launch
    assert launch.cooperative and launch.grid == "(SMS,)" and launch.shared_mem == "hold * 16"
    hold = dict(launch.bindings)["hold"]
    sms132 = {"cdiv": lambda a, b: -(-a // b), "SMS": 132}
    # 7944 float4s a block on 132 SMs: the row's share takes 7944 slots of 14272 (223 KiB), the bias the
    # other 6328 (its last 1616 come from L2).
    assert eval(hold, sms132) == HOLD_LIMIT // 16 == 14272 and HOLD_LIMIT < SMEM_LIMIT
    no_bias = FAM.render(dict(BLOCK=512), ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)",
                                                                      extra=", bias=False")).launch
    assert eval(dict(no_bias.bindings)["hold"], sms132) == 7944  # the whole share kept
    assert launch.args[:4] == ("in0", "out0", "param0", "param1") and launch.args[-3:] == ("hold", "scratch0", "scratch1")
    assert launch.scratch[1] == ("(1,)", "int32", "zeros")  # the barrier's arrivals start from zero every call


def test_weight_registers_sized_for_the_smallest_part(tmp_path):
    # 1048576 float4s a row over 114 SMs: 9198 a block, so 18 a thread at 512 threads, 36 at 256.
    assert vectors_a_thread(4194304, 512) == 18 and vectors_a_thread(4194304, 256) == 36
    p = ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)")
    assert "J = 18," in FAM.render(dict(BLOCK=512), p).source
    assert all(FAM.valid(dict(BLOCK=b), p) for b in (256, 384, 512)) and FAM.seeds(p)[0] == dict(BLOCK=512, BULK=3, PREFETCH=1)
    # A 16 MiB row fits the registers at every block size; a 17 MiB one at none (20 float4s a thread at 512
    # threads, 39 at 256).
    big = ln_problem(tmp_path, "(17, 256, 1024)", "(2, 17, 256, 1024)")
    assert vectors_a_thread(17 * 256 * 1024, 512) == 20 and vectors_a_thread(17 * 256 * 1024, 256) == 39
    assert FAM.supports(big) == "rows of 4456448 values: a block's share of the weight exceeds its registers"
    assert FAM.seeds(p) and all(FAM.valid(c, p) for c in FAM.seeds(p))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc for ptxas -v")
def test_the_weight_registers_do_not_spill(tmp_path):
    p = ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)")  # the most MAX_J allows
    for c in [dict(BLOCK=b, BULK=0) for b in (256, 384, 512)] + [dict(BLOCK=b, BULK=3, PREFETCH=f) for b in (256, 384, 512) for f in (0, 1)]:
        src = tmp_path / f"k{c['BLOCK']}_{c['BULK']}_{c.get('PREFETCH', 0)}.cu"
        src.write_text(FAM.render(c, p).source)
        r = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(src.with_suffix(".cubin")), str(src)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        spilled = int(re.search(r"\b(\d+) bytes spill stores", r.stderr).group(1))
        # cp.async: nothing; the bulk copies' mbarrier waits: a few registers (measured faster all the same)
        assert spilled <= (32 if c["BULK"] else 0) and "Used" in r.stderr, (c, r.stderr)


@pytest.mark.parametrize("shape, x_shape, extra, tail", [
    ("(64, 256, 256)", "(16, 64, 256, 256)", "", "y"),
    ("(4, 1024, 1024)", "(3, 4, 1024, 1024)", ", eps=1e-3, bias=False", "torch.relu(y) * 2"),
    ("(1048576,)", "(5, 1048576)", "", "torch.tanh(y) + 1"),
])
def test_configs_compile(tmp_path, shape, x_shape, extra, tail):
    p = ln_problem(tmp_path, shape, x_shape, extra, tail)
    assert FAM.supports(p) is None, FAM.supports(p)
    smoke_compile(FAM, p, 3)


def test_a_convolution_then_a_layer_norm_over_long_rows(tmp_path):
    init = "        self.conv = nn.Conv2d(3, 4, 3, padding=1)\n        self.ln = nn.LayerNorm((4, 1024, 1024))"
    p = problem_from_expr(tmp_path, "self.ln(self.conv(a))", "torch.randn(2, 3, 1024, 1024)", args="a", init=init)
    names = [f.name for f in families_for(p)[0]]
    assert "staged:conv_tf32x3_sm90+layer_norm_team" in names
    fam = families_for(p)[0][names.index("staged:conv_tf32x3_sm90+layer_norm_team")]
    smoke_compile(fam, p, 1)
    assert "_cooperative = True" in fam.render(fam.seeds(p)[0], p).source


def test_prefetch_takes_pieces_of_bulk_copies(tmp_path):
    p = ln_problem(tmp_path, "(64, 256, 256)", "(16, 64, 256, 256)")
    assert FAM.valid(dict(BLOCK=512, BULK=3, PREFETCH=3), p)
    assert not FAM.valid(dict(BLOCK=512, BULK=2, PREFETCH=3), p)  # more pieces than there are
    assert not FAM.valid(dict(BLOCK=512, BULK=0, PREFETCH=1), p)  # cp.async has no pieces
    assert "cp.async.bulk.prefetch.L2.global" in FAM.render(dict(BLOCK=512, BULK=3, PREFETCH=1), p).source
    assert "prefetch" not in FAM.render(dict(BLOCK=512, BULK=3), p).source  # a config from before the knob
