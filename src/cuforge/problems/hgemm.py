"""The generated hgemm family: C = A @ B in fp16 with fp32 accumulation over a grid of shapes."""

from __future__ import annotations

import itertools

from cuforge.problems.problem import Problem, ProblemMeta, TensorSpec, Tolerance

GRID = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
SUBSET_125 = (64, 256, 1024, 4096, 16384)

_SOURCE = '''"""hgemm {M}x{N}x{K}: C = A @ B, A is MxK and B is KxN row-major fp16, fp32 accumulation."""
import torch
import torch.nn as nn

M, N, K = {M}, {N}, {K}

CUFORGE = {{
    "dtype": "float16",
    "flops": "2 * M * N * K",
    "bytes": "2 * (M * K + K * N + M * N)",
    "families": ["gemm"],
    "baselines": ["torch", "torch.compile", "cublas", "cublaslt"],
    "policy": "custom",
    "small": {{"M": {sm}, "N": {sn}, "K": {sk}}},
}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        # The reference must accumulate in fp32 end to end.
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)]


def get_init_inputs():
    return []
'''


def hgemm_source(m: int, n: int, k: int) -> str:
    return _SOURCE.format(M=m, N=n, K=k, sm=min(m, 64), sn=min(n, 64), sk=min(k, 64))


def hgemm_problem(m: int, n: int, k: int, suite: str = "hgemm") -> Problem:
    """Built in-process: the source is ours, so no subprocess is needed to know its shapes."""
    meta = ProblemMeta(
        dtype="float16",
        tolerance=Tolerance.for_dtype("float16"),
        flops=float(2 * m * n * k),
        bytes=float(2 * (m * k + k * n + m * n)),
        families=("gemm",),
        baselines=("torch", "torch.compile", "cublas", "cublaslt"),
        policy="custom",
        small={"M": min(m, 64), "N": min(n, 64), "K": min(k, 64)},
        description=f"fp16 GEMM {m}x{n}x{k}, fp32 accumulation",
    )
    return Problem(
        id=f"hgemm/{m}_{n}_{k}",
        source=hgemm_source(m, n, k),
        meta=meta,
        inputs=(TensorSpec((m, k), "float16"), TensorSpec((k, n), "float16")),
        outputs=(TensorSpec((m, n), "float16"),),
        suite=suite,
        ops=("mm",),
    )


def hgemm_shapes(subset: str = "hgemm") -> list[tuple[int, int, int]]:
    grid = list(itertools.product(GRID, GRID, GRID))
    if subset == "hgemm":
        return grid
    if subset == "hgemm-small":
        return [s for s in grid if max(s) <= 1024]
    if subset == "hgemm-125":
        return list(itertools.product(SUBSET_125, SUBSET_125, SUBSET_125))
    if subset == "hgemm-large":
        return [s for s in grid if s[0] * s[1] * s[2] >= 2**40]
    raise KeyError(subset)


HGEMM_SUITES = ("hgemm", "hgemm-small", "hgemm-125", "hgemm-large")


def parse_hgemm_id(name: str) -> tuple[int, int, int] | None:
    """'hgemm/1024_512_64' or '1024_512_64' -> (1024, 512, 64); any positive dims are accepted."""
    tail = name.split("/", 1)[1] if name.startswith("hgemm/") else name
    parts = tail.split("_")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])
