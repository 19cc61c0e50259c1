"""Extensions built ahead (sandbox/protocol/prebuilt.py): a candidate's load_inline build recorded in
one process is loaded, not built again, in another; any change to what is built misses; a GPU
supervisor builds a module candidate's extensions in a fresh compile-only worker before it waits for
the GPU's turn, and its evaluation loads them."""

import shutil
import threading
import time
import uuid

import pytest

from cuforge.sandbox.protocol import prebuilt

from cuforge.sandbox.protocol.evaluation import EvalConfig

pytestmark = pytest.mark.skipif(shutil.which("ninja") is None, reason="torch's load_inline needs ninja")
CPU_CFG = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=120)

# A Python extension without torch's headers: it builds in about a second.
TINY = r'''
#include <Python.h>
#define CAT(a, b) a##b
#define NAMED(a, b) CAT(a, b)
#define TEXT(a) #a
#define QUOTED(a) TEXT(a)
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, QUOTED(TORCH_EXTENSION_NAME), NULL, -1, methods};
PyMODINIT_FUNC NAMED(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
'''


def tiny(answer: int) -> str:
    """torch names the module (TORCH_EXTENSION_NAME: the name, versioned when rebuilt in one process)."""
    return TINY.replace("ANSWER", str(answer))


def pybound(answer: int) -> str:
    """A pybind11 module, as torch's extensions are (about 8 s to build without torch's headers): a
    process hands back the pybind11 module it already loaded under a name."""
    return ("#include <pybind11/pybind11.h>\n"
            f"static int answer() {{ return {answer}; }}\n"
            'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }\n')


def test_an_extension_built_ahead_is_loaded_not_built_again(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    name = f"tiny_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "first"))
    with prebuilt.recording() as built:
        module = cpp_extension.load_inline(name, cpp_sources=[tiny(42)], no_implicit_headers=True, extra_ldflags=[""])
    assert module.answer() == 42 and len(built) == 1
    packed = prebuilt.pack(built)

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "second"))
    with prebuilt.replaying(packed, tmp_path / "handed") as used:
        again = cpp_extension.load_inline(name, cpp_sources=[tiny(42)], no_implicit_headers=True, verbose=True,
                                          extra_ldflags=[""])
    assert again.answer() == 42 and used == list(packed)
    assert not (tmp_path / "second").exists()  # nothing was built for it
    first = next((tmp_path / "handed").rglob("*.so"))
    before = first.stat()
    # The same candidate again in this process (evaluated twice in one worker): a new file, the
    # loaded one left as it is.
    with prebuilt.replaying(packed, tmp_path / "handed") as used:
        third = cpp_extension.load_inline(name, cpp_sources=[tiny(42)], no_implicit_headers=True, extra_ldflags=[""])
    assert third.answer() == 42 and used == list(packed) and len(list((tmp_path / "handed").rglob("*.so"))) == 2
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert cpp_extension.load_inline is not None and "replaying" not in repr(cpp_extension.load_inline)

    # Another source under the same name is built, not served the recorded library.
    with prebuilt.replaying(packed, tmp_path / "handed") as used:
        other = cpp_extension.load_inline(name, cpp_sources=[tiny(7)], no_implicit_headers=True)
    assert other.answer() == 7 and used == []


def test_build_keys_see_what_is_built_and_ignore_how_it_is_logged():
    def load_inline(name, cpp_sources, cuda_sources=None, extra_cflags=None, verbose=False):  # noqa: ANN001, ANN202
        pass

    key = prebuilt.build_key(load_inline, ("m", ["int x;"]), {})
    assert key == prebuilt.build_key(load_inline, (), {"name": "m", "cpp_sources": ["int x;"], "verbose": True})
    assert key != prebuilt.build_key(load_inline, ("m", ["int y;"]), {})
    assert key != prebuilt.build_key(load_inline, ("m", ["int x;"]), {"extra_cflags": ["-O3"]})
    assert prebuilt.build_key(load_inline, (), {"nonsense": 1}) is None


def test_libraries_past_the_limit_are_left_to_build_in_the_evaluation(tmp_path, monkeypatch):
    small, big = tmp_path / "small.so", tmp_path / "big.so"
    small.write_bytes(b"x" * 10)
    big.write_bytes(b"x" * (prebuilt.MAX_BYTES + 1))
    assert set(prebuilt.pack({"a": small, "b": big, "c": tmp_path / "missing.so"})) == {"a"}


CANDIDATE = """
import torch
from torch.utils.cpp_extension import load_inline
# Flag lists as KernelBench's examples pass them: torch appends to extra_ldflags as it builds.
ext = load_inline("{name}", cpp_sources=[{source!r}], no_implicit_headers=True, extra_cflags=[""], extra_ldflags=[""])

class ModelNew(torch.nn.Module):
    def forward(self, a):
        return torch.relu(a) * (ext.answer() - 41)
"""


def test_a_gpu_supervisor_builds_a_candidates_extensions_before_its_turn(tmp_path):
    from turn_helpers import CpuWorkerTakingTurns, hold, wait_until

    from cuforge.sandbox.protocol.candidate import Candidate
    from template_helpers import problem_from_expr

    problem = problem_from_expr(tmp_path, "torch.relu(a)", "torch.randn(64, 64)", args="a")
    config = CPU_CFG
    gpu = f"test-{uuid.uuid4().hex}"
    sup = CpuWorkerTakingTurns(gpu=gpu)
    holder = None
    try:
        # What a GPU worker's hello says (this machine has none): which architecture to build for.
        sup.info = {**sup.start(), "compute_capability": "9.0"}
        holder = hold(gpu, 120)
        done = []
        name = f"pyb_{uuid.uuid4().hex[:8]}"
        cand = Candidate(CANDIDATE.format(name=name, source=pybound(42)))
        evaluator = threading.Thread(target=lambda: done.append(sup.evaluate(problem, cand, config)))
        evaluator.start()
        # Built and its builder ended while the holder still has the GPU: the build took no turn.
        assert wait_until(lambda: sup.builder is not None and sup.builder.spawns == 1 and sup.builder.proc is None)
        time.sleep(0.3)
        assert not done
        holder.kill()
        holder.wait()
        evaluator.join(timeout=120)
        ev = done[0]
        assert ev.status == "ok", (ev.status, ev.message)
        assert ev.correctness.get("prebuilt_extensions") == 1 and "prebuilt" not in ev.correctness

        # The next candidate gets a fresh builder: nothing of the first one's process reaches it. It
        # builds under the same name (as LLMs' candidates and KernelBench's adversarial kernels do) a
        # library whose answer doubles the output: served the first one's module, it would pass.
        ev2 = sup.evaluate(problem, Candidate(CANDIDATE.format(name=name, source=pybound(43))), config)
        assert ev2.status == "wrong_output" and ev2.correctness.get("prebuilt_extensions") == 1, (ev2.status, ev2.message)
        assert sup.builder.spawns == 2 and sup.builder.proc is None

        # The first candidate again, in the same worker: it loads a fresh copy of its library.
        again = sup.evaluate(problem, cand, config)
        assert again.status == "ok" and again.correctness.get("prebuilt_extensions") == 1, (again.status, again.message)

        # A build that fails ahead decides nothing: the evaluation builds (and fails) as it would have.
        broken = Candidate(CANDIDATE.format(name="broken_ext", source="this is not C++"))
        ev3 = sup.evaluate(problem, broken, config)
        assert ev3.status == "compile_error" and "prebuilt_extensions" not in ev3.correctness
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        sup.close()


def test_the_local_executor_builds_ahead_while_another_process_has_the_gpu(tmp_path):
    # The search calls build_ahead before it queues a candidate for a GPU: the build runs while the
    # GPU's turn is another's, and the evaluation loads what it built.
    from turn_helpers import CpuWorkerTakingTurns, hold

    from cuforge.sandbox.driver.executor import LocalExecutor
    from cuforge.sandbox.protocol.candidate import Candidate
    from template_helpers import problem_from_expr

    problem = problem_from_expr(tmp_path, "torch.relu(a)", "torch.randn(32, 32)", args="a")
    config = CPU_CFG
    gpu = f"test-{uuid.uuid4().hex}"
    sup = CpuWorkerTakingTurns(gpu=gpu)
    executor = LocalExecutor([gpu], supervisors=[sup])
    name = f"tiny_{uuid.uuid4().hex[:8]}"
    cand = Candidate(CANDIDATE.format(name=name, source=tiny(42)))
    holder = None
    try:
        assert executor.build_ahead(problem, cand, config) is None  # no GPU worker has named its architecture
        sup.info = {**sup.start(), "compute_capability": "9.0"}
        holder = hold(gpu, 120)
        packed = executor.build_ahead(problem, cand, config)  # returns while the holder has the GPU
        assert len(packed) == 1 and executor.builders is not None
        assert all(b.proc is None for b in executor.builders.all)  # each builder ends with its candidate
        assert executor.build_ahead(problem, Candidate("import torch\nclass ModelNew(torch.nn.Module): pass\n"),
                                    config) is None  # nothing to build
        holder.kill()
        holder.wait()
        ev = executor.evaluate(problem, cand, config, packed)
        assert ev.status == "ok" and ev.correctness.get("prebuilt_extensions") == 1, (ev.status, ev.message)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        executor.close()


def test_a_search_builds_a_candidates_extensions_before_it_queues_it_for_the_gpu(tmp_path, suite_dir):
    # A replayed LLM reply (a load_inline module, judged split as untrusted proposers' candidates are):
    # the search has the executor build it ahead, and the evaluation's host loads what was built.
    import json

    from turn_helpers import CpuWorkerTakingTurns, search_through

    from cuforge.agent.config import ProposerSpec, RunConfig

    name = f"tiny_{uuid.uuid4().hex[:8]}"
    reply = "Built inline.\n```python\n" + CANDIDATE.format(name=name, source=tiny(42)) + "```\n"
    replies = tmp_path / "replies.jsonl"
    replies.write_text(json.dumps({"text": reply, "tokens_in": 10, "tokens_out": 10}) + "\n")
    cfg = RunConfig(suite=str(suite_dir), proposers=[ProposerSpec("replay", replay_file=str(replies))],
                    islands=1, generations=1, concurrency=1, device="cpu", gpus="1")
    sup = CpuWorkerTakingTurns(gpu=f"test-{uuid.uuid4().hex}", judge="split")
    store, executor = search_through(cfg, sup, tmp_path / "r.db")
    (row,) = store.conn.execute("SELECT status, correctness FROM evaluations").fetchall()
    assert row[0] == "ok", row
    correctness = json.loads(row[1])
    assert correctness.get("prebuilt_extensions") == 1 and "prebuilt" not in correctness
    assert executor.builders is not None and all(b.spawns == 1 and b.proc is None for b in executor.builders.all)
    assert sup.builder is None  # built by the search's call, not by the supervisor holding the GPU slot
