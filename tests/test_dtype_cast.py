"""`--dtype bf16|fp16` and CUFORGE "cast": an fp32 problem run in half precision the way KernelBench's
precision option runs it (floating inputs and the model's weights cast), judged against float64 by
that dtype's bound, by both runners; families that take only the fp32 graph say so instead of
proposing a wrong kernel; bad values are one line."""

import json
import textwrap

import pytest
from conftest import relu_problem_source, run_cli

from cuforge.kernels.families import families_for
from cuforge.problems.loader import load_files
from cuforge.problems.problem import ProblemError, Tolerance
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig

LINEAR_PROBLEM = """
import torch
CUFORGE = {"policy": "any", "dtype": "float32"%s}
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 96)
    def forward(self, x):
        return torch.relu(self.fc(x))
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
"""

CFG = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=120)


def candidate(body: str) -> Candidate:
    return Candidate("import torch\n" + textwrap.dedent(body))


HONEST = """
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 96)
    def forward(self, x):
        return torch.relu(torch.nn.functional.linear(x, self.fc.weight, self.fc.bias))
"""
# The same layer computed in fp32 and handed back in fp32: not the dtype the problem runs in.
FP32_OUT = HONEST.replace("return torch.relu(torch.nn.functional.linear(x, self.fc.weight, self.fc.bias))",
                          "return torch.relu(torch.nn.functional.linear(x.float(), self.fc.weight.float(), self.fc.bias.float()))")
# Two mantissa bits fewer than bf16 on every product's operands: coarser than an honest bf16 kernel.
COARSE = HONEST.replace("return torch.relu(torch.nn.functional.linear(x, self.fc.weight, self.fc.bias))", """q = lambda t: (t.float().view(torch.int32) & ~0x3FFFF).view(torch.float32)
        return torch.relu(torch.nn.functional.linear(q(x), q(self.fc.weight), q(self.fc.bias))).to(x.dtype)""")


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    d = tmp_path_factory.mktemp("cast")
    (d / "linear.py").write_text(LINEAR_PROBLEM % "")
    (loaded,), skipped = load_files([d / "linear.py"])
    assert not skipped
    return loaded


def test_a_problem_in_bf16_is_the_fp32_one_with_its_tensors_cast_and_its_id_saying_so(linear):
    bf16 = linear.in_dtype("bf16")
    assert bf16.id == linear.id + "@bf16" and bf16.meta.cast == bf16.meta.dtype == "bfloat16"
    assert [t.dtype for t in bf16.inputs] == ["bfloat16"] and bf16.meta.tolerance == Tolerance.for_dtype("bfloat16")
    assert bf16.meta.bytes == linear.meta.bytes / 2
    assert bf16.in_dtype("bfloat16") is bf16 and linear.in_dtype("fp16").meta.cast == "float16"
    with pytest.raises(ProblemError, match="is bfloat16: --dtype casts fp32 problems only"):
        bf16.in_dtype("fp16")
    with pytest.raises(ProblemError, match="unknown dtype 'fp8': use bf16 or fp16"):
        linear.in_dtype("fp8")


def test_a_file_asks_for_its_dtype_and_a_bad_one_is_skipped_in_one_line(tmp_path):
    (tmp_path / "good.py").write_text(LINEAR_PROBLEM % ', "cast": "fp16"')
    (tmp_path / "bad.py").write_text(LINEAR_PROBLEM % ', "cast": "int4"')
    loaded, skipped = load_files([tmp_path / "good.py", tmp_path / "bad.py"])
    assert [p.meta.cast for p in loaded] == ["float16"] and loaded[0].id.endswith("@fp16")
    assert len(skipped) == 1 and skipped[0].reason.startswith("CUFORGE cast: unknown dtype 'int4'")


def test_no_family_proposes_fp32_code_for_a_cast_problem(linear):
    assert families_for(linear)[0]  # the fp32 problem is covered
    fams, why = families_for(linear.in_dtype("bf16"))
    assert fams == [] and "runs in bfloat16 (--dtype)" in why


@pytest.mark.parametrize("judge", ["inprocess", "split"])
def test_both_runners_judge_a_cast_problem_by_its_dtype(linear, judge, monkeypatch):
    from cuforge.sandbox.driver.supervisor import Supervisor

    monkeypatch.setenv("CUFORGE_JUDGE", judge)
    problem = linear.in_dtype("bf16")
    with Supervisor(cpu_mode=True) as sup:
        ev = sup.evaluate(problem, candidate(HONEST), CFG)
        assert ev.ok, ev.message  # its model was cast like the reference's, its output is bf16
        ev = sup.evaluate(problem, candidate(FP32_OUT), CFG)
        assert not ev.ok and "dtype torch.float32 != expected torch.bfloat16" in ev.message, ev.message
        ev = sup.evaluate(problem, candidate(COARSE), CFG)
        assert not ev.ok and ev.status in ("wrong_output", "cheat:precision_downgrade"), (ev.status, ev.message)


def test_cli_eval_runs_a_problem_in_bf16_and_refuses_an_unknown_dtype(tmp_path):
    (tmp_path / "relu.py").write_text(relu_problem_source())
    (tmp_path / "ok.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                                    "        return torch.relu(x)\n")
    r = run_cli("eval", str(tmp_path / "relu.py"), str(tmp_path / "ok.py"), "--cpu", "--dtype", "bf16", "--json",
                "--unsafe-no-jail")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["problem_id"].endswith("relu.py@bf16")
    for args in (("eval", str(tmp_path / "relu.py"), str(tmp_path / "ok.py"), "--cpu", "--dtype", "fp8"),
                 ("run", "--suite", str(tmp_path), "--cpu", "--dtype", "fp8")):
        r = run_cli(*args)
        assert r.returncode == 2 and "--dtype: unknown dtype 'fp8': use bf16 or fp16" in r.stderr, r.stderr[-1000:]
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_traced_in_its_dtype_a_cast_problem_is_matched_as_one_written_in_it(tmp_path):
    """`load_in_dtype` traces the file again as it runs cast: the families that take fp16 and bf16 match
    an fp32 matmul file run in either as they match one written in it; the fp32 families say why not."""
    from cuforge.problems.loader import load_in_dtype

    (tmp_path / "mm.py").write_text(
        "import torch\nCUFORGE = {'dtype': 'float32', 'policy': 'mixed'}\nclass Model(torch.nn.Module):\n"
        "    def forward(self, a, b):\n        return a @ b\n"
        "def get_inputs():\n    return [torch.randn(1024, 512), torch.randn(512, 768)]\ndef get_init_inputs():\n    return []\n")
    (fp32,), _ = load_files([tmp_path / "mm.py"])
    fp16 = load_in_dtype(fp32, "fp16")
    assert fp16.id.endswith("mm.py@fp16") and fp16.meta.traced_in_cast and [t.dtype for t in fp16.inputs] == ["float16"] * 2
    assert {n.op for n in fp16.graph} == {"mm"}
    fams, why = families_for(fp16)
    assert [f.name for f in fams][:1] == ["gemm_sm90"], why
    bf16 = load_in_dtype(fp32, "bf16")
    assert [f.name for f in families_for(bf16)[0]][:1] == ["gemm_sm90"]
    assert "gemm_tf32x3_sm90" not in [f.name for f in families_for(fp16)[0]]
    # a cast problem no family takes: they say why, in their own words (not the generic --dtype refusal)
    (tmp_path / "sort.py").write_text(
        "import torch\nCUFORGE = {'dtype': 'float32', 'policy': 'mixed'}\nclass Model(torch.nn.Module):\n"
        "    def forward(self, a):\n        return torch.sort(a, dim=-1).values\n"
        "def get_inputs():\n    return [torch.randn(8, 1000)]\ndef get_init_inputs():\n    return []\n")
    (sort,), _ = load_files([tmp_path / "sort.py"])
    fams, why = families_for(load_in_dtype(sort, "bf16"))
    assert fams == [] and "not covered offline" in why and "(--dtype)" not in why


def test_a_kernelbench_style_super_call_casts_without_recursion(tmp_path, cpu_sup):
    """KernelBench's files call super(Model, self).__init__(): the cast builds that class cast rather than
    binding a subclass to the name Model (which sent that call round forever)."""
    from cuforge.problems.loader import load_in_dtype

    (tmp_path / "kb.py").write_text(
        "import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super(Model, self).__init__()\n"
        "        self.fc = torch.nn.Linear(64, 32)\n    def forward(self, x):\n        return torch.relu(self.fc(x))\n"
        "def get_inputs():\n    return [torch.randn(16, 64)]\ndef get_init_inputs():\n    return []\n")
    (fp32,), _ = load_files([tmp_path / "kb.py"])
    bf16 = load_in_dtype(fp32, "bf16")
    assert bf16.meta.traced_in_cast and {t.dtype for t in bf16.params} == {"bfloat16"}
    ev = cpu_sup.evaluate(bf16.for_cpu_test_mode(),
                          candidate("class ModelNew(__cuforge_problem__.Model):\n    pass\n"), CFG)
    assert ev.ok, ev.message
