"""Kernels compiled ahead of their evaluation: a candidate's NVRTC cubins, built in a compile-only worker.

A template kernel's NVRTC compile (0.2-1.6 s on an H200's host) is part of its evaluation's load, and
the evaluation holds the GPU's turn: while it compiles, no other evaluation can use the GPU. So where
the GPU is busy (another evaluation holds or awaits the turn) or the search queues candidates ahead
of the GPU, the supervisor first has a compile-only worker compile the kernels the candidate's module
would compile as it is imported, and hands the cubins to the evaluation, whose compiles then find
them in the cache under the keys they ask for.

What is compiled is found by reading the module (`kernel_sources`), never by running it: the
literal (source, options, name expressions) of each `_Stage` that cuforge's wrapper of format-B
kernels constructs (protocol/candidate.py). The worker that compiles runs no candidate code, only
NVRTC over those sources, so one serves many candidates. The supervisor does this only for the
in-process judge, whose worker runs each candidate's code in its own process anyway; the split
judge's candidate hosts compile their own.
"""

from __future__ import annotations

import ast
import base64
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cuforge.sandbox.protocol.prebuilt import MAX_BYTES, Extensions

# Entries of a prebuilt mapping that are cubins (the others are load_inline libraries, prebuilt.py).
CUBIN = "cubin:"
# A partition of a network names dozens of distinct kernels (DenseNet-201's: over a hundred), compiled
# several at once (runtime.compile_many); what is packed stays within prebuilt.MAX_BYTES.
MAX_KERNELS = 128


@dataclass(frozen=True)
class KernelSource:
    """One compile_cuda call a candidate's import makes."""

    source: str
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.source, list(self.options), list(self.name_expressions)]

    @staticmethod
    def from_wire(item: Any) -> KernelSource | None:
        """From [source, options, names] (lists or tuples); None for anything else."""
        if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], str)
                and all(isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v) for v in item[1:])):
            return None
        return KernelSource(item[0], tuple(item[1]), tuple(item[2]))


def kernel_sources(candidate: Any) -> list[KernelSource]:
    """The kernels a candidate's module compiles as it is imported, read from its source: each
    `_Stage(source, options, names, ...)` whose first three arguments are literals. A format-B
    candidate's module is that wrapper; a module written otherwise names none, and compiles its own."""
    try:
        text = candidate.module_source()
    except Exception:  # noqa: BLE001 - a malformed launch spec fails when the module is imported
        return []
    if "_Stage(" not in text:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a module no import would get through
        return []
    table = _kernel_table(tree)
    out: list[KernelSource] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_Stage"
                and len(node.args) >= 3):
            continue
        try:
            source, options, names = (_from_table(a, table) for a in node.args[:3])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, IndexError):
            continue
        kernel = KernelSource.from_wire([source, options, names])
        if kernel is not None and kernel not in out:
            out.append(kernel)
        if len(out) == MAX_KERNELS:
            break
    return out


def _kernel_table(tree: ast.Module) -> tuple[Any, ...]:
    """The module's `_KERNEL_SOURCES = (...)` (each distinct kernel source once; cuforge's wrapper writes
    it), where a top-level statement assigns it a literal tuple; () otherwise."""
    for stmt in tree.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == "_KERNEL_SOURCES"):
            try:
                value = ast.literal_eval(stmt.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return ()
            return value if isinstance(value, tuple) else ()
    return ()


def _from_table(node: ast.expr, table: tuple[Any, ...]) -> Any:
    """A literal, or `_KERNEL_SOURCES[i]` with a literal i read from the module's table."""
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "_KERNEL_SOURCES"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
        return table[node.slice.value]
    return ast.literal_eval(node)


def compile_kernels(items: list[Any]) -> dict[str, Any]:
    """(A compile-only worker's job.) Each kernel compiled with NVRTC for the worker's target arch:
    {"prebuilt": {CUBIN + cache key: JSON of the cubin (base64) and its name mapping}, "failed": n}.
    A kernel that does not compile is left out: its evaluation compiles it and reports why."""
    from cuforge import runtime

    arch = runtime.current_arch()
    packed: dict[str, str] = {}
    failed = total = 0
    kernels = [KernelSource.from_wire(item) for item in items[:MAX_KERNELS]]
    runtime.compile_many([(k.source, k.options, k.name_expressions) for k in kernels if k is not None], arch)
    for kernel in kernels:
        if kernel is None:
            failed += 1
            continue
        try:
            data, mapping, _ = runtime.compile_to_cubin(kernel.source, arch, kernel.options, kernel.name_expressions)
        except Exception:  # noqa: BLE001 - NVRTC's errors reach the user from the evaluation itself
            failed += 1
            continue
        if total + len(data) > MAX_BYTES:
            break
        total += len(data)
        key = runtime.cubin_key(kernel.source, kernel.options, arch, kernel.name_expressions)
        packed[CUBIN + key] = json.dumps({"cubin": base64.b64encode(data).decode(), "names": mapping})
    return {"prebuilt": packed, "failed": failed}


def seed_cubins(packed: dict[str, str] | None) -> int:
    """Put the cubins of a prebuilt mapping in this process's compile cache; how many. A malformed
    entry is skipped (the compile that would have found it runs NVRTC instead)."""
    from cuforge import runtime

    seeded = 0
    for name, value in (packed or {}).items():
        if not name.startswith(CUBIN) or not re.fullmatch(r"[0-9a-f]{64}", name[len(CUBIN):]):
            continue
        try:
            entry = json.loads(value)
            data = base64.b64decode(entry["cubin"], validate=True)
            mapping = {str(k): str(v) for k, v in dict(entry.get("names") or {}).items()}
        except (ValueError, TypeError, KeyError):
            continue
        runtime.seed_cubin(name[len(CUBIN):], data, mapping)
        seeded += 1
    return seeded


def split_off(packed: dict[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """A prebuilt mapping as (its cubins, the rest: load_inline libraries)."""
    items = (packed or {}).items()
    return {k: v for k, v in items if k.startswith(CUBIN)}, {k: v for k, v in items if not k.startswith(CUBIN)}


@contextmanager
def seeded(cubins: dict[str, str], into: Extensions) -> Iterator[None]:
    """Around a candidate's import: its cubins in the compile cache first, and afterwards, even where
    the import failed, `into.cubins` says how many of them its compiles found."""
    if not cubins:
        yield
        return
    from cuforge import runtime

    runtime.take_seeded_found()  # an earlier candidate's count is not this one's
    seed_cubins(cubins)
    try:
        yield
    finally:
        into.cubins = runtime.take_seeded_found()
