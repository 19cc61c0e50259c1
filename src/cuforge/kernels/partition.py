"""Any traced graph as a row of parts: each run of ops one family covers becomes that family's kernel,
and the ops between them stay PyTorch's, written out from the trace (KernelBench's mixed rule: PyTorch
may compute beside the candidate's own kernels). A problem no one kernel, head-and-tail pair or
pipeline covers still gets a correct candidate, faster where its kernels are.

Parts are found left to right: at each op, the longest run (at most MAX_RUN ops) that one family's
kernel covers and whose only value read later is one tensor; where none starts, the op joins the
PyTorch part before it. A value crossing a part boundary is fed to the next part that reads it: a
kernel's one output, or any value a PyTorch part made."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import Any

from cuforge.kernels.base import PY_CONFIG_TAG, Family
from cuforge.op_graph import OpNode, is_ref, renamed_node
from cuforge.problems.problem import Problem, TensorSpec
from cuforge.sandbox.protocol.candidate import TorchGraph, wrap_stages

MAX_VARIANTS = 6  # seeds beyond the first: one kernel's second seed each

# Ops whose result is not floating point: a kernel part never reads one (the trace keeps no dtypes).
NOT_FLOAT = frozenset({"argmax", "argmax_lastdim", "argmin", "eq", "ne", "gt", "lt", "ge", "le", "logical_and",
                       "logical_or", "logical_not", "logical_xor", "isnan", "isinf", "isfinite", "arange", "nonzero",
                       "bitwise_and", "bitwise_or", "bitwise_not", "empty", "scalar_tensor", "full", "zeros", "ones",
                       "randint", "bucketize", "searchsorted", "_to_copy", "to", "type_as", "lift_fresh_copy"})
# Ops that make a tensor from nothing but sizes and values: torch's default dtype unless a keyword asks
# another (full of an integer or a bool value makes that value's type).
FACTORIES = frozenset({"scalar_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "empty_strided"})
# Ops of several results, each a piece of their input: every result has the input's dtype.
PIECES = frozenset({"unbind", "split", "chunk", "split_with_sizes", "unsafe_split", "unsafe_chunk", "tensor_split"})
# What a cast (traced as _to_copy) to each floating dtype makes.
FLOAT_CASTS = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}
MAX_RUN = 16  # the longest run of ops asked of the families (a fused chain is rarely longer)
# A kernel part's knob that hands it back to PyTorch: a GEMM or a convolution alone is what cuBLAS and
# cuDNN are tuned for, and a partition's gain is often the fusion around them, not the product itself.
TORCH_KNOB = "TORCH"
LIBRARY_OPS = ("gemm", "linear", "conv", "gemv")  # family name prefixes: what a vendor library runs
LIBRARY_ATEN = frozenset({"convolution", "mm", "bmm", "addmm", "baddbmm"})  # the traced ops they anchor on
MAX_NODES = 4000  # a longer graph (a recurrent model traced step by step) is not cut: its search would not end


@dataclass(frozen=True)
class Part:
    """Graph nodes [start, end): one family's kernel over its own problem, or PyTorch (family None)."""

    start: int
    end: int
    family: Family | None
    problem: Problem | None
    reads: tuple[str, ...]  # values it reads from outside itself (forward inputs, earlier parts' values), in order
    makes: tuple[str, ...]  # its values that later parts or the forward's outputs read
    nodes: tuple[OpNode, ...] = ()  # its ops, as PyTorch runs them


def base_ref(ref: str) -> str:
    """The value a ref names: 't4.T' is t4 transposed, 't3.1' is t3's second result (its own value)."""
    return ref[:-2] if ref.endswith(".T") else ref


def refs_of(node: OpNode) -> list[str]:
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, tuple):
            for v in x:
                walk(v)
        elif is_ref(x):
            out.append(base_ref(x))

    walk(node.args)
    walk(tuple(v for _, v in node.kwargs))
    return out


def _maker(ref: str) -> str:
    """The node result a value belongs to ('t3.1' -> 't3')."""
    return ref.split(".")[0]


def external_reads(nodes: tuple[OpNode, ...]) -> list[str]:
    """Values the nodes read that none of them made, in first-read order (parameters excluded: every
    stage sees the model's parameters)."""
    made = {n.out for n in nodes}
    out: list[str] = []
    for n in nodes:
        for r in refs_of(n):
            if _maker(r) not in made and not r.startswith("param") and r not in out:
                out.append(r)
    return out


def last_reads(problem: Problem) -> dict[str, int]:
    """For each value, the index of the last node reading it (len(graph) for what the forward returns)."""
    out: dict[str, int] = {}
    for j, n in enumerate(problem.graph):
        for r in refs_of(n):
            out[r] = j
    for o in problem.graph_outputs:
        if o is not None:
            out[base_ref(o)] = len(problem.graph)
    return out


def value_dtypes(problem: Problem) -> dict[str, str]:
    """The floating dtype of each value the forward makes, as far as the trace tells it (it records shapes,
    not dtypes), by PyTorch's rules: a dtype keyword's (a cast, a factory, a sum to fp32); a factory
    without one makes torch's default fp32; else the promotion of the op's floating operands, where
    tensors of one or more dims outrank 0-dim ones (a half tensor times an fp32 scalar tensor stays
    half), one dtype stays, and fp32 beside a half or fp16 beside bf16 makes fp32. Boolean and integer
    values (masks, indices, NOT_FLOAT's results) are no operands of that promotion. A value whose
    operands' dtypes are not all known is left out: nothing guesses it."""
    leaves = {f"{prefix}{i}": spec for prefix, specs in (("in", problem.inputs), ("param", problem.params))
              for i, spec in enumerate(specs)}
    # Every leaf keeps its own dtype in the result; only floating ones take part in a promotion.
    known = {ref: spec.dtype for ref, spec in leaves.items()}
    other = {ref for ref, spec in leaves.items() if spec.dtype not in FLOAT_CASTS.values()}  # not floating point
    shapes = {ref: tuple(spec.shape) for ref, spec in leaves.items()}
    makers: dict[str, str] = {}
    for n in problem.graph:
        shapes[n.out] = tuple(n.shape)
        makers[n.out] = n.op
        asked = n.kwarg("dtype")
        if asked is not None and (n.op not in NOT_FLOAT or n.op in FACTORIES or n.op in ("_to_copy", "to")):
            if asked in FLOAT_CASTS:
                known[n.out] = FLOAT_CASTS[asked]
            else:
                other.add(n.out)
            continue
        if n.op in FACTORIES and not (n.op == "full" and not isinstance(n.args[1] if len(n.args) > 1 else None, float)):
            known[n.out] = "float32"  # torch's default dtype
            continue
        if n.op in NOT_FLOAT:
            other.add(n.out)
            continue
        refs = [r for r in refs_of(n) if r not in other]
        if not refs:
            if refs_of(n):  # only masks or indices in (tril of a bool mask, a sum of one): not floating point
                other.add(n.out)
            continue
        ranked = [r for r in refs if shapes.get(r, (1,)) != ()] or refs
        # An op's further results (t5.1) are its own dtype where every result is a piece of one tensor.
        operands = {known.get(r, known.get(r.partition(".")[0]) if makers.get(r.partition(".")[0]) in PIECES else None)
                    for r in ranked}
        if None in operands:
            continue
        known[n.out] = operands.pop() if len(operands) == 1 else "float32"
    return known


Facts = tuple[dict[str, str], dict[str, tuple[int, ...]], dict[str, str]]
_LAST_FACTS: list[tuple[tuple[OpNode, ...], Facts]] = []


def _facts(problem: Problem) -> Facts:
    """Each value's maker, shape and dtype, made once per graph: a partition asks for them for every
    run it tries (a graph of a thousand ops asks thousands of times)."""
    last = _LAST_FACTS[0] if _LAST_FACTS else None
    if last is not None and last[0] is problem.graph:
        return last[1]
    facts = ({n.out: n.op for n in problem.graph}, {n.out: n.shape for n in problem.graph}, value_dtypes(problem))
    _LAST_FACTS[:] = [(problem.graph, facts)]
    return facts


def kernel_problem(problem: Problem, start: int, end: int, reads: list[str], made: str) -> Problem | str:
    """Nodes [start, end) as a problem of their own: the values they read as inputs in0, in1, ... (the
    parameters stay the model's), `made` its one output; or why they cannot be one."""
    if not reads:
        return "reads no tensor of the forward (parameters only)"  # a kernel's outputs take its first input's device
    if any("." in r for r in reads):
        return "reads a second result of an op"
    makers, shapes, dtypes = _facts(problem)
    odd = next((r for r in reads if makers.get(r) in NOT_FLOAT and r not in dtypes), None)
    if odd is not None:  # the trace keeps shapes, not dtypes: a kernel would take the values for floats
        return f"reads {odd}, made by {makers[odd]} (not floating point)"
    alias = {r: f"in{i}" for i, r in enumerate(reads)}
    specs = []
    for r in reads:
        if r.startswith("in"):
            specs.append(problem.inputs[int(r[2:])])
        elif r not in shapes:
            return f"reads {r}, a tensor made outside the forward"
        elif r not in dtypes:  # a guess would hand the kernel bytes of another type
            return f"reads {r} ({makers[r]}), whose dtype the trace does not tell"
        else:
            specs.append(TensorSpec(tuple(shapes[r]), dtypes[r]))
    if made not in dtypes:
        return f"makes {made} ({makers[made]}), whose dtype the trace does not tell"

    nodes = tuple(renamed_node(n, alias, _out_of_place(n)) for n in problem.graph[start:end])
    out_shape = shapes[made]
    return replace(problem, id=f"{problem.id}#{start}-{end}", inputs=tuple(specs), graph=nodes, graph_outputs=(made,),
                   outputs=(TensorSpec(tuple(out_shape), dtypes[made]),),
                   ops=tuple(n.op for n in nodes))


def _out_of_place(node: OpNode) -> str:
    """An in-place elementwise op (relu_, hardtanh_, add_) as the families know it, out of place, where
    what it overwrites is a value the forward made: the trace names its result anew, so no later op
    reads the old values, and a kernel writing a fresh tensor computes the same. One overwriting a
    forward input or a parameter (a batch norm's counter) is left as it is, and no family takes it."""
    from cuforge.kernels.chains import ELEMENTWISE

    op = node.op
    target = node.args[0] if node.args else None
    if op.endswith("_") and op[:-1] in ELEMENTWISE and isinstance(target, str) and target.startswith(("t", "c")):
        return op[:-1]
    return op


# What a partition asks of each run of ops: the preferred family whose kernel alone covers it, or None
# (kernels/families.py supplies it: the registry is not imported here).
Cover = Callable[[Problem], "Family | None"]


# Runs one op longer than the longest covered so far are tried until this many in a row are not
# covered: a fused chain grows op by op (a convolution, + bias, + ReLU), and asking the families about
# every run up to MAX_RUN at every op would take minutes on a network of a thousand ops. A run ending in
# a view or a mask's negation is not counted: no kernel ends there, but one may go on past it (the
# scores GEMM, its [B, H, S, S] view, scale, ~mask, masked_fill, softmax and the view back are one).
GIVE_UP_AFTER = 4
PASSING = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "bitwise_not", "logical_not"})


def kernel_run(problem: Problem, start: int, last: dict[str, int], cover: Cover) -> Part | None:
    """The longest run of ops from `start` that one family's kernel covers, with one value read after it."""
    graph = problem.graph
    best, misses = None, 0
    # A cast opens what a kernel computes in another precision (LLaMA's `x.float()`, then its whole
    # norm): no shorter run from it is a kernel, so every length is tried.
    cast = graph[start].op == "_to_copy"
    for end in range(start + 1, min(len(graph), start + MAX_RUN) + 1):
        run = _run(problem, start, end, last, cover)
        if run is None:
            misses += graph[end - 1].op not in PASSING
            # An op no kernel takes alone ends the search from it.
            if not cast and (misses >= GIVE_UP_AFTER or end == start + 1):
                break
            continue
        best, misses = run, 0
    return best


def _values_of(last: dict[str, int]) -> dict[str, list[str]]:
    """Each node result's values that something reads ('t3' -> ['t3', 't3.1']), made once per `last`:
    scanning every value for each run tried made a partition quadratic in the graph's length."""
    key = id(last)
    if _VALUES_OF[:1] and _VALUES_OF[0][0] == key and _VALUES_OF[0][1] is last:
        return _VALUES_OF[0][2]
    out: dict[str, list[str]] = {}
    for r in last:
        out.setdefault(_maker(r), []).append(r)
    _VALUES_OF[:] = [(key, last, out)]
    return out


_VALUES_OF: list[tuple[int, dict[str, int], dict[str, list[str]]]] = []


def _made_and_read_after(nodes: tuple[OpNode, ...], end: int, last: dict[str, int]) -> list[str]:
    """The values `nodes` make that an op at or after `end`, or the forward's result, reads."""
    values = _values_of(last)
    return [r for n in nodes for r in values.get(n.out, ()) if last[r] >= end]


def _run(problem: Problem, start: int, end: int, last: dict[str, int], cover: Cover) -> Part | None:
    nodes = problem.graph[start:end]
    makes = _made_and_read_after(nodes, end, last)
    if len(makes) != 1 or makes[0] != nodes[-1].out:
        return None
    reads = external_reads(nodes)
    sub = kernel_problem(problem, start, end, reads, makes[0])
    if isinstance(sub, str):
        return None
    family = cover(sub)
    return None if family is None else Part(start, end, family, sub, tuple(reads), tuple(makes), nodes)


def side_effects_first(problem: Problem) -> Problem:
    """The graph with the ops that read no value of the forward and make none it reads (a batch norm's
    counter update, add_ on a buffer; an empty placeholder) moved to its start, in their order: they
    sat between a convolution and its batch norm, where each would cost a PyTorch part of its own.
    Nothing reads what they make, and no op before them reads a parameter they touch, so running them
    first computes the same."""
    last = last_reads(problem)
    loose, seen = [], set()  # seen: parameters read so far (one an op overwrites must not be read before it)
    for n in problem.graph:
        mine = refs_of(n)
        if all(r.startswith("param") for r in mine) and not seen & set(mine) and not any(_maker(r) == n.out for r in last):
            loose.append(n)
        seen.update(mine)
    if not loose:
        return problem
    ids = {id(n) for n in loose}
    return replace(problem, graph=tuple(loose) + tuple(n for n in problem.graph if id(n) not in ids))


def conv_bias_apart(problem: Problem) -> Problem:
    """The graph with each convolution that adds a bias as the convolution without it, then the bias
    (viewed [C, 1, ...]) added by an op of its own, under the convolution's name. PyTorch adds a
    convolution's bias in a pass of its own over the output after cuDNN's kernel (a third of eager's
    time on a transposed 3-D convolution with a pointwise tail); apart, the add joins the kernel after
    it, as torch.compile fuses it. A value the forward made before is renamed nothing: later ops read
    the add's result under the old name."""
    convs = [n for n in problem.graph if n.op == "convolution" and len(n.args) > 2 and is_ref(n.args[2]) and len(n.shape) > 2]
    if not convs:
        return problem
    numbers = [int(n.out[1:]) for n in problem.graph if n.out[:1] == "t" and n.out[1:].isdigit()]
    fresh = iter(f"t{k}" for k in range(max(numbers, default=0) + 1, 10**9))
    graph: list[OpNode] = []
    for n in problem.graph:
        if not any(n is c for c in convs):
            graph.append(n)
            continue
        view, conv = next(fresh), next(fresh)
        shape = (n.shape[1],) + (1,) * (len(n.shape) - 2)
        graph += [OpNode("view", (n.args[2], shape), (), view, shape),
                  OpNode(n.op, (n.args[0], n.args[1], None) + tuple(n.args[3:]), n.kwargs, conv, n.shape),
                  OpNode("add", (conv, view), (), n.out, n.shape)]
    return replace(problem, graph=tuple(graph), ops=tuple(n.op for n in graph))


def partition(problem: Problem, cover: Cover) -> list[Part] | str:
    """The graph as parts, left to right (see the module's docstring), `cover` naming the family of each
    run of ops; or why it is not cut."""
    graph = problem.graph
    if not graph:
        return "no traced graph"
    if len(graph) > MAX_NODES:
        return f"{len(graph)} traced ops (a recurrent model traced step by step?): more than the {MAX_NODES} a partition is searched over"
    opaque = sorted({r for n in graph for r in refs_of(n) if r.startswith("c") and r.endswith("x")})
    if opaque:
        return f"reads {opaque[0]}, a tensor made outside the forward (a captured global), which PyTorch's part cannot name"
    if any(o is None or base_ref(o).startswith("param") for o in problem.graph_outputs) or not problem.graph_outputs:
        return "the forward returns something other than tensors it computed"
    problem = side_effects_first(problem)
    last = last_reads(problem)
    parts: list[Part] = []
    torch_start, i = None, 0
    while i < len(graph):
        run = kernel_run(problem, i, last, cover)
        if run is None:
            torch_start = i if torch_start is None else torch_start
            i += 1
            continue
        if torch_start is not None:
            parts.append(_torch_part(problem, torch_start, i, last))
            torch_start = None
        parts.append(run)
        i = run.end
    if torch_start is not None:
        parts.append(_torch_part(problem, torch_start, len(graph), last))
    if not any(p.family is not None for p in parts):
        return "no run of its ops is one family's kernel"
    return parts


def summary(problem: Problem, parts: list[Part]) -> str:
    """Which families' kernels run which share of the ops, and which ops stay PyTorch's, in one line."""
    from collections import Counter

    kernels = [p for p in parts if p.family is not None]
    by_family = Counter(p.family.name for p in kernels if p.family is not None)
    left = Counter(n.op for p in parts if p.family is None for n in p.nodes)
    covered = sum(p.end - p.start for p in kernels)
    fams = ", ".join(f"{name} x{k}" if k > 1 else name for name, k in by_family.most_common())
    torch_ops = ", ".join(op for op, _ in left.most_common(8)) + (", ..." if len(left) > 8 else "")
    return (f"{len(kernels)} kernels over {covered} of {len(problem.graph)} ops ({fams})"
            + (f"; PyTorch runs {torch_ops}" if left else ""))


def _torch_part(problem: Problem, start: int, end: int, last: dict[str, int]) -> Part:
    nodes = problem.graph[start:end]
    makes = sorted(_made_and_read_after(nodes, end, last), key=lambda r: (int(_maker(r)[1:]), r))
    return Part(start, end, None, None, tuple(external_reads(nodes)), tuple(makes), nodes)


# ------------------------------------------------------------------------------------ PyTorch's part

_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "strided")


def _name(ref: str) -> str:
    """A Python name for a value: t3.1 -> t3_1."""
    return ref.replace(".", "_")


def _expr(x: Any) -> str:
    if isinstance(x, tuple):
        return "[" + ", ".join(_expr(v) for v in x) + "]"
    if is_ref(x):
        if x.endswith(".T"):
            return f"{_name(x[:-2])}.transpose(-1, -2)"
        return _name(x)
    if isinstance(x, str):
        if x.startswith("torch.") and x[6:] in _DTYPES:
            return x
        if x.startswith("device("):
            return "_device"  # traced on the meta device: the inputs' device now
        return repr(x)
    if isinstance(x, float) and x != x:
        return "float('nan')"
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return f"float('{x}')"
    return repr(x)


def _call(node: OpNode) -> str:
    op = node.op.removesuffix("_lastdim")
    args = ", ".join([_expr(a) for a in node.args] + [f"{k}={_expr(v)}" for k, v in node.kwargs])
    if op == "dropout":
        return f"torch.dropout({args})"
    if op == "gelu_tanh":
        op = "gelu"
    if op in ("view", "_unsafe_view"):  # the trace passes copies through: the source may not be contiguous
        op = "reshape"
    return f"aten.{op}({args})"


def torch_part_code(problem: Problem, part: Part) -> str:
    """part(inputs, params): the part's nodes as PyTorch calls, returning the values it makes."""
    nodes = part.nodes
    used_params = sorted({int(r[5:]) for n in nodes for r in refs_of(n) if r.startswith("param")})
    lines = ["def part(inputs, params):"]
    if part.reads:
        lines.append(f"    {', '.join(_name(r) for r in part.reads)}, = inputs")
    lines += [f"    param{i} = params[{i}]" for i in used_params]
    first = next((_name(r) for r in part.reads), f"param{used_params[0]}" if used_params else None)
    lines.append(f"    _device = {first}.device" if first else "    _device = torch.device('cuda')")
    seconds = {r for r in set(part.makes) | {r for n in nodes for r in refs_of(n)} if "." in r}
    read = {base_ref(r) for n in problem.graph for r in refs_of(n)} | {base_ref(o) for o in problem.graph_outputs if o}
    for n in nodes:
        if n.op in FACTORIES and n.out not in read:  # a buffer no op reads (cuDNN batch norm's reserve): not made
            continue
        lines.append(f"    {_name(n.out)} = {_call(n)}")
        results = sorted(int(r.split(".")[1]) for r in seconds if _maker(r) == n.out)
        if results:  # an op of several results: the first is its own name, the others name.i
            lines.append(f"    {_name(n.out)}_all = {_name(n.out)}")
            lines.append(f"    {_name(n.out)} = {_name(n.out)}_all[0]")
            lines += [f"    {_name(n.out)}_{k} = {_name(n.out)}_all[{k}]" for k in results]
        else:  # an aten op of several results (nll_loss_forward's loss and total weight): the first is the value
            lines.append(f"    {_name(n.out)} = {_name(n.out)}[0] if isinstance({_name(n.out)}, (tuple, list)) else {_name(n.out)}")
    # Kernels read their inputs row-major: a view made here (a permute) goes on as a contiguous copy.
    # They load up to 16 bytes at once, so a contiguous view starting mid-vector (a chunk) is copied too.
    lines.append(f"    made = ({''.join(_name(r) + '.contiguous(), ' for r in part.makes)})")
    lines.append("    return tuple(t if t.data_ptr() % 16 == 0 else t.clone() for t in made)")
    return "\n".join(lines) + "\n"


def as_pytorch(parts: list[Part]) -> list[Part]:
    """The same parts with every kernel part run by PyTorch too: what a CPU checks the cuts and feeds by."""
    return [replace(p, family=None, problem=None) for p in parts]


def parts_module(problem: Problem, parts: list[Part], kernels: list[Any], tag: dict[str, Any], replay: bool = False) -> str:
    """The candidate module: kernels[i], a rendered stage, runs kernel part i; PyTorch runs the others."""
    stages: list[Any] = []
    feeds: list[list[tuple[Any, ...]]] = []
    where: dict[str, tuple[Any, ...]] = {f"in{i}": ("in", i) for i in range(len(problem.inputs))}
    for i, (p, kernel) in enumerate(zip(parts, kernels)):
        if p.family is None:
            ops = sorted({n.op for n in p.nodes})
            stages.append(TorchGraph(torch_part_code(problem, p),
                                     f"{p.end - p.start} ops: {', '.join(ops[:6])}" + (", ..." if len(ops) > 6 else "")))
        else:
            stages.append(kernel)
        feeds.append([where[r] for r in p.reads])
        for k, r in enumerate(p.makes):
            where[r] = ("stage", i, k) if p.family is None else ("stage", i)
    # The forward's result: the last kernel's output as it is, else a PyTorch part that returns it.
    final = base_ref(problem.graph_outputs[0]) if problem.graph_outputs[0] else None
    if len(problem.graph_outputs) != 1 or problem.graph_outputs[0].endswith(".T") or where.get(final or "") != ("stage", len(parts) - 1):
        stages.append(TorchGraph(_return_code(problem), "the forward's result"))
        feeds.append([where[base_ref(o)] for o in problem.graph_outputs if o is not None])
    names = "+".join("torch" if p.family is None else p.family.name for p in parts)
    header = PY_CONFIG_TAG + json.dumps({**tag, "parts": names}, sort_keys=True) + "\n"
    return wrap_stages(stages, feeds, header, replay=replay)


def _return_code(problem: Problem) -> str:
    outs = [o for o in problem.graph_outputs if o is not None]
    body = ", ".join(f"x{i}.transpose(-1, -2)" if o.endswith(".T") else f"x{i}" for i, o in enumerate(outs))
    single = len(problem.graph_outputs) == 1
    return (f"def part(inputs, params):\n    {''.join(f'x{i}, ' for i in range(len(outs)))}= inputs\n"
            f"    return {body if single else '(' + body + ',)'}\n")
