"""Eval-mode batch norm (running statistics) is a per-channel affine, so a chain takes it like any
elementwise op: alone (the pointwise family), after a convolution (fused into its epilogue, as a CNN
block's conv + BN + ReLU), after a linear layer (BatchNorm1d per column); in fp32 and in half
precision. A batch norm in training mode is not one. Kernels compile with NVRTC here; their results
on a GPU: tests/test_gpu_half_families.py."""

import pytest

from cuforge.kernels.chains import compile_chain
from cuforge.kernels.families import families_for
from cuforge.problems.suites import load_suite
from template_helpers import problem_from_expr, smoke_compile


def bn_problem(tmp_path, expr, shape, bn, dtype, layer=None, train=False):
    init = f"        self.bn = {bn}.to({dtype})\n" + (f"        self.conv = {layer}.to({dtype})\n" if layer else "")
    init += "        self.bn.train()\n" if train else "        self.eval()\n"
    init += "        with torch.no_grad():\n            self.bn.running_mean.uniform_(-0.5, 0.5); self.bn.running_var.uniform_(0.5, 1.5)"
    return problem_from_expr(tmp_path, expr, f"torch.randn({shape}, dtype={dtype})", "x", init)


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.float16"])
@pytest.mark.parametrize("expr, shape, bn, layer, family", [
    ("torch.relu(self.bn(x))", "4, 16, 9, 9", "nn.BatchNorm2d(16)", None, "pointwise"),
    ("self.bn(x)", "4, 16, 33", "nn.BatchNorm1d(16)", None, "pointwise"),
    ("torch.relu(self.bn(self.conv(x)))", "2, 32, 16, 16", "nn.BatchNorm2d(32)",
     "nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)", "conv_direct"),
])
def test_an_eval_batch_norm_is_part_of_a_chain(tmp_path, dtype, expr, shape, bn, layer, family):
    p = bn_problem(tmp_path, expr, shape, bn, dtype, layer)
    fams, why = families_for(p)
    assert fams and fams[0].name == family, why
    source = fams[0].render(fams[0].seeds(p)[0], p).source
    assert "rsqrtf(" in source
    smoke_compile(fams[0], p, 1)


def test_in_fp32_the_convolution_and_the_linear_layer_fuse_it(tmp_path):
    conv = bn_problem(tmp_path, "torch.relu(self.bn(self.conv(x)))", "2, 64, 16, 16", "nn.BatchNorm2d(64)", "torch.float32",
                      "nn.Conv2d(64, 64, 3, padding=1, bias=False)")
    assert families_for(conv)[0][0].name == "conv_tf32x3_sm90"
    linear = bn_problem(tmp_path, "self.bn(self.conv(x))", "64, 128", "nn.BatchNorm1d(96)", "torch.float32", "nn.Linear(128, 96)")
    assert families_for(linear)[0][0].name == "gemm_tf32x3_sm90"
    for p in (conv, linear):
        smoke_compile(families_for(p)[0][0], p, 1)
    # ResNet's bottleneck in inference: three convolutions, each with its batch norm and ReLU fused
    resnet = next(p for p in load_suite("models").problems if p.id == "models/resnet_bottleneck")
    fam = families_for(resnet)[0][0]
    assert fam.name == "pipeline" and [s.family.name for s in fam.matched(resnet)] == ["conv_tf32x3_sm90"] * 3


def test_a_batch_norm_in_training_mode_is_not_a_chain_op(tmp_path):
    p = bn_problem(tmp_path, "torch.relu(self.bn(x))", "4, 16, 9, 9", "nn.BatchNorm2d(16)", "torch.float32", train=True)
    at = next(i for i, n in enumerate(p.graph) if n.op == "native_batch_norm")  # after its counter's add_
    why = compile_chain(p, p.graph[at:], "in0", (4, 16, 9, 9))
    assert isinstance(why, str) and "training mode" in why, why
    assert families_for(p)[0][0].name == "batch_norm"  # the family that computes the batch's statistics
