"""The sandbox on the CPU: supervisor (timeouts, crashes, respawn, memory), isolation, status
classification and the anti-cheat checks that need no GPU, with misbehaving candidates."""

import hashlib
import re
import textwrap
from dataclasses import asdict

import pytest

from conftest import relu_problem_source

from cuforge.problems.loader import load_files
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, launch_plan, normalize_source, wrap_kernel
from cuforge.sandbox.protocol.evaluation import EvalConfig, Evaluation
from cuforge.sandbox.driver.supervisor import Supervisor


CFG = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=60)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    d = tmp_path_factory.mktemp("p")
    (d / "relu_any.py").write_text(relu_problem_source(policy="any"))
    (d / "relu_custom.py").write_text(relu_problem_source(policy="custom"))
    loaded, skipped = load_files([d / "relu_any.py", d / "relu_custom.py"])
    assert not skipped
    return {p.name: p for p in loaded}


@pytest.fixture(scope="module")
def sup():
    s = Supervisor(cpu_mode=True)
    yield s
    s.close()


def run(sup, problems, body, policy="any", **cfg):
    src = "import torch\n" + textwrap.dedent(body)
    config = EvalConfig(**{**CFG.to_dict(), **cfg}) if cfg else CFG
    return sup.evaluate(problems[f"relu_{policy}"], Candidate(src), config)


HONEST = """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
"""


def test_honest_candidate_is_ok_with_interleaved_timings(sup, problems):
    ev = run(sup, problems, HONEST)
    assert ev.status == "ok", ev.message
    assert ev.correctness["trials_passed"] == 5 and ev.correctness["reference"] == "float64"
    # eager under PyTorch's default flags is named too: for a ReLU, the same kernels (precision contracts)
    assert set(ev.timings) == {"candidate", "torch", "torch.default_flags"}
    assert ev.timings["torch.default_flags"] == ev.timings["torch"] and ev.correctness["precision"] == "fp32"
    assert all(t.n >= 5 and t.method == "cpu-wallclock" and t.p20_ms <= t.median_ms <= t.p80_ms for t in ev.timings.values())
    assert ev.speedup_vs("torch") == pytest.approx(ev.timings["torch"].median_ms / ev.timings["candidate"].median_ms)
    assert sup.info["self_test"] == "ok"
    # Round trip through JSON keeps everything.
    assert Evaluation.from_dict(ev.to_dict()).timings == ev.timings


@pytest.mark.parametrize("body, status, fragment", [
    ("class ModelNew(torch.nn.Module)\n    pass\n", "compile_error", "syntax error at line"),
    ("raise ImportError('no such thing')\n", "runtime_error", "importing the candidate raised"),
    ("class Other: pass\n", "runtime_error", "defines no ModelNew"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        raise ValueError('kaboom')\n",
     "runtime_error", "forward raised ValueError: kaboom"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n", "wrong_output", "outside atol"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)[:-1]\n", "wrong_output", "shape"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.full_like(x, float('nan'))\n",
     "wrong_output", "NaN"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.zeros_like(x)\n",
     "wrong_output", "constant"),
])
def test_status_classification(sup, problems, body, status, fragment):
    ev = run(sup, problems, body)
    assert ev.status == status, (ev.status, ev.message)
    assert fragment in ev.message


def test_compile_error_reports_python_diagnostic(sup, problems):
    ev = run(sup, problems, "class ModelNew(torch.nn.Module)\n    pass\n")
    assert ev.diagnostics and ev.diagnostics[0].line == 2 and ev.diagnostics[0].severity == "error"


CHEATS = {
    "input_mutation": ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu_()\n", "any"),
    "thread": ("import threading, time\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
               "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        return x.clamp_min(0)\n", "any"),
    "timer_patch": ("import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() * 0.5\n" + HONEST, "any"),
    "monkeypatch": ("torch.relu = lambda x: x.clamp_min(0)\n" + HONEST, "any"),
    "lazy_tensor": ("class Lazy(torch.Tensor):\n    pass\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return x.clamp_min(0).as_subclass(Lazy)\n", "any"),
    "library_call": (HONEST, "custom"),
    "result_caching": ("class ModelNew(torch.nn.Module):\n    cache = None\n    def forward(self, x):\n"
                       "        if ModelNew.cache is None:\n            ModelNew.cache = x.clamp_min(0)\n        return ModelNew.cache\n", "any"),
    "precision_downgrade": ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0).half()\n", "any"),
    "aliasing": ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n", "any"),
}


@pytest.mark.parametrize("kind", sorted(CHEATS))
def test_each_cpu_detectable_cheat_is_named(sup, problems, kind):
    body, policy = CHEATS[kind]
    ev = run(sup, problems, body, policy=policy)
    assert ev.status == f"cheat:{kind}", (ev.status, ev.message)


def test_patching_the_harness_timing_module_is_a_timer_patch(sup, problems):
    body = "from cuforge.sandbox.judge import timing\ntiming._perf_counter = lambda: 0.0\n" + HONEST
    ev = run(sup, problems, body)
    assert ev.status == "cheat:timer_patch" and "judge.timing._perf_counter" in ev.message, (ev.status, ev.message)


@pytest.mark.parametrize("flag", ["allow_tf32", "allow_fp16_accumulation"])
def test_precision_flag_change_is_a_downgrade(sup, problems, flag):
    body = f"torch.backends.cuda.matmul.{flag} = True\n" + HONEST
    ev = run(sup, problems, body)
    assert ev.status == "cheat:precision_downgrade" and flag.removeprefix("allow_") in ev.message, (ev.status, ev.message)


@pytest.mark.parametrize("body, switch", [
    ("torch.backends.cudnn.enabled = False\n" + HONEST, "cudnn.enabled"),
    ("class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        torch.set_num_threads(1)\n"
     "        return x.clamp_min(0)\n", "cpu_threads"),
    ("torch.set_default_device('meta')\n" + HONEST, "default_device"),
])
def test_a_switch_eager_runs_under_changed_beside_it_is_named(sup, problems, body, switch):
    # In the worker's own process the switches are eager's too: cuDNN off or one CPU thread would slow the
    # baselines timed beside the candidate, and every evaluation after it in that worker.
    ev = run(sup, problems, body)
    assert ev.status == "cheat:monkeypatch" and switch in ev.message, (ev.status, ev.message)
    assert run(sup, problems, HONEST).status == "ok"  # the next candidate gets a worker with the switches as they were


def test_a_switch_the_problem_sets_itself_is_no_candidate_s(sup, tmp_path):
    # A Model() that turns cuDNN's autotuning on, as training scripts do: its reference keeps it, and an
    # honest candidate evaluated beside it is not accused of the change.
    src = relu_problem_source(policy="any").replace(
        "class Model(torch.nn.Module):\n",
        "class Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        torch.backends.cudnn.benchmark = True\n")
    assert "cudnn.benchmark = True" in src, src
    (tmp_path / "relu_tuned.py").write_text(src)
    (problem,), skipped = load_files([tmp_path / "relu_tuned.py"])
    assert not skipped
    ev = sup.evaluate(problem, Candidate("import torch\n" + textwrap.dedent(HONEST)), CFG)
    assert ev.status == "ok", (ev.status, ev.message)


LIBRARY = """
lib = torch.library.Library("cuforge_test_ns", "DEF")
lib.define("relu_times(Tensor a) -> Tensor")
lib.impl("relu_times", lambda a: a.clamp_min(0) * {k}, "CompositeExplicitAutograd")
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.ops.cuforge_test_ns.relu_times(x)
"""


def test_operators_a_candidate_registers_do_not_reach_the_next_candidate(sup, problems):
    # torch.library namespaces cannot be registered twice in a process, and a search's candidates keep
    # their parent's: one that fails on a namespace an earlier candidate left is evaluated again in a
    # fresh worker, and judged there.
    assert run(sup, problems, LIBRARY.format(k=1)).status == "ok"
    wrong = run(sup, problems, LIBRARY.format(k=2))
    assert wrong.status == "wrong_output", (wrong.status, wrong.message)
    assert "cuforge_test_ns" in wrong.correctness["retried_in_a_fresh_worker"], wrong.correctness
    again = run(sup, problems, LIBRARY.format(k=1))
    assert again.status == "ok", (again.status, again.message)
    # A candidate that registers its namespace twice itself fails in a fresh worker too, once retried.
    twice = run(sup, problems, LIBRARY.format(k=1) + 'torch.library.Library("cuforge_test_ns", "DEF")\n')
    assert twice.status == "runtime_error" and "TORCH_LIBRARY" in twice.message, (twice.status, twice.message)


def test_timeout_kills_and_respawns(problems):
    with Supervisor(cpu_mode=True) as s:
        ev = s.evaluate(problems["relu_any"], Candidate("import time, torch\n" + HONEST.replace("return", "time.sleep(3600); return")),
                        EvalConfig(**{**CFG.to_dict(), "timeout_s": 8}))
        assert ev.status == "timeout" and ev.worker_restarted and not s.alive()
        ev = s.evaluate(problems["relu_any"], Candidate("import torch\n" + HONEST), CFG)
        assert ev.status == "ok" and ev.worker_restarted and s.spawns == 2


def test_crash_hang_on_import_and_memory_runaway(problems):
    with Supervisor(cpu_mode=True) as s:
        segv = "import ctypes\nctypes.string_at(0)\n"
        ev = s.evaluate(problems["relu_any"], Candidate(segv), CFG)
        assert ev.status == "crash" and "SIGSEGV" in ev.message
        ev = s.evaluate(problems["relu_any"], Candidate("import os\nos._exit(7)\n"), CFG)
        assert ev.status == "crash" and "exit code 7" in ev.message
        hog = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
               "        self.hog = [bytearray(2**28) for _ in range(16)]\n        import time; time.sleep(60)\n")
        ev = s.evaluate(problems["relu_any"], Candidate(hog), EvalConfig(**{**CFG.to_dict(), "max_host_memory_gib": 1.5}))
        assert ev.status == "crash" and "GiB limit" in ev.message
        ev = s.evaluate(problems["relu_any"], Candidate("import torch\n" + HONEST), CFG)
        assert ev.ok and s.spawns == 4


def test_worker_environment_is_scrubbed_and_isolated(problems, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-never-arrive")
    monkeypatch.setenv("HF_TOKEN", "hf-should-never-arrive")
    body = """
import os, socket, tempfile, torch
leaked = [k for k in os.environ if 'KEY' in k or 'TOKEN' in k]
assert not leaked, f"secrets visible: {leaked}"
assert os.getcwd() == tempfile.gettempdir() == os.environ['HOME'] == '/tmp', os.getcwd()
s = socket.socket()
s.settimeout(1)
try:
    s.connect(('1.1.1.1', 53))
    raise AssertionError('network reachable')
except OSError:
    pass
""" + HONEST
    with Supervisor(cpu_mode=True) as s:
        ev = s.evaluate(problems["relu_any"], Candidate(body), CFG)
        assert ev.status == "ok", ev.message
        assert s.info["jail"] == "namespaces" and s.info["isolation"].startswith("jail (namespaces)")


def test_format_b_wrapper_is_valid_python_and_its_kernel_compiles():
    kernel = textwrap.dedent("""
        extern "C" __global__ void relu(const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
        }
    """)
    spec = LaunchSpec(entry="relu", grid="(cdiv(n, 256),)", block="(256,)", args=("in0", "out0", "n"),
                      outputs=(("in0.shape", "float32"),), bindings=(("n", "in0.numel()"),))
    cand = Candidate(kernel, "kernel", spec, proposer="test")
    compile(cand.module_source(), "<wrapper>", "exec")
    assert "relu" in wrap_kernel(kernel, spec)
    from cuforge.runtime import compile_cuda

    mod = compile_cuda(kernel, arch="sm_90a")
    assert mod.signatures["relu"][2].ctype == "int" and len(mod.cubin) > 0
    # Identity ignores whitespace and comments; the launch spec is part of it.
    assert Candidate(kernel + "\n// note\n", "kernel", spec).id == cand.id
    assert normalize_source("a  /* x */ b // y\n c") == "a b c"
    # A module's embedded kernels are compared whole, however they are quoted; its comments, blank lines
    # and the kernels' own comments and spacing are not part of the identity.
    commented = kernel.replace("{", "{  // one thread an element", 1)
    wrapped = [Candidate(wrap_kernel(commented.replace("x[i]", f"x[i] * {k}"), spec), "module") for k in (2, 3)]
    assert wrapped[0].id != wrapped[1].id
    assert wrapped[0].id == Candidate("# a comment\n\n" + wrap_kernel(
        kernel.replace("x[i]", "x[i] * 2").replace("{", "{\n/* one */", 1), spec), "module").id
    indented = "def f():\n    return 1\n"
    assert normalize_source(indented) != normalize_source("def f():\n    pass\n    return 1\n")
    with pytest.raises(ValueError):
        Candidate(kernel, "kernel")
    # A spec without scratch buffers, preparing kernels or a cooperative launch keeps the id it had
    # before those fields existed (the spec's fields then, in their order).
    old_recipe = hashlib.sha256(normalize_source(kernel).encode())
    old_recipe.update(b"kernel")
    old_recipe.update(repr({k: v for k, v in asdict(spec).items() if k not in ("scratch", "pre", "cooperative")}).encode())
    assert cand.id == old_recipe.hexdigest()[:16]


def test_scratch_buffers_are_allocated_per_call_and_checked():
    spec = LaunchSpec(entry="k", grid="(1,)", block="(32,)", args=("in0", "scratch0", "scratch1"),
                      outputs=(("in0.shape", "float32"),), bindings=(("n", "in0.numel()"),),
                      scratch=(("(4, n)", "float32", "empty"), ("(n,)", "int32", "zeros")))
    ns = {"in0": type("T", (), {"numel": lambda self: 5, "shape": (5,)})()}
    exec(launch_plan(spec), {"__builtins__": {}}, ns)
    assert ns["_scratch_specs"] == [((4, 5), "float32", "empty"), ((5,), "int32", "zeros")]
    assert LaunchSpec.from_dict({**asdict(spec), "scratch": [["(n,)", "int32"]]}).scratch == (("(n,)", "int32", "zeros"),)
    with pytest.raises(ValueError, match="'zeros' or 'empty'"):
        LaunchSpec(entry="k", grid="(1,)", block="(32,)", args=(), outputs=(), scratch=(("(n,)", "int32", "ones"),))


def test_launch_expressions_call_only_what_their_builtin_free_namespace_can_run():
    # A launch expression runs without builtins, where a torch call that imports lazily fails; a
    # 1x1 convolution's view of x, written into its launch arguments, failed so on the GPU only.
    def spec(*args: str, grid: str = "(1,)") -> LaunchSpec:
        return LaunchSpec(entry="k", grid=grid, block="(32,)", args=args, outputs=(("in0.shape", "float16"),))

    spec("tma_nd(in0, (64, 64, 1), view=(NB, C, -1))", "in0.numel()", "in0.size(0) * in0.stride(0)",
         grid="(min(cdiv(in0.numel(), 256), torch.cuda.get_device_properties(0).multi_processor_count),)")
    for bad, call in (("tma_nd(in0.view(NB, C, -1), (64, 64, 1))", "in0.view"), ("in0.contiguous()", "in0.contiguous"),
                      ("__import__('os')", "__import__")):
        with pytest.raises(ValueError, match=f"calls {re.escape(call)}: launch expressions call only"):
            spec(bad)
    with pytest.raises(ValueError, match="calls in0.view"):
        spec("in0", grid="(in0.view(-1).shape[0],)")
    with pytest.raises(ValueError, match="is not Python"):
        spec("in0 +")
    # A spec stored before the check (a run being resumed) still loads; its run fails as it did then.
    stored = asdict(spec("in0"))
    stored["args"] = ["tma_nd(in0.view(NB, C, -1), (64, 64, 1))"]
    assert LaunchSpec.from_dict(stored).args == ("tma_nd(in0.view(NB, C, -1), (64, 64, 1))",)
    with pytest.raises(ValueError, match="calls in0.view"):
        spec(*stored["args"])


def test_error_shape_separates_precision_loss_from_bugs():
    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.judge.verify import compare

    torch.manual_seed(0)
    a, b = torch.randn(128, 1024, dtype=torch.float64), torch.randn(1024, 128, dtype=torch.float64)
    ref = a @ b
    tol = Tolerance.for_dtype("float16")
    fp32_acc = (a.half().float() @ b.half().float()).half()
    assert compare(fp32_acc, (a.half().double() @ b.half().double()), torch.float16, tol).ok
    # fp16 accumulation: a running fp16 sum over K.
    acc = torch.zeros(128, 128, dtype=torch.float16)
    ah, bh = a.half(), b.half()
    for k in range(1024):
        acc = acc + (ah[:, k:k + 1] * bh[k:k + 1, :])
    verdict = compare(acc, ah.double() @ bh.double(), torch.float16, tol)
    assert not verdict.ok and verdict.kind == "precision_downgrade"
    # A bug: one row computed wrong.
    bad = fp32_acc.clone()
    bad[5] = 0
    verdict = compare(bad, ah.double() @ bh.double(), torch.float16, tol)
    assert not verdict.ok and verdict.kind == "wrong_output"
    # Plain wrong values.
    assert compare(ref.half() * 1.5, ref, torch.float16, tol).kind == "wrong_output"


def test_misses_the_eager_reference_shares_do_not_fail_a_candidate():
    """fp32 GEMMs over a long K miss atol = rtol = 1e-4 on a few near-zero outputs, cuBLAS's own
    included: a candidate no less accurate than the eager output passes; one with more or larger
    misses fails, and the error-norm bound still rejects reduced precision."""
    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.judge.verify import compare

    tol = Tolerance.for_dtype("float32")
    torch.manual_seed(0)
    ref = torch.randn(256, 256, dtype=torch.float64) * 64
    ref[0, :8] = 1e-6  # near-zero outputs: only atol protects them
    eager = (ref + torch.randn_like(ref) * 1e-5).float()
    eager[0, :4] += 5e-4  # the eager result misses four of them
    cand = ref.float().clone()
    cand[0, :2] += 3e-4  # two misses, smaller than the eager ones
    assert not compare(cand, ref, torch.float32, tol).ok  # without the eager output: a miss is a miss
    verdict = compare(cand, ref, torch.float32, tol, native=eager)
    assert verdict.ok and verdict.within_reference and verdict.mismatches == 2
    worse = cand.clone()
    worse[0, :6] += 3e-4  # more misses than the eager output
    assert not compare(worse, ref, torch.float32, tol, native=eager).ok
    larger = cand.clone()
    larger[0, 0] += 1e-3  # a miss larger than any of the eager output's
    assert not compare(larger, ref, torch.float32, tol, native=eager).ok
    tf32 = (ref * (1 + torch.randn_like(ref) * 3e-4)).float()  # TF32-sized errors everywhere
    fp32_eager = (ref * (1 + torch.randn_like(ref) * 1e-7)).float()  # the harness runs eager with TF32 off
    fp32_eager[0, :4] += 5e-4
    verdict = compare(tf32, ref, torch.float32, tol, native=fp32_eager)
    assert not verdict.ok and verdict.kind == "precision_downgrade"


def test_error_norm_is_calibrated_by_the_eager_output_where_the_output_cancels():
    """KernelBench's level2/23 (GroupNorm then a mean) and 77 (BatchNorm then a global average) give
    outputs near zero: every fp32 result, eager PyTorch's own, has a huge relative error norm. A
    candidate as accurate as eager (within NATIVE_NORM_FACTOR) passes; TF32-level error does not."""
    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.judge.verify import NATIVE_NORM_FACTOR, compare

    tol = Tolerance.for_dtype("float32")
    torch.manual_seed(0)
    ref = torch.randn(128, dtype=torch.float64) * 1e-9  # a mean of normalised values: ~0
    eager = (ref + torch.randn_like(ref) * 3e-8).float()  # fp32 rounding of O(1) terms that cancel
    honest = (ref + torch.randn_like(ref) * 9e-8).float()  # another summation order: 3x eager's error
    assert not compare(honest, ref, torch.float32, tol).ok  # uncalibrated: the norm bound fails it
    verdict = compare(honest, ref, torch.float32, tol, native=eager)
    assert verdict.ok, verdict.reason
    tf32 = (ref + torch.randn_like(ref) * 3e-8 * 2**13).float()  # TF32: 2^13 coarser rounding
    assert not compare(tf32, ref, torch.float32, tol, native=eager).ok  # past atol already
    coarse = (ref + torch.randn_like(ref) * 3e-8 * 2**9).float()  # within atol, 512x eager's error
    verdict = compare(coarse, ref, torch.float32, tol, native=eager)
    assert not verdict.ok and verdict.kind == "precision_downgrade", verdict.reason
    assert NATIVE_NORM_FACTOR < 2**9


def test_the_error_norm_bound_of_a_cancelling_output_rests_on_eager_s_largest_error_over_the_sets():
    """Eager's own error on an output that cancels is noise over a tiny norm and varies set to set; on a set
    where eager happens to be very accurate, an honest candidate was once more than NATIVE_NORM_FACTOR times
    worse (a GPU test's pipeline: a convolution, group norm, a mean). The bound then takes the largest eager
    error seen on the evaluation's other sets of the same output; where eager's error is steady (a normal
    output) that floor changes nothing and TF32-level error is still named."""
    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.judge.output_judge import Judge
    from cuforge.sandbox.judge.context import Context
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.judge.verify import NATIVE_NORM_FACTOR, compare

    tol = Tolerance.for_dtype("float32")
    torch.manual_seed(1)
    ref = torch.randn(4, dtype=torch.float64) * 1e-9
    typical = (ref + torch.randn_like(ref) * 3e-8).float()
    lucky = (ref + torch.randn_like(ref) * 3e-10).float()  # eager's error 100x below its usual on this set
    honest = (ref + torch.randn_like(ref) * 9e-8).float()
    first = compare(honest, ref, torch.float32, tol, native=typical)
    assert first.ok and first.native_rel_norm > 0
    assert not compare(honest, ref, torch.float32, tol, native=lucky).ok  # this set's draw alone accuses it
    assert compare(honest, ref, torch.float32, tol, native=lucky, native_floor=first.native_rel_norm).ok
    # The judge keeps the floor per output across the sets it judges.
    ctx = Context({}, {}, EvalConfig(), torch.device("cpu"), None, tol, 0, {}, {})
    judge = Judge(ctx, None, [], "float64")
    assert judge(0, honest, ref, typical).ok and ctx.native_rel[0] == first.native_rel_norm
    assert judge(0, honest, ref, lucky).ok and ctx.native_rel[0] == first.native_rel_norm
    # A normal output: eager's fp32 error is steady, the floor is of its size, TF32's error still fails.
    out = torch.randn(4096, dtype=torch.float64)
    fp32 = [(out * (1 + torch.randn_like(out) * 1e-7)).float() for _ in range(3)]
    floor = max(compare(e, out, torch.float32, tol, native=e).native_rel_norm for e in fp32)
    tf32 = (out * (1 + torch.randn_like(out) * 3e-4)).float()
    verdict = compare(tf32, out, torch.float32, tol, native=fp32[0], native_floor=floor)
    assert not verdict.ok and verdict.kind == "precision_downgrade" and NATIVE_NORM_FACTOR * floor < 3e-4


def _cancelling_model():
    """An output of norm ~1e-9 that eager computes as a sum cancelling to it: fp32 leaves ~1e-7 of
    rounding in every element, float64 none."""
    import torch

    class Cancelling(torch.nn.Module):
        def forward(self, x):
            return x[:4] * 1e-9 + ((x[4:8] * 3 + x[8:12]) - x[8:12] - x[4:8] * 3)

    return Cancelling()


def test_an_error_norm_accusation_on_the_first_set_waits_for_eager_s_error_on_fresh_sets():
    """On the evaluation's first set there is no earlier set to take eager's error from: where eager happened
    to be accurate on it, the error-norm bound alone would accuse an honest candidate. Before it does, the
    judge measures eager's error on three fresh sets only eager and float64 see, once per output; an output
    wrong past atol is named without that."""
    import types

    import torch

    from cuforge.problems.problem import Tolerance
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.judge.output_judge import Judge
    from cuforge.sandbox.judge.context import Context, Models
    from cuforge.sandbox.judge.verify import compare

    tol = Tolerance.for_dtype("float32")
    module = types.SimpleNamespace(get_inputs=lambda: [torch.randn(12)])
    eager = _cancelling_model()
    models = Models(reference=eager, reference64=_cancelling_model().double(), candidate=None)
    torch.manual_seed(3)
    x = torch.randn(12)
    ref = models.reference64(x.double())
    lucky = (ref + torch.randn_like(ref) * 1e-10).float()  # eager's error on this set, ~1000x below its usual
    honest = (ref + torch.randn_like(ref) * 3e-7).float()
    assert not compare(honest, ref, torch.float32, tol, native=lucky).ok  # this draw alone accuses it
    ctx = Context({}, {}, EvalConfig(), torch.device("cpu"), module, tol, 0, {}, {})
    judge = Judge(ctx, models, [x], "float64")
    verdict = judge(0, honest, ref, lucky)
    assert verdict.ok, verdict.reason
    assert ctx.calibrated == {0} and ctx.correctness["calibrated_native_rel_norm"]["0"] > 1.0
    # Calibrated once per output; an error past atol is named without it (no fresh sets to wait for).
    wrong = (ref + 1e-3).float()
    again = Judge(Context({}, {}, EvalConfig(), torch.device("cpu"), module, tol, 0, {}, {}), models, [x], "float64")
    verdict = again(0, wrong, ref, lucky)
    assert not verdict.ok and not again.ctx.calibrated
    # Reduced precision whose error norm exceeds even the calibrated floor is still named.
    coarse = (ref + torch.randn_like(ref) * 5e-5).float()
    verdict = judge(0, coarse, ref, lucky)
    assert not verdict.ok and verdict.kind == "precision_downgrade" and verdict.norm_only, verdict.reason


def test_escaped_work_needs_the_host_to_wait_for_the_device():
    from cuforge.sandbox.judge.timing import EscapeCheck, escaped_work

    # A slow Python launch path (0.3 ms of host time for a 10 us kernel) that returns while a queued
    # device spin still runs is not escaped work; the same host time spent waiting for the device is.
    slow_host = EscapeCheck(wall_ms=0.31, host_ms=0.3, event_ms=0.01, blocked_ms=0.3, spin_ms=5.0)
    assert escaped_work(slow_host) is None
    waits = EscapeCheck(wall_ms=0.31, host_ms=0.3, event_ms=0.01, blocked_ms=5.2, spin_ms=5.0)
    assert "waited for" in escaped_work(waits)
    hidden = EscapeCheck(wall_ms=2.0, host_ms=0.05, event_ms=0.01, blocked_ms=0.05, spin_ms=5.0)
    assert "escapes the timed stream" in escaped_work(hidden)
    # A launch-bound model (EfficientNet-B1 in PyTorch on an H100: 7.2 ms of host launches for 1.4 ms of
    # device time, several hundred kernels) blocks on the full launch queue behind the spin: not a cheat.
    launch_bound = EscapeCheck(wall_ms=7.3, host_ms=7.2, event_ms=1.4, blocked_ms=5.1, spin_ms=5.0)
    assert escaped_work(launch_bound, kernels_per_call=400) is None
    assert "waited for" in escaped_work(launch_bound, kernels_per_call=20)


def test_escaped_work_behind_a_slow_host_is_seen_in_what_the_device_drains():
    from cuforge.sandbox.judge.timing import EscapeCheck, escaped_work

    # A host slowed by other processes launches slower than a side stream computes: the wall clock, back
    # to back, is then the host's own, and only the work left after the timed stream's end shows it.
    hidden_by_host = EscapeCheck(wall_ms=0.9, host_ms=0.85, event_ms=0.002, blocked_ms=0.05, spin_ms=5.0, drain_ms=0.64)
    assert "ran 0.64 ms more after the timed stream" in escaped_work(hidden_by_host)
    # An honest call leaves the device idle once its own stream ends, at any host speed.
    honest = EscapeCheck(wall_ms=0.9, host_ms=0.85, event_ms=0.16, blocked_ms=0.05, spin_ms=5.0, drain_ms=0.02)
    assert escaped_work(honest) is None


def test_an_escaped_work_accusation_stands_only_if_every_check_makes_it():
    from cuforge.sandbox.judge.timing import ESCAPE_TRIES, EscapeCheck, confirmed_escape

    clean = EscapeCheck(wall_ms=0.02, host_ms=0.05, event_ms=0.019, blocked_ms=0.05, spin_ms=5.0)
    # Session 34's false accusation: one check whose host blocked 0.63 ms a call for a 19 us kernel.
    paused = EscapeCheck(wall_ms=0.64, host_ms=0.634, event_ms=0.0186, blocked_ms=3.0, spin_ms=5.0)

    def checks(*seq):
        runs = iter(seq)
        return lambda: next(runs)

    escape, msg, runs = confirmed_escape(checks(paused, clean))
    assert msg is None and escape is clean and runs == 2
    escape, msg, runs = confirmed_escape(checks(clean))
    assert msg is None and runs == 1  # a clean first check is not repeated
    # A real escape repeats on every check: the accusation stands, named, after all of them.
    escape, msg, runs = confirmed_escape(checks(*[paused] * ESCAPE_TRIES))
    assert "waited for" in msg and runs == ESCAPE_TRIES == 3
    # A launch-bound model is judged by its kernels per call on each run.
    launch_bound = EscapeCheck(wall_ms=7.3, host_ms=7.2, event_ms=1.4, blocked_ms=5.1, spin_ms=5.0)
    assert confirmed_escape(checks(launch_bound), kernels_per_call=400)[1] is None


def test_kernel_signatures_see_past_launch_attributes():
    """__launch_bounds__, __cluster_dims__ and the like, before or after void, are not the kernel."""
    from cuforge.runtime import kernel_signatures

    src = ('extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256, 1)\n'
           'k1(const float* __restrict__ x, int n) {}\n'
           'extern "C" __global__ __launch_bounds__(128) void k2(half* y) {}\n')
    sigs = kernel_signatures(src)
    assert list(sigs) == ["k1", "k2"]
    assert [(p.name, p.ctype, p.pointer) for p in sigs["k1"]] == [("x", "float", True), ("n", "int", False)]
    assert sigs["k2"][0].pointer and sigs["k2"][0].ctype == "half"


def test_candidates_run_from_a_real_file_so_source_reading_tools_work(sup, problems):
    # Triton's @jit reads its function's source with inspect: the candidate must come from a file.
    ev = run(sup, problems, """
    import inspect

    def relu_rule(x):
        return x.clamp_min(0)

    SOURCE = inspect.getsource(relu_rule)
    assert "clamp_min" in SOURCE and __file__.endswith(".py")

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return relu_rule(x)
    """)
    assert ev.status == "ok", ev.message


@pytest.mark.parametrize("module, package", [("tilelang", "tilelang"), ("cutlass.cute", "nvidia-cutlass-dsl")])
def test_a_candidate_for_a_missing_dsl_names_the_package(sup, problems, module, package):
    ev = run(sup, problems, f"""
    import {module}

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return x.clamp_min(0)
    """)
    assert ev.status == "compile_error" and f"needs package {package}" in ev.message, ev.message


DROPOUT_PROBLEM = '''
import torch
class Model(torch.nn.Module):
    def __init__(self, n, p):
        super().__init__()
        self.linear = torch.nn.Linear(n, n)
        self.dropout = torch.nn.Dropout(p)
    def forward(self, x):
        return torch.softmax(self.dropout(self.linear(x)), dim=1)
def get_inputs():
    return [torch.rand(64, 256)]
def get_init_inputs():
    return [256, 0.2]
'''


def _problem_file(tmp_path, name, source):
    """The problem of a written file, loaded as the CLI loads it."""
    (tmp_path / name).write_text(source)
    (problem,), skipped = load_files([tmp_path / name])
    assert not skipped, skipped
    return problem


def _itself(source):
    """PyTorch itself as the candidate: the problem's Model as ModelNew."""
    return Candidate(source + "\nclass ModelNew(Model):\n    pass\n")


def test_training_mode_dropout_reference_passes_pytorch_itself(tmp_path):
    """KernelBench's level2/66 keeps Dropout in training mode: candidate and reference draw their
    masks after one reseed, so PyTorch's own implementation is ok and a mask-free one is not."""
    problem = _problem_file(tmp_path, "dropout.py", DROPOUT_PROBLEM)
    with Supervisor(cpu_mode=True) as s:
        own = s.evaluate(problem, _itself(DROPOUT_PROBLEM), CFG)
        assert own.status == "ok", own.message
        no_dropout = DROPOUT_PROBLEM + ("\nclass ModelNew(Model):\n    def forward(self, x):\n"
                                        "        return torch.softmax(self.linear(x), dim=1)\n")
        ev = s.evaluate(problem, Candidate(no_dropout), CFG)
        assert ev.status == "wrong_output", ev.message


NOISE_PROBLEM = '''
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        keep = torch.rand_like(x) > 0.3
        return torch.tanh(x * keep + 0.1 * torch.randn_like(x))
def get_inputs():
    return [torch.rand(32, 64)]
def get_init_inputs():
    return []
'''


def test_the_float64_reference_replays_the_eager_reference_s_random_draws(tmp_path):
    """A float64 forward draws other numbers than a float32 one after the same seed (rand_like, randn_like;
    on a GPU a dropout's mask too), so the float64 reference of a stochastic problem disagreed with eager
    PyTorch itself, and the judge's allowance for eager's own misses let almost anything through (or, by
    chance, accused an honest kernel). The float64 reference now replays the eager forward's draws:
    PyTorch itself matches it to rounding, and a candidate drawing other numbers is wrong."""
    import torch

    from cuforge.sandbox.judge.random_tape import RandomTape, ReplayMismatch

    tape = RandomTape()
    torch.manual_seed(5)
    with tape.recording():
        a, da = torch.rand(4, 3), torch.nn.functional.dropout(torch.arange(1.0, 65.0), 0.5)
    with tape.replaying():
        b, db = torch.rand(4, 3, dtype=torch.float64), torch.nn.functional.dropout(torch.arange(1.0, 65.0, dtype=torch.float64), 0.5)
    assert [name for name, _ in tape.draws][0] == "rand" and torch.equal(a.double(), b) and torch.equal(da.double(), db)
    with pytest.raises(ReplayMismatch):
        with tape.replaying():
            torch.rand(5, 3, dtype=torch.float64)
    with pytest.raises(ReplayMismatch, match="were not made"):
        with tape.replaying():
            torch.rand(4, 3, dtype=torch.float64)

    problem = _problem_file(tmp_path, "noise.py", NOISE_PROBLEM)
    with Supervisor(cpu_mode=True) as s:
        own = s.evaluate(problem, _itself(NOISE_PROBLEM), CFG)
        assert own.status == "ok", own.message
        # Ok because the draws agree, not because eager's own misses against float64 excuse everything (they
        # did: a relative error norm of 0.8 passed as "within the reference's misses").
        assert own.correctness["reference"] == "float64" and own.correctness["rel_norm_err"] < 1e-6, own.correctness
        assert "misses_within_reference" not in own.correctness
        other = NOISE_PROBLEM + ("\nclass ModelNew(Model):\n    def forward(self, x):\n        torch.rand(1)\n"
                                 "        return super().forward(x)\n")
        ev = s.evaluate(problem, Candidate(other), CFG)
        assert ev.status == "wrong_output", ev.message


def test_a_forward_that_is_the_worker_s_first_parallel_cpu_op_is_not_a_thread_cheat(tmp_path):
    """PyTorch's CPU softmax of 32 x 64 started the intra-op thread pool when it was the worker's first
    parallel op, and the first trial's thread census called the honest candidate cheat:thread. The worker
    starts its pools before any candidate runs."""
    src = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, dim=1)\n"
           "def get_inputs():\n    return [torch.rand(32, 64)]\ndef get_init_inputs():\n    return []\n")
    problem = _problem_file(tmp_path, "softmax.py", src)
    with Supervisor(cpu_mode=True) as s:
        ev = s.evaluate(problem, _itself(src), CFG)
        assert ev.status == "ok", (ev.status, ev.message)


def test_blocking_probe_spins_longer_than_a_launch_bound_call_takes_on_the_host():
    """KernelBench's CViT in training mode spends 5.7 ms per call on the host: a 5 ms probe spin made
    it look as if it waited for the device. The spin now lasts at least 4x the call's host time."""
    from cuforge.sandbox.judge.timing import BLOCK_SPIN_CYCLES, MAX_BLOCK_SPIN_CYCLES, block_spin_cycles

    assert block_spin_cycles(0.01) == BLOCK_SPIN_CYCLES
    assert block_spin_cycles(5.7) >= 4 * 5.7e-3 * 2.0e9  # >= 4x host time at 2 GHz
    assert block_spin_cycles(1e6) == MAX_BLOCK_SPIN_CYCLES


@pytest.mark.parametrize("name, library", [
    ("void fft2d_r2c_16x16<float>(float2*, float const*, int, int, int)", True),  # cuDNN FFT conv (AlexNet)
    ("void convolveNd_dgrad_float_engine<float, 3, 512, 6, 5, 3, 3, 3, false>(int, int)", True),  # ConvTranspose3d
    ("void cudnn::cnn::conv2d_grouped_direct_kernel<float>(...)", True),
    ("add_kernel(float const*, float const*, float*, int)", False),  # KernelBench's example: a candidate's own
    ("fused_gelu_kernel", False),
])
def test_library_kernels_are_told_from_a_candidates_own(name, library):
    from cuforge.sandbox.host.monitor import LIBRARY_KERNEL

    assert bool(LIBRARY_KERNEL.search(name)) is library


def test_a_worker_closed_while_it_starts_ends_the_start_at_once():
    # A run stopping (its wall time used) closes its evaluators from another thread; one whose worker is
    # still starting must not wait out the start's timeout for a hello that will never come.
    import threading
    import time

    from cuforge.sandbox.driver.supervisor import Supervisor, WorkerStartError

    sup = Supervisor(cpu_mode=True)
    got = []

    def start():
        try:
            got.append(sup.start())
        except WorkerStartError as e:
            got.append(e)

    starter = threading.Thread(target=start)
    starter.start()
    deadline = time.monotonic() + 30
    while sup.proc is None and time.monotonic() < deadline:  # spawned, now waiting for its hello
        time.sleep(0.01)
    t0 = time.monotonic()
    sup.close()
    starter.join(timeout=30)
    assert not starter.is_alive() and time.monotonic() - t0 < 5
    assert got and (isinstance(got[0], dict) or "shut down while it started" in str(got[0])), got
