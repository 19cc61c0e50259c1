"""One evaluation at a time on a GPU, across every cuforge process of this machine. Another run's kernels
on the same GPU stretch this one's timings, and the judges' checks for work a candidate hides from the
timer (timing.escaped_work's wall clock against events; brackets.RemoteBracketTimer._busy_after's probe)
cannot tell their kernels from the candidate's: evaluators sharing a GPU would accuse honest kernels.

The turn is an exclusive flock on a per-GPU file in the system's temporary directory: the kernel drops
it when its holder exits or is killed, so no crash leaves a GPU locked."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR = "cuforge-gpu-turns"


def turn_path(gpu_id: str) -> Path:
    """The lock file of a physical GPU (its index or UUID, as CUDA_VISIBLE_DEVICES names it)."""
    return Path(tempfile.gettempdir()) / LOCK_DIR / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu_id)}.lock"


def _open(path: Path) -> int:
    if not path.parent.is_dir():
        path.parent.mkdir(exist_ok=True)
        try:  # every user's runs share the directory, as they share the GPU
            path.parent.chmod(0o1777)
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)  # flock needs no write access
    try:
        os.fchmod(fd, 0o666)
    except OSError:  # another user's file: theirs to set
        pass
    return fd


class TurnAbandoned(Exception):
    """The waiter gave up before the GPU's turn came (its evaluator was shut down meanwhile)."""


def _others_waiting(wait_fd: int) -> bool:
    """Whether another process announced that it waits for this GPU's turn (holds the waiters' file)."""
    try:
        fcntl.flock(wait_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(wait_fd, fcntl.LOCK_UN)
    return False


@contextmanager
def gpu_turn(gpu_id: str, give_up: Callable[[], bool] | None = None, poll_s: float = 0.02) -> Iterator[float | None]:
    """Hold the GPU's turn for the block; yields the seconds waited for it, or None where the lock file
    cannot be made (a read-only temporary directory): the block then runs without a turn, as before.
    While waiting, `give_up()` is asked every `poll_s`; when it says so, TurnAbandoned is raised (a
    blocking wait would hold a stopped run's thread until another process's evaluation ended).

    Waiters announce themselves with a shared lock on a second file, and a process that finds others
    waiting queues behind them for a poll or two: without it, one evaluating candidates back to back
    takes the turn again the moment it lets go, before any poller wakes, and starves the others."""
    try:
        fd = _open(turn_path(gpu_id))
        wait_fd = _open(turn_path(gpu_id).with_suffix(".waiting"))
    except OSError:
        yield None
        return
    try:
        t0 = time.monotonic()
        polite = _others_waiting(wait_fd)
        announced = False
        while True:
            if not polite:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
            polite = False
            if not announced:
                fcntl.flock(wait_fd, fcntl.LOCK_SH)
                announced = True
            if give_up is not None and give_up():
                raise TurnAbandoned(f"gave up waiting for GPU {gpu_id}'s turn after {time.monotonic() - t0:.1f} s") from None
            time.sleep(poll_s)
        os.close(wait_fd)  # no longer waiting
        wait_fd = -1
        yield time.monotonic() - t0
    finally:
        if wait_fd >= 0:
            os.close(wait_fd)
        os.close(fd)  # closing the only descriptor releases the lock


def turn_busy(gpu_id: str) -> bool:
    """Whether another process holds this GPU's turn or waits for it now (False where the lock files
    cannot be made): work that needs no GPU is worth doing before taking a turn that is not free."""
    try:
        fd = _open(turn_path(gpu_id))
        wait_fd = _open(turn_path(gpu_id).with_suffix(".waiting"))
    except OSError:
        return False
    try:
        if _others_waiting(wait_fd):
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(wait_fd)
        os.close(fd)  # releases the lock if it was taken here


def _live_processes() -> dict[int, int]:
    """pid -> parent pid of every process that has not exited, from /proc. A zombie has closed its
    files, and its GPU context with them, so it does not count."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if state not in ("Z", "X"):
            out[int(entry.name)] = int(ppid)
    return out


def process_tree(pid: int) -> set[int]:
    """A process and all its live descendants (a jail's processes run in their own session, out of
    the reach of its process group)."""
    children: dict[int, list[int]] = {}
    for child, parent in _live_processes().items():
        children.setdefault(parent, []).append(child)
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children.get(p, ()))
    return tree


def wait_exited(pids: set[int], timeout_s: float = 10.0) -> bool:
    """Wait until all these processes have exited, at most `timeout_s`; whether they did. A worker
    killed in a hung kernel keeps the GPU busy while the driver tears its context down: the turn is
    held until then, so the next evaluation (of any process) is not timed beside it."""
    deadline = time.monotonic() + timeout_s
    while pids & _live_processes().keys():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def physical_gpu(gpu: int | str | None) -> str:
    """The id the worker's CUDA_VISIBLE_DEVICES gets: a string is already one (the executors pass
    physical ids); an int indexes this process's own CUDA_VISIBLE_DEVICES when that is set."""
    if isinstance(gpu, str):
        return gpu
    index = gpu or 0
    visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return visible[index] if index < len(visible) else str(index)
