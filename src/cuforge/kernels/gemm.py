"""The GEMM families: fp16 or bf16 C = A @ B on Hopper (wgmma and TMA, with multicast clusters) and on
Ampere (mma.sync), and the fused linear layer (bias and an activation in the epilogue) on Hopper."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, Family, fills_gpu, tiles
from cuforge.kernels.leaves import leaf_spec
from cuforge.kernels.registry import family
from cuforge.op_graph import is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec


# The operands' element type in the half-precision GEMM templates (_half_gemm.cu.j2): its C type, the
# wgmma / mma.sync operand type, and how fp32 pairs are packed into it and unpacked from it.
HALF_ELEMENTS = {
    "float16": {"name": "fp16", "ctype": "half", "mma": "f16", "pack2": "__floats2half2_rn", "unpack2": "__half22float2"},
    "bfloat16": {"name": "bf16", "ctype": "__nv_bfloat16", "mma": "bf16", "pack2": "__floats2bfloat162_rn",
                 "unpack2": "__bfloat1622float2"},
}


def element(problem: Problem) -> dict[str, str]:
    """The template values of the problem's half-precision element type (its first input's)."""
    return HALF_ELEMENTS[problem.inputs[0].dtype]


def plain_hgemm(problem: Problem) -> str | None:
    """None when the problem is C = A @ B over 2-D fp16 (or 2-D bf16) operands with 16-byte aligned rows."""
    if problem.ops != ("mm",) or len(problem.inputs) != 2:
        return "not a plain C = A @ B"
    if problem.graph and problem.graph[0].args[:2] != ("in0", "in1"):
        return "operands are not the two inputs as given (transposed or swapped)"
    a, b = problem.inputs
    if a.dtype not in HALF_ELEMENTS or b.dtype != a.dtype or len(a.shape) != 2 or len(b.shape) != 2:
        return "needs two 2-D operands, both fp16 or both bf16"
    if a.shape[1] % 8 or b.shape[1] % 8:
        return f"needs K and N multiples of 8 for 16-byte loads (K={a.shape[1]}, N={b.shape[1]})"
    return None


@family(10)
class GemmSm90(Family):
    """fp16 or bf16 GEMM for Hopper (sm_90a): TMA loads into 128-byte-swizzled tiles, wgmma from shared
    memory, a producer warpgroup and one or two consumer warpgroups over an mbarrier ring, a
    persistent grid walking work units in grouped order, optional split-K (fp32 partials in a
    workspace, summed in split order by the tile's last split, added atomically into one sum, or -
    "cluster" - summed through distributed shared memory by the 2-16 blocks of one cluster), TMA
    multicast (CLUSTER_M x CLUSTER_N tiles in a cluster: each A k-tile read from L2 once per cluster
    row, each B k-tile once per cluster column) and a TMA-store or direct epilogue."""

    anchors = frozenset({"mm"})

    BK = 64
    WS_LIMIT = 256 << 20  # split-K workspace bytes
    # Tile shapes, largest first, with a rough per-flop efficiency of each (bigger tiles reuse more).
    LAYOUTS = {(128, 256): 1.0, (256, 128): 1.0, (128, 192): 0.97, (128, 128): 0.9, (64, 256): 0.85,
               (128, 64): 0.75, (64, 128): 0.75, (64, 192): 0.8, (64, 64): 0.55}

    template = "gemm_sm90"

    def __init__(self, name: str = "gemm_sm90") -> None:
        super().__init__(name, {"BM": (64, 128, 256), "BN": (8, 16, 32, 64, 128, 192, 256),
                                "STAGES": (2, 3, 4, 5, 6, 7, 8, 12, 16),
                                "GROUP_M": (1, 4, 8, 16), "SPLIT_K": (1, 2, 4, 8, 16, 32, 64),
                                "REDUCE": ("ordered", "atomic", "cluster"), "EPI": ("tma", "direct"),
                                "CLUSTER_M": (1, 2, 4), "CLUSTER_N": (1, 2, 4), "ONE_CONSUMER": (False, True)})

    DEFAULTS = {"CLUSTER_M": 1, "CLUSTER_N": 1, "ONE_CONSUMER": False}  # configs from before these knobs

    def supports(self, problem: Problem) -> str | None:
        return plain_hgemm(problem)

    def runs_on(self, compute_capability: str) -> bool:
        return compute_capability == "9.0"  # wgmma and setmaxnreg exist only on sm_90a

    @staticmethod
    def shape(problem: Problem) -> tuple[int, int, int]:
        """(M, K, N) of C[M, N] = A[M, K] @ B[K, N]."""
        return problem.inputs[0].shape[0], problem.inputs[0].shape[1], problem.inputs[1].shape[1]

    @staticmethod
    def consumers(c: dict[str, Any]) -> tuple[int, int]:
        """(consumer warpgroups, how many of them sit side by side along N). ONE_CONSUMER: one warpgroup
        takes the whole tile (wider or more wgmmas a k-step, each stage's A and B read once, not twice)."""
        if c.get("ONE_CONSUMER", False):
            return 1, 1
        if c["BM"] == 64:
            return (2, 2) if c["BN"] in (128, 256) else (1, 1)
        return 2, 1

    CLUSTER_MAX = 8  # the portable cluster size: tiles sharing loads by multicast
    SPLIT_CLUSTER_MAX = 16  # splits reduced in one cluster: Hopper's non-portable maximum (the launch allows it)

    @staticmethod
    def cluster_split(c: dict[str, Any]) -> bool:
        return c["SPLIT_K"] > 1 and c["REDUCE"] == "cluster"

    @classmethod
    def multicast(cls, c: dict[str, Any]) -> tuple[int, int]:
        """(cluster rows, cluster columns) of tiles sharing loads; (1, 1): no multicast."""
        return c.get("CLUSTER_M", cls.DEFAULTS["CLUSTER_M"]), c.get("CLUSTER_N", cls.DEFAULTS["CLUSTER_N"])

    @classmethod
    def recv_at(cls, c: dict[str, Any]) -> int:
        """A cluster-reduced split writes its fp32 partial (rows padded by 8) over its stages; the other
        splits' partials of its own rows land after both (copied in while this block may still be loading)."""
        return max(c["STAGES"] * (c["BM"] + c["BN"]) * cls.BK * 2, c["BM"] * (c["BN"] + 8) * 4)

    @staticmethod
    def reduce_slice_bytes(c: dict[str, Any]) -> int:
        """One block's rows of a cluster-reduced partial (padded): under 1 KiB they go by st.async stores,
        else by one bulk copy per receiver (measured on an H100; the probes are in docs/benchmarks.md's git history)."""
        return c["BM"] // c["SPLIT_K"] * (c["BN"] + 8) * 4

    @classmethod
    def pipe_bytes(cls, c: dict[str, Any]) -> int:
        """The stages, and with a cluster-reduced split the partials (see recv_at)."""
        if not cls.cluster_split(c):
            return c["STAGES"] * (c["BM"] + c["BN"]) * cls.BK * 2
        return cls.recv_at(c) + (c["SPLIT_K"] - 1) * cls.reduce_slice_bytes(c)

    @classmethod
    def smem_bytes(cls, c: dict[str, Any]) -> int:
        nc = cls.consumers(c)[0]
        epilogue = nc * 2 * 64 * 64 * 2 if c["EPI"] == "tma" else 0
        return cls.pipe_bytes(c) + epilogue + 1024 + 16 * c["STAGES"] + 24  # the barriers, the split flag

    NARROW = (8, 16, 32)  # BN below 64: one 64-row consumer, B's k-tile in one TMA box, direct stores

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        if c["BM"] == 256 and c["BN"] > 128:  # 128 x BN accumulators per thread would spill
            return False
        if c["BN"] in self.NARROW and (c["BM"] != 64 or c["EPI"] != "direct"):  # the TMA store moves 64 x 64 chunks
            return False
        if c.get("ONE_CONSUMER", False):  # only where two is the rule; at most 128 fp32 accumulators a thread
            auto = {**c, "ONE_CONSUMER": False}
            if self.consumers(auto)[0] == 1 or c["BM"] // 64 * c["BN"] // 2 > 128:
                return False
        m, k, n = self.shape(problem)
        split = c["SPLIT_K"]
        cm, cn = self.multicast(c)
        if cm * cn > 1:  # a cluster of tiles, each block one tile (not split), none of them wholly outside C
            if cm * cn > self.CLUSTER_MAX or split > 1 or -(-m // c["BM"]) < cm or -(-n // c["BN"]) < cn:
                return False
        if split > 1:
            if split > -(-k // self.BK) or tiles(m, n, c["BM"], c["BN"]) * split > 4 * SEED_SMS:
                return False  # more splits than k-tiles, or the tiles already fill the GPU
            if self.cluster_split(c):  # one cluster per tile; its blocks store the sum directly
                if split > self.SPLIT_CLUSTER_MAX or c["EPI"] != "direct":
                    return False
            elif (1 if c["REDUCE"] == "atomic" else split) * m * n * 4 > self.WS_LIMIT:  # the fp32 partials
                return False
        elif c["REDUCE"] != "ordered":  # no reduction without split-K: one spelling per kernel
            return False
        return self.smem_bytes(c) <= SMEM_LIMIT

    def seed_config(self, problem: Problem, bm: int, bn: int, split: int = 1, epi: str = "tma",
                    reduce: str = "ordered", cluster: tuple[int, int] = (1, 1)) -> dict[str, Any]:
        # 64 x 128 and 128 x 64 tiles in one consumer warpgroup (m64n128 wgmmas, or two m64n64 sharing B's
        # reads) rather than two of m64n64: faster on 12 and 13 of 13 probed shapes, by up to 14% (1024^3;
        # docs/benchmarks.md's git history)
        base = {"BM": bm, "BN": bn, "GROUP_M": 8, "SPLIT_K": split, "REDUCE": reduce, "EPI": epi,
                "CLUSTER_M": cluster[0], "CLUSTER_N": cluster[1], "ONE_CONSUMER": (bm, bn) in ((64, 128), (128, 64))}
        # as many stages as fit; past 8 only for narrow tiles (wider ones measured no better at 8 than at
        # 6-7, and keep the second block per SM that fewer stages leave room for)
        deepest = 16 if bn in self.NARROW else 8
        m, k, n = self.shape(problem)
        k_tiles = -(-k // self.BK)
        if k_tiles <= 4 and tiles(m, n, bm, bn) * split <= 2 * SEED_SMS:
            # K <= 256 on at most two waves: stages past the k-tiles only grow the shared memory (measured on
            # the 41 small shapes with K <= 256: 3 stages at K = 64, 4 at K = 256, 1.0-1.5% faster than 8;
            # more waves keep the depth, which prefetches a block's next tile)
            deepest = min(deepest, max(3, k_tiles))
        stages = [s for s in self.knobs["STAGES"] if s <= deepest and self.valid({**base, "STAGES": s}, problem)]
        return {**base, "STAGES": max(stages) if stages else 2}

    # Seed cost model, in units of one k-tile of a bm x bn tile at efficiency 1 per element (about 33 ps
    # on an H100), calibrated on measured hgemm shapes (the split-K probes in docs/benchmarks.md's git history): an
    # atomic reduction moves every split's fp32 partial through L2 (~0.15 units per output element and
    # split) after a zeroing memset (~2 us); a cluster reduction costs ~0.4 us (~0.8 us while its second
    # barrier was a cluster-scope release too), ~20 ns per block and a tile's partial per split through
    # distributed shared memory.
    ATOMIC_PER_ELEMENT_SPLIT = 0.15
    ATOMIC_FIXED = 60_000
    CLUSTER_FIXED = 12_000
    CLUSTER_PER_BLOCK = 600

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m, k, n = self.shape(problem)
        k_tiles = -(-k // self.BK)

        def cost(plan: tuple[int, int, int, str]) -> float:
            """Waves of work units x one unit's k-tiles x tile area / efficiency, plus the reduction."""
            bm, bn, split, reduce = plan
            units = tiles(m, n, bm, bn) * split
            mainloop = -(-units // SEED_SMS) * -(-k_tiles // split) * bm * bn / self.LAYOUTS[(bm, bn)]
            mainloop += bm * bn  # the last unit's epilogue overlaps no loads (big tiles lose on short K)
            if split == 1:
                return mainloop
            if reduce == "cluster":
                return mainloop + self.CLUSTER_FIXED + self.CLUSTER_PER_BLOCK * units + bm * bn * split
            return mainloop + self.ATOMIC_FIXED + m * n * split * self.ATOMIC_PER_ELEMENT_SPLIT

        def plans_for(bm: int, bn: int) -> list[tuple[int, int, int, str]]:
            """Unsplit; split K atomically only when the tiles leave multiprocessors idle, into at most
            about two units per multiprocessor of a few k-tiles each; in a cluster of 64 x 64 tiles, into
            at most 128 blocks, when the tiles fill at most a quarter of the GPU with 4+ k-tiles a split
            or half of it with 8+ (larger tiles, shorter splits or more blocks measured slower: 128 x 256
            split 4 at half speed; 128 x 64 split 4 at 0.43-0.61x on 256 x 1024 x 1024 / 16384; 64 x 64
            in 2 splits of 8 k-tiles 0.95x vs 0.86-0.89x unsplit on 1024 x 256 x 1024)."""
            count = tiles(m, n, bm, bn)
            out = [(bm, bn, 1, "ordered")]
            for s in self.knobs["SPLIT_K"][1:]:
                if count < SEED_SMS and count * s <= 2 * SEED_SMS and k_tiles >= 4 * s:
                    out.append((bm, bn, s, "atomic"))
                few = (count <= SEED_SMS // 4 and k_tiles >= 4 * s) or (count <= SEED_SMS // 2 and k_tiles >= 8 * s)
                if s <= self.CLUSTER_MAX and (bm, bn) == (64, 64) and few and count * s <= 128:
                    out.append((bm, bn, s, "cluster"))
            return out

        def seed(plan: tuple[int, int, int, str], epi: str | None = None) -> dict[str, Any]:
            bm, bn, split, reduce = plan
            epi = epi or ("direct" if reduce == "cluster" else "tma")
            c = self.seed_config(problem, bm, bn, split=split, epi=epi, reduce=reduce)
            # 6 stages: two 64 x 64 blocks per SM and enough loads in flight (measured on long splits:
            # 0.85-0.97x at 6, 0.73-0.90x at 4, 8 leaves one block per SM and lost up to 0.2x)
            return {**c, "STAGES": 6} if reduce == "cluster" else c

        plans = sorted((p for bm, bn in self.LAYOUTS for p in plans_for(bm, bn)),
                       key=lambda p: (cost(p), p[2], -p[0] * p[1]))
        best = plans[0]
        # the other kind second: split-K's fixed costs can outweigh its parallelism, or the reverse
        other = next((p for p in plans if (p[2] == 1) != (best[2] == 1)), None)
        # a different tile next, not one wider than the matrix where the best is not (wasted rows)
        fits = [p for p in plans if p[:2] != best[:2] and p != other and p[0] <= max(m, best[0]) and p[1] <= max(n, best[1])]
        same_tile = [p for p in plans if p[:2] == best[:2] and p not in (best, other)]  # e.g. 64 x 64 only
        runner_up = (fits or same_tile or [p for p in plans if p not in (best, other)])[0]
        out = [seed(best)] + ([seed(other)] if other else []) + [seed(runner_up)]
        if k_tiles <= 8 and tiles(m, n, 64, 16) <= SEED_SMS and best[2] == 1:
            # short K on few tiles: 64 x 16 tiles (4x the blocks of 64 x 64), 16 stages, second (measured
            # 0.95-0.97x vs 0.92-0.94x for 64 x 64 on 64-256 rows/columns at K = 256; cuBLAS picks such
            # narrow tiles there too)
            out.insert(1, self.seed_config(problem, 64, 16, epi="direct"))
        if best[3] == "atomic":
            out.append(seed((*best[:3], "ordered")))  # the deterministic reduction
        if best[3] != "cluster":  # a cluster split stores directly: the other epilogue
            out.append(seed(best, epi="direct"))
        out = self.narrow_splits(problem) + out
        kept = [c for c in out if self.valid(c, problem)]
        return [c for i, c in enumerate(kept) if c not in kept[:i]]

    def narrow_splits(self, problem: Problem) -> list[dict[str, Any]]:
        """Cluster splits of 64 x 16 / 32 / 64 tiles where a 64 x 64 grid has at most 16 tiles and K at
        least 16 k-tiles (measured 1.07-1.63x vs cuBLAS there, up to 35% faster than the 64 x 64 splits:
        the probes in docs/benchmarks.md's git history). Two rules: "fill 64" - as many blocks as fit in 64 (about
        half the GPU), the split nearest sqrt(k-tiles) among those, then the widest tile; "sqrt" - 64 x 64
        tiles split about sqrt(k-tiles) ways, halved until at most 128 blocks. "fill 64" goes first unless
        it leaves a block more than 32 k-tiles (a long serial chain per block: 256 x 256 x 16384 ran 13.4 us
        split 8, ~20 us split 4). On 17 of the 18 probed shapes they cover, the first pick was the measured
        best or within 1% of it."""
        m, k, n = self.shape(problem)
        k_tiles = -(-k // self.BK)
        if k_tiles < 16 or tiles(m, n, 64, 64) > 16:
            return []
        splits = [s for s in self.knobs["SPLIT_K"][1:] if s <= self.SPLIT_CLUSTER_MAX and k_tiles >= 2 * s]
        root = k_tiles ** 0.5
        plans = [(bn, s) for bn in (16, 32, 64) for s in splits if tiles(m, n, 64, bn) * s <= 64]
        fill = max(plans, key=lambda p: (tiles(m, n, 64, p[0]) * p[1], -abs(math.log2(p[1] / root)), p[0]), default=None)
        sqrt_split = max((s for s in splits if s <= root), default=splits[0] if splits else None)
        while sqrt_split and sqrt_split > 2 and tiles(m, n, 64, 64) * sqrt_split > 128:
            sqrt_split //= 2
        ordered = [fill, (64, sqrt_split) if sqrt_split else None]
        if fill and k_tiles / fill[1] > 32:
            ordered.reverse()
        configs = [{**self.seed_config(problem, 64, p[0], split=p[1], epi="direct", reduce="cluster"), "STAGES": 6}
                   for p in ordered if p]
        return [c for c in configs if self.valid(c, problem)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        return {"B_KMAJOR": False, "BIAS": False, "ACT": "none", "ELEM": element(problem)}

    def b_operand(self, c: dict[str, Any], problem: Problem) -> tuple[str, str, tuple[str, ...]]:
        """(B's TMA descriptor, N's binding, extra kernel arguments after C). With multicast a block
        loads 1 / CLUSTER_M of each 64 x 64 chunk of B's k-tile (its k-rows)."""
        rows = self.BK // self.multicast(c)[0]
        if c["BN"] in self.NARROW:  # one box of BN columns, swizzled by its row bytes
            return f"tma_2d(in1, {c['BN']}, {rows}, {self.b_swizzle(c)})", "in1.shape[1]", ()
        return f"tma_2d(in1, 64, {rows})", "in1.shape[1]", ()

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        bm, bn, split = c["BM"], c["BN"], c["SPLIT_K"]
        cm, cn = self.multicast(c)
        units = f"cdiv(M, {bm}) * cdiv(N, {bn}) * {split}"
        # persistent blocks, except clusters: a block per unit (a cluster-reduced split) or per tile
        # (multicast: a cluster per CLUSTER_M x CLUSTER_N tiles)
        if cm * cn > 1:
            grid = f"(cdiv(M, {bm * cm}) * cdiv(N, {bn * cn}) * {cm * cn},)"
        else:
            grid = f"({units},)" if self.cluster_split(c) else f"(max(1, min({units}, SMS)),)"
        b_desc, n_binding, epilogue_args = self.b_operand(c, problem)
        args = [f"tma_2d(in0, {self.BK}, {bm // cn})", b_desc]  # multicast: 1 / CLUSTER_N of A's rows a block
        if c["EPI"] == "tma":
            args.append("tma_2d(out0, 64, 64)")
        args += ["out0", *epilogue_args]
        scratch: tuple[tuple[str, str, str], ...] = ()
        counters = f"cdiv(M, {bm}) * cdiv(N, {bn})"
        if split > 1 and c["REDUCE"] == "atomic":  # one zeroed buffer: the fp32 sum, then per-tile counters
            args.append("scratch0")
            scratch = ((f"(M * N + {counters},)", "float32", "zeros"),)
        elif split > 1 and c["REDUCE"] == "ordered":  # every split's fp32 partial (each fully written), and zeroed per-tile counters
            args += ["scratch0", "scratch1"]
            scratch = ((f"({split}, M, N)", "float32", "empty"), (f"({counters},)", "int32", "zeros"))
        return LaunchSpec(entry=self.name, grid=grid, block=f"({128 * (self.consumers(c)[0] + 1)},)",
                          shared_mem=str(self.smem_bytes(c)), args=(*args, "M", "N", "K"),
                          outputs=(("(M, N)", problem.inputs[0].dtype),), scratch=scratch,
                          bindings=(("M", "in0.shape[0]"), ("K", "in0.shape[1]"), ("N", n_binding),
                                    ("SMS", "torch.cuda.get_device_properties(in0.device).multi_processor_count")))

    def derived(self, config: dict[str, Any]) -> dict[str, Any]:
        nc, cn = self.consumers(config)
        cluster_m, cluster_n = self.multicast(config)
        return {"NC": nc, "CN": cn, "TN": config["BN"] // cn, "PIPE_BYTES": self.pipe_bytes(config), "RECV_AT": self.recv_at(config),
                "CLUSTER_STORES": self.cluster_split(config) and self.reduce_slice_bytes(config) < 1024,
                "CLUSTER": self.cluster_split(config), "MCAST": cluster_m * cluster_n > 1,
                "BCH": self.b_box_columns(config), "B_SWIZZLE": self.b_swizzle(config)}

    @staticmethod
    def b_box_columns(c: dict[str, Any]) -> int:
        """Columns of one TMA box of B (N-major): 128-byte rows at most."""
        return min(c["BN"], 64)

    @classmethod
    def b_swizzle(cls, c: dict[str, Any]) -> int:
        """Shared-memory swizzle of B's N-major box: its row bytes (64 columns: 128), none for 16-byte rows."""
        row = cls.b_box_columns(c) * 2
        return row if row >= 32 else 0


LINEAR_ACTS = ("relu", "silu", "gelu", "gelu_tanh")  # traced aten op = the template's ACT


@dataclass(frozen=True)
class LinearMatch:
    """act(in0 @ W^T (+ bias)) read off the graph: W and the bias are leaves (parameters or inputs)."""

    weight: str
    bias: str | None
    act: str


def match_linear(problem: Problem) -> LinearMatch | str:
    """The problem as a linear layer over its first input, with an optional bias and activation, or why
    it is not one."""
    graph = problem.graph
    if not graph or len(graph) > 2 or graph[0].op not in ("addmm", "mm"):
        return f"not a linear layer (mm or addmm) with an optional {'/'.join(LINEAR_ACTS)} after it"
    first = graph[0]
    if first.op == "addmm":
        if first.kwarg("beta", 1) != 1 or first.kwarg("alpha", 1) != 1:
            return "addmm with beta or alpha other than 1"
        bias, x, wt = first.args[:3]
    else:
        bias, (x, wt) = None, first.args[:2]
    if x != "in0" or not is_ref(wt) or not wt.endswith(".T") or (bias is not None and not is_ref(bias)):
        return "not in0 @ weight.T (+ bias)"
    act = "none"
    if len(graph) == 2:
        node = graph[1]
        # gelu's `approximate` is in the op's name already (gelu / gelu_tanh)
        if node.op not in LINEAR_ACTS or node.args[:1] != (first.out,) or len(node.args) != 1 \
                or any(k != "approximate" for k, _ in node.kwargs):
            return f"the op after the product is not one of {'/'.join(LINEAR_ACTS)} applied to it"
        act = node.op
    if problem.graph_outputs != (graph[-1].out,):
        return "the forward's output is not the layer's"
    specs = [problem.inputs[0], leaf_spec(problem, wt[:-2]), leaf_spec(problem, bias) if bias else None]
    xs, ws, bs = specs
    if ws is None or (bias is not None and bs is None):
        return "the weight or the bias is not an input or a parameter"
    if xs.dtype not in HALF_ELEMENTS or any(t is not None and t.dtype != xs.dtype for t in (ws, bs)) \
            or len(xs.shape) != 2 or len(ws.shape) != 2 or (bs is not None and tuple(bs.shape) != (ws.shape[0],)):
        return "needs a 2-D input, a 2-D weight and a 1-D bias over its rows, all fp16 or all bf16"
    if ws.shape[1] != xs.shape[1]:
        return "the weight's shape does not match the input"
    if xs.shape[1] % 8 or ws.shape[0] % 8:
        return f"needs in and out features multiples of 8 for TMA (K={xs.shape[1]}, N={ws.shape[0]})"
    return LinearMatch(wt[:-2], bias, act)


@family(20)
class LinearSm90(GemmSm90):
    """A linear layer with its epilogue fused, for Hopper: act(x @ W^T (+ b)) with x [M, K], W [N, K] and
    b [N] fp16 or bf16 (nn.Linear's layout: W is read K-major straight from the parameter, no transpose),
    the bias and activation (ReLU, SiLU, exact or tanh GELU) applied to the fp32 accumulators before the
    one store. W and b may be any of the model's parameters (a layer among several) or inputs."""

    anchors = frozenset({"addmm", "mm"})

    def __init__(self) -> None:
        super().__init__("linear_sm90")

    def supports(self, problem: Problem) -> str | None:
        found = match_linear(problem)
        return found if isinstance(found, str) else None

    def extra(self, problem: Problem) -> dict[str, Any]:
        found = match_linear(problem)
        assert not isinstance(found, str)
        return {"B_KMAJOR": True, "BIAS": found.bias is not None, "ACT": found.act, "ELEM": element(problem)}

    def b_operand(self, c: dict[str, Any], problem: Problem) -> tuple[str, str, tuple[str, ...]]:
        found = match_linear(problem)
        assert not isinstance(found, str)
        # multicast: a block loads 1 / CLUSTER_M of the BN rows of W
        return (f"tma_2d({found.weight}, {self.BK}, {c['BN'] // self.multicast(c)[0]})", f"{found.weight}.shape[0]",
                (found.bias,) if found.bias else ())

    @staticmethod
    def shape(problem: Problem) -> tuple[int, int, int]:
        found = match_linear(problem)
        assert not isinstance(found, str)
        weight = leaf_spec(problem, found.weight)
        return problem.inputs[0].shape[0], problem.inputs[0].shape[1], weight.shape[0]  # type: ignore[union-attr]


@family(30)
class GemmSm80(Family):
    """fp16 or bf16 GEMM, fp32 accumulation: mma.sync m16n8k16 + ldmatrix + a cp.async multistage pipeline,
    grouped rasterization; runs on sm_80 to sm_90."""

    anchors = frozenset({"mm"})

    def __init__(self) -> None:
        super().__init__("gemm_sm80", {
            "BM": (32, 64, 128, 256), "BN": (32, 64, 128, 256), "BK": (32, 64), "WM": (1, 2, 4), "WN": (1, 2, 4),
            "STAGES": (2, 3, 4, 5, 6), "GROUP_M": (1, 4, 8, 16)})

    def supports(self, problem: Problem) -> str | None:
        return plain_hgemm(problem)

    @staticmethod
    def smem_bytes(c: dict[str, Any]) -> int:
        return c["STAGES"] * (c["BM"] * (c["BK"] + 8) + c["BK"] * (c["BN"] + 8)) * 2

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        warps = c["WM"] * c["WN"]
        if warps not in (2, 4, 8):
            return False
        wtm, wtn = c["BM"] // c["WM"], c["BN"] // c["WN"]
        if c["BM"] % c["WM"] or c["BN"] % c["WN"] or wtm % 16 or wtn % 16:
            return False
        accumulators = (wtm // 16) * (wtn // 8) * 4
        return 16 <= accumulators <= 128 and self.smem_bytes(c) <= SMEM_LIMIT

    # Tile presets from large to small; seeds take the largest that still fills the GPU with blocks.
    PRESETS: tuple[dict[str, Any], ...] = (
        dict(BM=128, BN=256, BK=32, WM=2, WN=4, STAGES=4, GROUP_M=8),
        dict(BM=128, BN=128, BK=32, WM=2, WN=2, STAGES=4, GROUP_M=8),
        dict(BM=128, BN=64, BK=64, WM=2, WN=2, STAGES=3, GROUP_M=8),
        dict(BM=64, BN=64, BK=64, WM=2, WN=2, STAGES=3, GROUP_M=4),
        dict(BM=64, BN=32, BK=64, WM=2, WN=1, STAGES=4, GROUP_M=4),
        dict(BM=32, BN=64, BK=64, WM=1, WN=2, STAGES=3, GROUP_M=1),
        dict(BM=32, BN=32, BK=64, WM=1, WN=2, STAGES=4, GROUP_M=1),
    )
    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        m = problem.inputs[0].shape[0]
        n = problem.inputs[1].shape[1]
        valid = [c for c in self.PRESETS if self.valid(c, problem)]

        def blocks(c: dict[str, Any]) -> int:
            return tiles(m, n, c["BM"], c["BN"])

        filling = [c for c in valid if fills_gpu(blocks(c))]
        first = filling[0] if filling else valid[-1]
        rest = sorted((c for c in valid if c is not first), key=lambda c: abs(blocks(c) - SEED_SMS))
        return [first, *rest]

    def extra(self, problem: Problem) -> dict[str, Any]:
        return {"ELEM": element(problem)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        return LaunchSpec(entry=self.name, grid=f"(cdiv(M, {c['BM']}) * cdiv(N, {c['BN']}),)",
                          block=f"({c['WM'] * c['WN'] * 32},)", shared_mem=str(self.smem_bytes(c)),
                          args=("in0", "in1", "out0", "M", "N", "K"), outputs=(("(M, N)", problem.inputs[0].dtype),),
                          bindings=(("M", "in0.shape[0]"), ("K", "in0.shape[1]"), ("N", "in1.shape[1]")))
