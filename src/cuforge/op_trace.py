"""Recording the aten ops a piece of PyTorch code dispatches (from Python or C++ extensions), and,
optionally, its dataflow graph: which tensors (inputs, parameters, earlier results) and constants
each op consumed. The graph is what offline kernel families match (a GEMM followed by an
elementwise epilogue, a norm written out op by op) and where constants such as an eps come from."""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from cuforge.op_graph import OpNode

# Views that hand back the same values under the same shape (refs pass straight through).
_SAME_VALUES = frozenset({"detach", "alias", "contiguous", "clone", "lift_fresh", "lift_fresh_copy", "_to_copy"})


def op_name(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The aten op's name, refined where one name covers different kernels."""
    name = func.overloadpacket.__name__
    if name == "gelu" and kwargs.get("approximate") == "tanh":
        return "gelu_tanh"  # a different function, not a flavour of the same one
    if name in ("_softmax", "_log_softmax", "_safe_softmax") and len(args) > 1 and hasattr(args[0], "dim"):
        if int(args[1]) % max(args[0].dim(), 1) == args[0].dim() - 1:
            return name + "_lastdim"  # row-wise kernels cover the last dimension only
    if name in ("sum", "max", "argmax") and len(args) > 1 and hasattr(args[0], "dim") and args[0].dim() > 0:
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        keepdim = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
        if len(dims) == 1 and isinstance(dims[0], int) and dims[0] % args[0].dim() == args[0].dim() - 1 and not keepdim:
            return name + "_lastdim"
    return name


class OpRecorder(TorchDispatchMode):
    """Use as a context manager; `ops` lists every aten op name dispatched inside it. With
    graph=True, name the forward's tensors first (`name_tensors`), and `nodes` holds the graph."""

    def __init__(self, graph: bool = False) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.graph = graph
        self.nodes: list[OpNode] = []
        self._refs: dict[int, str] = {}
        self._alive: list[Any] = []  # keeps traced tensors alive so their ids stay unique
        self._literals: dict[int, int | float] = {}  # 0-dim tensors made from a Python number: their value
        # FLOPs of ops whose results were made without running them (a recurrent layer on the meta
        # device), which a FlopCounterMode around the recorder therefore never saw.
        self.uncounted_flops = 0

    def name_tensors(self, prefix: str, tensors: list[Any]) -> None:
        for i, t in enumerate(tensors):
            self._bind(t, f"{prefix}{i}")

    def ref(self, t: Any) -> str | None:
        return self._refs.get(id(t))

    def _bind(self, t: Any, ref: str) -> None:
        self._refs[id(t)] = ref
        self._literals.pop(id(t), None)  # written in place: a result now, no longer the number
        self._alive.append(t)

    def literal(self, t: Any, value: int | float) -> None:
        """`t` is a 0-dim tensor the forward made from the Python number `value` (torch.tensor(0.5)): the
        graph takes it as that constant, as it takes a Python scalar argument. Traced on the meta device,
        its value exists nowhere else. The lift_fresh that torch.tensor dispatches, if just recorded,
        is dropped."""
        ref = self.ref(t)
        if ref is not None and self.nodes and self.nodes[-1].out == ref and self.nodes[-1].op in ("lift_fresh", "lift_fresh_copy"):
            popped = self.nodes.pop()
            if self.ops and self.ops[-1] == popped.op:
                self.ops.pop()
            del self._refs[id(t)]
        self._literals[id(t)] = value
        self._alive.append(t)

    def whole(self, name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `func` (a recurrent layer: aten's lstm, gru, rnn_tanh or rnn_relu) as one node `name`
        over its arguments, its results `out`, `out.1`, ...: traced op by op it is a graph of thousands
        of steps, each a few ops, that no partition is searched over; whole, PyTorch's own call (cuDNN's
        on a GPU) runs it in a partition's PyTorch part. What it dispatches inside is not recorded."""
        import torch

        ops, graph = len(self.ops), self.graph
        self.graph = False
        try:
            out = recurrent_on_meta(name, args, kwargs)
            if out is None:
                out = func(*args, **kwargs)
            else:
                self.uncounted_flops += recurrent_flops(name, args)
        finally:
            self.graph = graph
            del self.ops[ops:]
        self.ops.append(name)
        first = out[0] if isinstance(out, (tuple, list)) else out
        if graph and isinstance(first, torch.Tensor):
            ref = f"t{len(self.nodes)}"
            self.nodes.append(OpNode(name, tuple(self._const(a) for a in args),
                                     tuple((k, self._const(v)) for k, v in sorted(kwargs.items())), ref, tuple(first.shape)))
            self._bind(first, ref)
            for i, o in enumerate(out[1:] if isinstance(out, (tuple, list)) else (), 1):
                if isinstance(o, torch.Tensor):
                    self._bind(o, f"{ref}.{i}")
        return out

    def collapse(self, start: int, ref: str | None, p: float, out: Any) -> None:
        """The nodes recorded since `start` are one training-mode dropout, of the tensor named `ref` before
        the call (an in-place dropout renames it), with drop probability `p`: they become the one node
        dropout(ref, p, True) (aten::dropout's arguments) whose result is `out`. Traced on the meta device
        or the CPU, dropout dispatches as empty_like, bernoulli_, div_ and mul; on a GPU as native_dropout,
        whose random draws only that op reproduces: the graph names the op, not its decomposition."""
        import torch

        if not self.graph or ref is None or not isinstance(out, torch.Tensor):
            return
        del self.nodes[start:]
        node = f"t{len(self.nodes)}"
        self.nodes.append(OpNode("dropout", (ref, float(p), True), (), node, tuple(out.shape)))
        self._bind(out, node)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = op_name(func, args, kwargs)
        self.ops.append(name)
        out = func(*args, **kwargs)
        if self.graph:
            self._record(name, args, kwargs, out)
        return out

    def _record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        import torch

        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if not isinstance(first, torch.Tensor):
            return
        if name in _SAME_VALUES and args and id(args[0]) in self._literals and first.dim() == 0:
            self._literals[id(first)] = self._literals[id(args[0])]  # a copy of a literal is the literal
            self._alive.append(first)
            return
        if self._overwrites_captured(name, args, first):
            # A tensor made outside the forward, overwritten whole (self.hidden.copy_(h0)): from here on it
            # is the copied tensor; what it held before is never read.
            self._bind(first, self.ref(args[1]))
            return
        src = self.ref(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and self._passes_through(name, args, first):
            self._bind(first, src if name in _SAME_VALUES or first.dim() < 2 or not self._swaps(name, args, first)
                       else (src[:-2] if src.endswith(".T") else src + ".T"))
            return
        ref = f"{'t' if any(isinstance(a, torch.Tensor) for a in args) else 'c'}{len(self.nodes)}"
        self.nodes.append(OpNode(name, tuple(self._const(a) for a in args),
                                 tuple((k, self._const(v)) for k, v in sorted(kwargs.items())), ref, tuple(first.shape)))
        self._bind(first, ref)
        if isinstance(out, (tuple, list)):
            for i, o in enumerate(out[1:], 1):
                if isinstance(o, torch.Tensor):
                    self._bind(o, f"{ref}.{i}")

    def _overwrites_captured(self, name: str, args: tuple[Any, ...], out: Any) -> bool:
        """copy_ into a tensor the graph never saw made, from a traced tensor of its shape and dtype."""
        import torch

        return (name == "copy_" and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2])
                and self.ref(args[0]) is None and id(args[0]) not in self._literals and self.ref(args[1]) is not None
                and tuple(args[0].shape) == tuple(args[1].shape) and args[0].dtype == args[1].dtype
                and out is args[0])

    @staticmethod
    def _swaps(name: str, args: tuple[Any, ...], out: Any) -> bool:
        """Whether a view op swapped the last two dims (t, transpose(-1, -2), permute(..., -1, -2))."""
        n = out.dim()
        if name == "t":
            return n == 2
        if name in ("transpose", "swapaxes") and len(args) >= 3:
            return sorted((int(args[1]) % n, int(args[2]) % n)) == [n - 2, n - 1]
        if name == "permute" and len(args) >= 2:
            dims = [int(d) % n for d in args[1]]
            return dims == list(range(n - 2)) + [n - 1, n - 2]
        return False

    def _passes_through(self, name: str, args: tuple[Any, ...], out: Any) -> bool:
        """Views and copies whose result is the source's values, or its transpose."""
        if name in _SAME_VALUES:
            return tuple(out.shape) == tuple(args[0].shape) and out.dtype == args[0].dtype
        if name in ("t", "transpose", "swapaxes", "permute"):
            return self._swaps(name, args, out)
        if name in ("view", "_unsafe_view", "reshape", "expand"):
            return tuple(out.shape) == tuple(args[0].shape)
        return False

    def _const(self, a: Any) -> Any:
        import torch

        if isinstance(a, torch.Tensor):
            if id(a) in self._literals:
                return self._literals[id(a)]
            ref = self.ref(a)
            if ref is None:  # a tensor the graph never saw made (a captured global): opaque
                ref = f"c{len(self.nodes)}x"
            return ref
        if isinstance(a, (bool, int, float, str)) or a is None:
            return a
        if isinstance(a, (list, tuple)):
            return tuple(self._const(v) for v in a)
        return repr(a)


_LITERAL_DTYPES = ("torch.float32", "torch.float64", "torch.int64", "torch.int32")


def _dropout_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, float] | None:
    """(input, p) where `func(*args, **kwargs)` is a training-mode dropout that draws (0 < p < 1), else None."""
    import torch
    import torch.nn.functional as F

    if func is F.dropout:
        names = ("input", "p", "training", "inplace")
        defaults = {"p": 0.5, "training": True}
    elif func in (torch.dropout, torch.dropout_):
        names = ("input", "p", "train")
        defaults = {}
    else:
        return None
    bound = {**defaults, **dict(zip(names, args)), **kwargs}
    p, train = bound.get("p"), bound.get("training", bound.get("train"))
    if not isinstance(bound.get("input"), torch.Tensor) or not isinstance(p, (int, float)) or train is not True:
        return None
    return (bound["input"], float(p)) if 0 < p < 1 else None


def _padded_layer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """A recurrent layer's call in the padded form, (input, hx, params, has_biases, num_layers, dropout,
    train, bidirectional, batch_first) with hx a list for lstm, as (input, initial states, layers,
    bidirectional, batch_first); None for the packed-sequence form (data, batch_sizes, hx, params, ...)
    and any other."""
    if kwargs or len(args) != 9 or not isinstance(args[1] if name == "lstm" else args[2], (list, tuple)):
        return None
    states = list(args[1]) if name == "lstm" else [args[1]]
    return args[0], states, int(args[4]), bool(args[7]), bool(args[8])


def recurrent_on_meta(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The results of a whole recurrent layer (aten's lstm, gru, rnn_tanh, rnn_relu over a padded input)
    whose input lies on the meta device, made from the shapes alone; None for anything else. On the meta
    device PyTorch runs such a layer step by step through Python meta functions: a 6-layer GRU over 512
    steps took 16 s to trace, where its shapes follow from its arguments: the output is the input with
    its features replaced by directions x the hidden state's width, and the final states keep the
    initial states' shapes."""
    import torch

    layer = _padded_layer(name, args, kwargs)
    if layer is None:
        return None
    x, states, _layers, bidirectional, batch_first = layer
    if not isinstance(x, torch.Tensor) or x.device.type != "meta" or x.dim() not in (2, 3) \
            or not all(isinstance(h, torch.Tensor) and h.device.type == "meta" for h in states):
        return None
    width = states[0].shape[-1] * (2 if bidirectional else 1)
    # Batch first, PyTorch runs the layer time first and hands back a transposed view: the same strides
    # here, since the ops after the layer dispatch differently on them (a linear layer as mm on a copy).
    output = x.new_empty((x.shape[1], x.shape[0], width)).transpose(0, 1) if batch_first and x.dim() == 3 \
        else x.new_empty((*x.shape[:-1], width))
    finals = tuple(h.new_empty(h.shape) for h in states)
    return (output, *finals)


def recurrent_flops(name: str, args: tuple[Any, ...]) -> int:
    """The FLOPs PyTorch's FlopCounterMode counts for a whole recurrent layer in the padded form
    (recurrent_on_meta's): per layer and direction, each step's products of the input and of the hidden
    state with every gate's weights, and an LSTM's projection where it has one."""
    layer = _padded_layer(name, args, {})
    assert layer is not None, "recurrent_flops takes the padded form recurrent_on_meta made results for"
    x, states, layers, bidirectional, batch_first = layer
    steps, batch = (x.shape[0], 1) if x.dim() == 2 else (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
    out = states[0].shape[-1]  # a direction's output width: the projection's where an LSTM has one
    hidden = states[1].shape[-1] if name == "lstm" else out
    gates = {"lstm": 4, "gru": 3}.get(name, 1)
    directions = 2 if bidirectional else 1
    rows, total, width = steps * batch, 0, x.shape[-1]
    for _ in range(layers):
        per_direction = 2 * rows * gates * hidden * (width + out) + (2 * rows * hidden * out if out != hidden else 0)
        total += directions * per_direction
        width = directions * out
    return int(total)


def _recurrent_layer(func: Any) -> str | None:
    """The aten name of `func` where it is a whole recurrent layer (what nn.LSTM, nn.GRU and nn.RNN call)."""
    import torch

    for name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        if func is getattr(torch._C._VariableFunctions, name, None):
            return name
    return None


class LiteralCapture(TorchFunctionMode):
    """Tells a graph recorder the value of each 0-dim tensor the forward makes from a Python number
    (torch.tensor(0.5), torch.tensor(0.0, device=x.device)), which dispatch alone never sees; and which
    recorded ops are one training-mode dropout (OpRecorder.collapse). Enter it inside the recorder. Only
    dtypes whose arithmetic with an fp32 tensor is the number's own."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        import torch

        layer = _recurrent_layer(func)
        if layer is not None:
            return self.recorder.whole(layer, func, args, kwargs or {})
        dropout = _dropout_call(func, args, kwargs or {})
        start, src = len(self.recorder.nodes), None if dropout is None else self.recorder.ref(dropout[0])
        out = func(*args, **(kwargs or {}))
        if dropout is not None:
            self.recorder.collapse(start, src, dropout[1], out)
        if func in (torch.tensor, torch.as_tensor, torch.scalar_tensor) and args and type(args[0]) in (int, float) \
                and isinstance(out, torch.Tensor) and out.dim() == 0 and str(out.dtype) in _LITERAL_DTYPES:
            self.recorder.literal(out, args[0])
        return out
