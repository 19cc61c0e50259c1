"""Extensions a candidate builds with torch's `load_inline`, built ahead of its evaluation.

Building a `load_inline` extension (nvcc and a C++ compiler over torch's headers) takes tens of
seconds, and a candidate builds it while it is imported. Imported in the evaluation itself, that
build would hold the GPU's turn while the GPU idles. So the supervisor first imports the candidate in
a compile-only worker (jailed, no GPU), which records each extension built (`recording`), and hands
the built libraries to the evaluation, which loads them in place of building (`replaying`).

What is handed over is untrusted - the candidate's own code ran where it was built - and it is
handed only to the evaluation of that same candidate, whose code could build or load anything
itself: nothing of one candidate reaches another. A call whose arguments differ from every recorded
one (a candidate that builds differently when it sees a GPU, say) builds as it would have anyway.

A recorded extension is built and loaded under a module name of its own (the candidate's name and its
build key): a process hands back the module it already loaded under a name (pybind11's modules, which
torch's extensions are), so two candidates that both call their extension "fast_matmul", evaluated one
after the other in one worker, would otherwise both run the first one's code.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The most a candidate's built libraries may weigh together, to be handed over (within the wire's
# 16 MiB message once in base64).
MAX_BYTES = 8 * 2**20
# Arguments that change how a build is logged or kept, never what it builds.
_IGNORED = {"verbose", "keep_intermediates"}


def builds_ahead(candidate: Any) -> bool:
    """Whether a candidate (protocol.candidate.Candidate) may build an extension as it is imported:
    a module whose source calls load_inline."""
    return getattr(candidate, "format", "") == "module" and "load_inline" in getattr(candidate, "source", "")


def build_key(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """A digest of the call's arguments as `function` binds them (defaults filled in); None for a call
    that does not bind (it fails the same way when it runs)."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    named = {k: v for k, v in bound.arguments.items() if k not in _IGNORED}
    text = json.dumps(named, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def module_name(name: str, key: str) -> str:
    """The module name a recorded build is made and loaded under: the candidate's name, made its own."""
    return f"{name}_{key[:16]}"


def _renamed(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             key: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.arguments["name"] = module_name(str(bound.arguments["name"]), key)
    return bound.args, bound.kwargs


def _extension_api() -> Any:
    import torch.utils.cpp_extension as ext

    return ext


@contextmanager
def recording() -> Iterator[dict[str, Path]]:
    """While open, each `load_inline` call that builds and loads a Python module is recorded:
    {build key: the built library's path}."""
    ext = _extension_api()
    original = ext.load_inline
    built: dict[str, Path] = {}

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        # The key first: torch appends to the caller's own flag lists (extra_ldflags) as it builds.
        key = build_key(original, args, kwargs)
        if key is not None:
            args, kwargs = _renamed(original, args, kwargs, key)
        result = original(*args, **kwargs)
        # A Python module names its library; a library of torch ops alone is returned as its path.
        path = result if isinstance(result, str) else getattr(result, "__file__", None)
        if key is not None and path and Path(path).is_file():
            built[key] = Path(path)
        return result

    ext.load_inline = load_inline
    try:
        yield built
    finally:
        ext.load_inline = original


def pack(built: dict[str, Path]) -> dict[str, str]:
    """{key: base64 of the library}, whole libraries only, within MAX_BYTES altogether."""
    out: dict[str, str] = {}
    total = 0
    for key, path in built.items():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if total + len(data) > MAX_BYTES:
            continue
        total += len(data)
        out[key] = base64.b64encode(data).decode()
    return out


@contextmanager
def replaying(packed: dict[str, str] | None, directory: Path) -> Iterator[list[str]]:
    """While open, a `load_inline` call whose build key is in `packed` loads that library (written
    under `directory`) instead of building; every other call builds as usual. Yields the keys used."""
    used: list[str] = []
    if not packed:
        yield used
        return
    ext = _extension_api()
    original = ext.load_inline
    load_built = getattr(ext, "_import_module_from_library", None)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        key = build_key(original, args, kwargs)
        if key is None or key not in packed or load_built is None:
            return original(*args, **kwargs)
        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        name = module_name(str(bound.arguments["name"]), key)
        # A new file every time: the same candidate evaluated again in this process must not write over
        # a library it has loaded (rewriting mapped code crashes the process).
        where = directory / f"{key[:24]}-{uuid.uuid4().hex[:12]}"
        where.mkdir(parents=True)
        library = where / f"{name}.so"
        library.write_bytes(base64.b64decode(packed[key]))
        used.append(key)
        return load_built(name, str(where), bool(bound.arguments.get("is_python_module", True)))

    ext.load_inline = load_inline
    try:
        yield used
    finally:
        ext.load_inline = original


@dataclass
class Extensions:
    """What one candidate import did with what was built ahead: the prebuilt extensions it loaded,
    those it built, and how many of its NVRTC compiles found a cubin compiled ahead (prebuilt_cubins.py)."""

    used: list[str] = field(default_factory=list)
    built: dict[str, Path] = field(default_factory=dict)
    cubins: int = 0


@contextmanager
def around_import(packed: dict[str, str] | None, directory: Path, record: bool) -> Iterator[Extensions]:
    """A candidate's import: loading the extensions in `packed` instead of building them, and with
    `record`, noting those it builds."""
    out = Extensions()
    with replaying(packed, directory) as used:
        if record:
            with recording() as built:
                yield out
            out.built.update(built)
        else:
            yield out
    out.used[:] = used
