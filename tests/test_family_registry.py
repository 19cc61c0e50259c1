"""Kernel families register where they are defined (kernels/registry.py) and are indexed by the aten
ops they are built around: matching a problem asks only the families that could match it. The index
must change nothing but the time: on every problem of KernelBench's level1-2 and the built-in suites,
the families found and the reasons given are the same as when every family is asked."""

import time

import pytest

from conftest import ROOT

from cuforge.kernels import families as F
from cuforge.kernels.registry import family, registered

KB = next((p for p in (ROOT.parent / "shared" / "kernelbench", ROOT / ".kb") if p.is_dir()), None)


def test_every_family_is_registered_once_in_its_order_of_preference():
    names = [f.name for f in registered()]
    assert len(names) == len(set(names)) == 41
    assert names[:3] == ["gemm_sm90", "linear_sm90", "gemm_sm80"] and names[-2:] == ["topk_rows", "topk_chunks"]
    assert names.index("conv_tf32x3_sm90") + 1 == names.index("conv_half_sm90") == names.index("conv_direct") - 1
    assert names.index("conv_direct") + 1 == names.index("conv_pointwise_f32")  # leads() puts it first under one TF32 product
    assert names.index("conv_pointwise_f32") + 1 == names.index("conv_rows_f32")  # after the others; leads() puts it first where timed faster
    assert names.index("gemm_tf32x3_sm90") + 1 == names.index("gemm_planes_sm90") == names.index("gemm_f32") - 1
    assert [f.name for f in F.FAMILIES[:41]] == names
    assert "gated_cell" in names
    assert names.index("flash_attention") + 1 == names.index("flash_attention_sm90")  # the wgmma kernel leads where timed faster (leads())
    assert len(F.FAMILIES) == 41 + len([f for f in F.FAMILIES if f.name.startswith("staged:")])


def test_two_families_at_one_rank_are_refused_by_name():
    class One:
        pass

    class Other:
        pass

    family(999_001)(One)
    with pytest.raises(ValueError, match="families One and Other both have rank 999001"):
        family(999_001)(Other)
    from cuforge.kernels import registry

    del registry._RANKED[999_001]  # leave the registry as the package made it


@pytest.fixture(scope="module")
def corpus() -> list:
    """KernelBench's level1 and level2 files and the built-in suites, traced once for the module
    (level3's 50 files would add minutes of tracing; benchmarks/level3_coverage.py covers them)."""
    from cuforge.problems.loader import load_files
    from cuforge.problems.suites import load_suite

    problems = []
    for suite in ("level1", "level2", "hgemm-small"):
        problems += load_suite(suite).problems
    if KB is not None:
        files = [f for level in ("level1", "level2") for f in sorted((KB / level).glob("*.py"))]
        loaded, skipped = load_files(files)
        assert not skipped, skipped[:3]
        problems += loaded
    return problems


def test_the_index_finds_what_asking_every_family_finds(corpus, capsys):
    problems = corpus
    t0 = time.perf_counter()
    indexed = [F.families_for(p) for p in problems]
    t1 = time.perf_counter()
    everyone = [F.families_for(p, index=False) for p in problems]
    t2 = time.perf_counter()
    for p, (fams, why), (all_fams, all_why) in zip(problems, indexed, everyone):
        assert [f.name for f in fams] == [f.name for f in all_fams], p.id
        assert bool(why) == bool(all_why), p.id
    with capsys.disabled():
        print(f"\n{len(problems)} problems: families_for {t1 - t0:.1f} s indexed, {t2 - t1:.1f} s asking every family")


def test_the_pipeline_s_index_picks_each_stage_s_family_as_asking_every_family_does(corpus):
    """The pipeline asks only the families a part's ops could match about each part it cuts; the family
    chosen for each stage is the one asking every family (leaders first) finds, on every problem a
    pipeline covers: level1-2 and the built-in suites, and the models suite's fp32 CNN blocks under both
    contracts (where conv_pointwise_f32 leads the 1x1 convolutions or does not)."""
    from cuforge.kernels.pipeline import by_lead
    from cuforge.problems.suites import load_problem

    blocks = [load_problem(f"models/{name}").under(contract) for name in ("resnet_bottleneck", "mobilenetv2_inverted_residual")
              for contract in ("fp32", "pytorch")]
    checked = 0
    for p in corpus + blocks:
        stages = F.PIPELINE.memo_match(p)
        if isinstance(stages, str):
            continue
        first_pool = F.PIPELINE.heads if F.PIPELINE.starts_with_head(p) else F.PIPELINE.singles
        for i, stage in enumerate(stages):
            pool = first_pool if i == 0 else F.PIPELINE.singles
            asked_all = next((f for f in by_lead(pool, stage.problem) if f.supports(stage.problem) is None), None)
            assert stage.family is asked_all, (p.id, i, stage.family.name, asked_all and asked_all.name)
            checked += 1
    assert checked >= 3 * len(blocks)


def test_every_family_answers_every_problem_without_raising(corpus):
    """A family's matcher meets graphs it was not written for; it says why not, it never raises (a
    pooling file once made the pipeline's chain compiler raise KeyError)."""
    for p in corpus:
        for fam in F.FAMILIES + [F.PIPELINE]:
            why = fam.supports(p)
            assert why is None or (isinstance(why, str) and why), (p.id, fam.name)


def test_an_anchored_family_is_not_asked_about_a_graph_without_its_ops():
    from dataclasses import replace

    gemm = next(f for f in F.FAMILIES if f.name == "gemm_sm90")
    assert F.could_match(gemm, frozenset({"mm"})) and not F.could_match(gemm, frozenset({"relu"}))
    staged = next(f for f in F.FAMILIES if f.name.startswith("staged:conv_tf32x3_sm90"))
    assert staged.anchors == frozenset({"convolution"})
    pointwise = next(f for f in F.FAMILIES if f.name == "pointwise")
    assert pointwise.anchors is None and F.could_match(pointwise, frozenset())
    assert replace  # dataclasses stay importable beside the registry


def test_every_seed_is_a_point_of_its_family_s_knob_space_and_renders(corpus):
    """Seeds are configs like any other: typed and checked (Family.config) before a kernel is rendered,
    for every family that covers a problem of the corpus, the two- and many-kernel ones through their
    stages' families."""
    rendered = 0
    for p in corpus:
        fams, _ = F.families_for(p)
        for fam in fams:
            for seed in fam.seeds(p)[:4]:
                if fam.valid(seed, p):
                    assert fam.render(seed, p).source, (p.id, fam.name, seed)
                    rendered += 1
    assert rendered > len(corpus)


def test_no_module_the_registry_imports_imports_the_family_list_back():
    """The registry imports every module of the kernels package while `families` is still loading: a
    module there that imports `families` at its top fails with a circular import whenever `families`
    is imported first (`cuforge problems list` does). Read from the source, and tried in a fresh process."""
    import ast
    import subprocess
    import sys

    from conftest import ROOT

    offenders = []
    for path in sorted((ROOT / "src" / "cuforge" / "kernels").glob("*.py")):
        if path.name == "families.py":
            continue
        for node in ast.parse(path.read_text()).body:  # module level only: a function may import it lazily
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module == "cuforge.kernels":
                names = [f"cuforge.kernels.{a.name}" for a in node.names]
            if "cuforge.kernels.families" in names:
                offenders.append(path.name)
    assert offenders == []
    r = subprocess.run([sys.executable, "-c", "import cuforge.kernels.families as f; print(len(f.FAMILIES))"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and int(r.stdout) >= 28, r.stderr[-2000:]
