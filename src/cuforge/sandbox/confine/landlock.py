"""The jail without namespaces: Landlock (file system, TCP, signals, abstract sockets) plus a seccomp
filter, applied by the worker to itself before it starts a thread or imports torch.

Landlock (ABI >= 6): reads only under the system, Python and package paths the supervisor names,
writes only in the worker's scratch directory, no TCP bind or connect, no signal to a process
outside the sandbox, no ptrace of one (so no /proc/<driver>/environ), no abstract unix socket
outside it. seccomp: no socket but AF_UNIX (UDP and raw sockets are outside Landlock's reach), no
ptrace, process_vm_*, setns, unshare, mount, pivot_root, bpf, kernel modules or kexec, and no
setsid/setpgid, so that the supervisor's process-group kill reaches every process a candidate
starts. Pure ctypes: nothing here may import torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
MIN_ABI = 6  # signal and abstract-socket scoping

# Landlock file-system rights, by the ABI that introduced them.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV

# seccomp: (audit arch, seccomp syscall, {name: number}) per machine.
_ARCHES = {
    "x86_64": (0xC000003E, 317, {"socket": 41, "socketpair": 53, "ptrace": 101, "process_vm_readv": 310,
                                 "process_vm_writev": 311, "setns": 308, "unshare": 272, "mount": 165,
                                 "umount2": 166, "pivot_root": 155, "kexec_load": 246, "init_module": 175,
                                 "finit_module": 313, "bpf": 321, "setsid": 112, "setpgid": 109}),
    "aarch64": (0xC00000B7, 277, {"socket": 198, "socketpair": 199, "ptrace": 117, "process_vm_readv": 270,
                                  "process_vm_writev": 271, "setns": 268, "unshare": 97, "mount": 40,
                                  "umount2": 39, "pivot_root": 41, "kexec_load": 104, "init_module": 105,
                                  "finit_module": 273, "bpf": 280, "setsid": 157, "setpgid": 154}),
}
AF_UNIX = 1
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


class LandlockError(OSError):
    pass


NOBODY = 65534


def jail_uid() -> int | None:
    """The unprivileged uid a worker started as root runs as (CUFORGE_JAIL_UID, default 65534): as
    root, Landlock alone leaves every root process's /proc/<pid>/environ readable. None when not root,
    or when CUFORGE_JAIL_UID=0 keeps the worker root on purpose (that hole open)."""
    if os.geteuid() != 0:
        return None
    raw = os.environ.get("CUFORGE_JAIL_UID", str(NOBODY))
    try:
        uid = int(raw)
    except ValueError:
        raise LandlockError(errno.EINVAL, f"CUFORGE_JAIL_UID={raw!r} is not a number") from None
    if uid < 0:
        raise LandlockError(errno.EINVAL, f"CUFORGE_JAIL_UID={uid} is not a uid")
    return uid or None


def unreadable_to(uid: int, path: str) -> str | None:
    """The first directory on the way to `path` (or `path` itself) that `uid`, with no supplementary
    groups, could not enter or read - judged from the mode bits, before any process drops to it."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        here = os.sep + os.path.join(*parts[1:i]) if i > 1 else os.sep
        try:
            st = os.stat(here)
        except OSError:
            return None  # a path this machine lacks: nothing to read there
        last = i == len(parts)
        need = (stat.S_IROTH | stat.S_IXOTH) if last and os.path.isdir(here) else stat.S_IROTH if last else stat.S_IXOTH
        if st.st_uid == uid:
            need <<= 6
        elif st.st_gid == uid:
            need <<= 3
        if st.st_mode & need != need:
            return here
    return None


def drop_to(uid: int, must_read: list[str]) -> None:
    """Become `uid` (group the same number, no supplementary groups) for good, then check that the
    paths the worker runs from are still readable: a Python prefix under /root is not, for one."""
    present = [p for p in must_read if os.path.exists(p)]  # seen as root, before the drop
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    for path in present:
        if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            raise LandlockError(errno.EACCES, f"the jail's uid {uid} cannot read {path}: make it readable to "
                                              "others or set CUFORGE_JAIL_UID")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    try:
        v = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(v), 0)


def seccomp_supported() -> bool:
    return platform.machine() in _ARCHES


def available() -> tuple[bool, str]:
    abi = landlock_abi()
    if abi < MIN_ABI:
        return False, f"Landlock ABI {abi} (need {MIN_ABI}: signal scoping)" if abi else "Landlock not enabled"
    if not seccomp_supported():
        return False, f"no seccomp filter for {platform.machine()}"
    return True, f"Landlock ABI {abi} + seccomp"


def _fs_rights(abi: int) -> int:
    rights = FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _check(result: int, what: str) -> int:
    if result < 0:
        e = ctypes.get_errno()
        raise LandlockError(e, f"{what}: {os.strerror(e)}")
    return result


def restrict(read_only: list[str], writable: list[str], devices: list[str], allow: tuple[str, ...] = ()) -> None:
    """Confine this process (and every thread and child it makes from now on). `allow`: system
    calls of the seccomp list to leave allowed."""
    libc = _libc()
    abi = landlock_abi()
    if abi < MIN_ABI:
        raise LandlockError(errno.ENOSYS, f"Landlock ABI {abi} < {MIN_ABI}")
    handled = _fs_rights(abi)
    attr = struct.pack("QQQ", handled, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
                "landlock_create_ruleset")
    try:
        for paths, rights in ((read_only, READ), (writable, handled), (devices, DEVICE & handled)):
            for path in paths:
                try:
                    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path this machine lacks
                try:
                    allowed = rights if os.path.isdir(path) else rights & (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE
                                                                           | FS_TRUNCATE | FS_IOCTL_DEV)
                    rule = struct.pack("=Qi", allowed, pfd)
                    rbuf = ctypes.create_string_buffer(rule, len(rule))
                    _check(libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), rbuf,
                                        ctypes.c_uint32(0)), f"landlock_add_rule {path}")
                finally:
                    os.close(pfd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(fd)
    _install_seccomp(libc, allow)


def install_seccomp_only(allow: tuple[str, ...] = ()) -> None:
    """The seccomp half alone, where the kernel has no Landlock (a candidate host inside the
    namespace jail on such a kernel)."""
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _install_seccomp(libc, allow)


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None, allow: tuple[str, ...] = ()) -> bytes:
    """The filter: deny the listed syscalls (but those in `allow`) with EPERM, socket/socketpair
    unless AF_UNIX."""
    arch, _, nrs = _ARCHES[machine or platform.machine()]
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
    deny = RET_ERRNO | errno.EPERM
    denied = [n for name, n in nrs.items() if name not in ("socket", "socketpair", *allow)]
    prog = [_bpf(ld_w_abs, 0, 0, 4), _bpf(jeq_k, 1, 0, arch), _bpf(ret_k, 0, 0, deny),  # foreign arch: deny all
            _bpf(ld_w_abs, 0, 0, 0)]
    if arch == _ARCHES["x86_64"][0]:  # x32 system calls (nr | 2^30) would dodge the numbers below
        prog += [_bpf(0x35, 0, 1, 0x40000000), _bpf(ret_k, 0, 0, deny)]
    for n in denied:
        prog += [_bpf(jeq_k, 0, 1, n), _bpf(ret_k, 0, 0, deny)]
    for name in ("socket", "socketpair"):
        # nr == socket ? (args[0] == AF_UNIX ? allow : deny) : next
        prog += [_bpf(jeq_k, 0, 4, nrs[name]), _bpf(ld_w_abs, 0, 0, 16), _bpf(jeq_k, 0, 1, AF_UNIX),
                 _bpf(ret_k, 0, 0, RET_ALLOW), _bpf(ret_k, 0, 0, deny)]
    prog.append(_bpf(ret_k, 0, 0, RET_ALLOW))
    return b"".join(prog)


def _install_seccomp(libc: ctypes.CDLL, allow: tuple[str, ...] = ()) -> None:
    _, nr_seccomp, _ = _ARCHES[platform.machine()]
    code = seccomp_program(allow=allow)
    filt = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(code) // 8, ctypes.addressof(filt))
    _check(libc.syscall(nr_seccomp, ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC),
                        ctypes.byref(fprog)), "seccomp")
