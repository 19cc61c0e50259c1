"""Writing outputs without destroying anything: no command overwrites a file it did not create.

A single output file (an HTML report, a CSV) replaces an existing file only with --force, and
never the results store being read nor any SQLite database. An output directory (an export) must
be empty, new, or one cuforge made: a manifest in it lists what cuforge wrote there with each
file's hash, so a later export may replace those files (unless someone edited them since), and
refuses, listing the paths, wherever it would touch anything else."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

from cuforge.fmt import file_kind

MANIFEST = ".cuforge-export.json"
STDOUT = "-"  # an output file named "-" is standard output


class OutputError(RuntimeError):
    """An output would replace or delete something cuforge did not create; the message lists it."""


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def is_stdout(path: Path | str) -> bool:
    return str(path) == STDOUT


def check_output_file(path: Path, force: bool = False, protected: tuple[Path, ...] = ()) -> None:
    """Refuse an output path that is not a regular file (a device, a FIFO, a socket, a directory,
    followed through links), a protected file (the store being read, with its -wal/-shm), an SQLite
    database, or an existing file without --force. "-" is standard output."""
    from cuforge.results.store import is_sqlite_file

    if is_stdout(path):
        return
    for p in protected:
        for q in (p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")):
            if _same_file(path, q):
                raise OutputError(f"{path} is the results store being read; write the output elsewhere")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise OutputError(f"{path} is {file_kind(mode)}; name a regular file (or - for standard output)")
    if is_sqlite_file(path):
        raise OutputError(f"{path} is an SQLite database; cuforge never overwrites one, even with --force")
    if not force:
        raise OutputError(f"{path} exists; pass --force to replace it")


def write_file(path: Path, data: str | bytes) -> None:
    """Write through a temporary file so that a failure never leaves a half-written output; "-"
    writes to standard output. A write that fails (a full disk) raises OutputError naming the path."""
    raw = data if isinstance(data, bytes) else data.encode()
    if is_stdout(path):
        sys.stdout.flush()
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            f.write(raw)
        tmp.replace(path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def _digest(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _read_manifest(out: Path) -> dict[str, str]:
    try:
        data = json.loads((out / MANIFEST).read_text())
        files = data.get("files", {})
        return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def _file_digest(path: Path) -> str | None:
    """A regular file's hash; None for anything else (reading a FIFO would block)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def check_output_dir(out: Path) -> None:
    """Before any work: the directory is new, empty, or cuforge-made."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is {file_kind(os.stat(out).st_mode)}, not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        entries = sorted(p.name for p in out.iterdir())
        shown = ", ".join(entries[:8]) + (f" (+{len(entries) - 8} more)" if len(entries) > 8 else "")
        raise OutputError(f"{out} is not empty and was not made by cuforge (it holds {shown}); "
                          "export into a new or empty directory")


def write_tree(out: Path, files: dict[Path, str | bytes]) -> list[Path]:
    """Write files under `out` and record them in its manifest. Files of an earlier export that
    this one no longer writes are removed, if unchanged. Refuses, listing every conflicting path,
    if it would replace a file cuforge did not write or one edited since."""
    check_output_dir(out)
    old = _read_manifest(out)
    rel = {p.relative_to(out).as_posix(): data for p, data in files.items()}
    conflicts = []
    for name in rel:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            conflicts.append(f"{name} (a directory)")
        elif path.exists() or path.is_symlink():
            if name not in old:
                conflicts.append(f"{name} (not written by cuforge)")
            elif _file_digest(path) != old[name]:
                conflicts.append(f"{name} (changed since cuforge wrote it)")
    stale = [n for n in old if n not in rel and (out / n).exists()]
    conflicts += [f"{n} (changed since cuforge wrote it)" for n in stale if _file_digest(out / n) != old[n]]
    if conflicts:
        raise OutputError(f"export into {out} would replace: {'; '.join(conflicts[:10])}"
                          + (f" (+{len(conflicts) - 10} more)" if len(conflicts) > 10 else "")
                          + "; move them away or export elsewhere")
    for name in stale:
        (out / name).unlink()
    for name, data in rel.items():
        write_file(out / name, data)
    manifest = {"written_by": "cuforge export", "files": {n: _digest(d) for n, d in sorted(rel.items())}}
    write_file(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return sorted(files)
