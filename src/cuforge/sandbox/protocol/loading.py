"""Turn problem and candidate sources into live modules, classifying failures: the same code in the
judge (a problem's reference) and wherever a candidate runs."""

from __future__ import annotations

import hashlib
import linecache
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from cuforge.sandbox.protocol.evaluation import Diagnostic
from cuforge.sandbox.protocol.prebuilt import Extensions, around_import
from cuforge.sandbox.protocol.prebuilt_cubins import seeded, split_off
from cuforge.sandbox.protocol.precision import flags_kept, precision_flags, set_pytorch_defaults, tf32_switches


class CandidateLoadError(Exception):
    def __init__(self, status: str, message: str, diagnostics: list[Diagnostic] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.diagnostics = diagnostics or []
        self.extensions: Extensions | None = None  # what the failed import used of what was built ahead


_PROBLEMS: dict[str, types.ModuleType] = {}
# problem module name -> the TF32 switches its code set while it loaded
PROBLEM_TF32: dict[str, dict[str, bool]] = {}


# Packages that candidates written for other DSLs import, and what to install for them.
PACKAGE_FOR_MODULE = {"cutlass": "nvidia-cutlass-dsl (CuTe DSL)", "tilelang": "tilelang", "triton": "triton",
                      "einops": "einops", "thunderkittens": "thunderkittens"}


def module_from_source(source: str, name: str, extra_globals: dict[str, Any] | None = None,
                       directory: Path | None = None) -> types.ModuleType:
    """Run `source` as module `name`. With `directory`, from a real file there, so that tools that
    read a function's source (Triton's @jit, inspect, tracebacks) work as they do on imported code."""
    module = types.ModuleType(name)
    filename = f"<{name}>"
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.py"
        path.write_text(source)
        filename = str(path)
        linecache.checkcache(filename)
    module.__file__ = filename
    if extra_globals:
        module.__dict__.update(extra_globals)
    sys.modules[name] = module
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)  # noqa: S102 - running user code is the worker's job
    return module


def scratch_dir() -> Path:
    """Where candidate files are written: the worker's private temporary directory."""
    return Path(tempfile.gettempdir()) / "candidates"


def problem_module(source: str, scale: dict[str, int] | None = None, cast: str | None = None) -> types.ModuleType:
    """Problem modules are cached per source (and scale and cast): their reference outputs are reused
    across candidates. `scale` sets module constants (the sizes) before anything reads them; `cast`
    (a torch dtype name) runs an fp32 problem in that dtype as KernelBench's precision option does:
    its floating inputs and its Model's parameters and buffers cast."""
    key = hashlib.sha256((source + repr(sorted((scale or {}).items())) + repr(cast)).encode()).hexdigest()[:16]
    mod = _PROBLEMS.get(key)
    if mod is None:
        # Loaded under PyTorch's defaults, so that the TF32 switches the problem's own code sets are
        # known (a default-flags contract keeps them for its reference; see precision.apply_flags), and
        # the caller's switches as they were afterwards: loading sets no contract.
        with flags_kept():
            set_pytorch_defaults()
            before = precision_flags()
            mod = module_from_source(source, f"cuforge_problem_{key}")
            PROBLEM_TF32[mod.__name__] = tf32_switches(before, precision_flags())
        for name, value in (scale or {}).items():
            if hasattr(mod, name):
                setattr(mod, name, value)
        if cast:
            cast_problem(mod, cast)
        _PROBLEMS[key] = mod
    return mod


CASTS = ("float16", "bfloat16")


def cast_problem(mod: types.ModuleType, dtype_name: str) -> None:
    """The module's get_inputs returns its floating tensors in `dtype_name`, and its Model is built in it."""
    import torch

    if dtype_name not in CASTS:
        raise ValueError(f"cannot cast a problem to {dtype_name!r}: use {' or '.join(CASTS)}")
    dtype = getattr(torch, dtype_name)
    get_inputs = getattr(mod, "get_inputs")
    model: type = getattr(mod, "Model")

    def cast_inputs() -> list[Any]:
        return [cast_tensor(x, dtype) for x in get_inputs()]

    # The class itself is built cast (its __init__, then .to(dtype)), not replaced: KernelBench's files
    # call super(Model, self).__init__(), which a subclass bound to the name Model would send round forever.
    original = getattr(model, "__init__")

    def cast_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.to(dtype)

    setattr(model, "__init__", cast_init)
    setattr(mod, "get_inputs", cast_inputs)


def cast_tensor(x: Any, dtype: Any) -> Any:
    """A floating tensor in `dtype`; anything else as it is."""
    import torch

    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def cast_module(model: Any, dtype: Any) -> Any:
    """A module's floating parameters and buffers in `dtype` (what Module.to(dtype) does); anything else as it is."""
    import torch

    return model.to(dtype) if isinstance(model, torch.nn.Module) else model


def problem_tf32(module: types.ModuleType) -> dict[str, bool]:
    """The TF32 switches a loaded problem's own code set (empty for most problems)."""
    return PROBLEM_TF32.get(module.__name__, {})


def candidate_class(module_source: str, problem: types.ModuleType, candidate_id: str) -> type:
    """Import a candidate module and return its ModelNew; failures become compile/runtime errors."""
    from cuforge.runtime import CompileError

    try:
        module = module_from_source(module_source, f"cuforge_candidate_{candidate_id}",
                                    {"__cuforge_problem__": problem}, scratch_dir())
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        package = PACKAGE_FOR_MODULE.get(root, root or "?")
        raise CandidateLoadError("compile_error", f"the candidate needs package {package}, which is not installed "
                                 f"here (import {e.name} failed)") from None
    except SyntaxError as e:
        raise CandidateLoadError("compile_error", f"Python syntax error at line {e.lineno}: {e.msg}",
                                 [Diagnostic(e.lineno, e.offset, "error", f"Python: {e.msg}")]) from None
    except CompileError as e:
        raise CandidateLoadError("compile_error", str(e), e.diagnostics) from None
    except Exception as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        # load_inline / cpp_extension failures are compile errors of the candidate's CUDA code.
        if "Error building extension" in text or "ninja" in text.lower() or "nvcc" in text.lower():
            raise CandidateLoadError("compile_error", _last_lines(text)) from None
        raise CandidateLoadError("runtime_error", f"importing the candidate raised {_last_lines(text)}") from None
    cls = getattr(module, "ModelNew", None)
    if not isinstance(cls, type):
        raise CandidateLoadError("runtime_error", "candidate module defines no ModelNew class")
    return cls


def load_candidate(module_source: str, problem: types.ModuleType, candidate_id: str,
                   prebuilt: dict[str, str] | None = None, record: bool = False) -> tuple[type, Extensions]:
    """candidate_class, loading the extensions built ahead for this candidate (prebuilt.py) instead of
    building them and finding the cubins compiled ahead in the cache (prebuilt_cubins.py), and with
    `record`, noting those its import builds."""
    cubins, libraries = split_off(prebuilt)
    with around_import(libraries, scratch_dir().parent / "prebuilt", record) as extensions, seeded(cubins, extensions):
        try:
            cls = candidate_class(module_source, problem, candidate_id)
        except CandidateLoadError as e:
            e.extensions = extensions
            raise
    return cls, extensions


def _last_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:1] + lines[-n:]) if len(lines) > n + 1 else " | ".join(lines)
