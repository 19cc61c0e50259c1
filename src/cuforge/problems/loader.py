"""Loads problem files through a subprocess inspector, with per-file timeouts and a result cache.

User problem files are never imported in this process: `inspect_worker` imports them in a child
that reports JSON. A file that hangs or crashes the child is reported as skipped, and the child is
restarted for the remaining files.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cuforge import __version__
from cuforge.fmt import file_kind
from cuforge.procenv import scrubbed_env
from cuforge.op_graph import OpNode, drop_identity_reductions, fold_operand_scales
from cuforge.problems.problem import (
    Problem,
    ProblemError,
    SkippedProblem,
    meta_from_inspection,
    tensor_spec_from_dict,
)

# Tracing KernelBench's 6-layer bidirectional GRUs over 512 steps takes about a minute on a busy core.
DEFAULT_TIMEOUT_S = 180.0


def cache_dir() -> Path:
    root = os.environ.get("CUFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cuforge"
    )
    return Path(root)


def _cache_key(mode: str, source: bytes) -> str:
    h = hashlib.sha256()
    h.update(f"{mode}|{__version__}|{_torch_version()}|v13|".encode())  # bumped whenever the inspector's reply changes (v13: recurrent layers as one node)
    h.update(source)
    return h.hexdigest()


def _torch_version() -> str:
    # Read from the installed distribution: importing torch here would cost seconds per CLI call.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


class Inspector:
    """A child process that imports problem files one at a time; restarted when a file kills it."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        src_root = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(p for p in (src_root, os.environ.get("PYTHONPATH", "")) if p)
        env = scrubbed_env({"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"})
        return subprocess.Popen(
            [sys.executable, "-m", "cuforge.problems.inspect_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=os.path.dirname(src_root),
        )

    def ask(self, path: str, mode: str, cast: str | None = None) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"path": path, "mode": mode, "cast": cast}) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return {"path": path, "ok": False, "error": "the inspector process died before reading this file"}
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=self.timeout_s)
        sel.close()
        if not ready:
            self.close()
            return {"path": path, "ok": False, "error": f"hangs: no answer within {self.timeout_s:.0f} s", "transient": True}
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            self._proc = None
            return {"path": path, "ok": False, "error": f"crashed the inspector (exit code {code})", "transient": True}
        return json.loads(line)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: Inspector | None = None


@contextmanager
def shared_inspector() -> Iterator[None]:
    """Within this block every inspection in this process asks one long-lived inspector child
    (restarted when a file kills or hangs it): for a test suite or a batch tool that loads problems
    call after call, each fresh child would cost a Python start and a torch import."""
    global _SHARED
    outer, _SHARED = _SHARED, _SHARED or Inspector()
    try:
        yield
    finally:
        if outer is None:
            _SHARED.close()
        _SHARED = outer


def _inspector(timeout_s: float) -> Inspector:
    if _SHARED is None:
        return Inspector(timeout_s)
    _SHARED.timeout_s = timeout_s
    return _SHARED


def inspect_files(
    paths: Iterable[Path],
    mode: str = "inspect",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_file: Callable[[Path], None] | None = None,
    use_cache: bool = True,
    cast: str | None = None,
) -> list[tuple[Path, str, dict[str, Any]]]:
    """Inspect each file (traced in `cast`'s dtype where given); returns (path, source, reply) in order.
    Cached by content, cast and versions."""
    results: list[tuple[Path, str, dict[str, Any]]] = []
    cdir = cache_dir() / "inspect"
    inspector = _inspector(timeout_s)
    try:
        for path in paths:
            try:
                raw = read_regular_file(path)
            except OSError as e:
                results.append((path, "", {"ok": False, "error": f"cannot read: {e.strerror}"}))
                continue
            source = raw.decode("utf-8", errors="replace")
            cfile = cdir / f"{_cache_key(mode + (f'|cast={cast}' if cast else ''), raw)}.json"
            if use_cache and cfile.exists():
                try:
                    results.append((path, source, json.loads(cfile.read_text())))
                    continue
                except (OSError, json.JSONDecodeError):
                    pass
            if on_file:  # only where time is spent: a file answered from the cache is not announced
                on_file(path)
            reply = inspector.ask(str(path.resolve()), mode, cast)
            if use_cache and not reply.get("transient"):
                _write_cache(cfile, reply)
            results.append((path, source, reply))
    finally:
        if inspector is not _SHARED:
            inspector.close()
    return results


def read_regular_file(path: Path) -> bytes:
    """A problem file's bytes. Opened without blocking and checked before reading: a FIFO named
    *.py would otherwise block the read until something writes to it, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(0, f"{file_kind(mode)}, not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _write_cache(cfile: Path, reply: dict[str, Any]) -> None:
    try:
        cfile.parent.mkdir(parents=True, exist_ok=True)
        tmp = cfile.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(reply))
        tmp.replace(cfile)
    except OSError:
        pass  # a cache we cannot write only costs time


def problem_from_reply(path: Path, source: str, reply: dict[str, Any], problem_id: str, suite: str | None) -> Problem:
    data = reply["data"]
    meta = meta_from_inspection(data["declared"], data["derived"])
    outputs = data.get("outputs")
    graph, graph_outputs = fold_operand_scales(*drop_identity_reductions(
        tuple(OpNode.from_json(n) for n in (data.get("graph") or {}).get("nodes", ())),
        tuple((data.get("graph") or {}).get("outputs", ()))))
    problem = Problem(
        id=problem_id,
        source=source,
        meta=meta,
        inputs=tuple(tensor_spec_from_dict(s) for s in data["inputs"]),
        outputs=tuple(tensor_spec_from_dict(s) for s in outputs) if outputs is not None else None,
        init_inputs=tuple(data.get("init_inputs") or ()),
        params=tuple(tensor_spec_from_dict(s) for s in data.get("params") or ()),
        path=path,
        suite=suite,
        ops=tuple(data.get("ops") or ()),
        graph=graph,
        graph_outputs=graph_outputs,
    )
    return problem


def load_in_dtype(problem: Problem, name: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Problem:
    """`problem.in_dtype(name)` with its graph traced as it runs in that dtype (the file inspected again
    with the cast applied), so that the families that take that dtype can match it and the others say
    why not. A problem with no file (a generated one) keeps its fp32 trace, which no family takes."""
    cast = problem.in_dtype(name)
    if cast is problem or problem.path is None:
        return cast
    ((_, _, reply),) = inspect_files([problem.path], "inspect", timeout_s, cast=cast.meta.cast)
    if not reply.get("ok"):
        raise ProblemError(f"{problem.id} in {cast.meta.cast}: {reply.get('error') or 'the trace failed'}")
    # The cast trace's tensors and graph; the metadata stays the cast problem's (its declared fp32 sizes
    # and tolerance are in_dtype's to translate).
    traced = problem_from_reply(problem.path, problem.source, reply, cast.id, problem.suite)
    return replace(cast, meta=replace(cast.meta, traced_in_cast=True), graph=traced.graph,
                   graph_outputs=traced.graph_outputs, ops=traced.ops, inputs=traced.inputs,
                   outputs=traced.outputs if traced.outputs is not None else cast.outputs, params=traced.params)


def in_each_dtype(problem: Problem, declared: dict[str, Any]) -> list[Problem]:
    """The problem in the dtype its CUFORGE "cast" names, or in each dtype its "dtypes" lists (fp32 itself;
    bf16, fp16 cast from it), or the problem alone."""
    cast = declared.get("cast")  # the file asks to be run in another dtype
    if cast is not None:
        try:
            return [load_in_dtype(problem, str(cast))]
        except ProblemError as e:
            raise ProblemError(f"CUFORGE cast: {e}") from None
    dtypes = declared.get("dtypes")
    if dtypes is None:
        return [problem]
    if not isinstance(dtypes, (list, tuple)) or not dtypes:
        raise ProblemError("CUFORGE dtypes must be a non-empty list such as ['fp32', 'bf16', 'fp16']")
    out = []
    for name in dtypes:
        if str(name).strip().lower() in ("fp32", "float32"):
            out.append(problem)
        else:
            try:
                out.append(load_in_dtype(problem, str(name)))
            except ProblemError as e:
                raise ProblemError(f"CUFORGE dtypes: {e}") from None
    return out


def load_files(
    paths: list[Path],
    suite: str | None = None,
    id_prefix: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_file: Callable[[Path], None] | None = None,
) -> tuple[list[Problem], list[SkippedProblem]]:
    problems: list[Problem] = []
    skipped: list[SkippedProblem] = []
    with shared_inspector():  # one inspector child for the files and their other dtypes' traces
        for path, source, reply in inspect_files(paths, "inspect", timeout_s, on_file):
            if not reply.get("ok"):
                skipped.append(SkippedProblem(str(path), reply.get("error") or "unknown failure"))
                continue
            pid = f"{id_prefix}/{path.stem}" if id_prefix else str(path)
            try:
                problems.extend(in_each_dtype(problem_from_reply(path, source, reply, pid, suite), reply["data"]["declared"]))
            except ProblemError as e:
                skipped.append(SkippedProblem(str(path), str(e)))
    return problems, skipped


def problem_files_in(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise ProblemError(f"{directory}: not a directory")
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


def validate_files(
    paths: list[Path], timeout_s: float = DEFAULT_TIMEOUT_S, on_file: Callable[[Path], None] | None = None
) -> list[tuple[Path, bool, str, dict[str, Any] | None]]:
    """Per file: (path, ok, one-line verdict, report). Runs each reference once on the CPU."""
    out: list[tuple[Path, bool, str, dict[str, Any] | None]] = []
    for path, source, reply in inspect_files(paths, "validate", timeout_s, on_file, use_cache=False):
        slow = not reply.get("ok") and reply.get("transient")
        if slow:
            # The CPU run of a big model (a bidirectional GRU, say) can outlast the limit; the file is
            # still valid if it inspects on the meta device. Its reference runs on the GPU when evaluated.
            (_, source, reply), = inspect_files([path], "inspect", timeout_s, use_cache=False)
            if reply.get("ok"):
                reply["data"]["reference_run"] = f"not run on the CPU: over {timeout_s:.0f} s at full size"
        if not reply.get("ok"):
            out.append((path, False, reply.get("error") or "unknown failure", None))
            continue
        try:
            problem = problem_from_reply(path, source, reply, str(path), None)
        except ProblemError as e:
            out.append((path, False, str(e), reply["data"]))
            continue
        verdict = f"{problem.shapes_summary()}; reference {reply['data'].get('reference_run', 'not run')}"
        if problem.meta.unknown:
            verdict += f"; unknown: {', '.join(problem.meta.unknown)}"
        out.append((path, True, verdict, reply["data"]))
    return out
