"""Runs inside a real worker (op "probe") and tries what a hostile candidate would: `cuforge doctor`
reports the jail from these answers, and the driver checks the network ones from its own side.

Each check is (name, held, detail); `held` is True when the jail stopped the attempt.
"""

from __future__ import annotations

import os
import resource
import socket
from typing import Any


def _check(name: str, held: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "held": bool(held), "detail": detail}


def _processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _environ_secrets(names: list[str]) -> list[str]:
    """Secret names found in any visible process's environment."""
    found = set()
    for pid in _processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        for entry in data.split(b"\0"):
            key = entry.split(b"=", 1)[0].decode(errors="replace")
            if key in names:
                found.add(f"{key} (pid {pid})")
    return sorted(found)


def _can_connect(host: str, port: int) -> bool:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False  # no socket at all (the Landlock jail's seccomp filter)
    s.settimeout(1.0)
    try:
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _readable(path: str) -> bool:
    """Can its contents be read (a directory listed, a file opened)? Landlock leaves a path's
    existence visible; what matters is that nothing in it can be read."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        return True
    except OSError:
        return False


def _writable(path: str) -> bool:
    """Can a new file be made in this directory (or next to this file)?"""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    probe = os.path.join(d, f".cuforge-jail-probe-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("x")
    except OSError:
        return False
    os.unlink(probe)
    return True


def probe(targets: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    pids = _processes()
    driver = targets.get("driver_pid")
    checks.append(_check("processes", len(pids) <= 8 and (driver is None or driver not in pids or driver in (1, os.getpid())),
                         f"{len(pids)} process(es) visible" + (f"; the driver (pid {driver}) is not" if driver else "")))
    secrets = _environ_secrets(list(targets.get("secret_names") or []))
    checks.append(_check("secrets", not secrets, "no secret in any visible environment" if not secrets
                         else f"visible: {', '.join(secrets)}"))
    listen = targets.get("listen")
    if listen:
        reached = _can_connect(listen[0], int(listen[1]))
        checks.append(_check("network", not reached, f"{'reached' if reached else 'cannot reach'} the driver's "
                             f"listener on {listen[0]}:{listen[1]}"))
    for path in targets.get("hidden") or []:
        readable = _readable(path)
        checks.append(_check("hidden", not readable, f"{path} {'readable' if readable else 'not readable'}"))
    for path in targets.get("read_only") or []:
        w = os.path.exists(path) and _writable(path)
        checks.append(_check("read-only", not w, f"{path} {'writable' if w else 'not writable'}"))
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    checks.append(_check("limits", hard != resource.RLIM_INFINITY and soft == hard,
                         f"hard CPU-time limit {hard} s" if hard != resource.RLIM_INFINITY else "no hard CPU-time limit"))
    home = os.environ.get("HOME", "")
    checks.append(_check("scratch", _writable(home) and _writable(os.environ.get("TMPDIR", "/tmp")),
                         f"HOME and TMPDIR ({home}) are a private writable scratch"))
    return checks
