"""norm_rows' warp-per-row mode on the CPU: short rows (a layer norm over the 64-wide last dim of a
convolution's output, as in KernelBench's level2/34) seed it first, long rows never take it, it re-reads
the row rather than caching it in a block's shared memory, its grid covers every row with BLOCK / 32
rows a block, and its seeds compile with NVRTC for sm_90a in fp32 and bf16."""

import pytest

from cuforge.kernels.norms import NormRows
from template_helpers import problem_from_expr, smoke_compile

LN64 = "        self.ln = nn.LayerNorm(64)"


@pytest.mark.parametrize("dtype", ["", ", dtype=torch.bfloat16"])
def test_short_rows_seed_a_warp_per_row_first_and_compile(tmp_path, dtype):
    init = LN64 + (".to(torch.bfloat16)" if dtype else "")
    p = problem_from_expr(tmp_path, "F.gelu(self.ln(a)) * 2.0", f"torch.randn(2, 4, 3, 5, 64{dtype})", args="a", init=init)
    n = NormRows()
    seeds = n.seeds(p)
    assert seeds[0] == dict(BLOCK=256, VEC=4, CACHE="global", ROW_WARP=1)
    assert all(n.valid(c, p) for c in seeds) and sum(c.get("ROW_WARP", 0) for c in seeds) == 1
    launch = n.render(seeds[0], p).launch
    assert launch.grid == "(cdiv(rows, 8),)" and launch.shared_mem == "0"
    assert n.render(seeds[1], p).launch.grid == "(rows,)"  # a block per row, as before
    assert not n.valid(dict(BLOCK=256, VEC=4, CACHE="smem", ROW_WARP=1), p)  # no block-wide cache for a warp's row
    smoke_compile(n, p, 2)


def test_long_rows_never_take_a_warp_per_row(tmp_path):
    n = NormRows()
    mid = problem_from_expr(tmp_path, "F.layer_norm(a, (1000,))", "torch.randn(33, 1000)", args="a")
    assert n.seeds(mid)[-1].get("ROW_WARP") == 1 and not n.seeds(mid)[0].get("ROW_WARP")  # offered last, after the blocks
    long = problem_from_expr(tmp_path, "F.layer_norm(a, (4096,))", "torch.randn(8, 4096)", args="a")
    assert not any(c.get("ROW_WARP") for c in n.seeds(long))
    assert not n.valid(dict(BLOCK=256, VEC=4, CACHE="global", ROW_WARP=1), long)
