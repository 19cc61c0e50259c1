"""Recurrent cells in one kernel (nn.LSTMCell, nn.GRUCell, or any cell written the same way): one or two
linear projections of the step's (batch, K) inputs, each cut into G equal gates along the feature dim
(split / chunk), and an elementwise chain over the gates and (batch, hidden) tensors that makes the
(batch, hidden) results. Eager runs two GEMMs and a cell kernel, the gates going through memory in
between; here a block computes every gate of its hidden units from the weights' rows for them, and the
chain runs on the accumulators. Two projections that are only added before the split share one
accumulator (LSTM); a GRU keeps its input and hidden projections apart (its new gate multiplies one by
the reset gate). fp16/bf16 on mma.sync with fp32 accumulation; fp32 on three TF32 products a step
(fp32 accuracy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily, fills_gpu, tiles
from cuforge.kernels.chains import literal
from cuforge.kernels.gemm import HALF_ELEMENTS
from cuforge.kernels.leaves import leaf_spec, readers_of
from cuforge.kernels.registry import family
from cuforge.op_graph import OpNode, is_ref
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

DTYPES = ("float32", "float16", "bfloat16")
PROJECTIONS = ("addmm", "mm", "linear")
SPLITS = ("unsafe_split", "split", "unsafe_chunk", "chunk")
UNARY = {"sigmoid": "sigmoid_f({0})", "tanh": "tanhf({0})", "relu": "fmaxf({0}, 0.f)", "neg": "(-{0})"}
BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
          "rsub": "({1} - {0})"}


@dataclass(frozen=True)
class Projection:
    a: str  # the (batch, k) input multiplied
    w: str  # the (gates * hidden, k) weight, stored row-major as nn.Linear keeps it
    bias: str | None
    k: int
    set: int  # the accumulator it adds into


@dataclass(frozen=True)
class CellMatch:
    projections: tuple[Projection, ...]
    sets: tuple[tuple[int, ...], ...]  # each accumulator's projections
    gates: int
    hidden: int
    batch: int
    dtype: str
    rows_in: tuple[str, ...]  # (batch, hidden) leaves the chain reads
    body: str  # C statements computing the chain from s<set>_<gate> and x<i>_v
    results: tuple[str, ...]  # the C value of each output, in order


def _plain(op: str) -> str:
    """An in-place op as its out-of-place name (sigmoid_ -> sigmoid); private aten ops unchanged."""
    return op[:-1] if op.endswith("_") and not op.startswith("_") else op


def _projection(problem: Problem, node: OpNode, dtype: str) -> tuple[str, str, str | None] | str:
    """(input, weight, bias) of x @ W^T (+ b) with W stored as nn.Linear keeps it, or why not."""
    if node.op == "linear":
        a, w, bias = (tuple(node.args) + (None, None, None))[:3]
        if w is None or (isinstance(w, str) and w.endswith(".T")):
            return "a linear whose weight is not stored (out, in)"
    else:
        bias, a, wt = (None, *node.args[:2]) if node.op == "mm" else tuple(node.args[:3])
        if not (isinstance(wt, str) and wt.endswith(".T")):
            return f"{node.op} of a weight not stored (out, in)"
        w = wt[:-2]
        if any(v not in (None, 1) for k, v in node.kwargs if k in ("beta", "alpha")):
            return f"{node.op} with alpha or beta"
    specs = [leaf_spec(problem, r) if is_ref(r) else None for r in (a, w)]
    if any(s is None or len(s.shape) != 2 or s.dtype != dtype for s in specs):
        return "a projection of something other than 2-D inputs and weights of the output's dtype"
    if specs[0].shape[1] != specs[1].shape[1]:
        return "a projection whose input and weight widths differ"
    if bias is not None:
        b = leaf_spec(problem, bias) if is_ref(bias) else None
        if b is None or tuple(b.shape) != (specs[1].shape[0],) or b.dtype != dtype:
            return "a projection's bias is not a vector of its width"
    return a, w, bias


def match_gated_cell(problem: Problem) -> CellMatch | str:
    """The forward as projections cut into gates and an elementwise chain, or why it is not one."""
    graph = problem.graph
    outs = problem.outputs or ()
    if not graph or not outs or any(o.dtype not in DTYPES or len(o.shape) != 2 for o in outs):
        return "needs (batch, hidden) fp32, fp16 or bf16 outputs"
    dtype, (batch, hidden) = outs[0].dtype, tuple(outs[0].shape)
    if any(o.dtype != dtype or tuple(o.shape) != (batch, hidden) for o in outs):
        return "the outputs differ in shape or dtype"
    readers = readers_of(problem)

    projections: dict[str, tuple[str, str, str | None]] = {}
    for n in graph:
        if n.op in PROJECTIONS:
            found = _projection(problem, n, dtype)
            if isinstance(found, str):
                return found
            projections[n.out] = found
    if not projections or len(projections) > 2:
        return "not one or two linear projections"
    width = {graph_node.shape[1] for graph_node in graph if graph_node.out in projections}
    if len(width) != 1:
        return "projections of different widths"
    (width,) = width
    if width % hidden:
        return f"a projection of width {width} is not whole gates of {hidden}"
    gates = width // hidden
    order = list(projections)
    # Two projections only added together before the split share one accumulator (LSTM).
    merged = next((n for n in graph if _plain(n.op) == "add" and len(n.args) == 2 and set(n.args) == set(order)
                   and len(order) == 2 and not n.kwargs and all(len(readers.get(p, [])) == 1 for p in order)), None)
    sets = ((0, 1),) if merged is not None else tuple((i,) for i in range(len(order)))
    projs = tuple(Projection(*projections[p], k=leaf_spec(problem, projections[p][0]).shape[1],
                             set=0 if merged is not None else i) for i, p in enumerate(order))
    if any(leaf_spec(problem, p.a).shape[0] != batch for p in projs):
        return "a projection's batch differs from the outputs'"

    lines: list[str] = []
    for si, members in enumerate(sets):
        for g in range(gates):
            biases = "".join(f" + to_float(bias{k}[{g} * HIDDEN + j])" for k in members if projs[k].bias)
            lines.append(f"const float s{si}_{g} = acc{si}[{g}][i][jn][q]{biases};")
    wide: dict[str, list[str]] = {}  # (batch, gates * hidden) values: one C value per gate
    narrow: dict[str, str] = {}  # (batch, hidden) values
    rows_in: list[str] = []
    for i, p in enumerate(order):
        wide[p] = [f"s{projs[i].set}_{g}" for g in range(gates)]
    if merged is not None:
        wide[merged.out] = [f"s0_{g}" for g in range(gates)]

    def operand(x: Any) -> tuple[str, list[str] | str] | str:
        """('n', C value) / ('w', per-gate values) / ('s', literal) for an argument, or why not."""
        if isinstance(x, bool) or not isinstance(x, (int, float, str)):
            return f"an operand {x!r} the chain cannot read"
        if not isinstance(x, str):
            return ("s", literal(x))
        if x in wide:
            return ("w", wide[x])
        if x in narrow:
            return ("n", narrow[x])
        spec = leaf_spec(problem, x) if is_ref(x) else None
        if spec is not None and tuple(spec.shape) == (batch, hidden) and spec.dtype == dtype:
            if x not in rows_in:
                rows_in.append(x)
            return ("n", f"x{rows_in.index(x)}_v")
        return f"{x} is neither a gate, a (batch, hidden) tensor of the output's dtype nor a constant"

    for n in graph:
        if n.out in projections or n is merged:
            continue
        op = _plain(n.op)
        if op in SPLITS:
            src, size, dim = (tuple(n.args) + (None, None, 0))[:3]
            pieces = size if op.endswith("chunk") else (width // size if isinstance(size, int) and size else 0)
            if src not in wide or dim not in (1, -1) or pieces != gates or (not op.endswith("chunk") and size != hidden):
                return f"a {n.op} that does not cut a projection into its {gates} gates of {hidden}"
            for g in range(gates):
                narrow[n.out if g == 0 else f"{n.out}.{g}"] = wide[src][g]
            continue
        if op not in UNARY and op not in BINARY:
            return f"{n.op} is not a projection, a gate split or an elementwise op the cell kernel has"
        if (op not in UNARY and len(n.args) != 2) or (op in UNARY and len(n.args) != 1) \
                or any(k != "alpha" or v != 1 for k, v in n.kwargs):
            return f"{n.op} with arguments the cell kernel does not take"
        args = [operand(a) for a in n.args]
        bad = next((a for a in args if isinstance(a, str)), None)
        if bad is not None:
            return bad
        kinds = {k for k, _ in args if k != "s"}
        if kinds == {"w", "n"}:
            return f"{n.op} mixes a whole projection with one gate"
        fmt = UNARY.get(op) or BINARY[op]
        name = f"v{len(wide) + len(narrow)}"
        if kinds == {"w"}:
            per = [fmt.format(*(v[g] if k == "w" else v for k, v in args)) for g in range(gates)]
            lines += [f"const float {name}_{g} = {e};" for g, e in enumerate(per)]
            wide[n.out] = [f"{name}_{g}" for g in range(gates)]
        else:
            lines.append(f"const float {name} = {fmt.format(*(v for _, v in args))};")
            narrow[n.out] = name
    if not any(_plain(n.op) in SPLITS for n in graph):
        return "no gate split of a projection"
    results = []
    for o in problem.graph_outputs:
        found = operand(o) if o else "an output that is not a value"
        if isinstance(found, str) or found[0] != "n":
            return f"the output {o} is not one (batch, hidden) value of the chain"
        results.append(found[1])
    per16 = 4 if dtype == "float32" else 8
    if any(p.k % per16 for p in projs):
        return f"needs input widths that are multiples of {per16} (16-byte loads)"
    reads = [f"const float x{i}_v = to_float(x{i}[o]);" for i in range(len(rows_in))]
    body = lines[:len(sets) * gates] + reads + lines[len(sets) * gates:]
    return CellMatch(projs, sets, gates, hidden, batch, dtype, tuple(rows_in), "\n".join(body), tuple(results))


@family(235)
class GatedCell(GraphFamily):
    """A block: BM batch rows x BN hidden units in every gate, WM x WN warps, BK-wide k tiles through a
    STAGES-deep cp.async pipeline; KS groups of warps and CL blocks of a cluster (Hopper) split the k
    tiles."""

    anchors = frozenset(SPLITS)

    def __init__(self) -> None:
        super().__init__("gated_cell", {"BM": (16, 32, 64, 128), "BN": (8, 16, 32), "BK": (32, 64, 128),
                                        "WM": (1, 2, 4), "WN": (1, 2), "KS": (1, 2, 4), "STAGES": (2, 3, 4, 5, 6),
                                        "CL": (1, 2, 4)})

    DEFAULTS = {"CL": 1}  # configs stored before the cluster split

    def match(self, problem: Problem) -> CellMatch | str:
        return match_gated_cell(problem)

    @staticmethod
    def smem_bytes(c: dict[str, Any], m: CellMatch) -> int:
        """The pipeline's stages, or the sums handed over at the end (between k-step groups, or every
        set of a block for the cluster's first block) if more."""
        pipeline = c["STAGES"] * (c["BM"] + m.gates * c["BN"]) * (c["BK"] + 8) * (4 if m.dtype == "float32" else 2)
        handover = (c["KS"] - 1) * c["BM"] * c["BN"] * m.gates * 4
        cluster = len(m.sets) * c["BM"] * c["BN"] * m.gates * 4 if c.get("CL", 1) > 1 else 0
        return max(pipeline, handover, cluster)

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        step = 8 if m.dtype == "float32" else 16  # the mma's k
        if c["BM"] % (16 * c["WM"]) or c["BN"] % (8 * c["WN"]) or c["BK"] % (step * c["KS"]):
            return False
        if c["WM"] * c["WN"] * c["KS"] > 16:  # 512 threads a block at most
            return False
        if c.get("CL", 1) > sum(-(-p.k // c["BK"]) for p in m.projections):  # a block with no k tile
            return False
        accumulators = len(m.sets) * m.gates * (c["BM"] // c["WM"] // 16) * (c["BN"] // c["WN"] // 8) * 4
        return accumulators <= 128 and self.smem_bytes(c, m) <= SMEM_LIMIT

    # Deep pipelines first: a block's share of the weights is a few hundred KB streamed once, so the
    # bytes in flight per SM bound the speed (the fp32 ones do not fit and drop out). One block a tile
    # of units left an H200 with about one block an SM on a 1024-unit LSTM (21% occupancy, 893 GB/s):
    # clusters of 4 or 2 blocks splitting the k tiles come first.
    PRESETS: tuple[dict[str, Any], ...] = (
        dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=2, STAGES=4, CL=4),
        dict(BM=64, BN=8, BK=128, WM=4, WN=1, KS=4, STAGES=6, CL=1),
        dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=1, STAGES=4, CL=4),
        dict(BM=64, BN=8, BK=128, WM=4, WN=1, KS=4, STAGES=3, CL=2),
        dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=2, STAGES=6, CL=1),
        dict(BM=64, BN=8, BK=128, WM=4, WN=1, KS=4, STAGES=3, CL=1),
        dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=2, STAGES=4, CL=1),
        dict(BM=64, BN=16, BK=128, WM=4, WN=2, KS=2, STAGES=3, CL=1),
        dict(BM=32, BN=8, BK=128, WM=2, WN=1, KS=4, STAGES=4, CL=1),
        dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=1, STAGES=4, CL=1),
        dict(BM=32, BN=16, BK=64, WM=2, WN=2, KS=1, STAGES=4, CL=1),
        dict(BM=16, BN=8, BK=64, WM=1, WN=1, KS=4, STAGES=4, CL=1),
        dict(BM=128, BN=16, BK=32, WM=4, WN=2, KS=1, STAGES=3, CL=1),
    )

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """The presets that fill the GPU with blocks first (the weights are read once per batch tile)."""
        m = self.matched(problem)
        valid = [c for c in self.PRESETS if self.valid(c, problem)]
        if m.dtype == "float32":
            # The fp32 cells (three TF32 products, bound by arithmetic more than by the weights' stream)
            # ran 1.03-1.08x eager with the cluster presets first against 1.13-1.23x without: last.
            valid = [c for c in valid if c["CL"] == 1] + [c for c in valid if c["CL"] > 1]
        full = [c for c in valid if fills_gpu(c["CL"] * tiles(m.batch, m.hidden, c["BM"], c["BN"]))]
        return full + [c for c in valid if c not in full]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        half = m.dtype != "float32"
        return {"HALF": half, "ELEM": HALF_ELEMENTS.get(m.dtype), "DTYPE": m.dtype, "GATES": m.gates,
                "HIDDEN": m.hidden, "SETS": m.sets, "PROJECTIONS": m.projections, "ROWS_IN": m.rows_in,
                "EPILOGUE": m.body, "RESULTS": m.results}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        args = [r for p in m.projections for r in (p.a, p.w, *((p.bias,) if p.bias else ()))]
        args += [*m.rows_in, *(f"out{i}" for i in range(len(m.results))), "M"]
        return LaunchSpec(entry=self.name, grid=f"(cdiv({m.hidden}, {c['BN']}), cdiv(M, {c['BM']}), {c['CL']})",
                          block=f"({c['WM'] * c['WN'] * c['KS'] * 32},)", shared_mem=str(self.smem_bytes(c, m)),
                          args=tuple(args), outputs=tuple((f"({m.batch}, {m.hidden})", m.dtype) for _ in m.results),
                          bindings=(("M", f"{m.projections[0].a}.shape[0]"),))
