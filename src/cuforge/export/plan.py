"""What an export contains: for each operator, a per-shape dispatch table of winning kernels with
their launches made concrete (grid, block, shared memory and arguments are fixed per tuned shape),
and the reference it falls back to everywhere else.

A kernel enters the table only where the run measured it faster than every library baseline the
fallback could be (torch eager, cuBLAS), so the exported op is never slower than its fallback on
the shapes it was tuned for, as far as the run's measurements go.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cuforge.problems.problem import Problem
from cuforge.kernel_args import Param, kernel_signatures
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec

FALLBACK_BASELINES = ("torch", "cublas")  # what the exported op calls where it has no kernel


class ExportError(ValueError):
    """The export cannot be made as asked; the message names the cause."""


class NotExportable(ValueError):
    """This candidate cannot become a standalone kernel entry (the op falls back for its shape)."""


@dataclass(frozen=True)
class Arg:
    kind: str  # "input", "output" or "scalar"
    index: int = 0  # input/output position
    value: float | int = 0  # scalar value
    ctype: str = ""  # the kernel parameter's C type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Kernel:
    """One distinct compiled kernel, under a symbol unique within the export."""

    symbol: str
    source: str  # entry renamed to `symbol`
    options: tuple[str, ...]
    params: tuple[Param, ...]
    candidate_id: int
    config: dict[str, Any] | None


@dataclass(frozen=True)
class Entry:
    """A tuned shape: the kernel and its concrete launch."""

    shapes: tuple[tuple[int, ...], ...]  # input shapes
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: tuple[Arg, ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    problem_id: str
    speedups: dict[str, float]
    timings_ms: dict[str, float]


@dataclass
class Op:
    name: str
    kind: str  # "gemm" (C = A @ B, fp16; C API cuforge_hgemm-style, cuBLAS fallback) or "generic"
    input_dtypes: tuple[str, ...]
    input_ranks: tuple[int, ...]
    output_dtypes: tuple[str, ...]
    reference_source: str
    tolerance: dict[str, float]
    entries: list[Entry] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # tuned problems left to the fallback, and why
    notes: list[str] = field(default_factory=list)  # e.g. a faster kernel that could not be exported


@dataclass
class Plan:
    run: dict[str, Any]
    ops: list[Op]
    kernels: dict[str, Kernel]


def op_name_of(problem: Problem) -> tuple[str, str]:
    """(op name, kind). fp16 plain GEMMs of any shape form one `hgemm` op with a dispatch table."""
    if problem.ops == ("mm",) and [t.dtype for t in problem.inputs] == ["float16", "float16"] \
            and [len(t.shape) for t in problem.inputs] == [2, 2]:
        return "hgemm", "gemm"
    name = re.sub(r"\W+", "_", problem.name).strip("_").lower()
    if not name or name[0].isdigit():
        name = "op_" + name
    return name, "generic"


def kernel_symbol(entry: str, source: str) -> str:
    return f"{entry}_{hashlib.sha256(source.encode()).hexdigest()[:10]}"


def rename_entry(source: str, entry: str, symbol: str) -> str:
    return re.sub(rf"\b{re.escape(entry)}\b", symbol, source)


def _meta_inputs(problem: Problem) -> list[Any]:
    import torch

    return [torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta") for t in problem.inputs]


def lower(problem: Problem, candidate: Candidate, sm_count: int) -> tuple[Kernel, dict[str, Any]]:
    """Evaluate a format-B launch spec at the problem's input shapes: concrete grid, block, shared
    memory, outputs, and each argument as an input, an output or a scalar of the kernel's C type."""
    import torch

    if candidate.format != "kernel" or candidate.launch is None:
        raise NotExportable("a module-format candidate (Python ModelNew) is not a standalone kernel")
    if problem.params:
        raise NotExportable("the reference model has parameters; exported ops take inputs only")
    launch: LaunchSpec = candidate.launch
    sigs = kernel_signatures(candidate.source)
    if launch.entry not in sigs:
        raise NotExportable(f"kernel {launch.entry!r} not found as an extern \"C\" __global__ function")
    params = sigs[launch.entry]
    if launch.name_expressions:
        raise NotExportable("templated kernels (name expressions) are not exported")
    if launch.pre:
        raise NotExportable("kernels launched after a preparing kernel (3xTF32 operand splits) are not exported yet")
    if launch.cooperative:
        raise NotExportable("cooperative kernels (blocks that wait on each other) are not exported yet")
    if launch.scratch:
        raise NotExportable("kernels with scratch workspaces (split-K) are not exported yet")
    if any(len(o) > 2 for o in launch.outputs):
        raise NotExportable("kernels that accumulate into zeroed outputs (row sums) are not exported yet")
    inputs = _meta_inputs(problem)
    ns: dict[str, Any] = {"cdiv": lambda a, b: (a + b - 1) // b, "min": min, "max": max, "SMS": sm_count}
    ns.update({f"in{i}": x for i, x in enumerate(inputs)})

    class _Props:  # the only device query launch specs make
        multi_processor_count = sm_count

    ns["torch"] = type("T", (), {"cuda": type("C", (), {"get_device_properties": staticmethod(lambda *_: _Props)})})

    def no_tma(*_: Any, **__: Any) -> None:
        raise NotExportable("TMA descriptors (gemm_sm90) are encoded per call on the host; exports do not ship "
                            "that yet, so these shapes use the fallback")

    ns["tma_2d"] = ns["tma_nd"] = no_tma
    safe = {"__builtins__": {}}
    try:
        for name, expr in launch.bindings:
            ns[name] = eval(expr, safe, ns)  # noqa: S307 - our own launch specs, as the sandbox evaluates them
        outputs = []
        for i, (shape, dtype, *_) in enumerate(launch.outputs):
            out = torch.empty(tuple(eval(shape, safe, ns)), dtype=getattr(torch, dtype), device="meta")
            ns[f"out{i}"] = out
            outputs.append(out)
        grid = _dim3(eval(launch.grid, safe, ns))
        block = _dim3(eval(launch.block, safe, ns))
        smem = int(eval(launch.shared_mem, safe, ns))
        values = [eval(a, safe, ns) for a in launch.args]
    except NotExportable:
        raise
    except Exception as e:  # noqa: BLE001
        raise NotExportable(f"launch spec does not evaluate at these shapes: {type(e).__name__}: {e}") from None
    if len(values) != len(params):
        raise NotExportable(f"{len(values)} launch arguments for {len(params)} kernel parameters")
    args = [_classify(v, p, inputs, outputs) for v, p in zip(values, params)]
    symbol = kernel_symbol(launch.entry, candidate.source)
    kernel = Kernel(symbol, rename_entry(candidate.source, launch.entry, symbol), tuple(launch.options), tuple(params),
                    0, None)
    return kernel, {"grid": grid, "block": block, "shared_mem": smem, "args": tuple(args),
                    "outputs": tuple((tuple(o.shape), str(o.dtype).removeprefix("torch.")) for o in outputs)}


def _dim3(v: Any) -> tuple[int, int, int]:
    t = tuple(int(x) for x in (v if isinstance(v, (tuple, list)) else (v,)))
    if not 1 <= len(t) <= 3 or any(x < 1 for x in t):
        raise NotExportable(f"bad launch dimensions {v!r}")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


def _classify(value: Any, param: Param, inputs: list[Any], outputs: list[Any]) -> Arg:
    import torch

    if isinstance(value, torch.Tensor):
        for i, x in enumerate(inputs):
            if value is x:
                return Arg("input", i, ctype=param.ctype)
        for i, x in enumerate(outputs):
            if value is x:
                return Arg("output", i, ctype=param.ctype)
        raise NotExportable(f"argument {param.name!r} is a derived tensor, not an input or output")
    if param.pointer:
        raise NotExportable(f"argument {param.name!r} is a pointer but the launch passes {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotExportable(f"argument {param.name!r}: unsupported value {value!r}")
    return Arg("scalar", value=value, ctype=param.ctype)
