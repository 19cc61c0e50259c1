"""A CUDA kernel's parameters, read from its source, and the values a launch passes for them: what the
runtime's launches (runtime.CudaKernel) and the exported libraries' wrappers (export/plan.py) agree on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuforge.tma import LaunchError

_SCALAR_TYPES: dict[str, Any] = {
    "int": np.int32, "int32_t": np.int32, "signed": np.int32, "signed int": np.int32,
    "unsigned": np.uint32, "unsigned int": np.uint32, "uint32_t": np.uint32,
    "long long": np.int64, "long long int": np.int64, "int64_t": np.int64, "long": np.int64,
    "ptrdiff_t": np.int64, "unsigned long long": np.uint64, "uint64_t": np.uint64, "size_t": np.uint64,
    "unsigned long": np.uint64, "float": np.float32, "double": np.float64, "half": np.float16,
    "__half": np.float16, "bool": np.bool_, "short": np.int16, "int16_t": np.int16,
    "unsigned short": np.uint16, "uint16_t": np.uint16, "char": np.int8, "int8_t": np.int8,
    "signed char": np.int8, "unsigned char": np.uint8, "uint8_t": np.uint8,
}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__", "struct"}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str
    pointer: bool


def _split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_param(text: str) -> Param:
    text = re.sub(r"=.*$", "", text).strip()
    pointer = "*" in text or "&" in text
    tokens = [t for t in re.split(r"[\s*&]+", text) if t and t not in _QUALIFIERS]
    if len(tokens) < 2:
        return Param(tokens[0] if tokens else "?", "?", pointer)
    return Param(tokens[-1], " ".join(tokens[:-1]), pointer)


def kernel_signatures(source: str) -> dict[str, list[Param]]:
    """extern "C" __global__ kernels and their parameters, parsed from source (comments removed)."""
    clean = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    sigs: dict[str, list[Param]] = {}
    # attributes such as __launch_bounds__(...), __cluster_dims__(...), __maxnreg__(...) on either side of void
    attrs = r"(?:__\w+__\s*\([^)]*\)\s*)*"
    pattern = re.compile(r"__global__\s+" + attrs + r"void\s+" + attrs + r"(\w+)\s*\(")
    for m in pattern.finditer(clean):
        depth, i = 1, m.end()
        while i < len(clean) and depth:
            depth += {"(": 1, ")": -1}.get(clean[i], 0)
            i += 1
        body = clean[m.end(): i - 1]
        sigs[m.group(1)] = [parse_param(p) for p in _split_params(body)] if body.strip() not in ("", "void") else []
    return sigs


def by_value_struct(param: Param) -> bool:
    """A parameter passed as a struct's bytes (a tensor map): neither a pointer nor a scalar type."""
    return not param.pointer and param.ctype not in _SCALAR_TYPES


def convert_arg(param: Param, value: Any) -> Any:
    """A Python/torch value -> the ctypes/numpy object cuda.core passes as this parameter."""
    return converter(param)(value)


def converter(param: Param) -> Any:
    """convert_arg for one parameter as a function of the value: a kernel launched many times decides
    once what its parameter needs (a type lookup and bounds cost more per launch than the launch)."""
    import torch

    tensor = torch.Tensor
    name, ctype = param.name, param.ctype
    if param.pointer:
        # Pointers travel as 8-byte unsigned integers (same size and alignment as a device pointer).
        def pointer(value: Any) -> Any:
            if isinstance(value, tensor):
                if not value.is_cuda:
                    raise LaunchError(f"argument {name!r}: tensor is on {value.device}, not on a CUDA device")
                return np.uint64(value.data_ptr())
            if isinstance(value, int):
                return np.uint64(value)
            if value is None:
                return np.uint64(0)
            raise LaunchError(f"argument {name!r} is a pointer ({ctype}*) but got {type(value).__name__}")
        return pointer
    np_type = _SCALAR_TYPES.get(ctype)

    def scalar(value: Any) -> Any:
        if isinstance(value, tensor):
            raise LaunchError(f"argument {name!r} is a {ctype} scalar but got a tensor")
        return value

    if np_type is None:
        return scalar  # a struct by value (e.g. a tensor map): the caller passes a ready object
    if np_type in (np.float16, np.float32, np.float64):
        return lambda value: np_type(float(scalar(value)))
    bounds = _int_bounds(np_type)

    def integer(value: Any) -> Any:
        scalar(value)
        if isinstance(value, float) and not float(value).is_integer():
            raise LaunchError(f"argument {name!r} is {ctype} but got non-integer {value}")
        v = int(value)
        if bounds is not None and not bounds[0] <= v <= bounds[1]:
            raise LaunchError(f"argument {name!r}: {value} does not fit {ctype}")
        return np_type(v)
    return integer


# np.iinfo costs microseconds a call, and a launch converts several integer arguments: kept per type.
_INT_BOUNDS: dict[Any, tuple[int, int] | None] = {}


def _int_bounds(np_type: Any) -> tuple[int, int] | None:
    if np_type not in _INT_BOUNDS:
        info = np.iinfo(np_type) if np_type is not np.bool_ else None
        _INT_BOUNDS[np_type] = None if info is None else (int(info.min), int(info.max))
    return _INT_BOUNDS[np_type]
