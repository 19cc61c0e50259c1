"""Caches that later evaluations trust: written only by trusted code, keyed by content, verified on read.

A worker's own cache (CUFORGE_CACHE_DIR) lies on its jail's scratch and dies with it: cubins,
Triton, inductor and extension builds made after candidate code ran are never reused by another
worker. What is worth sharing and cannot depend on a candidate - the machine's measured ceilings
and the cuBLASLt helper library - a new worker makes before it receives any candidate and hands to
its supervisor in its hello; the supervisor (outside the jail) writes each into the shared cache
with its SHA-256 beside it. Workers see the shared cache read-only (named on their command line,
`--shared-cache`, and set here by `configure`) and use an entry only when its bytes match that digest.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

# The only kinds of entry a worker may hand over, each one directory of the shared cache.
KINDS = ("ceilings", "native")
MAX_ENTRY_BYTES = 64 * 2**20


_SHARED: list[Path] = []  # the worker's shared cache, as its supervisor named it


def configure(shared: str | Path | None) -> None:
    """Where this process reads the shared cache (None: nowhere; each entry is made afresh)."""
    _SHARED[:] = [Path(shared)] if shared else []


def shared_dir() -> Path | None:
    return _SHARED[0] if _SHARED else None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verified_path(kind: str, name: str) -> Path | None:
    """The shared entry's path when it exists and its bytes match its recorded digest."""
    root = shared_dir()
    if root is None or kind not in KINDS:
        return None
    path = root / kind / name
    try:
        data = path.read_bytes()
        recorded = (root / kind / f"{name}.sha256").read_text().strip()
    except OSError:
        return None
    return path if _digest(data) == recorded else None


def verified_bytes(kind: str, name: str) -> bytes | None:
    path = verified_path(kind, name)
    return path.read_bytes() if path is not None else None


def handover(entries: dict[str, Path]) -> dict[str, str]:
    """Worker side, before any candidate: {'kind/name': base64 bytes} for its hello."""
    out: dict[str, str] = {}
    for rel, path in entries.items():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if len(data) <= MAX_ENTRY_BYTES:
            out[rel] = base64.b64encode(data).decode()
    return out


def accept(root: Path, offered: dict[str, str]) -> list[str]:
    """Supervisor side, at hello: write each well-formed entry and its digest into the shared cache;
    returns the entries written. A name that is not plain kind/file is refused."""
    written = []
    for rel, b64 in offered.items():
        kind, _, name = rel.partition("/")
        if kind not in KINDS or not name or "/" in name or name.startswith(".") or name.endswith(".sha256"):
            continue
        try:
            data = base64.b64decode(b64, validate=True)
        except (ValueError, TypeError):
            continue
        if len(data) > MAX_ENTRY_BYTES:
            continue
        d = root / kind
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{name}.tmp{os.getpid()}"
            tmp.write_bytes(data)
            (d / f".{name}.sha256.tmp{os.getpid()}").write_text(_digest(data) + "\n")
            tmp.replace(d / name)
            (d / f".{name}.sha256.tmp{os.getpid()}").replace(d / f"{name}.sha256")
        except OSError:
            continue  # a cache we cannot write only costs time
        written.append(rel)
    return written
