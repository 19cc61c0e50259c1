"""Precision contracts (protocol/precision.py): fp32, pytorch and kernelbench set what correct means and
the flags the reference and eager run under; every result names eager under both contracts' flags;
bad names are one line. What needs a GPU (cuDNN's TF32 convolutions against the contracts) is in
tests/test_gpu_precision.py."""

import textwrap

import pytest

from conftest import conv_problem_source, relu_problem_source, run_cli

from cuforge.problems.loader import load_files
from cuforge.problems.problem import ProblemError
from cuforge.sandbox.protocol import precision as pr
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig

CFG = dict(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=60)

TF32_PROBLEM = '''
import torch

torch.backends.cuda.matmul.allow_tf32 = True  # the problem's own setting

class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b

def get_inputs():
    return [torch.randn(64, 64), torch.randn(64, 64)]

def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    d = tmp_path_factory.mktemp("contracts")
    (d / "relu.py").write_text(relu_problem_source(policy="any"))
    (d / "conv.py").write_text(conv_problem_source())
    (d / "tf32.py").write_text(TF32_PROBLEM)
    (d / "relu_kb.py").write_text(relu_problem_source(policy="any").replace('"policy": "any"', '"policy": "any", "precision": "kernelbench"'))
    loaded, skipped = load_files(sorted(d.glob("*.py")))
    assert not skipped, skipped
    return {p.name: p for p in loaded}


@pytest.fixture(scope="module")
def sup(cpu_sup):
    return cpu_sup


@pytest.fixture(autouse=True)
def _strict_after():
    yield
    pr.set_strict_precision()  # this process's flags as every other test expects them


def evaluate(sup, problem, body, **cfg):
    return sup.evaluate(problem, Candidate("import torch\n" + textwrap.dedent(body)), EvalConfig(**{**CFG, **cfg}))


def test_the_contracts_set_the_flags_they_name():
    pr.apply_flags("pytorch")
    flags = pr.precision_flags()
    assert flags["cudnn.allow_tf32"] == "True" and flags["matmul.allow_tf32"] == "False"
    assert flags["matmul.fp16_reduced"] == "True"
    pr.apply_flags("fp32")
    flags = pr.precision_flags()
    assert flags["cudnn.allow_tf32"] == "False" and flags["matmul.fp16_reduced"] == "False"
    pr.apply_flags("kernelbench", {"matmul.allow_tf32": True})
    assert pr.precision_flags()["matmul.allow_tf32"] == "True"
    pr.apply_flags("fp32", {"matmul.allow_tf32": True})  # fp32 means fp32, whatever the problem set
    assert pr.precision_flags()["matmul.allow_tf32"] == "False"


def test_an_unknown_contract_is_one_line_naming_the_valid_ones():
    with pytest.raises(pr.UnknownContract, match="unknown precision contract 'tf32': use fp32, pytorch, kernelbench"):
        pr.contract("tf32")
    assert pr.contract(None).name == "fp32" and pr.contract(" PyTorch ").name == "pytorch"


def test_tf32_is_allowed_only_where_the_default_computation_uses_it():
    assert pr.tf32_allowed("pytorch", ("convolution", "relu"))
    assert not pr.tf32_allowed("fp32", ("convolution",))
    assert not pr.tf32_allowed("pytorch", ("mm",))  # PyTorch's default keeps matmuls in fp32
    assert pr.tf32_allowed("pytorch", ("mm",), {"matmul.allow_tf32": True})
    assert not pr.tf32_allowed("pytorch", ("convolution",), {"cudnn.allow_tf32": False})
    assert pr.flags_matter(("convolution",), "float32") and pr.flags_matter(("addmm",), "bfloat16")
    assert not pr.flags_matter(("relu", "sum"), "float32") and not pr.flags_matter(("mm",), "float32")


def test_a_problem_that_turns_tf32_on_keeps_it_under_the_default_flags_contracts(problems):
    from cuforge.sandbox.protocol.loading import problem_module, problem_tf32

    pr.set_strict_precision()
    before = pr.precision_flags()
    module = problem_module(problems["tf32"].source + "\n# loaded afresh here\n")
    assert problem_tf32(module) == {"matmul.allow_tf32": True}
    assert pr.precision_flags() == before  # loading a problem sets no contract in the caller
    assert problem_tf32(problem_module(problems["relu"].source)) == {}


def test_every_result_names_eager_under_both_contracts_flags(sup, problems):
    honest = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n"
    ev = evaluate(sup, problems["relu"], honest)
    assert ev.ok, ev.message
    assert ev.correctness["precision"] == "fp32"
    # A ReLU runs the same kernels under both flags: the other name is eager's own timing, and says so.
    assert ev.timings[pr.DEFAULT_EAGER] == ev.timings["torch"] and "same kernels" in ev.correctness["eager_flags"]
    ev = evaluate(sup, problems["relu"], honest, precision="pytorch")
    assert ev.ok and ev.correctness["precision"] == "pytorch" and pr.STRICT_EAGER in ev.timings
    # A convolution does not: eager under the other flags is a contender of its own, timed interleaved.
    conv = ("class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)\n"
            "    def forward(self, x):\n        return torch.nn.functional.conv2d(x, self.conv.weight, self.conv.bias, padding=1)\n")
    ev = evaluate(sup, problems["conv"], conv, precision="pytorch")
    assert ev.ok, ev.message
    assert "eager_flags" not in ev.correctness
    assert ev.timings[pr.STRICT_EAGER] is not ev.timings["torch"] and ev.timings[pr.STRICT_EAGER].n >= 5
    assert pr.STRICT_EAGER in ev.speedups


def test_torch_compile_is_also_timed_under_the_other_flags_where_they_matter(sup, problems):
    """Where the flags change what eager runs (a convolution), torch.compile of the reference is timed
    under both too: the contract's, and a copy compiled and called under the other contract's flags."""
    conv = ("class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)\n"
            "    def forward(self, x):\n        return torch.nn.functional.conv2d(x, self.conv.weight, self.conv.bias, padding=1)\n")
    ev = evaluate(sup, problems["conv"], conv, precision="fp32", baselines=("torch", "torch.compile"))
    assert ev.ok, ev.message
    assert not ev.correctness.get("baselines_skipped"), ev.correctness.get("baselines_skipped")
    twin = ev.timings[pr.DEFAULT_COMPILED]
    assert twin is not ev.timings["torch.compile"] and twin.n >= 5 and pr.DEFAULT_COMPILED in ev.speedups
    # A ReLU runs the same kernels under both flags: no twin is compiled.
    relu = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n"
    ev = evaluate(sup, problems["relu"], relu, baselines=("torch", "torch.compile"))
    assert ev.ok and "torch.compile" in ev.timings and pr.DEFAULT_COMPILED not in ev.timings


def test_changing_a_precision_flag_is_a_downgrade_under_every_contract(sup, problems):
    sneaky = """
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            torch.backends.cuda.matmul.allow_tf32 = True
            return x.clamp_min(0)
    """
    for name in pr.CONTRACTS:
        ev = evaluate(sup, problems["relu"], sneaky, precision=name)
        assert ev.status == "cheat:precision_downgrade", (name, ev.status, ev.message)


def test_kernelbench_judges_by_its_own_tolerance_and_fp32_by_the_error_norm(sup, problems):
    # 3e-5 relative error everywhere: inside KernelBench's atol/rtol of 1e-4, far outside what an fp32
    # ReLU (exact) may carry.
    off = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0) * (1 + 3e-5)\n"
    strict = evaluate(sup, problems["relu"], off)
    assert strict.status == "cheat:precision_downgrade", strict.message
    kb = evaluate(sup, problems["relu"], off, precision="kernelbench")
    assert kb.ok, kb.message
    far = "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0) * (1 + 3e-3)\n"
    ev = evaluate(sup, problems["relu"], far, precision="kernelbench")
    assert not ev.ok and "outside atol=0.0001, rtol=0.0001" in ev.message, ev.message


def test_a_problem_declares_its_contract_and_a_bad_one_is_refused(problems, tmp_path):
    from cuforge.agent.config import RunConfig
    from cuforge.agent.loop import eval_config

    kb = problems["relu_kb"]
    assert kb.meta.precision == "kernelbench"
    assert eval_config(RunConfig(suite="x"), kb).precision == "kernelbench"
    assert eval_config(RunConfig(suite="x", precision="pytorch"), kb).precision == "pytorch"  # the run's wins
    assert eval_config(RunConfig(suite="x"), problems["relu"]).precision == "fp32"
    bad = tmp_path / "bad.py"
    bad.write_text(relu_problem_source().replace('"policy": "any"', '"policy": "any", "precision": "tf32"'))
    loaded, skipped = load_files([bad])
    assert not loaded and "CUFORGE precision: unknown precision contract 'tf32'" in skipped[0].reason
    from cuforge.problems.problem import meta_from_inspection

    with pytest.raises(ProblemError, match="CUFORGE precision: unknown precision contract 'half'"):
        meta_from_inspection({"precision": "half"}, {})


@pytest.mark.parametrize("args", [
    ("eval", "level1/relu", "CANDIDATE", "--cpu", "--precision", "tf32"),
    ("run", "--suite", "hgemm-small", "--compile-only", "--precision", "bf16"),
    ("baseline", "--suite", "hgemm-small", "--precision", "strict"),
])
def test_cli_refuses_an_unknown_contract_in_one_line(tmp_path, args):
    cand = tmp_path / "c.py"
    cand.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    argv = [str(cand) if a == "CANDIDATE" else a for a in args]
    r = run_cli(*argv) if args[0] == "eval" else run_cli(*argv, "--results", str(tmp_path / "r.db"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "--precision" in lines[0] and "fp32, pytorch, kernelbench" in lines[0], r.stderr


def test_leaderboard_names_the_baseline_and_its_flags():
    from cuforge.results.leaderboard import baseline_words

    assert "TF32 on" in baseline_words(pr.DEFAULT_EAGER, None)
    assert "the pytorch contract" in baseline_words("torch", "pytorch")
    assert "fp32 unless" in baseline_words("torch", None)
