"""Shared by the template-family tests: writing a KernelBench-format problem file around one forward
expression, and compiling a family's seeds plus random valid configs with NVRTC."""

import random

from cuforge.problems.loader import load_files
from cuforge.runtime import compile_cuda

PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F
{cuforge}
class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, {args}):
        return {expr}
def get_inputs():
    return [{inputs}]
def get_init_inputs():
    return []
"""


def problem_from_expr(tmp_path, expr, inputs, args="a, b", init="        pass", cuforge="", prefix="t"):
    """Load a problem whose forward returns `expr` over `args` (built from `inputs`)."""
    f = tmp_path / f"p{abs(hash((expr, inputs, init, cuforge))) % 10**12}.py"
    f.write_text(PROBLEM.format(expr=expr, inputs=inputs, args=args, init=init, cuforge=cuforge))
    (p,), skipped = load_files([f], id_prefix=prefix)
    assert not skipped, skipped
    return p


def smoke_compile(fam, p, n_random):
    """The family's seeds and `n_random` random valid configs compile with NVRTC for sm_90a, and each
    wrapper is valid Python."""
    rng = random.Random(0)
    configs = fam.seeds(p)
    while len(configs) < len(fam.seeds(p)) + n_random:
        c = {k: rng.choice(v) for k, v in fam.knobs.items()}
        if fam.valid(c, p):
            configs.append(c)
    for c in configs:
        cand = fam.render(c, p)
        mod = compile_cuda(cand.source, arch="sm_90a", options=cand.launch.options)
        assert fam.name in mod.signatures and len(mod.cubin) > 0, c
        compile(cand.module_source(), "<wrapper>", "exec")
