"""The whole-GPU batch norm family on the CPU: it takes training batch norms whose channels are large
(and leaves smaller ones to batch_norm, naming why), is preferred over batch_norm there, launches
cooperatively with one block an SM and as much of each block's share kept in registers and shared
memory as fits, keeps to the register budget, and every config kind compiles with NVRTC (each tail
caching and order, a register part, 4-wide and element-wise loads, a chain), also as a staged tail."""

import pytest

from cuforge.kernels.base import SMEM_LIMIT
from cuforge.kernels.batch_norm_team import HOLD_LIMIT, BatchNormTeam
from cuforge.kernels.families import families_for
from template_helpers import problem_from_expr, smoke_compile
from test_batch_norm import bn_problem

FAM = BatchNormTeam()


def test_large_channels_go_to_the_team_and_small_ones_do_not(tmp_path):
    big = bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(2, 2, 1024, 1024)", "torch.relu(y)")  # 8 MiB a channel
    assert [f.name for f in families_for(big)[0]][:2] == ["batch_norm_team", "batch_norm"]
    small = bn_problem(tmp_path, "nn.BatchNorm2d(16)", "(4, 16, 30, 32)")
    assert FAM.supports(small) == "channels of 15 KiB: batch_norm's two passes"
    assert FAM.supports(bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(2, 2, 1024, 1023)")) == "channels of 8184 KiB: batch_norm's two passes"
    assert families_for(small)[0][0].name == "batch_norm"
    assert "eval mode" in FAM.supports(bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(4, 2, 1024, 1024)", train=False))


def test_launch_keeps_what_registers_and_shared_memory_hold(tmp_path):
    p = bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(16, 2, 1024, 1024)")  # KernelBench's 64 MiB channels
    launch = FAM.render(dict(BLOCK=256, UNROLL=4, VEC=4, KEEP=2, REGS=32, BACK=1), p).launch
    assert launch.cooperative and launch.grid == "(SMS,)"
    hold = dict(launch.bindings)["hold"]
    assert hold == f"min(max(cdiv(4194304, SMS) - 8192, 0), {HOLD_LIMIT // 16})" and HOLD_LIMIT < SMEM_LIMIT
    sms132 = {"cdiv": lambda a, b: -(-a // b), "SMS": 132}
    # On 132 SMs a block's share is 31776 float4s: 8192 in registers (32 a thread), 14272 (223 KiB) in
    # shared memory, the rest read twice.
    assert eval(hold, sms132) == 14272
    no_regs = FAM.render(dict(BLOCK=512, UNROLL=4, VEC=4, KEEP=1, REGS=0, BACK=0), p).launch
    assert eval(dict(no_regs.bindings)["hold"], sms132) == 14272
    smaller = FAM.render(dict(BLOCK=256, UNROLL=4, VEC=4, KEEP=2, REGS=32, BACK=1),
                         bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(4, 2, 1024, 1024)")).launch
    assert eval(dict(smaller.bindings)["hold"], sms132) == 0  # 7944 a block: registers (256 x 32) hold it all
    assert launch.shared_mem == "hold * 16"
    assert launch.args[-3:] == ("hold", "scratch0", "scratch1") and launch.args[2:4] == ("param0", "param1")
    assert launch.scratch[1] == ("(1,)", "int32", "zeros")  # the barrier's arrivals start from zero every call


def test_register_budget_and_vector_width(tmp_path):
    p = bn_problem(tmp_path, "nn.BatchNorm1d(2)", "(4, 2, 1048577)")  # a span no float4 divides
    assert all(c["VEC"] == 1 for c in FAM.seeds(p))
    assert not FAM.valid(dict(BLOCK=256, UNROLL=4, VEC=4, KEEP=0, REGS=0, BACK=0), p)
    q = bn_problem(tmp_path, "nn.BatchNorm2d(2)", "(4, 2, 1024, 1024)")
    # The configs past the register budget (ptxas -v: spills) are not valid.
    assert FAM.valid(dict(BLOCK=256, UNROLL=4, VEC=4, KEEP=0, REGS=32, BACK=1), q)
    assert FAM.valid(dict(BLOCK=512, UNROLL=4, VEC=4, KEEP=0, REGS=0, BACK=1), q)
    assert FAM.valid(dict(BLOCK=1024, UNROLL=2, VEC=1, KEEP=0, REGS=0, BACK=0), q)
    assert not FAM.valid(dict(BLOCK=256, UNROLL=8, VEC=4, KEEP=0, REGS=8, BACK=1), q)
    assert not FAM.valid(dict(BLOCK=512, UNROLL=2, VEC=4, KEEP=0, REGS=8, BACK=1), q)
    assert not FAM.valid(dict(BLOCK=1024, UNROLL=2, VEC=4, KEEP=0, REGS=0, BACK=1), q)


@pytest.mark.parametrize("layer, x_shape, tail", [
    ("nn.BatchNorm2d(2)", "(4, 2, 1024, 1024)", "y"),
    ("nn.BatchNorm1d(2, eps=1e-3)", "(4, 2, 1048577)", "torch.tanh(y)"),
    ("nn.BatchNorm3d(3, affine=False)", "(2, 3, 64, 128, 256)", "y * 3"),
])
def test_configs_compile(tmp_path, layer, x_shape, tail):
    p = bn_problem(tmp_path, layer, x_shape, tail)
    assert FAM.supports(p) is None, FAM.supports(p)
    smoke_compile(FAM, p, 4)


def test_a_convolution_then_a_batch_norm_over_large_channels(tmp_path):
    # As the tail of a staged candidate (launched cooperatively by the stage wrapper): 8 MiB channels after
    # the convolution, so the team's tail comes before batch_norm's.
    init = "        self.conv = nn.Conv2d(3, 2, 3, padding=1)\n        self.bn = nn.BatchNorm2d(2)"
    p = problem_from_expr(tmp_path, "torch.relu(self.bn(self.conv(a)))", "torch.randn(8, 3, 512, 512)", args="a", init=init)
    names = [f.name for f in families_for(p)[0]]
    assert names.index("staged:conv_tf32x3_sm90+batch_norm_team") < names.index("staged:conv_tf32x3_sm90+batch_norm")
    fam = families_for(p)[0][names.index("staged:conv_tf32x3_sm90+batch_norm_team")]
    smoke_compile(fam, p, 1)
    assert "_cooperative = True" in fam.render(fam.seeds(p)[0], p).source
