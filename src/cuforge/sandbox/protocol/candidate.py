"""Candidates: format A (a Python module defining ModelNew) and format B (raw kernel + launch spec).

Format B is what template proposers emit; it is wrapped into a format-A module that compiles the
kernel with cuforge's fast runtime and launches it from ModelNew.forward.
"""

from __future__ import annotations

import ast
import contextvars
import hashlib
import io
import re
import tokenize
from dataclasses import asdict, dataclass, field
from typing import Any

FORMATS = ("module", "kernel")


@dataclass(frozen=True)
class LaunchSpec:
    """How to call a raw kernel. Every field is a Python expression evaluated per forward over:
    in0, in1, ... (inputs), p_<name> (the reference model's parameters and buffers, dots as '_';
    also param0, param1, ... in the order of Problem.params),
    the names in `bindings` (evaluated in order), cdiv, min, max, and tma_2d / tma_nd (TMA descriptors).
    `scratch` buffers (shape expression, dtype, "zeros" or "empty") are allocated per forward, inside
    the timed call, and named scratch0, ...: a kernel's workspace (split-K partial sums, tile counters).
    An output is (shape, dtype), allocated uninitialized, or (shape, dtype, "zeros") for kernels that
    accumulate into it (a row sum by atomics); zeroing is part of the timed call either way.
    `pre` kernels (entry, grid, block, args: a tuple expression) of the same source run first, in
    order, on the same stream and inside the timed call: a pass that lays out an operand for the main
    kernel in a scratch buffer. `cooperative`: the main kernel's blocks wait on each other, so it is
    launched cooperatively (all resident at once, or the launch fails)."""

    entry: str
    grid: str
    block: str
    args: tuple[str, ...]
    outputs: tuple[tuple[str, ...], ...]  # (shape expression, dtype name[, "zeros"])
    bindings: tuple[tuple[str, str], ...] = ()
    shared_mem: str = "0"
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    scratch: tuple[tuple[str, str, str], ...] = ()
    pre: tuple[tuple[str, str, str, str], ...] = ()
    cooperative: bool = False

    def __post_init__(self) -> None:
        for out in self.outputs:
            if len(out) not in (2, 3) or (len(out) == 3 and out[2] != "zeros"):
                raise ValueError(f"an output is (shape, dtype) or (shape, dtype, 'zeros'), not {out!r}")
        for entry in self.scratch:
            if len(entry) != 3 or entry[2] not in ("zeros", "empty"):
                raise ValueError(f"a scratch buffer is (shape, dtype, 'zeros' or 'empty'), not {entry!r}")
        for launch in self.pre:
            if len(launch) != 4 or not all(isinstance(x, str) for x in launch):
                raise ValueError(f"a pre kernel is (entry, grid, block, args), four expressions, not {launch!r}")
        if _CHECK_CALLS.get():
            for expr in self.expressions():
                _calls_only_namespace_functions(expr)

    def expressions(self) -> tuple[str, ...]:
        """Every Python expression the forward evaluates."""
        return (self.grid, self.block, self.shared_mem, *self.args, *(e for _, e in self.bindings),
                *(o[0] for o in self.outputs), *(s[0] for s in self.scratch), *(x for p in self.pre for x in p[1:]))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LaunchSpec:
        """A spec as sent or stored. Its calls are not checked again: one stored before a check existed
        (in a run being resumed) runs and fails as it did then, a verdict, rather than stopping the resume."""
        token = _CHECK_CALLS.set(False)
        try:
            return LaunchSpec(
                entry=d["entry"], grid=d["grid"], block=d["block"], args=tuple(d["args"]),
                outputs=tuple(tuple(o) for o in d["outputs"]), bindings=tuple((a, b) for a, b in d.get("bindings", ())),
                shared_mem=str(d.get("shared_mem", "0")), options=tuple(d.get("options", ())),
                name_expressions=tuple(d.get("name_expressions", ())),
                scratch=tuple((s[0], s[1], s[2] if len(s) > 2 else "zeros") for s in d.get("scratch", ())),
                pre=tuple(tuple(p) for p in d.get("pre", ())),  # type: ignore[misc]
                cooperative=bool(d.get("cooperative", False)),
            )
        finally:
            _CHECK_CALLS.reset(token)


# What a launch expression may call. The expressions run without builtins, so a call into torch from
# them (a tensor's view, say) can fail where torch imports lazily: "KeyError: '__import__'" on a GPU
# only. Such work belongs in a namespace function, whose own module has builtins.
_NAMESPACE_FUNCTIONS = frozenset({"cdiv", "min", "max", "tma_2d", "tma_nd"})
_CHECK_CALLS: contextvars.ContextVar[bool] = contextvars.ContextVar("check_launch_calls", default=True)
_TENSOR_SIZES = frozenset({"numel", "size", "stride", "dim", "element_size"})  # numbers read off a tensor


def _calls_only_namespace_functions(expr: str) -> None:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"launch expression {expr!r} is not Python: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        while isinstance(f, ast.Attribute):
            f = f.value
        if isinstance(node.func, ast.Name) and node.func.id in _NAMESPACE_FUNCTIONS:
            continue
        if isinstance(node.func, ast.Attribute) and isinstance(f, ast.Name) and f.id == "torch":
            continue  # torch's own functions (device properties): module-level, found by attribute
        if isinstance(node.func, ast.Attribute) and node.func.attr in _TENSOR_SIZES:
            continue
        raise ValueError(f"launch expression {expr!r} calls {ast.unparse(node.func)}: launch expressions call only "
                         f"{', '.join(sorted(_NAMESPACE_FUNCTIONS))}, torch's functions and a tensor's "
                         f"{', '.join(sorted(_TENSOR_SIZES))}")


def normalize_source(source: str) -> str:
    """Whitespace and comments removed: two sources equal here are the same candidate. A Python module
    is read by its tokens, so that a CUDA source inside one of its strings keeps every character: a
    kernel embedded as a one-line repr would otherwise lose all after its first // comment, and
    different kernels would look like one."""
    try:
        ast.parse(source)
        return _normalize_python(source)
    except (SyntaxError, ValueError, tokenize.TokenError):
        return _normalize_c(source)


def _normalize_c(source: str) -> str:
    s = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    s = re.sub(r"(//|#(?!include|define|pragma|if|endif|else|elif|undef))[^\n]*", "", s)
    return re.sub(r"\s+", " ", s).strip()


_C_SOURCE = re.compile(r"__global__|#include|__device__")
_LAYOUT = {tokenize.NEWLINE: "\n", tokenize.INDENT: ">", tokenize.DEDENT: "<"}


def _normalize_python(source: str) -> str:
    """Comments and blank lines dropped; indentation kept as markers (it is the program's structure); a
    string holding C or CUDA source compared by its own normalized text, other strings as written."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
            continue
        if tok.type in _LAYOUT:
            out.append(_LAYOUT[tok.type])
        elif tok.type == tokenize.STRING and _C_SOURCE.search(tok.string):
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                value = None
            out.append(repr(_normalize_c(value)) if isinstance(value, str) else tok.string)
        else:
            out.append(tok.string)
    return " ".join(out)


@dataclass(frozen=True)
class Candidate:
    source: str
    format: str = "module"
    launch: LaunchSpec | None = None
    proposer: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"candidate format must be one of {FORMATS}, not {self.format!r}")
        if self.format == "kernel" and self.launch is None:
            raise ValueError("a format-B (kernel) candidate needs a launch spec")

    @property
    def id(self) -> str:
        h = hashlib.sha256(normalize_source(self.source).encode())
        h.update(self.format.encode())
        if self.launch is not None:
            spec = asdict(self.launch)
            for later in ("scratch", "pre", "cooperative"):  # ids of candidates from before these fields existed stay the same
                if not spec[later]:
                    del spec[later]
            h.update(repr(spec).encode())
        return h.hexdigest()[:16]

    def module_source(self) -> str:
        return self.source if self.format == "module" else wrap_kernel(self.source, self.launch)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "launch": asdict(self.launch) if self.launch else None,
                "proposer": self.proposer, "meta": self.meta}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Candidate:
        launch = LaunchSpec.from_dict(d["launch"]) if d.get("launch") else None
        return Candidate(d["source"], d.get("format", "module"), launch, d.get("proposer", ""), d.get("meta") or {})


def launch_plan(launch: LaunchSpec) -> str:
    """Bindings in order, then output specs, grid, block and shared memory, as one Python block."""
    lines = [f"{name} = {expr}" for name, expr in launch.bindings]
    lines.append("_out_specs = [" + ", ".join(f"({o[0]}, {o[1]!r}, {(o[2] if len(o) > 2 else 'empty')!r})"
                                              for o in launch.outputs) + "]")
    lines.append("_scratch_specs = [" + ", ".join(f"({shape}, {dtype!r}, {init!r})" for shape, dtype, init in launch.scratch) + "]")
    lines += [f"_grid = {launch.grid}", f"_block = {launch.block}", f"_shared = {launch.shared_mem}",
              f"_cooperative = {bool(launch.cooperative)!r}"]
    lines.append("_pre_grids = [" + "".join(f"{grid}, " for _, grid, _, _ in launch.pre) + "]")
    lines.append("_pre_blocks = [" + "".join(f"{block}, " for _, _, block, _ in launch.pre) + "]")
    return "\n".join(lines) + "\n"


def launch_args(launch: LaunchSpec) -> str:
    return "(" + "".join(f"{a}, " for a in launch.args) + ")"


_WRAPPER = '''"""Format-B candidate wrapped by cuforge: {entries} launched from ModelNew.forward, one after another,
each stage's launch spec evaluated over its own inputs (the forward's inputs or an earlier stage's output)."""
import ast
import re
import warnings

import torch
from cuforge.runtime import compile_cuda, compile_many
from cuforge.tma import tma_2d, tma_nd


def cdiv(a, b):
    return (a + b - 1) // b


def _names(code):
    # Every name a launch expression's code reads, its nested code's included.
    out = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out |= _names(const)
    return out


class _Params(list):
    # The model's (name, tensor) pairs, read once a forward: a network of a thousand parameters and
    # buffers runs hundreds of stages, and each stage walking them all cost more than its kernel.
    def __init__(self, pairs):
        super().__init__(pairs)
        self.tensors = [t for _, t in pairs]


def _model_params(model):
    # The pairs named_parameters() and then named_buffers() of model.ref give, in their order, read
    # from each module's own tables every forward (a buffer .cuda() replaced, a parameter assigned
    # anew, is seen); only the module tree is walked once: walking it with named_modules' generators
    # cost about a millisecond a forward on a network.
    tree = model.__dict__.get("_tree")
    if tree is None:
        tree = model.__dict__["_tree"] = [(p + "." if p else "", m) for p, m in model.ref.named_modules()]
    pairs = []
    for table in ("_parameters", "_buffers"):
        seen = set()
        for prefix, module in tree:
            for name, t in module.__dict__[table].items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    pairs.append((prefix + name, t))
    return _Params(pairs)


# What a launch plan may read and still be remembered per input shapes: shapes, strides, dtypes and
# devices of the tensors it names and the device's SM count. A plan that reads anything else (a tensor
# map, a data pointer, a value) runs every call.
_PLAN_PURE = frozenset(("cdiv", "min", "max", "torch", "int", "len", "tuple", "cuda", "get_device_properties",
                        "multi_processor_count", "shape", "stride", "dtype", "device", "size", "dim", "ndim", "numel"))
_TENSOR_NAME = re.compile(r"in[0-9]+|param[0-9]+|p_[A-Za-z0-9_]+")
_NO_BUILTINS = {{"__builtins__": {{}}}}
_PLANS_KEPT = 64  # plans remembered per stage; a model called with ever new shapes starts over past it


def _spec(x):
    # What a pure plan can see of a value: a tensor's layout, a hashable value itself.
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device)
    hash(x)  # an unhashable value (a list) makes the call plan afresh
    return (type(x), x)


def _holds_tensor(v):
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (tuple, list)):
        return any(_holds_tensor(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_tensor(x) for x in v.values())
    return False


class _Plan:
    # One evaluation of a stage's launch plan: the names it binds for the argument expressions, and
    # the grid, block, shared memory and the outputs and scratch to allocate, as the launch needs them.
    __slots__ = ("bound", "outs", "scratch", "grid", "block", "shared", "cooperative", "pre_grids", "pre_blocks")

    def __init__(self, ns, bound):
        self.bound = {{k: ns[k] for k in bound if k in ns}}
        self.outs = [(shape, getattr(torch, dtype), getattr(torch, init)) for shape, dtype, init in ns["_out_specs"]]
        self.scratch = [(shape, getattr(torch, dtype), getattr(torch, init)) for shape, dtype, init in ns["_scratch_specs"]]
        self.grid, self.block, self.shared = ns["_grid"], ns["_block"], int(ns["_shared"])
        self.cooperative, self.pre_grids, self.pre_blocks = ns["_cooperative"], ns["_pre_grids"], ns["_pre_blocks"]


class _Stage:
    # The launch expressions run as two compiled blocks (bindings, output shapes, grid, block and shared
    # memory; then the arguments, once the outputs exist) instead of one eval each; the first block's
    # result is remembered per layout of what it reads where it reads only layouts (_PLAN_PURE): a
    # network runs a hundred stages a forward, and evaluating it every call was about a sixth of a
    # stage's host time in Python (the launch and allocations are the rest). Outputs are allocated here, in a
    # frame with normal builtins: torch may import lazily. The kernel is compiled by load(), once every
    # stage exists, so a module's kernels compile at once (_load).
    def __init__(self, source, options, names, entry, pre, plan, args):
        self.kernel_spec = (source, tuple(options), tuple(names))
        self.entry = entry
        self.pre_spec = [(e, compile(a, "<pre-kernel args>", "eval")) for e, a in pre]
        self.plan = compile(plan, "<launch spec>", "exec")
        self.args = compile(args, "<launch args>", "eval")
        self.wanted = set().union(*(_names(c) for c in [self.plan, self.args] + [a for _, a in self.pre_spec]))
        self.picks = None  # (name in the launch spec, index in params) of the parameters it reads
        bound = {{n.id for n in ast.walk(ast.parse(plan)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}}
        names = _names(self.plan)
        self.bound = bound
        self.plan_reads = sorted(n for n in names if _TENSOR_NAME.fullmatch(n))
        self.plans = {{}} if names - bound <= _PLAN_PURE | set(self.plan_reads) else None

    def load(self):
        source, options, names = self.kernel_spec
        module = compile_cuda(source, options, name_expressions=names)
        self.kernel = module.kernel(self.entry)
        self.pre = [(module.kernel(e), a) for e, a in self.pre_spec]

    def _pick(self, params):
        picks = []
        for i, (name, _) in enumerate(params):
            picks += [(key, i) for key in ("p_" + name.replace(".", "_"), f"param{{i}}") if key in self.wanted]
        return picks

    def _plan(self, ns):
        key = None
        if self.plans is not None:
            try:
                key = tuple(_spec(ns.get(n)) for n in self.plan_reads)
                plan = self.plans.get(key)
            except TypeError:
                key = plan = None
            if plan is not None:
                return plan
        scope = dict(ns)
        exec(self.plan, {{"__builtins__": {{}}}}, scope)
        plan = _Plan(scope, self.bound)
        if key is not None and not any(_holds_tensor(v) for v in plan.bound.values()):  # a bound tensor is this call's
            if len(self.plans) >= _PLANS_KEPT:
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def __call__(self, inputs, params):
        ns = {{"cdiv": cdiv, "min": min, "max": max, "torch": torch, "tma_2d": tma_2d, "tma_nd": tma_nd}}
        for i, x in enumerate(inputs):
            ns[f"in{{i}}"] = x
        if self.picks is None or self.picks[0] != len(params):
            self.picks = (len(params), self._pick(params))
        for key, i in self.picks[1]:
            ns[key] = params[i][1]
        plan = self._plan(ns)
        ns.update(plan.bound)
        device = inputs[0].device
        outs = []
        for i, (shape, dtype, make) in enumerate(plan.outs):
            outs.append(make(shape, dtype=dtype, device=device))
            ns[f"out{{i}}"] = outs[-1]
        for i, (shape, dtype, make) in enumerate(plan.scratch):
            ns[f"scratch{{i}}"] = make(shape, dtype=dtype, device=device)
        for (pre, pre_args), pre_grid, pre_block in zip(self.pre, plan.pre_grids, plan.pre_blocks):
            pre(pre_grid, pre_block, *eval(pre_args, _NO_BUILTINS, ns))
        self.kernel(plan.grid, plan.block, *eval(self.args, _NO_BUILTINS, ns), shared_mem=plan.shared,
                    cooperative=plan.cooperative)
        return outs[0] if len(outs) == 1 else tuple(outs)


class _GraphStage:
    # Ops of the traced graph that no kernel of the candidate covers, run by PyTorch as written out
    # (`part(inputs, params)` returns the values later stages read, in order).
    def __init__(self, code):
        ns = {{"torch": torch, "aten": torch.ops.aten}}
        exec(compile(code, "<pytorch part>", "exec"), ns)
        self.part = ns["part"]

    def __call__(self, inputs, params):
        return self.part(inputs, params.tensors)


class _TorchStage:
    # One PyTorch call as a stage: an op whose result only PyTorch's own kernel reproduces (the random
    # draws of a training-mode dropout).
    def __init__(self, expr):
        self.expr = compile(expr, "<torch stage>", "eval")

    def __call__(self, inputs, params):
        # Normal builtins: torch's Python layers run from this frame and may import.
        return eval(self.expr, {{"torch": torch}}, {{f"in{{i}}": x for i, x in enumerate(inputs)}})


def _load(stages):
    # Every kernel stage's kernel, the distinct ones compiled several at once first.
    kernels = [s for s in stages if isinstance(s, _Stage)]
    compile_many([s.kernel_spec for s in kernels])
    for s in kernels:
        s.load()
    return stages


# Each distinct kernel source once: a network's partition runs hundreds of stages over a few dozen
# kernels, and written out per stage its module was megabytes (stored with every candidate).
_KERNEL_SOURCES = {sources}
_STAGES = _load([{stages}])
# Per stage, where each of its inputs comes from: ("in", i) the forward's input i, ("stage", j) stage j's
# output; None: the forward's inputs as they are.
_FEEDS = {feeds!r}
# The forward replayed from a CUDA graph (_Replay), where the candidate asks for it.
_REPLAY = {replay!r}


def _run(inputs, params):
    results = []
    for stage, feed in zip(_STAGES, _FEEDS):
        # ("in", i): the forward's input i; ("stage", j): stage j's output; ("stage", j, k): the k-th
        # value a PyTorch part j returns
        xs = inputs if feed is None else [inputs[f[1]] if f[0] == "in" else results[f[1]] if len(f) == 2
                                          else results[f[1]][f[2]] for f in feed]
        results.append(stage(xs, params))
    return results[-1]


def _fresh(out):
    # The graph's own output copied, so that no call returns memory the next replay overwrites.
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_fresh(o) for o in out)
    return out


def _clear_capture_mark():
    # A capture that failed part way leaves PyTorch's CUDA generator marked as capturing, and every
    # later random draw then fails; an empty capture that succeeds clears the mark.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the CUDA graph is empty"
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread_local"):
            pass


class _Replay:
    # The forward's stages captured in one CUDA graph and replayed, the inputs copied into the graph's
    # own first: a network's partition issues hundreds of Python launches, whose host time exceeds
    # their kernels' device time at small batches. A call whose inputs' layouts or parameters' storage
    # differ from the graph's runs eagerly once (which also makes what capture needs: cuDNN's plans,
    # the allocator's blocks) and is captured at the next such call, so every call computes its
    # forward exactly once. A forward that cannot be captured (it waits for the device) runs eagerly
    # from then on; one that draws random numbers never replays.
    def __init__(self):
        self.seen = self.key = self.graph = None
        self.off = any(isinstance(s, _TorchStage) for s in _STAGES)

    def __call__(self, inputs, params):
        # Inside a caller's own capture (a judge timing small calls by graph replay) the stages are
        # recorded into that graph as they are: no launch is left to save, and a graph cannot be
        # captured or replayed while its stream captures.
        if (self.off or torch.is_grad_enabled() or not all(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
                or torch.cuda.is_current_stream_capturing()):
            return _run(inputs, params)
        key = (tuple((x.shape, x.stride(), x.dtype, x.device) for x in inputs), tuple(t.data_ptr() for t in params.tensors))
        if key != self.key:
            if key != self.seen:
                self.seen = key
                return _run(inputs, params)
            try:
                self._capture(inputs, params, key)
            except Exception:  # noqa: BLE001 - whatever stops capture, the stages run eagerly
                self.off, self.graph, self.key = True, None, None
                _clear_capture_mark()
                return _run(inputs, params)
        for mine, x in zip(self.inputs, inputs):
            mine.copy_(x)
        self.graph.replay()
        return _fresh(self.out)

    def _capture(self, inputs, params, key):
        self.graph = self.key = None
        mine = [x.clone() for x in inputs]
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of this process (a judge's gate) may use CUDA meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = _run(mine, params)
        self.inputs, self.out, self.graph, self.key = mine, out, graph, key


class ModelNew(torch.nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
        # Owns the parameters; built under the same seed as the reference, so they are equal.
        self.ref = __cuforge_problem__.Model(*init_inputs)
        self.__dict__["_replay"] = _Replay() if _REPLAY else None

    def forward(self, *inputs):
        params = _model_params(self)
        replay = self.__dict__["_replay"]
        return _run(inputs, params) if replay is None else replay(inputs, params)
'''


@dataclass(frozen=True)
class TorchCall:
    """A stage of a staged candidate that is one PyTorch call: `expr`, a Python expression over its
    inputs in0, in1, ... and `torch` (torch.dropout(in0, 0.2, True): random draws only PyTorch's own
    kernel reproduces). Allowed where the problem's policy allows PyTorch ops beside own kernels."""

    expr: str

    def __post_init__(self) -> None:
        compile(self.expr, "<torch stage>", "eval")  # a SyntaxError here, not when the module is imported


@dataclass(frozen=True)
class TorchGraph:
    """A stage of a staged candidate that is PyTorch running a run of traced ops no kernel covers:
    `code` defines part(inputs, params) -> the tuple of values later stages read (parameters in
    Problem.params order)."""

    code: str
    summary: str  # the ops it runs, for the module's docstring

    def __post_init__(self) -> None:
        compile(self.code, "<pytorch part>", "exec")  # a SyntaxError here, not when the module is imported


def _stage_text(stage: tuple[str, LaunchSpec] | TorchCall | TorchGraph, sources: list[str]) -> str:
    """A stage as the module constructs it; a kernel's source as its index in `sources` (added there
    where it is new), the module's _KERNEL_SOURCES."""
    if isinstance(stage, TorchCall):
        return f"_TorchStage({stage.expr!r})"
    if isinstance(stage, TorchGraph):
        return f"_GraphStage({stage.code!r})"
    source, launch = stage
    if source not in sources:
        sources.append(source)
    return (f"_Stage(_KERNEL_SOURCES[{sources.index(source)}], {tuple(launch.options)!r}, {tuple(launch.name_expressions)!r}, {launch.entry!r}, "
            f"{[(entry, args) for entry, _, _, args in launch.pre]!r}, {launch_plan(launch)!r}, {launch_args(launch)!r})")


def wrap_stages(stages: list[tuple[str, LaunchSpec] | TorchCall | TorchGraph],
                feeds: list[list[tuple[str, int]] | list[tuple[Any, ...]] | None], header: str = "",
                replay: bool = False) -> str:
    """A format-A module running format-B kernels (and PyTorch calls, TorchCall) one after another:
    stage i's launch spec sees its inputs, as listed in feeds[i] (None: the forward's inputs), as in0,
    in1, ... and the model's parameters as usual. `replay`: the forward is captured in a CUDA graph
    and replayed on later calls with the same input layouts and parameter storage (_Replay). A
    malformed expression fails when the module is imported, like any candidate's syntax error."""
    if len(stages) != len(feeds) or not stages:
        raise ValueError("a staged candidate needs one feed list per stage, and at least one stage")
    for i, feed in enumerate(feeds):
        for f in feed or ():
            kind, j = f[0], f[1]
            if kind not in ("in", "stage") or (kind == "stage" and not 0 <= j < i) or len(f) > (3 if kind == "stage" else 2) \
                    or (len(f) == 3 and not isinstance(stages[j], TorchGraph)):
                raise ValueError(f"stage {i} is fed from {tuple(f)!r}: an input, an earlier stage, or a value of an earlier PyTorch part")

    def named(stage: tuple[str, LaunchSpec] | TorchCall | TorchGraph) -> str:
        if isinstance(stage, TorchCall):
            return f"torch call {stage.expr!r}"
        if isinstance(stage, TorchGraph):
            return f"PyTorch ({stage.summary})"
        return repr(stage[1].entry)

    sources: list[str] = []
    rendered = ", ".join(_stage_text(stage, sources) for stage in stages)
    entries = " then ".join(named(stage) for stage in stages)
    return header + _WRAPPER.format(sources="(" + "".join(f"{src!r}, " for src in sources) + ")",
                                    entries=f"kernel {entries}" if len(stages) == 1 else f"kernels {entries}",
                                    stages=rendered, feeds=[None if f is None else list(f) for f in feeds],
                                    replay=bool(replay))


def wrap_kernel(source: str, launch: LaunchSpec) -> str:
    """A format-B candidate as a module: its one kernel, launched over the forward's inputs."""
    return wrap_stages([(source, launch)], [None])
