"""An LLM gets the part that is left: where only a partition covers a problem, its prompt shows that
candidate (cuforge's kernels, PyTorch written out for the rest) and names the ops no kernel covers;
where no partition runs on the GPU, the kernel for the longest head of the graph and the ops after it.
Tested through `cuforge run` against a scripted OpenAI-compatible server."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, relu_problem_source
from llm_servers import ScriptedLLMServer, openai_reply

from cuforge.agent.partial import partial_cover
from cuforge.problems.loader import load_files

MM_SORT = """
import torch
M, K, N = 256, 512, 384
CUFORGE = {"policy": "mixed", "dtype": "float32", "small": {"M": 8, "K": 16, "N": 12}}
class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.sort(a @ b, dim=-1).values
def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]
def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    d = tmp_path_factory.mktemp("partial")
    (d / "mm_sort.py").write_text(MM_SORT)
    return d


@pytest.fixture(scope="module")
def mm_sort(suite):
    (p,), skipped = load_files([suite / "mm_sort.py"])
    assert not skipped
    return p


def test_a_partition_comes_as_its_candidate_with_the_pytorch_parts_named(mm_sort):
    pc = partial_cover(mm_sort, "9.0")
    assert pc is not None and pc.family == "partition" and pc.head_ops == ("mm",) and pc.rest_ops == ("sort",)
    compile(pc.module, "<partition module>", "exec")  # a module as a candidate would be: it parses
    assert "class ModelNew" in pc.module and "_Stage(" in pc.module and "_GraphStage(" in pc.module
    assert "aten.sort(" in pc.module


def test_the_longest_covered_head_comes_with_a_module_that_runs_its_kernel(mm_sort):
    # On a GPU the partition's Hopper kernels do not run on, the head is a kernel that does.
    pc = partial_cover(mm_sort, "8.0")
    assert pc is not None and pc.family.startswith("gemm") and pc.family != "gemm_tf32x3_sm90"
    assert pc.head_ops == ("mm",) and pc.rest_ops == ("sort",)
    assert pc.cut_shape == (256, 384) and pc.cut_dtype == "float32" and pc.rest_inputs == ()
    compile(pc.module, "<head module>", "exec")
    assert "class ModelNew" in pc.module and "_Stage(" in pc.module


def test_a_problem_covered_whole_or_run_in_another_dtype_has_no_partial_cover(mm_sort, tmp_path):
    (tmp_path / "relu.py").write_text(relu_problem_source())
    (relu,), _ = load_files([tmp_path / "relu.py"])
    assert partial_cover(relu) is None  # the offline search covers it whole
    assert partial_cover(mm_sort.in_dtype("bf16")) is None


def test_the_llm_prompt_names_the_rest_and_shows_the_kernel_already_chosen(suite, tmp_path):
    db = tmp_path / "r.db"
    with ScriptedLLMServer(openai_reply("No idea yet.")) as srv:
        r = subprocess.run([sys.executable, "-m", "cuforge.cli", "run", "--suite", str(suite), "--provider", "openai",
                            "--model", "test-model", "--base-url", srv.url + "/v1", "--islands", "1", "--generations", "1",
                            "--concurrency", "1", "--compile-only", "--results", str(db), "--json"],
                           capture_output=True, text=True, timeout=600, cwd=ROOT,
                           env=dict(os.environ, OPENAI_API_KEY="sk-test"))
        assert r.returncode in (0, 1), r.stderr[-3000:]
        sent = [m["content"] for req in srv.requests for m in req["body"]["messages"] if m["role"] == "user"]
    assert sent, r.stderr[-2000:]
    prompt = sent[0]
    # A partition covers it (the GEMM a kernel, the sort PyTorch's): the prompt shows that candidate
    assert "# Already covered: the parts cuforge's kernels compute" in prompt and "compute 1 of the forward's ops (mm)" in prompt
    assert "No kernel of cuforge's covers these ops: sort." in prompt and "class ModelNew" in prompt
    assert "aten.sort(" in prompt
    assert json.loads(r.stdout)["llm_calls"] >= 1
