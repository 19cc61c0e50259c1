"""Template families on a real GPU: correct across awkward shapes, or declared unsupported."""

import random

import pytest

from cuforge.kernels.families import Elementwise
from cuforge.kernels.gemm import GemmSm80, GemmSm90
from cuforge.problems.hgemm import hgemm_problem
from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol.evaluation import EvalConfig

pytestmark = pytest.mark.gpu
CFG = EvalConfig(baselines=("torch",), max_timing_s=1.0, min_samples=10, profile=False)


def gemm_configs(p, n_random=4):
    g = GemmSm80()
    configs = g.seeds(p)
    rng = random.Random(1)
    while len(configs) < len(g.seeds(p)) + n_random:
        c = {k: rng.choice(v) for k, v in g.knobs.items()}
        if g.valid(c, p):
            configs.append(c)
    return configs


@pytest.mark.parametrize("shape", [(128, 128, 128), (1000, 704, 336), (1, 64, 64), (64, 8, 8), (777, 1032, 1024),
                                   (4096, 4096, 4096)])
def test_gemm_sm80_is_correct_on_awkward_shapes(sup, shape):
    p = hgemm_problem(*shape)
    for c in gemm_configs(p, 2 if shape[0] * shape[1] > 2**22 else 4):
        ev = sup.evaluate(p, GemmSm80().render(c, p), CFG)
        assert ev.status == "ok", (shape, c, ev.status, ev.message)


SM90_EXTRA = [dict(BM=64, BN=64, STAGES=4, GROUP_M=1, SPLIT_K=4, REDUCE="ordered", EPI="tma"),
              dict(BM=256, BN=128, STAGES=3, GROUP_M=4, SPLIT_K=1, REDUCE="ordered", EPI="direct"),
              dict(BM=64, BN=256, STAGES=3, GROUP_M=16, SPLIT_K=2, REDUCE="atomic", EPI="tma"),
              dict(BM=128, BN=192, STAGES=2, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma"),
              dict(BM=64, BN=192, STAGES=5, GROUP_M=8, SPLIT_K=2, REDUCE="ordered", EPI="direct"),
              dict(BM=128, BN=128, STAGES=4, GROUP_M=1, SPLIT_K=8, REDUCE="atomic", EPI="tma"),
              dict(BM=64, BN=64, STAGES=3, GROUP_M=8, SPLIT_K=64, REDUCE="atomic", EPI="direct"),
              # split-K reduced in a cluster: 8 blocks of 64 x 64, 2 of 128 x 256 (two consumers), 4 of 64 x 256
              # (these send their partials by bulk copies), 8 of 64 x 8 (by st.async stores, as do the
              # 16-split 64 x 16 tiles below)
              dict(BM=64, BN=64, STAGES=4, GROUP_M=8, SPLIT_K=8, REDUCE="cluster", EPI="direct"),
              dict(BM=64, BN=8, STAGES=6, GROUP_M=8, SPLIT_K=8, REDUCE="cluster", EPI="direct"),
              dict(BM=128, BN=256, STAGES=3, GROUP_M=1, SPLIT_K=2, REDUCE="cluster", EPI="direct"),
              dict(BM=64, BN=256, STAGES=2, GROUP_M=8, SPLIT_K=4, REDUCE="cluster", EPI="direct"),
              # narrow tiles: B's box of 8 (no swizzle), 16 (32-byte) or 32 (64-byte swizzle) columns
              dict(BM=64, BN=8, STAGES=16, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="direct"),
              dict(BM=64, BN=16, STAGES=12, GROUP_M=4, SPLIT_K=2, REDUCE="atomic", EPI="direct"),
              dict(BM=64, BN=32, STAGES=8, GROUP_M=1, SPLIT_K=4, REDUCE="cluster", EPI="direct"),
              dict(BM=64, BN=32, STAGES=16, GROUP_M=8, SPLIT_K=2, REDUCE="ordered", EPI="direct"),
              # 16 splits in one cluster: past the portable size (the launch allows non-portable clusters)
              dict(BM=64, BN=16, STAGES=6, GROUP_M=8, SPLIT_K=16, REDUCE="cluster", EPI="direct"),
              dict(BM=64, BN=64, STAGES=8, GROUP_M=1, SPLIT_K=16, REDUCE="cluster", EPI="direct"),
              # one consumer warpgroup for the whole tile: m64n128, m64n256, two m64n64 sharing B
              dict(BM=64, BN=128, STAGES=8, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", ONE_CONSUMER=True),
              dict(BM=64, BN=256, STAGES=4, GROUP_M=4, SPLIT_K=2, REDUCE="ordered", EPI="direct", ONE_CONSUMER=True),
              dict(BM=128, BN=64, STAGES=8, GROUP_M=8, SPLIT_K=4, REDUCE="atomic", EPI="tma", ONE_CONSUMER=True),
              dict(BM=128, BN=128, STAGES=6, GROUP_M=1, SPLIT_K=2, REDUCE="cluster", EPI="direct", ONE_CONSUMER=True)]


@pytest.mark.parametrize("shape", [(128, 128, 128), (1000, 704, 336), (1, 64, 64), (64, 8, 8), (777, 1032, 1024),
                                   (200, 136, 8), (64, 64, 16384), (100, 200, 4104), (1, 72, 2056), (4096, 4096, 4096)])
def test_gemm_sm90_is_correct_on_awkward_shapes(sup, shape):
    """TMA zero-fills partial tiles (M, N, K not multiples of the tile; a box wider than the matrix)
    and clips stores; every layout, split-K with uneven k ranges (all three reductions), both
    epilogues; persistent blocks
    that take several work units (777 x 1032 in 64 x 64 tiles is 221 units on 132 SMs)."""
    p, g = hgemm_problem(*shape), GemmSm90()
    configs = g.seeds(p) + [c for c in SM90_EXTRA if g.valid(c, p)]
    for c in configs[: 3 if shape[0] * shape[1] > 2**22 else len(configs)]:
        ev = sup.evaluate(p, g.render(c, p), CFG)
        assert ev.status == "ok", (shape, c, ev.status, ev.message)


# TMA multicast: clusters of CLUSTER_M x CLUSTER_N tiles, each block loading a slice of the shared k-tiles
SM90_MULTICAST = [dict(BM=128, BN=64, STAGES=8, GROUP_M=8, CLUSTER_M=2, CLUSTER_N=1, EPI="tma"),
                  dict(BM=64, BN=128, STAGES=6, GROUP_M=1, CLUSTER_M=1, CLUSTER_N=2, EPI="direct"),
                  dict(BM=64, BN=64, STAGES=4, GROUP_M=16, CLUSTER_M=2, CLUSTER_N=2, EPI="tma"),
                  dict(BM=128, BN=128, STAGES=5, GROUP_M=4, CLUSTER_M=4, CLUSTER_N=1, EPI="direct"),
                  dict(BM=64, BN=64, STAGES=8, GROUP_M=8, CLUSTER_M=1, CLUSTER_N=4, EPI="tma"),
                  dict(BM=64, BN=192, STAGES=4, GROUP_M=8, CLUSTER_M=2, CLUSTER_N=1, EPI="tma"),
                  dict(BM=128, BN=256, STAGES=4, GROUP_M=8, CLUSTER_M=2, CLUSTER_N=1, EPI="tma"),
                  dict(BM=256, BN=128, STAGES=3, GROUP_M=8, CLUSTER_M=1, CLUSTER_N=2, EPI="direct"),
                  dict(BM=64, BN=8, STAGES=16, GROUP_M=8, CLUSTER_M=1, CLUSTER_N=4, EPI="direct"),
                  dict(BM=64, BN=32, STAGES=12, GROUP_M=4, CLUSTER_M=2, CLUSTER_N=2, EPI="direct"),
                  dict(BM=64, BN=16, STAGES=16, GROUP_M=1, CLUSTER_M=4, CLUSTER_N=1, EPI="direct")]


@pytest.mark.parametrize("shape", [(130, 136, 72), (1000, 704, 336), (777, 1032, 1024), (100, 200, 4104), (4096, 4096, 4096)])
def test_gemm_sm90_multicast_is_correct_on_awkward_shapes(sup, shape):
    """Clusters past C's edge (777 rows in pairs of 128-row tiles: the last cluster's second tile lies
    wholly outside, zero-filled, still loading its slice for its peer), partial tiles, K % 64 != 0."""
    p, g = hgemm_problem(*shape), GemmSm90()
    configs = [{**c, "SPLIT_K": 1, "REDUCE": "ordered"} for c in SM90_MULTICAST]
    configs = [c for c in configs if g.valid(c, p)]
    assert len(configs) >= (2 if shape[0] < 200 else 5), shape
    for c in configs[: 2 if shape[0] * shape[1] > 2**22 else len(configs)]:
        ev = sup.evaluate(p, g.render(c, p), CFG)
        assert ev.status == "ok", (shape, c, ev.status, ev.message)


def test_unsupported_gemm_shapes_are_declared():
    assert GemmSm80().supports(hgemm_problem(64, 64, 33)) and GemmSm80().supports(hgemm_problem(64, 30, 64))


ELEMENTWISE = """
import torch
import torch.nn.functional as F
N = {n}
CUFORGE = {{"policy": "custom", "dtype": "{dtype}"}}
class Model(torch.nn.Module):
    def forward(self, x):
        return {expr}
def get_inputs():
    return [torch.randn(N, dtype=torch.{dtype})]
def get_init_inputs():
    return []
"""


def test_elementwise_family_is_correct_with_tails(sup, tmp_path):
    exprs = {"relu": "torch.relu(x)", "gelu": "F.gelu(x)", "gelu_tanh": "F.gelu(x, approximate='tanh')",
             "silu": "F.silu(x)", "sigmoid": "torch.sigmoid(x)"}
    e = Elementwise()
    for op, expr in exprs.items():
        for dtype in ("float32", "float16", "bfloat16"):
            f = tmp_path / f"{op}_{dtype}.py"
            f.write_text(ELEMENTWISE.format(n=1000003, dtype=dtype, expr=expr))  # not a multiple of any vector width
            (p,), skipped = load_files([f])
            assert not skipped and e.supports(p) is None, (op, dtype)
            # Two seeds, then steps of several vectors a thread on a grid of one wave: the last step is
            # partly past the vectors, and at VEC 1, UNROLL 2 the loop takes two steps (1M / 256 blocks).
            steps = [dict(VEC=v, BLOCK=128, WAVES=1, UNROLL=u) for v, u in ((1, 2), (1, 8), (2, 4), (4, 2), (8, 4))]
            for c in e.seeds(p)[:2] + steps:
                if e.valid(c, p):
                    ev = sup.evaluate(p, e.render(c, p), CFG)
                    assert ev.status == "ok", (op, dtype, c, ev.status, ev.message)


ROWS = """
import torch
ROWS, COLS = {rows}, {cols}
CUFORGE = {{"policy": "custom", "dtype": "float32"}}
class Model(torch.nn.Module):
    def forward(self, x):
        return {expr}
def get_inputs():
    return [torch.randn(ROWS, COLS) * {scale}]
def get_init_inputs():
    return []
"""


def check_row_family(sup, tmp_path, fam, exprs, shapes, scale=1):
    """Each op at each (rows, cols): the family covers the traced problem and its first two seeds
    evaluate ok (correct against float64, no cheat)."""
    for op, expr in exprs.items():
        for rows, cols in shapes:
            f = tmp_path / f"{op}_{rows}_{cols}.py"
            f.write_text(ROWS.format(rows=rows, cols=cols, expr=expr, scale=scale))
            (p,), skipped = load_files([f])
            assert not skipped and fam.supports(p) is None, (op, p.ops)
            for c in fam.seeds(p)[:2]:
                ev = sup.evaluate(p, fam.render(c, p), CFG)
                assert ev.status == "ok", (op, rows, cols, c, ev.status, ev.message)


def test_softmax_family_is_correct_on_odd_rows(sup, tmp_path):
    from cuforge.kernels.softmax import SoftmaxRows

    exprs = {"softmax": "torch.softmax(x, dim=-1)", "log_softmax": "torch.log_softmax(x, dim=-1)"}
    check_row_family(sup, tmp_path, SoftmaxRows(), exprs, ((7, 1), (33, 1000), (64, 4099), (2048, 8192)), scale=4)


def test_reduction_family_is_correct_on_odd_rows(sup, tmp_path):
    from cuforge.kernels.families import ReduceRows

    exprs = {"sum": "torch.sum(x, dim=-1)", "max": "torch.max(x, dim=-1).values", "argmax": "torch.argmax(x, dim=-1)"}
    check_row_family(sup, tmp_path, ReduceRows(), exprs, ((5, 1), (33, 1001), (256, 65536)))


LINEAR = """
import torch
import torch.nn.functional as F
M, K, N = {m}, {k}, {n}
CUFORGE = {{"policy": "custom", "dtype": "float16"}}
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(K, N, dtype=torch.float16)
    def forward(self, x):
        return {expr}
def get_inputs():
    return [torch.randn(M, K, dtype=torch.float16)]
def get_init_inputs():
    return []
"""


LINEAR_EXPRS = {"relu": "torch.relu(self.linear(x))", "silu": "F.silu(self.linear(x))", "gelu": "F.gelu(self.linear(x))",
                "none": "self.linear(x)"}


@pytest.mark.parametrize("op", sorted(LINEAR_EXPRS))  # one test each: ~50 kernels per op, ~75 s on an H100
def test_linear_family_fuses_bias_and_activation_on_awkward_shapes(sup, tmp_path, op):
    """x @ W^T + b then ReLU / SiLU / GELU / nothing, with W read K-major from the parameter; partial
    tiles, split-K (the epilogue runs once, after the reduction), both epilogue paths."""
    from cuforge.kernels.gemm import LinearSm90

    g = LinearSm90()
    expr = LINEAR_EXPRS[op]
    extra = [dict(BM=64, BN=256, STAGES=3, GROUP_M=8, SPLIT_K=4, REDUCE="atomic", EPI="direct"),
             dict(BM=256, BN=128, STAGES=3, GROUP_M=4, SPLIT_K=2, REDUCE="ordered", EPI="tma"),
             dict(BM=64, BN=192, STAGES=4, GROUP_M=1, SPLIT_K=1, REDUCE="ordered", EPI="tma"),
             dict(BM=128, BN=64, STAGES=4, GROUP_M=8, SPLIT_K=8, REDUCE="cluster", EPI="direct"),
             dict(BM=128, BN=64, STAGES=6, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", CLUSTER_M=2, CLUSTER_N=2),
             dict(BM=64, BN=128, STAGES=4, GROUP_M=1, SPLIT_K=1, REDUCE="ordered", EPI="direct", CLUSTER_M=4, CLUSTER_N=1),
             dict(BM=64, BN=16, STAGES=16, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="direct"),
             dict(BM=64, BN=32, STAGES=12, GROUP_M=8, SPLIT_K=2, REDUCE="ordered", EPI="direct", CLUSTER_M=1, CLUSTER_N=1),
             dict(BM=64, BN=8, STAGES=16, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="direct", CLUSTER_M=1, CLUSTER_N=2),
             dict(BM=64, BN=32, STAGES=6, GROUP_M=8, SPLIT_K=16, REDUCE="cluster", EPI="direct"),
             dict(BM=64, BN=128, STAGES=8, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", ONE_CONSUMER=True),
             dict(BM=128, BN=64, STAGES=6, GROUP_M=8, SPLIT_K=2, REDUCE="atomic", EPI="direct", ONE_CONSUMER=True)]
    for m, k, n in ((100, 1032, 136), (1, 64, 64), (777, 1024, 520)):
        f = tmp_path / f"linear_{op}_{m}_{k}_{n}.py"
        f.write_text(LINEAR.format(m=m, k=k, n=n, expr=expr))
        (p,), skipped = load_files([f])
        assert not skipped and g.supports(p) is None, (op, p.ops)
        for c in g.seeds(p)[:2] + [c for c in extra if g.valid(c, p)]:
            ev = sup.evaluate(p, g.render(c, p), CFG)
            assert ev.status == "ok", (op, (m, k, n), c, ev.status, ev.message)
