"""Template kernels compiled ahead (sandbox/protocol/prebuilt_cubins.py): the kernels a format-B or
staged module compiles are read from its source, never run; a compile-only worker compiles them with
NVRTC and stays up for the next candidate; an evaluation handed the cubins finds them under the keys its
own compiles ask for; a GPU supervisor compiles ahead only while another process has or awaits the
GPU's turn, and only for the in-process judge; the search's executor compiles ahead of the queue."""

import base64
import json
import uuid

import pytest

from cuforge import runtime
from cuforge.kernels.families import families_for
from cuforge.sandbox.driver.executor import LocalExecutor
from cuforge.sandbox.driver.gpu_turn import gpu_turn, turn_busy
from cuforge.sandbox.driver.supervisor import Supervisor
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, wrap_stages
from cuforge.sandbox.protocol.evaluation import EvalConfig
from cuforge.sandbox.protocol.prebuilt_cubins import CUBIN, KernelSource, kernel_sources, seed_cubins
from template_helpers import problem_from_expr
from turn_helpers import CpuWorkerTakingTurns, hold, search_through, wait_until

CFG = EvalConfig(device="cpu", trials=2, min_samples=5, max_samples=10, timeout_s=120)
SCALE = r"""extern "C" __global__ void scale(const float* x, float* y, long long n, float s) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
"""
SPEC = LaunchSpec(entry="scale", grid="(cdiv(in0.numel(), 256),)", block="(256,)",
                  args=("in0", "out0", "in0.numel()", "2.0"), outputs=(("in0.shape", "float32"),),
                  options=("-DSCALE_TEST=1",))


@pytest.fixture(scope="module")
def relu(tmp_path_factory):
    """torch.relu over a 64 x 64 input, and the template library's first kernel for it."""
    problem = problem_from_expr(tmp_path_factory.mktemp("relu"), "torch.relu(a)", "torch.randn(64, 64)", args="a")
    fam = families_for(problem)[0][0]
    return problem, fam.render(fam.seeds(problem)[0], problem)


class CompilingWorkerTakingTurns(CpuWorkerTakingTurns):
    """A GPU supervisor whose worker compiles for sm_90a without a GPU: its imports of format-B
    kernels compile (where a CPU worker cannot ask a GPU its architecture), and then fail to launch."""

    def _command(self):  # noqa: ANN202
        args, env = super()._command()
        return [*args, "--compile-only", "--arch", "sm_90a"], env


def test_the_kernels_a_module_compiles_are_read_from_its_source(relu):
    _, templated = relu
    (k,) = kernel_sources(templated)
    assert k == KernelSource(templated.source, templated.launch.options, templated.launch.name_expressions)
    single = Candidate(SCALE, "kernel", SPEC)
    assert kernel_sources(single) == [KernelSource(SCALE, ("-DSCALE_TEST=1",))]
    other = SCALE.replace("* s", "+ s")
    staged = Candidate(wrap_stages([(SCALE, SPEC), (other, SPEC)], [None, [("stage", 0)]]))
    assert [k.source for k in kernel_sources(staged)] == [SCALE, other]
    # A module written otherwise names none: it compiles (or builds) its own, in its evaluation.
    assert kernel_sources(Candidate("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")) == []
    assert kernel_sources(Candidate("src = make()\n_Stage(src, (), (), 'k')\n")) == []  # not literals
    assert kernel_sources(Candidate("_Stage('x', (), (), 'k'\n")) == []  # not Python
    # Each distinct source is written once, in the module's literal table, and read from it.
    twice = wrap_stages([(SCALE, SPEC), (SCALE, SPEC), (other, SPEC)], [None, [("stage", 0)], [("stage", 1)]])
    assert twice.count("long long i = blockIdx.x") == 2 and "_KERNEL_SOURCES[1]" in twice
    assert [k.source for k in kernel_sources(Candidate(twice))] == [SCALE, other]
    assert kernel_sources(Candidate("_KERNEL_SOURCES = make()\n_Stage(_KERNEL_SOURCES[0], (), (), 'k')\n")) == []
    assert kernel_sources(Candidate("_KERNEL_SOURCES = ('x',)\n_Stage(_KERNEL_SOURCES[3], (), (), 'k')\n")) == []


def test_a_compile_only_worker_compiles_them_and_an_evaluation_finds_them(relu):
    problem, templated = relu
    builder = Supervisor(compile_only=True, target_arch="sm_90a")
    sup = Supervisor(compile_only=True)
    try:
        bad = KernelSource("extern \"C\" __global__ void k() { undefined_name(); }")
        packed = builder.compile_kernels([*kernel_sources(templated), bad], 120)
        # The one that compiles, under the key its evaluation's compile asks for; the other is left
        # to its evaluation, which reports NVRTC's diagnostics.
        key = runtime.cubin_key(templated.source, templated.launch.options, "sm_90a", templated.launch.name_expressions)
        assert list(packed) == [CUBIN + key]
        assert base64.b64decode(json.loads(packed[CUBIN + key])["cubin"])[:4] == b"\x7fELF"
        proc = builder.proc
        packed2 = builder.compile_kernels(kernel_sources(Candidate(SCALE, "kernel", SPEC)), 120)
        assert len(packed2) == 1 and builder.proc is proc and builder.spawns == 1  # one worker for many candidates

        ev = sup.evaluate(problem, templated, replace_cfg(), packed)
        assert ev.status == "compiled" and ev.correctness.get("prebuilt_cubins") == 1, (ev.status, ev.message)
        # Without them nothing counts as built ahead; entries with a key that is no cache key, or no cubin, are not seeded.
        ev = sup.evaluate(problem, templated, replace_cfg(), {})
        assert ev.status == "compiled" and "prebuilt_cubins" not in ev.correctness
        forged = {CUBIN + "../../escape": packed[CUBIN + key], CUBIN + "0" * 64: "not json"}
        assert seed_cubins(forged) == 0
    finally:
        builder.close()
        sup.close()


def test_a_network_s_kernels_compile_at_once_and_all_are_built_ahead():
    """A partition of a network names dozens of distinct kernels: runtime.compile_many compiles those not
    cached several at once (a failing one is left to its own compile, which reports NVRTC's diagnostics),
    and a compile-only worker packs more of them than the 16 it once stopped at."""
    tag = uuid.uuid4().hex[:8]  # kernels no earlier run of this test left in the disk cache
    sources = [SCALE.replace("* s", f"* s + {i}.0f").replace("scale(", f"scale_{tag}(") for i in range(20)]
    bad = f'extern "C" __global__ void k_{tag}() {{ undefined_name(); }}'
    kernels = [(src, ("-DSCALE_TEST=1",), ()) for src in sources[:3]]
    assert runtime.compile_many([*kernels, kernels[0], (bad, (), ())], "sm_90a") == 3
    for src, options, names in kernels:
        assert runtime.compile_to_cubin(src, "sm_90a", options, names)[2].cache == "memory"
    with pytest.raises(runtime.CompileError, match="undefined_name"):
        runtime.compile_to_cubin(bad, "sm_90a")
    spec = LaunchSpec(entry=f"scale_{tag}", grid=SPEC.grid, block=SPEC.block, args=SPEC.args, outputs=SPEC.outputs)
    staged = Candidate(wrap_stages([(src, spec) for src in sources], [None] + [[("stage", i)] for i in range(19)]))
    assert len(kernel_sources(staged)) == 20
    builder = Supervisor(compile_only=True, target_arch="sm_90a")
    try:
        assert len(builder.compile_kernels(kernel_sources(staged), 300)) == 20
    finally:
        builder.close()


def test_a_fresh_process_s_first_compiles_run_at_once(tmp_path):
    """compile_many may be the first to import cuda.core in a process (a candidate host importing a
    staged module): it imports it before its threads start, since threads importing it at once can see
    it half initialised (a compile failed that way once here, under load, and would have run again one
    by one). Every kernel compiles on the threads."""
    import subprocess
    import sys

    code = (f"from cuforge import runtime\nsrc = {SCALE!r}\n"
            "kernels = [(src.replace('* s', f'* s + {i}.0f'), (), ()) for i in range(6)]\n"
            "print(runtime.compile_many(kernels, 'sm_90a', threads=6))\n")
    env = {**__import__("os").environ, "CUFORGE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["6"], (done.stdout, done.stderr[-2000:])


def replace_cfg() -> EvalConfig:
    import dataclasses

    return dataclasses.replace(CFG, compile_only=True)


def test_the_gpu_turn_says_when_it_is_busy():
    gpu = f"test-{uuid.uuid4().hex}"
    assert not turn_busy(gpu)
    with gpu_turn(gpu):
        assert turn_busy(gpu)
    assert not turn_busy(gpu)
    holder = hold(gpu, 60)
    try:
        assert turn_busy(gpu)
    finally:
        holder.kill()
        holder.wait()
    assert wait_until(lambda: not turn_busy(gpu), 10)


def test_a_gpu_supervisor_compiles_ahead_only_while_the_gpu_is_busy(relu):
    import threading

    problem, templated = relu
    fam = families_for(problem)[0][0]
    other = fam.render(fam.seeds(problem)[1], problem)
    gpu = f"test-{uuid.uuid4().hex}"
    sup = CompilingWorkerTakingTurns(gpu=gpu, judge="inprocess")
    split = CpuWorkerTakingTurns(gpu=gpu, judge="split")
    holder = None
    try:
        sup.info = {**sup.start(), "compute_capability": "9.0"}  # what a GPU worker's hello says
        # An idle GPU: the kernel compiles in the evaluation's turn, which keeps no one waiting.
        ev = sup.evaluate(problem, templated, CFG)
        assert "prebuilt_cubins" not in ev.correctness and sup.kernel_builder is None, ev.correctness
        # Another process has the GPU: compiled meanwhile, and the evaluation finds the cubin.
        holder = hold(gpu, 120)
        done = []
        evaluator = threading.Thread(target=lambda: done.append(sup.evaluate(problem, other, CFG)))
        evaluator.start()
        assert wait_until(lambda: sup.kernel_builder is not None and sup.kernel_builder.alive())
        assert not done  # still waiting for the turn
        holder.kill()
        holder.wait()
        evaluator.join(timeout=120)
        # The kernel cannot run on this machine (no GPU), but its evaluation loaded it built.
        assert done[0].status == "runtime_error" and done[0].correctness.get("prebuilt_cubins") == 1, done[0].correctness
        assert sup.kernel_builder.spawns == 1 and sup.kernel_builder.alive()  # kept for the next candidate
        # The split judge's candidate hosts compile their own.
        split.info = {**sup.info, "judge": "split"}
        holder = hold(gpu, 120)
        assert split._prebuild(problem, templated, CFG) == {} and split.kernel_builder is None
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        sup.close()
        split.close()
    assert sup.kernel_builder.proc is None  # ended with its GPU supervisor


def test_the_search_executor_compiles_a_template_kernel_ahead_of_the_queue(relu):
    problem, templated = relu
    gpu = f"test-{uuid.uuid4().hex}"
    sup = CpuWorkerTakingTurns(gpu=gpu, judge="inprocess")
    executor = LocalExecutor([gpu], supervisors=[sup])
    executor.builder_count = 1
    try:
        assert executor.build_ahead(problem, templated, CFG) is None  # no GPU worker has named its architecture
        sup.info = {**sup.start(), "compute_capability": "9.0"}
        packed = executor.build_ahead(problem, templated, CFG)
        assert [k.startswith(CUBIN) for k in packed] == [True]
        assert all(b.alive() for b in executor.builders.all)
        plain = Candidate("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
        assert executor.build_ahead(problem, plain, CFG) is None  # nothing to build
    finally:
        executor.close()


def test_a_template_search_compiles_its_kernels_ahead_of_the_gpu_queue(tmp_path, suite_dir):
    # The template search's candidates (format-B kernels, judged in process) go through the executor's
    # builders before they queue for the GPU; the evaluation is handed their cubins.
    from cuforge.agent.config import ProposerSpec, RunConfig

    cfg = RunConfig(suite=str(suite_dir), proposers=[ProposerSpec("template")], islands=1, generations=3,
                    concurrency=2, device="cpu", gpus="1")
    sup = CompilingWorkerTakingTurns(gpu=f"test-{uuid.uuid4().hex}", judge="inprocess")
    store, executor = search_through(cfg, sup, tmp_path / "r.db", builder_count=1)
    rows = store.conn.execute("SELECT status, correctness, message FROM evaluations").fetchall()
    assert rows
    # On this machine (no GPU) the kernels cannot run, but each evaluation's import found them built.
    assert {status for status, _, _ in rows} == {"runtime_error"}, rows
    assert all(json.loads(c).get("prebuilt_cubins", 0) >= 1 for _, c, _ in rows), rows
    (builder,) = executor.builders.all
    assert len(rows) >= 2 and builder.spawns == 1  # one compile-only worker for every candidate


class WorkerThatCannotStart(Supervisor):
    def _command(self):  # noqa: ANN202
        args, env = super()._command()
        return [*args[:args.index("-m") + 1], "cuforge.no_such_module", *args[args.index("-m") + 2:]], env


def test_a_compile_only_worker_that_cannot_start_is_not_started_again(relu):
    _, templated = relu
    builder = WorkerThatCannotStart(compile_only=True, target_arch="sm_90a")
    try:
        assert builder.compile_kernels(kernel_sources(templated), 60) == {}
        assert builder.compile_kernels(kernel_sources(templated), 60) == {}  # its candidates compile in the turn
        assert builder.spawns == 1 and builder.start_failed
    finally:
        builder.close()
