"""Candidates of three or four kernels on the CPU: where the graph is cut (each part one family's, the
first a convolution or GEMM), which stage each kernel reads (an earlier stage's tensor or a forward
input), the family offered only where nothing else covers the graph, its seeds valid and compiling with
NVRTC stage by stage, and the template proposer running out of its seeds without failing."""

import pytest

from cuforge.agent.template_proposer import TemplateProposer
from cuforge.kernels.base import config_of
from cuforge.kernels.families import families_for
from graph_eval import assert_stages_compute_forward
from template_helpers import problem_from_expr, smoke_compile

CONV_POOL_MEAN = ("torch.tanh(torch.mean(F.hardtanh(F.max_pool2d(self.conv(a), 2), -1, 1), dim=(2, 3), keepdim=True))",
                  "torch.randn(2, 8, 20, 21)", "        self.conv = nn.ConvTranspose2d(8, 16, 3, stride=2)")

POOL_FIRST = ("(lambda y: torch.softmax(y.view(2, 16, -1), dim=2).view(2, 16, 8, 12, 12) * self.s)"
              "(torch.clamp(self.conv(F.avg_pool3d(a, 2)), 0.0, 1.0))", "torch.rand(2, 8, 8, 12, 12)",
              "        self.conv = nn.ConvTranspose3d(8, 16, 3, stride=2, padding=1, output_padding=1)\n"
              "        self.s = nn.Parameter(torch.randn(1, 16, 1, 1, 1))")

# KernelBench level2 shapes at small sizes, each three or four kernels (test_gpu_staged runs them on a GPU).
PIPELINE_CASES = [
    # level2/10's: a transposed convolution, max pooling, hardtanh, a mean over H, W, tanh.
    CONV_POOL_MEAN,
    # level2/51's: the GEMM's input back as a residual after a mean and a GELU (a later stage reads an input).
    ("F.gelu(torch.mean(self.fc(a) - self.s, dim=1, keepdim=True)) + a", "torch.randn(64, 128)",
     "        self.fc = nn.Linear(128, 128)\n        self.s = nn.Parameter(torch.randn(128))"),
    # level2/72's: a training-mode batch norm, then two average poolings.
    ("F.avg_pool3d(F.avg_pool3d(self.bn(self.conv(a)), 2), 2)", "torch.randn(2, 4, 9, 10, 11)",
     "        self.conv = nn.ConvTranspose3d(4, 8, 3, stride=2)\n        self.bn = nn.BatchNorm3d(8)"),
    # level2/15's: x - x.mean(...) after a batch norm, the last stage reading the stages one and two back.
    ("(lambda y: y - y.mean(dim=(2, 3, 4), keepdim=True))(self.bn(self.conv(a)))", "torch.randn(2, 4, 6, 7, 8)",
     "        self.conv = nn.ConvTranspose3d(4, 8, 3, stride=2)\n        self.bn = nn.BatchNorm3d(8)"),
    # level2/23's: a group norm, then the mean of each image.
    ("self.gn(self.conv(a)).mean(dim=[1, 2, 3, 4])", "torch.randn(4, 3, 8, 12, 12)",
     "        self.conv = nn.Conv3d(3, 16, 3)\n        self.gn = nn.GroupNorm(4, 16)"),
    # level2/55's and 98's: a GEMM's features pooled as (N, 1, 1, F) through unsqueezes, squeezed back.
    ("torch.sum(F.max_pool1d(self.fc(a).unsqueeze(1), 2).squeeze(1), dim=1) * 0.5", "torch.randn(64, 256)",
     "        self.fc = nn.Linear(256, 512)"),
    ("torch.max(F.gelu(F.avg_pool1d(self.fc(a).unsqueeze(1), 16).squeeze(1)) * 2.0, dim=1).values", "torch.randn(64, 256)",
     "        self.fc = nn.Linear(256, 512)"),
    # level2/38's: an average pooling before a transposed convolution, a clamp, a softmax over the spatial
    # dims (merged by a view) and a per-channel scale.
    POOL_FIRST,
    # level2/75's: a group norm, a min over the features, then a bias that broadcasts it to (1, F, N, 1).
    ("torch.min(self.gn(self.fc(a)), dim=1, keepdim=True)[0] + self.b", "torch.randn(64, 128)",
     "        self.fc = nn.Linear(128, 96)\n        self.gn = nn.GroupNorm(8, 96)\n        self.b = nn.Parameter(torch.randn(1, 96, 1, 1))"),
]


def test_a_convolution_a_pooling_and_a_mean_are_three_stages(tmp_path):
    p = problem_from_expr(tmp_path, *CONV_POOL_MEAN[:2], args="a", init=CONV_POOL_MEAN[2])
    fams, why = families_for(p)
    assert [f.name for f in fams] == ["pipeline"], why
    stages = fams[0].matched(p)
    assert [s.family.name for s in stages][0] == "conv_tf32x3_sm90" and len(stages) in (3, 4)
    assert stages[1].family.name == "pool" and stages[-1].family.name == "reduce_dim"
    assert stages[0].feed == (("in", 0),)
    assert all(s.feed[0] == ("stage", i) for i, s in enumerate(stages[1:]))
    # Each stage's output is the next one's input.
    for a, b in zip(stages, stages[1:]):
        assert a.problem.outputs[0].shape == b.problem.inputs[0].shape


def test_a_later_stage_reads_a_forward_input_through_its_feed(tmp_path):
    # KernelBench level2/51's shape: the GEMM's input comes back as a residual after a mean and a GELU.
    p = problem_from_expr(tmp_path, "F.gelu(torch.mean(self.fc(a) - self.s, dim=1, keepdim=True)) + a", "torch.randn(64, 128)",
                          args="a", init="        self.fc = nn.Linear(128, 128)\n        self.s = nn.Parameter(torch.randn(128))")
    fams, why = families_for(p)
    assert [f.name for f in fams] == ["pipeline"], why
    stages = fams[0].matched(p)
    assert stages[-1].feed == (("stage", len(stages) - 2), ("in", 0)), [s.feed for s in stages]


def test_offered_only_where_one_or_two_kernels_do_not_cover(tmp_path):
    two = problem_from_expr(tmp_path, "torch.min(self.conv(a) * 2, dim=1, keepdim=True)[0]", "torch.randn(2, 5, 30, 31)",
                            args="a", init="        self.conv = nn.Conv2d(5, 40, 3)")
    assert "pipeline" not in [f.name for f in families_for(two)[0]]
    plain = problem_from_expr(tmp_path, "torch.relu(a)", "torch.randn(8, 8)", args="a")
    assert "pipeline" not in [f.name for f in families_for(plain)[0]]
    # No convolution or GEMM first: each part is any family's kernel, chained.
    bare = problem_from_expr(tmp_path, "torch.cumsum(torch.softmax(a, dim=0), dim=1).sum(dim=0)", "torch.randn(8, 8)", args="a")
    fams, _ = families_for(bare)
    assert [s.family.name for s in fams[0].matched(bare)] == ["softmax_dim", "scan_rows", "reduce_dim"]
    assert_stages_compute_forward(fams[0], bare)


def test_seeds_are_valid_render_as_one_module_and_compile(tmp_path):
    p = problem_from_expr(tmp_path, *CONV_POOL_MEAN[:2], args="a", init=CONV_POOL_MEAN[2])
    fam = families_for(p)[0][0]
    seeds = fam.seeds(p)
    assert len(seeds) >= 2 and all(fam.valid(c, p) for c in seeds)
    assert not fam.valid({}, p) and not fam.valid({**seeds[0], "s0.NOPE": 1}, p)
    cand = fam.render(seeds[0], p)
    cfg = config_of(cand.source)
    assert cfg["family"] == "pipeline" and cfg["stages"].startswith("conv_tf32x3_sm90+pool+")
    assert fam.complete(cfg) == fam.complete(seeds[0])
    smoke_compile(fam, p, 0)


def test_after_its_seeds_the_search_moves_the_stages_knobs(tmp_path):
    # A pipeline's knobs are its stages' (s<i>.<knob>): after its seeds, a search whose parent is a
    # pipeline moves one or two of them (it used to find nothing to propose and end the problem).
    p = problem_from_expr(tmp_path, *CONV_POOL_MEAN[:2], args="a", init=CONV_POOL_MEAN[2])
    fam = families_for(p)[0][0]
    seeds = fam.seeds(p)
    proposer = TemplateProposer(seed=1)
    seen = [config_of(proposer.propose_candidate(p, "IMPROVE", None, [], "9.0").source) for _ in seeds]
    assert len({str(sorted(c.items())) for c in seen}) == len(seeds)
    knobs = fam.knobs_for(p)
    stages = fam.matched(p)
    assert set(knobs) == {f"s{i}.{k}" for i, s in enumerate(stages) for k in s.family.knobs}
    parent_cfg = fam.complete(seeds[0])
    parent = type("Parent", (), {"source": fam.render(seeds[0], p).source})()
    children = [fam.complete(config_of(proposer.propose_candidate(p, "IMPROVE", parent, [], "9.0").source)) for _ in range(6)]
    assert len({str(sorted(c.items())) for c in children}) == 6 and all(fam.valid(c, p) for c in children)
    for child in children:
        assert 1 <= sum(child.get(k) != parent_cfg.get(k) for k in knobs) <= 2, (child, parent_cfg)


def test_a_resumed_run_does_not_propose_a_pipeline_seed_again(tmp_path):
    p = problem_from_expr(tmp_path, *CONV_POOL_MEAN[:2], args="a", init=CONV_POOL_MEAN[2])
    fam = families_for(p)[0][0]
    seeds = fam.seeds(p)
    proposer = TemplateProposer(seed=1)
    proposer.remember(p, fam.render(seeds[0], p).source)
    offered = [fam.complete(config_of(proposer.propose_candidate(p, "IMPROVE", None, [], "9.0").source)) for _ in seeds[1:]]
    assert fam.complete(seeds[0]) not in offered and len(offered) == len(seeds) - 1


def test_a_stage_reads_the_tensor_two_stages_back(tmp_path):
    # KernelBench level2/15's shape: x - x.mean(...) after a batch norm; the subtraction reads the batch
    # norm's output (stage 1) and the mean of it (stage 2).
    p = problem_from_expr(tmp_path, "(lambda y: y - y.mean(dim=(2, 3, 4), keepdim=True))(self.bn(self.conv(a)))",
                          "torch.randn(2, 4, 6, 7, 8)", args="a",
                          init="        self.conv = nn.ConvTranspose3d(4, 8, 3, stride=2)\n        self.bn = nn.BatchNorm3d(8)")
    fams, why = families_for(p)
    assert [f.name for f in fams] == ["pipeline"], why
    stages = fams[0].matched(p)
    assert [s.family.name for s in stages] == ["conv_tf32x3_sm90", "batch_norm", "reduce_dim", "pointwise"]
    assert stages[3].feed in ((("stage", 2), ("stage", 1)), (("stage", 1), ("stage", 2)))
    smoke_compile(fams[0], p, 0)


@pytest.mark.parametrize("expr, inputs, init", PIPELINE_CASES)
def test_the_stages_compute_what_the_forward_computes(tmp_path, expr, inputs, init):
    # The cut and the feeds checked without a GPU: every stage's graph run with torch, chained as the
    # candidate module chains its kernels, against the model's own forward.

    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "pipeline"
    assert_stages_compute_forward(fam, p)


def test_a_compile_only_run_evaluates_each_distinct_pipeline_once(tmp_path):
    # Each stage's CUDA source sits in the module as a one-line repr: the candidate's identity must see
    # all of it (a // comment in it once hid every later stage's config, and a run stopped at one seed).
    import sqlite3

    from conftest import run_cli

    suite = tmp_path / "suite"
    suite.mkdir()
    problem_from_expr(suite, *CONV_POOL_MEAN[:2], args="a", init=CONV_POOL_MEAN[2])
    db = tmp_path / "r.db"
    r = run_cli("run", "--suite", str(suite), "--islands", "1", "--generations", "3", "--compile-only", "--results",
                str(db), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    con = sqlite3.connect(db)
    try:
        got = con.execute("SELECT e.status, c.source FROM evaluations e JOIN candidates c ON c.id = e.candidate_id").fetchall()
    finally:
        con.close()
    assert [status for status, _ in got] == ["compiled"] * 3
    configs = {str(sorted(config_of(source).items())) for _, source in got}
    assert len(configs) == 3


def test_a_gemm_whose_features_are_pooled_through_unit_dims_is_four_kernels(tmp_path):
    # KernelBench level2/55: unsqueeze, pool, squeeze are one pooling kernel over the GEMM's output.
    p = problem_from_expr(tmp_path, "torch.sum(F.max_pool1d(self.fc(a).unsqueeze(1), 2).squeeze(1), dim=1) * 0.5",
                          "torch.randn(64, 256)", args="a", init="        self.fc = nn.Linear(256, 512)")
    fam = families_for(p)[0][0]
    stages = fam.matched(p)
    assert [s.family.name for s in stages] == ["gemm_tf32x3_sm90", "pool", "reduce_rows", "pointwise"]
    assert stages[1].problem.outputs[0].shape == (64, 256)  # the pooled features, squeezed back to 2-d
    smoke_compile(fam, p, 0)


def test_a_graph_that_starts_with_neither_a_convolution_nor_a_gemm_starts_with_any_familys_kernel(tmp_path):
    # KernelBench level2/38: the pooling's kernel, then the convolution's, then the softmax's.
    expr, inputs, init = POOL_FIRST
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    fam = families_for(p)[0][0]
    assert [s.family.name for s in fam.matched(p)] == ["pool", "conv_tf32x3_sm90", "softmax_rows"]
    assert_stages_compute_forward(fam, p)
    smoke_compile(fam, p, 0)
    # Two kernels where the first is not a convolution or a GEMM: no staged pair takes them, the pipeline does.
    two = problem_from_expr(tmp_path, "torch.softmax(F.avg_pool2d(a, 2), dim=-1) * 2", "torch.randn(4, 8, 32, 64)", args="a")
    fams = [f.name for f in families_for(two)[0]]
    assert fams == ["pipeline"], fams
    assert [s.family.name for s in families_for(two)[0][0].matched(two)] == ["pool", "softmax_rows"]
