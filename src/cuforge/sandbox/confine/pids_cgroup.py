"""A pids cgroup for each jailed worker started as root.

The kernel exempts uid 0 from RLIMIT_NPROC, so inside bubblewrap's jail a root candidate's fork
bomb is bounded only in lifetime (the jail ends with its worker), not in count. A pids cgroup bounds
the count of processes and threads whatever the uid. The cgroup is made beside the driver's own
(cgroup v2: a sibling of its cgroup, whose parent may delegate `pids`; v1: under its place in the
`pids` hierarchy), so limits set above the driver (a container's memory cap) still hold. Pure
file-system work: nothing here may import torch.
"""

from __future__ import annotations

import errno
import itertools
import os
import time
from pathlib import Path

_SERIAL = itertools.count()


class CgroupError(OSError):
    pass


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, type, options) of each cgroup mount."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    out.append((parts[1], parts[2], parts[3]))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: '' for v2, the controllers for v1."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                out[controllers] = path
    except (OSError, ValueError):
        pass
    return out


def parent_dir() -> Path | None:
    """The directory new pids cgroups go under, or None where none can be made."""
    own = _own_paths()
    for mount, kind, opts in _mounts():
        if kind == "cgroup" and "pids" in opts.split(","):
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
            if path is not None:
                return Path(mount + path.rstrip("/")) if path != "/" else Path(mount)
    for mount, kind, _ in _mounts():
        if kind != "cgroup2" or "" not in own:
            continue
        here = Path(mount) / own[""].lstrip("/")
        # v2 forbids controllers in a cgroup that holds processes (the root excepted): a new cgroup
        # goes beside this one, under a parent that hands `pids` down to its children. A parent that
        # has the controller but does not hand it down yet (a container runtime's slice, which holds
        # no process itself) is asked to: that changes no limit of anything already in it.
        parent = here if own[""] == "/" else here.parent
        if _delegates_pids(parent):
            return parent
    return None


def _delegates_pids(parent: Path) -> bool:
    try:
        if "pids" in (parent / "cgroup.subtree_control").read_text().split():
            return True
        if "pids" not in (parent / "cgroup.controllers").read_text().split():
            return False
        (parent / "cgroup.subtree_control").write_text("+pids")
        return "pids" in (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def available() -> tuple[bool, str]:
    """Whether this process can make a pids cgroup, and where or why not."""
    if os.geteuid() != 0:
        return False, "not root (the process limit binds)"
    parent = parent_dir()
    if parent is None:
        return False, "no pids cgroup controller this process can use"
    if not os.access(parent, os.W_OK):
        return False, f"{parent} is not writable"
    return True, f"pids cgroup under {parent}"


class PidsCgroup:
    """One worker's cgroup: made before the worker starts, joined by it before it execs, removed
    once every process in it has ended."""

    def __init__(self, max_pids: int, parent: Path | None = None) -> None:
        parent = parent or parent_dir()
        if parent is None:
            raise CgroupError(errno.ENOENT, "no pids cgroup controller this process can use")
        self.path = parent / f"cuforge-{os.getpid()}-{next(_SERIAL)}"
        try:
            self.path.mkdir()
            (self.path / "pids.max").write_text(str(max_pids))
        except OSError as e:
            self.remove()
            raise CgroupError(e.errno or errno.EIO, f"cannot make a pids cgroup at {self.path}: {e.strerror}") from None
        self.procs = str(self.path / "cgroup.procs")

    def join(self) -> None:
        """Move the calling process in: for a preexec_fn, so only os-level calls, no allocation-heavy work."""
        fd = os.open(self.procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def remove(self, wait_s: float = 2.0) -> None:
        """rmdir once empty: a killed process leaves its cgroup only when it is reaped."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return  # left for the next boot; an empty cgroup costs nothing
                time.sleep(0.02)
