"""The built-in `models` suite: operators of real models (LLaMA/Mistral, GPT-2, ViT, ResNet, MobileNetV2,
ConvNeXt, LSTM/GRU, serving and training steps) at the shapes those models run, each file in fp32 and,
through CUFORGE "dtypes", in bf16 and fp16. Every problem loads, and PyTorch's own model as the
candidate passes the judge in every dtype (no false accusation of half-precision PyTorch); which
family covers each, or why none does, is said before any run."""

import json

import pytest
from conftest import run_cli

from cuforge.kernels.families import families_for
from cuforge.problems.problem import ProblemError
from cuforge.problems.suites import load_problem, load_suite
from cuforge.sandbox.protocol.candidate import Candidate
from cuforge.sandbox.protocol.evaluation import EvalConfig

CFG = EvalConfig(device="cpu", trials=5, min_samples=5, max_samples=10, timeout_s=120)
# The problem's own Model, subclassed: PyTorch computing the operator in the problem's dtype.
ITSELF = Candidate("import torch\nclass ModelNew(__cuforge_problem__.Model):\n    pass\n")


@pytest.fixture(scope="module")
def models():
    return load_suite("models")


def test_the_suite_has_forty_problems_or_more_in_three_dtypes(models):
    assert not models.skipped, models.skipped[:3]
    ids = [p.id for p in models.problems]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    dtypes = {p.meta.dtype for p in models.problems}
    assert dtypes == {"float32", "bfloat16", "float16"}
    for name in ("llama_rmsnorm", "gqa_attention", "resnet_bottleneck", "lstm_cell", "convnext_block"):
        assert {f"models/{name}", f"models/{name}@bf16", f"models/{name}@fp16"} <= set(ids)


def test_one_dtype_of_a_file_is_loaded_by_its_id():
    p = load_problem("models/rotary_half@fp16")
    assert p.id == "models/rotary_half@fp16" and p.meta.cast == "float16"
    assert load_problem("models/rotary_half").meta.dtype == "float32"
    with pytest.raises(ProblemError, match="rotary_half comes as models/rotary_half, models/rotary_half@bf16"):
        load_problem("models/rotary_half@fp8")


def test_pytorch_itself_passes_the_judge_in_every_dtype(models, cpu_sup):
    failed = []
    for p in models.problems:
        ev = cpu_sup.evaluate(p.for_cpu_test_mode(), ITSELF, CFG)
        if not ev.ok:
            failed.append((p.id, ev.status, ev.message[:200]))
    assert not failed, failed


def test_each_problem_says_which_family_covers_it_or_why_none_does(models):
    for p in models.problems:
        fams, why = families_for(p)
        assert fams or why.startswith("not covered offline"), p.id
        if p.meta.cast:  # traced as it runs, in its dtype: the families' own dtype checks decide
            assert p.meta.traced_in_cast and all(t.dtype != "float32" for t in p.inputs if t.dtype.startswith("float"))
            assert all(f.name not in ("gemm_tf32x3_sm90", "conv_tf32x3_sm90", "gemm_f32", "gemv_f32") for f in fams)


def test_problems_list_names_the_suite_s_coverage():
    r = run_cli("problems", "list", "--suite", "models", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["problems"]
    assert len(rows) >= 40
    by_id = {row["id"]: row for row in rows}
    assert by_id["models/llama_rmsnorm"]["offline"] and by_id["models/llama_rmsnorm"]["not_covered"] is None
    # Its x.float() ... .to(x.dtype) in one kernel: norm_rows first, residual_norm's empty prologue next.
    assert by_id["models/llama_rmsnorm@bf16"]["offline"] == ["norm_rows", "residual_norm"]
    assert by_id["models/residual_rmsnorm@bf16"]["offline"] == ["residual_norm"]
    assert by_id["models/topk_sampling"]["offline"] == ["topk_chunks", "topk_rows"] and by_id["models/topk_sampling"]["not_covered"] is None
    assert all(row["offline"] for row in rows)  # every problem of the suite covered, in every dtype


def test_every_partition_s_pytorch_parts_compute_the_forward(models, cpu_sup, tmp_path):
    """Each file at its CUFORGE['small'] sizes (its module constants set to them, so the trace and the
    shapes a partition writes out are the small ones), cut into parts, every part (kernel parts too) run
    by PyTorch as the partition writes it out, and judged: the cuts, the values fed between parts and
    the dtypes a part is told it reads are what the forward computes. Under the `pytorch` contract the
    library's products with the ops around them fused (partition:library) are cut and judged alike."""
    from cuforge.kernels.families import LIBRARY_AROUND, PARTITION
    from cuforge.problems.loader import load_files

    paths = sorted({p.path for p in models.problems})
    for path in paths:
        ns: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), ns)
        small = "".join(f"{k} = {v!r}\n" for k, v in ns["CUFORGE"]["small"].items())
        (tmp_path / path.name).write_text(path.read_text() + "\n# the CUFORGE['small'] sizes\n" + small)
    problems, skipped = load_files(sorted(tmp_path.glob("*.py")))
    assert not skipped, skipped[:2]
    failed, cut, library = [], 0, 0
    for p in problems:
        fams = families_for(p)[0]
        under = p.under("pytorch")  # where cuDNN may use TF32, the library's products with the rest fused
        cuts = [(p, PARTITION)] if fams and fams[0] is PARTITION else []
        if LIBRARY_AROUND in families_for(under)[0]:
            cuts.append((under, LIBRARY_AROUND))
            library += 1
        for q, family in cuts:
            cut += 1
            ev = cpu_sup.evaluate(q.for_cpu_test_mode(), Candidate(family.in_pytorch(q), "module"), CFG)
            if not ev.ok:
                failed.append((q.id, family.name, ev.status, ev.message[:200]))
    # ResNet's bottleneck and MobileNetV2's block in fp32: cuDNN's convolutions, batch norms and activations fused
    assert cut >= 20 and library >= 2 and not failed, (cut, library, failed)
