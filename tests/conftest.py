import os
import sys
from pathlib import Path

import pytest

from outcome_log import pytest_configure, pytest_runtest_logreport  # noqa: F401 - CUFORGE_TEST_LOG=path: outcomes as they happen

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


HAS_GPU = _has_gpu()


def pytest_xdist_auto_num_workers(config):  # noqa: ANN001
    """`-n auto` on a machine of up to 4 cores: one test process more than cores. Much of the suite
    waits on processes it starts (jailed workers, inspectors, CLI runs) and on timeouts, so a process
    a core leaves them idle: on CI's 2 cores, 3 processes ran the suite in 13 minutes against 15.5-16.5."""
    cores = len(os.sched_getaffinity(0))
    return cores + 1 if cores <= 4 else cores


# A GPU test's own limit where it sets none. Evaluations on one GPU take turns (gpu_turn), so a test's
# time grows with the test processes sharing its GPU: a skinny-GEMM test of 30 evaluations passed in
# under 6.5 minutes beside 5 other test processes on one H200, and beside 11 it failed past the
# default 300 s while waiting for the GPU's turn.
GPU_TEST_TIMEOUT_S = 1200


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    if HAS_GPU:
        for item in items:
            if "gpu" in item.keywords and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(GPU_TEST_TIMEOUT_S))
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sup():
    """One GPU evaluation worker per test process (the GPU tests' shared fixture): a worker's start and
    self-test hold the GPU's turn, so one for each module that a process runs a test of costs the
    whole suite minutes of one GPU. A test that breaks the worker gets a fresh one from the supervisor,
    as a run would. Under pytest-xdist on a machine of several GPUs, test process gwN evaluates on GPU
    N mod their count: evaluations on one GPU take turns (gpu_turn), so spreading the processes over
    the GPUs is what makes them run at once."""
    import torch

    from cuforge.sandbox.driver.supervisor import Supervisor

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    s = Supervisor(gpu=int(worker[2:] or 0) % max(1, torch.cuda.device_count()))
    yield s
    s.close()


@pytest.fixture(scope="module")
def cpu_sup():
    """One CPU-mode evaluation worker per test module."""
    from cuforge.sandbox.driver.supervisor import Supervisor

    s = Supervisor(cpu_mode=True)
    yield s
    s.close()


@pytest.fixture(scope="session", autouse=True)
def _one_inspector():
    """Every problem this test process loads is traced by one inspector child, not a fresh one (a
    Python start and a torch import) per load."""
    from cuforge.problems.loader import shared_inspector

    with shared_inspector():
        yield


def session_cache_dir(tmp_path_factory, shared: bool = True) -> Path:  # noqa: ANN001
    """The cache the tests use, never the user's: by default one for all the test processes of a run
    (pytest-xdist gives each its own base folder under the run's), so a kernel the same seeds and
    problem make in two processes compiles once; a fresh one each run. `shared=False`: this test
    process's own, for tests that check nothing else wrote to it."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if shared and os.environ.get("PYTEST_XDIST_WORKER") else base) / "cache"


@pytest.fixture(autouse=True)
def _isolated_cache(request, tmp_path_factory, monkeypatch):  # noqa: ANN001
    # A module that sets OWN_CACHE = True (the jail's: a candidate must leave the cache as it found it)
    # gets its process's own cache, which other processes' compiles do not change under it.
    shared = not getattr(request.module, "OWN_CACHE", False)
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(session_cache_dir(tmp_path_factory, shared)))


def benchmark_module(name: str):
    """A script of benchmarks/ imported as a module (its own imports, `_common` among them, resolve there)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def run_cli(*args: str, env: dict | None = None, timeout: float = 300):
    import subprocess

    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "cuforge.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


RELU_PROBLEM = '''
import torch
N = {n}
CUFORGE = {{"policy": "{policy}", "flops": "{flops}", "bytes": "8 * N", "dtype": "float32"}}
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(N)]
def get_init_inputs():
    return []
'''


CONV_PROBLEM = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d({cin}, {cout}, 3, padding=1)

    def forward(self, x):
        return self.conv(x)

def get_inputs():
    return [torch.randn({batch}, {cin}, {hw}, {hw})]

def get_init_inputs():
    return []
"""


def conv_problem_source(cin: int = 4, cout: int = 8, batch: int = 2, hw: int = 16) -> str:
    """A plain-KernelBench-format 3x3 convolution problem (no CUFORGE dict), the precision tests' workload."""
    return CONV_PROBLEM.format(cin=cin, cout=cout, batch=batch, hw=hw)


def relu_problem_source(n: int = 4096, policy: str = "any", flops: str = "N") -> str:
    """A fp32 ReLU problem file, the test suites' smallest honest workload."""
    return RELU_PROBLEM.format(n=n, policy=policy, flops=flops)


@pytest.fixture
def suite_dir(tmp_path):
    """A directory suite holding one small fp32 ReLU problem (policy any)."""
    d = tmp_path / "suite"
    d.mkdir()
    (d / "relu.py").write_text(relu_problem_source())
    return d
