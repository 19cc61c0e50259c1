"""Softmax, log-softmax and row norms (L1, L2, RMS, instance, group, layer) over rows too long for one
block to hold: a thread-block cluster per row (Hopper). Where the row fits the cluster's shared memory
(RESIDENT), each block keeps its slice there, so the row is read once and written once where one block
per row must read it twice; longer rows are still spread over up to 16 blocks, each reading its slice
twice (a few long rows - a layer norm over 16 MiB rows - otherwise occupy a few SMs). The statistics
meet through distributed shared memory. The problems are the ones `softmax_rows` and `normalize`
match (their matchers, their traced prologue and epilogue chains); this family takes the long rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, Family
from cuforge.kernels.chains import CTYPES, Epilogue, per_16_bytes
from cuforge.kernels.normalize import NormalizeMatch, match_normalize
from cuforge.kernels.softmax import MAX_CACHED, SoftmaxMatch, match_softmax
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

MIN_ROW_BYTES = 64 * 1024  # shorter rows fit one block's registers or shared memory: softmax_rows / normalize
SLICE_LIMIT = SMEM_LIMIT - 4 * 1024  # a block's slice, with room for its static shared memory
SOFTMAX_REGISTER_ROW = MAX_CACHED * 1024  # softmax_rows keeps rows up to this long in registers
CLUSTERS = (2, 4, 8, 16)  # 16 is Hopper's non-portable maximum (the runtime allows it at launch)


@dataclass(frozen=True)
class RowsMatch:
    mode: str  # softmax | norm
    x: str
    dtype: str
    rows: int
    cols: int
    softmax: SoftmaxMatch | None = None
    norm: NormalizeMatch | None = None


def match_rows(problem: Problem) -> RowsMatch | str:
    sm = match_softmax(problem)
    if not isinstance(sm, str) and sm.safe:
        return "a softmax that writes rows of -inf as zeros (softmax_rows covers it)"
    if not isinstance(sm, str):
        found = RowsMatch("softmax", sm.x, sm.in_dtype, sm.rows, sm.cols, softmax=sm)
    else:
        nm = match_normalize(problem)
        if isinstance(nm, str):
            return f"{sm}; {nm}"
        if nm.inner != 1:
            return "the norm's statistic runs over a middle dim, not rows"
        if nm.dtype != "float32":  # the row-on-chip kernels read and write fp32 rows (normalize takes halves)
            return f"a norm of {nm.dtype} rows (kept on chip in fp32 only)"
        found = RowsMatch("norm", "in0", "float32", nm.outer, nm.reduced, norm=nm)
    if found.cols * 4 < MIN_ROW_BYTES or (found.mode == "softmax" and found.cols <= SOFTMAX_REGISTER_ROW):
        return f"rows of {found.cols} fit one block (the one-block families cover them)"
    if found.rows * max(CLUSTERS) >= 2**31:
        return "too many rows for one grid"
    return found


def slice_elements(cols: int, cluster: int, vec: int) -> int:
    """Each block's share of a row, rounded up to a whole 16-byte vector of the fp32 buffer (as the kernel does)."""
    unit = max(vec, 4)
    per_block = -(-cols // cluster)
    return -(-per_block // unit) * unit


def fits(cols: int, cluster: int, vec: int) -> bool:
    """Whether a block's slice of the row fits its shared memory."""
    return slice_elements(cols, cluster, vec) * 4 <= SLICE_LIMIT


@family(110)
class RowsCluster(Family):
    """CLUSTER blocks of BLOCK threads per row; VEC-wide loads (16 bytes) where a slice is aligned,
    UNROLL of them in flight per thread; the slice kept in shared memory (RESIDENT) or read twice;
    statistics in double (norms) or an fp32 (max, sum of exp) per block (softmax: the sum from shared
    memory once the block's max is known, or ONLINE: folded in while loading, a batch of UNROLL x VEC values at a
    time; online anyway where the row is read twice), combined in one fixed order in every block."""

    def __init__(self) -> None:
        super().__init__("rows_cluster", {"CLUSTER": CLUSTERS, "BLOCK": (256, 512, 1024), "VEC": (1, 4, 8),
                                          "UNROLL": (1, 2, 4, 8), "RESIDENT": (True, False), "ONLINE": (False, True)})

    DEFAULTS = {"RESIDENT": True, "ONLINE": False}

    def supports(self, problem: Problem) -> str | None:
        found = match_rows(problem)
        return found if isinstance(found, str) else None

    def runs_on(self, compute_capability: str) -> bool:
        return tuple(int(x) for x in compute_capability.split(".")) >= (9, 0)  # thread-block clusters

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        c = self.complete(c)  # seeds leave later-added knobs at their defaults
        f = match_rows(problem)
        if isinstance(f, str):
            return False
        if c["VEC"] > 1 and c["VEC"] != per_16_bytes(f.dtype):  # one 16-byte load
            return False
        if c["ONLINE"] and (f.mode != "softmax" or not c["RESIDENT"]):
            return False  # a norm's sums are already taken while loading; a row read twice is summed online
        return (not c["RESIDENT"] or fits(f.cols, c["CLUSTER"], c["VEC"])) and c["UNROLL"] * c["VEC"] <= 32

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = match_rows(problem)
        assert not isinstance(f, str)
        vec = per_16_bytes(f.dtype)

        def smallest(limit: int) -> int:  # the fewest blocks whose slices fit `limit` bytes each
            return next((cl for cl in CLUSTERS if slice_elements(f.cols, cl, vec) * 4 <= limit), max(CLUSTERS))

        big = max(CLUSTERS)
        if not fits(f.cols, big, vec):  # read twice, over as many blocks as a cluster has
            out = [dict(CLUSTER=big, BLOCK=512, VEC=1, UNROLL=8, RESIDENT=False),
                   dict(CLUSTER=big, BLOCK=512, VEC=vec, UNROLL=4, RESIDENT=False),
                   dict(CLUSTER=8, BLOCK=1024, VEC=vec, UNROLL=4, RESIDENT=False)]
            return [c for c in out if self.valid(c, problem)]
        two = smallest(SLICE_LIMIT // 2 - 2048)  # two blocks per SM: one loads while the other writes
        one = smallest(SLICE_LIMIT)
        out = [  # softmax's sum of exp folded in while loading: 393216 columns 0.94 of the copy against 0.91 (rows_cluster_probe3)
               dict(CLUSTER=two, BLOCK=1024 if two == one else 512, VEC=vec, UNROLL=4, RESIDENT=True, ONLINE=True),
               dict(CLUSTER=two, BLOCK=1024 if two == one else 512, VEC=vec, UNROLL=4, RESIDENT=True),
               # Half the threads with twice the loads each: softmax over 393216 columns 4.67 vs 4.80 ms (kb_s22_probe1).
               dict(CLUSTER=two, BLOCK=256, VEC=vec, UNROLL=8, RESIDENT=True),
               dict(CLUSTER=one, BLOCK=1024, VEC=vec, UNROLL=4, RESIDENT=True),
               dict(CLUSTER=min(2 * two, big), BLOCK=512, VEC=vec, UNROLL=4, RESIDENT=True),
               dict(CLUSTER=two, BLOCK=512, VEC=1, UNROLL=8, RESIDENT=True)]
        seen: list[dict[str, Any]] = []
        for c in out:
            if c not in seen and self.valid(c, problem):
                seen.append(c)
        return seen

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = match_rows(problem)
        assert not isinstance(f, str)
        if f.softmax is not None:
            return {"MODE": "softmax", "T": CTYPES[f.dtype], "LOG": f.softmax.log, "PRO": f.softmax.prologue,
                    "EPI": f.softmax.epilogue}
        m = f.norm
        assert m is not None
        return {"MODE": "norm", "T": "float", "KIND": m.kind, "EPS": repr(float(m.eps)) + "f", "PRO": Epilogue(),
                "AFFINE_W": m.weight is not None, "AFFINE_B": m.bias is not None, "GROUPS": m.groups,
                "CPG_SPAN": m.channel_span, "CPG": m.reduced // m.channel_span, "EPI": m.epilogue,
                "LAST_DIM": problem.inputs[0].shape[-1]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_rows(problem)
        assert not isinstance(f, str)
        unit = max(c["VEC"], 4)
        shared = f"(cdiv(cdiv(cols, {c['CLUSTER']}), {unit}) * {unit}) * 4" if c["RESIDENT"] else "0"
        grid = f"(rows * {c['CLUSTER']},)"
        if f.softmax is not None:
            s = f.softmax
            return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)", shared_mem=shared,
                              args=(s.x, "out0", "rows", "cols", *s.prologue.launch_args(), *s.epilogue.launch_args()),
                              outputs=((f"{s.x}.shape", s.out_dtype),),
                              bindings=(("cols", s.cols_binding()), ("rows", f"{s.x}.numel() // max(cols, 1)")))
        m = f.norm
        assert m is not None
        affine = tuple(r for r in (m.weight, m.bias) if r is not None)
        return LaunchSpec(entry=self.name, grid=grid, block=f"({c['BLOCK']},)", shared_mem=shared,
                          args=("in0", "out0", "rows", "cols", *affine, *m.epilogue.launch_args()),
                          outputs=(("in0.shape", "float32"),),
                          bindings=(("rows", str(m.outer)), ("cols", str(m.reduced))))
