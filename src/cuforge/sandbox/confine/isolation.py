"""OS-level isolation for worker processes: a private network namespace where allowed, rlimits.

Used in children before they import torch, so nothing here may touch CUDA or import heavy modules.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000


# Address space a CPU-mode worker may map beyond its memory limit (libraries, thread stacks, arenas).
ADDRESS_SPACE_HEADROOM = 4 * 2**30


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 6 * 3600  # whole worker lifetime; a runaway host loop ends here at worst
    file_size_bytes: int = 4 * 2**30
    max_processes: int = 4096  # per user; blocks fork bombs without breaking thread pools (not for root: the kernel exempts uid 0)
    open_files: int = 65536
    core_dumps: bool = False
    # A hard address-space limit; only for workers without CUDA, whose driver reserves far more
    # virtual memory than it uses (GPU workers are held to their memory limit by resident-set polling).
    address_space_bytes: int | None = None


def _unshare(flags: int) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc.unshare(flags) == 0


def enter_private_network() -> bool:
    """Move this process into a new, empty network namespace (loopback down, no routes)."""
    if _unshare(CLONE_NEWNET):
        return True
    # Unprivileged: a user namespace first grants the right to make a network namespace.
    uid, gid = os.getuid(), os.getgid()
    if not _unshare(CLONE_NEWUSER | CLONE_NEWNET):
        return False
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError:
        pass
    return True


def apply_limits(limits: Limits) -> None:
    def setl(which: int, value: int) -> None:
        # Hard limits, not soft ones: candidate code could raise a soft limit back to the hard one.
        try:
            soft, hard = resource.getrlimit(which)
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (cap, cap))
        except (ValueError, OSError):
            pass

    setl(resource.RLIMIT_CPU, limits.cpu_seconds)
    setl(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    setl(resource.RLIMIT_NPROC, limits.max_processes)
    setl(resource.RLIMIT_NOFILE, limits.open_files)
    if not limits.core_dumps:
        setl(resource.RLIMIT_CORE, 0)
    if limits.address_space_bytes:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
        except (ValueError, OSError):
            pass


def child_setup(limits: Limits):  # noqa: ANN201
    """A preexec_fn: a new session (so one kill takes the whole group) and the limits.

    The private network namespace is entered by the worker itself at start, before it imports
    anything, so that it can report whether it got one.
    """

    def setup() -> None:
        os.setsid()
        apply_limits(limits)

    return setup
