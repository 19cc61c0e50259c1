"""Runs inside a subprocess: imports problem files (user code) and reports what they declare.

Protocol: one JSON request per stdin line, {"path": ..., "mode": "inspect" | "validate"}; one JSON
reply per stdout line, {"path", "ok", "error", "data"}. The problem file's own prints go to stderr
so they cannot corrupt the protocol. Never imported by the CLI process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import traceback
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from cuforge.aten_ops import compute_ops, families_of_ops
from cuforge.device_map import CudaTo
from cuforge.op_trace import LiteralCapture, OpRecorder

# Full-size reference runs on the CPU are skipped above this much input data.
from cuforge.problems.problem import CPU_FULL_SIZE_BYTES as CPU_FULL_SIZE_LIMIT_BYTES  # noqa: E402

def _spec(t: Any) -> dict[str, Any]:
    if not isinstance(t, torch.Tensor):  # a number passed through as it is
        kind = "bool" if isinstance(t, bool) else "int64" if isinstance(t, int) else "float64"
        return {"shape": [], "dtype": kind, "value": t}
    spec = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    if not t.is_contiguous():  # a transposed or expanded input: kernels that read row-major would misread it
        spec["contiguous"] = False
    return spec


def _flatten_outputs(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def _load_module(path: str):  # noqa: ANN202
    name = "cuforge_problem_" + str(abs(hash(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _check_interface(module) -> None:  # noqa: ANN001
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        raise _Bad(f"missing {', '.join(missing)}")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise _Bad("Model is not a torch.nn.Module subclass")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn)):
            raise _Bad(f"{fn} is not callable")
    meta = getattr(module, "CUFORGE", None)
    if meta is not None and not isinstance(meta, dict):
        raise _Bad("CUFORGE must be a dict")


class _Bad(Exception):
    """The file is not a usable problem; the message is the cause."""


def _eval_meta_value(value: Any, namespace: dict[str, Any]) -> Any:
    """CUFORGE flops/bytes may be numbers or expressions over the module's constants."""
    if isinstance(value, str):
        names = {k: v for k, v in namespace.items() if isinstance(v, (int, float)) and not k.startswith("_")}
        try:
            return float(eval(value, {"__builtins__": {}, "math": math}, names))  # noqa: S307
        except Exception as e:  # noqa: BLE001
            raise _Bad(f"CUFORGE expression {value!r} failed: {type(e).__name__}: {e}") from None
    return value


def _declared(module) -> dict[str, Any]:  # noqa: ANN001
    meta = dict(getattr(module, "CUFORGE", None) or {})
    for key in ("flops", "bytes"):
        if key in meta:
            meta[key] = _eval_meta_value(meta[key], vars(module))
    return meta


# Non-tensor inputs KernelBench passes through to forward as they are.
_SCALARS = (bool, int, float)


def _call_inputs(module, device: str | None) -> tuple[list[Any], list[Any]]:  # noqa: ANN001
    """get_init_inputs() and get_inputs() on `device` (None: the CPU); `.cuda()` and device="cuda"
    in them are mapped there too (this process never uses a GPU)."""
    with torch.device(device or "cpu"), CudaTo(device or "cpu"):
        try:
            init = list(module.get_init_inputs())
        except Exception as e:  # noqa: BLE001
            raise _Bad(f"get_init_inputs() raised {type(e).__name__}: {e}") from None
        try:
            inputs = list(module.get_inputs())
        except Exception as e:  # noqa: BLE001
            raise _Bad(f"get_inputs() raised {type(e).__name__}: {e}") from None
    for i, x in enumerate(inputs):
        if not isinstance(x, (torch.Tensor, *_SCALARS)):
            raise _Bad(f"get_inputs() returned a {type(x).__name__} at position {i}: inputs must be tensors, "
                       "numbers or booleans")
    return init, inputs


def _param_specs(model: torch.nn.Module) -> list[dict[str, Any]]:
    return [_spec(p) for p in list(model.parameters()) + list(model.buffers())]


def _nbytes(specs: list[dict[str, Any]]) -> int:
    from cuforge.problems.problem import tensor_spec_from_dict

    return sum(tensor_spec_from_dict(s).nbytes for s in specs)


# Ops that read only part of their first argument: a row gather, a slice. The roofline floor cannot
# count a leaf tensor read only through these as read in full (a 50 MB embedding table a bag sums 20
# rows of), or an honest kernel that reads just the rows it needs would be judged impossibly fast.
_PARTIAL_READS = frozenset({"embedding", "_embedding_bag", "embedding_bag", "_embedding_bag_forward_only",
                            "index_select", "gather", "index", "take", "slice", "select", "narrow",
                            "as_strided", "diagonal", "unfold"})
_LEAF = re.compile(r"^((?:in|param)\d+)(?:\.T)?$")


def _leaf_refs(value: Any) -> list[str]:
    if isinstance(value, str):
        m = _LEAF.match(value)
        return [m.group(1)] if m else []
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _leaf_refs(v)]
    return []


def fully_read_leaves(graph: dict[str, Any]) -> set[str]:
    """The inputs and parameters (`in3`, `param0`) some op of the traced graph reads in full, or the
    forward returns: what a kernel computing the graph must read at least once. A leaf only gathered
    from or sliced, or never used, is not in it."""
    full: set[str] = set()
    for op, args, kwargs, _out, _shape in graph["nodes"]:
        for i, a in enumerate(args):
            if not (i == 0 and op in _PARTIAL_READS):
                full.update(_leaf_refs(a))
        for _k, v in kwargs:
            full.update(_leaf_refs(v))
    full.update(_leaf_refs(graph["outputs"]))
    return full


def least_bytes(in_specs: list[dict[str, Any]], params: list[dict[str, Any]], outputs: list[dict[str, Any]],
                graph: dict[str, Any]) -> int:
    """Bytes any kernel computing the problem must move: the leaves read in full, and the outputs."""
    full = fully_read_leaves(graph)
    leaves = [s for i, s in enumerate(in_specs) if f"in{i}" in full]
    leaves += [s for i, s in enumerate(params) if f"param{i}" in full]
    return _nbytes(leaves) + _nbytes(outputs)


def _trace(module, init: list[Any], inputs: list[Any], device: str | None):  # noqa: ANN001, ANN202
    """Build the model and run forward once, recording aten ops and counted FLOPs."""
    with torch.device(device or "cpu"), CudaTo(device or "cpu"):
        try:
            model = module.Model(*init)
        except Exception as e:  # noqa: BLE001
            if device != "meta" or not _is_meta_gap(e):
                raise _Bad(f"Model(*get_init_inputs()) raised {type(e).__name__}: {e}") from None
            model = None
    if model is None:
        # __init__ needs real values (a .item(), say): build it for real on the CPU, then move it.
        with CudaTo("cpu"):
            try:
                model = module.Model(*init)
            except Exception as e:  # noqa: BLE001
                raise _Bad(f"Model(*get_init_inputs()) raised {type(e).__name__}: {e}") from None
        model = model.to(device)
    recorder = OpRecorder(graph=True)
    recorder.name_tensors("in", inputs)
    recorder.name_tensors("param", list(model.parameters()) + list(model.buffers()))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, recorder, LiteralCapture(recorder):
        out = model(*inputs)
    outs = _flatten_outputs(out)
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise _Bad(f"forward returned a non-tensor at position {i} ({type(o).__name__})")
    graph = {"nodes": [n.to_json() for n in recorder.nodes], "outputs": [recorder.ref(o) for o in outs]}
    return model, outs, recorder.ops, counter.get_total_flops() + recorder.uncounted_flops, graph


def _is_meta_gap(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}".lower()
    return "meta" in text or isinstance(e, NotImplementedError) or "data-dependent" in text


def inspect(path: str, cast: str | None = None) -> dict[str, Any]:
    """Import and trace a problem file; with `cast` (a torch dtype name), as it runs in that dtype (its
    floating inputs and its Model's parameters cast, cuforge.sandbox.protocol.loading.cast_problem)."""
    module = _load_module(path)
    _check_interface(module)
    if cast:
        from cuforge.sandbox.protocol.loading import cast_problem

        try:
            cast_problem(module, cast)
        except ValueError as e:
            raise _Bad(str(e)) from None
    declared = _declared(module)
    init, inputs = _call_inputs(module, "meta")
    outputs: list[dict[str, Any]] | None = None
    ops: list[str] = []
    flops = 0
    graph: dict[str, Any] = {"nodes": [], "outputs": []}
    params: list[dict[str, Any]] = []
    note = ""
    try:
        model, outs, ops, flops, graph = _trace(module, init, inputs, "meta")
        outputs = [_spec(o) for o in outs]
        params = _param_specs(model)
    except _Bad:
        raise
    except Exception as e:  # noqa: BLE001
        if not _is_meta_gap(e):
            raise _Bad(f"forward raised {type(e).__name__}: {e}") from None
        note = f"output shapes unknown: forward does not run on the meta device ({type(e).__name__})"
    in_specs = [_spec(x) for x in inputs]
    derived: dict[str, Any] = {
        "dtype": in_specs[0]["dtype"] if in_specs and in_specs[0]["dtype"].startswith(("float", "bfloat")) else None,
        "flops": flops if flops > 0 else None,
        "bytes": least_bytes(in_specs, params, outputs, graph) if outputs is not None else None,
        "families": families_of_ops(ops),
    }
    derived_ops = compute_ops(ops)
    return {
        "declared": _jsonable(declared),
        "derived": derived,
        "inputs": in_specs,
        "outputs": outputs,
        "params": params,
        "init_inputs": _jsonable(init),
        "ops": derived_ops,
        "graph": graph,
        "note": note,
    }


def validate(path: str) -> dict[str, Any]:
    """Inspect, then run the reference once on the CPU (scaled down where CUFORGE['small'] allows)."""
    report = inspect(path)
    module = sys.modules["cuforge_problem_" + str(abs(hash(path)))]
    small = (report["declared"].get("small") or {})
    for k, v in small.items():
        if not hasattr(module, k):
            raise _Bad(f"CUFORGE small names {k!r}, which is not a module constant")
        setattr(module, k, v)
    full_bytes = _nbytes(report["inputs"])
    if not small and full_bytes > CPU_FULL_SIZE_LIMIT_BYTES:
        report["reference_run"] = (
            f"skipped: inputs are {full_bytes / 2**20:.0f} MiB at full size and the file declares no CUFORGE['small']"
        )
        return report
    torch.manual_seed(0)
    init, inputs = _call_inputs(module, None)
    try:
        model, outs, _ops, flops, _graph = _trace(module, init, inputs, None)
    except _Bad:
        raise
    except Exception as e:  # noqa: BLE001
        raise _Bad(f"forward raised {type(e).__name__}: {e}") from None
    for i, o in enumerate(outs):
        if o.is_floating_point() and not bool(torch.isfinite(o).all()):
            raise _Bad(f"reference output {i} has NaN/Inf on the CPU run")
    in_specs = [_spec(x) for x in inputs]
    out_specs = [_spec(o) for o in outs]
    report["reference_run"] = "ok (scaled down)" if small else "ok (full size)"
    report["small_check"] = {
        "declared": _jsonable(_declared(module)),
        "counted_flops": flops,
        "actual_bytes": _nbytes(in_specs) + _nbytes(_param_specs(model)) + _nbytes(out_specs),
        "outputs": out_specs,
        "output_numel": sum(o.numel() for o in outs),
        "input_numel": sum(x.numel() for x in inputs),
    }
    return report


def _jsonable(x: Any) -> Any:
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return {"tensor": _spec(x)}
    return repr(x)


def _describe_import_error(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"syntax error at line {e.lineno}: {e.msg}"
    if isinstance(e, ModuleNotFoundError):
        return f"imports missing module {e.name!r}"
    return f"import raised {type(e).__name__}: {e}"


def handle(request: dict[str, Any]) -> dict[str, Any]:
    path = request["path"]
    try:
        data = validate(path) if request.get("mode") == "validate" else inspect(path, request.get("cast"))
        return {"path": path, "ok": True, "error": "", "data": data}
    except _Bad as e:
        return {"path": path, "ok": False, "error": str(e), "data": None}
    except BaseException as e:  # noqa: BLE001 - any failure of user code is a verdict on the file
        if isinstance(e, (SyntaxError, ImportError)) or _in_import(e):
            msg = _describe_import_error(e)
        else:
            msg = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
        return {"path": path, "ok": False, "error": msg.splitlines()[0] if msg else type(e).__name__, "data": None}


def _in_import(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_load_module":
            return True
        tb = tb.tb_next
    return False


def main() -> None:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # user prints must not reach the protocol stream
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = handle(json.loads(line))
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
