"""Two-kernel candidates on the CPU: where a graph is cut (the longest head the anchor family fuses,
a tail another family matches), how the tail's refs are renamed, the module that launches both
kernels (valid Python, its config recoverable, each stage's kernel compiling with NVRTC), and the
norm families' elementwise chain after a group or layer norm."""

import pytest

from cuforge.kernels.base import config_of
from cuforge.kernels.families import families_for
from cuforge.kernels.normalize import Normalize
from cuforge.kernels.staged import Staged, cut_at
from cuforge.runtime import compile_cuda
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, TorchGraph, wrap_stages
from template_helpers import problem_from_expr, smoke_compile

CONV_GN = ("self.gn(torch.relu(self.conv(a)) * 2)", "torch.randn(2, 8, 20, 20)",
           "        self.conv = nn.Conv2d(8, 32, 3)\n        self.gn = nn.GroupNorm(4, 32)")


def test_the_cut_is_after_the_longest_fused_head(tmp_path):
    p = problem_from_expr(tmp_path, CONV_GN[0], CONV_GN[1], args="a", init=CONV_GN[2])
    fams, _ = families_for(p)
    # 8 input channels: the direct convolution leads the implicit GEMM as the head (conv.direct_first).
    assert [f.name for f in fams[:2]] == ["staged:conv_direct+normalize", "staged:conv_tf32x3_sm90+normalize"]
    cut = fams[0].matched(p)
    assert [n.op for n in cut.head.graph] == ["convolution", "relu", "mul"]
    assert cut.head.graph_outputs == (cut.head.graph[-1].out,) and cut.head.outputs[0].shape == (2, 32, 18, 18)
    assert cut.tail.graph[0].op == "native_group_norm" and cut.tail.graph[0].args[0] == "in0"
    assert cut.tail.inputs[0].shape == (2, 32, 18, 18) and cut.tail_inputs == ()


def test_a_tail_that_reads_the_forward_inputs_gets_them_after_the_cut_tensor(tmp_path):
    p = problem_from_expr(tmp_path, "torch.softmax(a @ b, dim=-1) + c", "torch.randn(64, 32), torch.randn(32, 48), torch.randn(64, 48)",
                          args="a, b, c")
    cut = cut_at(p, 1)
    assert cut.tail_inputs == (2,) and [s.shape for s in cut.tail.inputs] == [(64, 48), (64, 48)]
    assert cut.tail.graph[-1].args[1] == "in1"  # c, renamed after the cut tensor (in0)


def test_a_cut_whose_rest_reads_inside_the_head_is_refused(tmp_path):
    p = problem_from_expr(tmp_path, "(lambda y: torch.softmax(torch.relu(y), dim=-1) + y)(a @ b)",
                          "torch.randn(64, 32), torch.randn(32, 48)")
    assert cut_at(p, 2) == "the rest reads a value from inside the head"


def test_a_head_may_end_in_unit_dims_added_or_dropped_but_no_other_view(tmp_path):
    p = problem_from_expr(tmp_path, "torch.relu(torch.tanh(a).unsqueeze(1).squeeze(1).unsqueeze(0))", "torch.randn(8, 8)", args="a")
    ops = [n.op for n in p.graph]
    assert ops == ["tanh", "unsqueeze", "squeeze", "unsqueeze", "relu"]
    for k in (2, 3, 4):  # after tanh's unit-dim views: the tail gets the viewed tensor
        cut = cut_at(p, k)
        assert not isinstance(cut, str), (k, cut)
        assert cut.tail.inputs[0].shape == p.graph[k - 1].shape
    regrouped = problem_from_expr(tmp_path, "torch.relu(torch.tanh(a).view(4, 16))", "torch.randn(8, 8)", args="a")
    assert [n.op for n in regrouped.graph] == ["tanh", "view", "relu"]
    assert cut_at(regrouped, 2) == "the head would end in a view"
    viewed_input = problem_from_expr(tmp_path, "torch.relu(a.unsqueeze(0))", "torch.randn(8, 8)", args="a")
    assert cut_at(viewed_input, 1) == "the head would end in a view"


# KernelBench level2/28: an instance norm of a GEMM's rows viewed as (N, 1, 1, F), then + y, * y.
GEMM_ROW_INSTANCE_NORM = ("(self.inorm(self.fc(a).unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1) + b) * b",
                          "torch.randn(32, 64), torch.randn(32, 96)",
                          "        self.fc = nn.Linear(64, 96)\n        self.inorm = nn.InstanceNorm2d(96)")


def test_a_gemm_then_an_instance_norm_of_its_rows_with_the_second_input_in_the_chain(tmp_path):
    from graph_eval import assert_stages_compute_forward

    expr, inputs, init = GEMM_ROW_INSTANCE_NORM
    p = problem_from_expr(tmp_path, expr, inputs, init=init)
    fam = families_for(p)[0][0]
    assert fam.name == "staged:gemm_tf32x3_sm90+normalize"
    tail = fam.matched(p).tail
    m = Normalize().matched(tail)
    assert (m.kind, m.outer, m.reduced, m.inner) == ("instance", 32, 96, 1)
    assert [kind for _, kind in m.epilogue.tensors] == ["rc"]  # y, per element (read once for both uses)
    assert_stages_compute_forward(fam, p)
    smoke_compile(fam, p, 0)
    # The norm's result must come back to the input's shape: one kernel writes its input's shape.
    kept = problem_from_expr(tmp_path, "self.inorm(a.unsqueeze(1).unsqueeze(1)) + 1", "torch.randn(32, 96)", args="a",
                             init="        self.inorm = nn.InstanceNorm2d(96)")
    assert "the output must have the input's shape" in Normalize().supports(kept)


def test_the_staged_module_launches_both_kernels_and_carries_its_config(tmp_path):
    p = problem_from_expr(tmp_path, CONV_GN[0], CONV_GN[1], args="a", init=CONV_GN[2])
    fam = families_for(p)[0][0]
    assert isinstance(fam, Staged)
    seeds = fam.seeds(p)
    assert seeds and all(k.startswith(("h.", "t.")) for k in seeds[0]) and all(fam.valid(c, p) for c in seeds)
    cand = fam.render(seeds[0], p)
    assert cand.format == "module" and cand.meta["family"] == fam.name
    assert config_of(cand.source) == {"family": fam.name, **fam.complete(seeds[0])}
    compile(cand.source, "<staged>", "exec")
    cut = fam.matched(p)
    h, t = fam.split(fam.complete(seeds[0]))
    for family, config, part in ((fam.head, h, cut.head), (fam.tail, t, cut.tail)):
        stage = family.render(config, part)
        assert repr(stage.source) in cand.source  # embedded as a literal
        compile_cuda(stage.source, arch="sm_90a", options=stage.launch.options)


def test_stages_are_fed_only_from_inputs_and_earlier_stages():
    launch = LaunchSpec(entry="k", grid="(1,)", block="(1,)", args=("in0", "out0"), outputs=(("in0.shape", "float32"),))
    with pytest.raises(ValueError, match="an input, an earlier stage"):
        wrap_stages([("src", launch), ("src", launch)], [[("in", 0)], [("stage", 1)]])
    # the k-th value of an earlier stage: only a PyTorch part returns several
    with pytest.raises(ValueError, match="a value of an earlier PyTorch part"):
        wrap_stages([("src", launch), ("src", launch)], [[("in", 0)], [("stage", 0, 1)]])
    part = TorchGraph("def part(inputs, params):\n    return (inputs[0], inputs[0] * 2)\n", "two values")
    compile(wrap_stages([part, ("src", launch)], [[("in", 0)], [("stage", 0, 1)]]), "<staged>", "exec")
    with pytest.raises(ValueError, match="one feed list per stage"):
        wrap_stages([("src", launch)], [])


@pytest.mark.parametrize("expr, init", [
    ("F.hardtanh(self.gn(a), -0.5, 0.5)", "        self.gn = nn.GroupNorm(8, 64)"),
    ("(lambda y: y * torch.sigmoid(y) * self.w)(self.gn(a))", "        self.gn = nn.GroupNorm(8, 64)\n        self.w = nn.Parameter(torch.randn(64))"),
    ("F.gelu(self.ln(a)) * 2.0", "        self.ln = nn.LayerNorm(64)"),
])
def test_a_norm_op_followed_by_an_elementwise_chain_is_one_normalize_kernel(tmp_path, expr, init):
    p = problem_from_expr(tmp_path, expr, "torch.randn(16, 64)", args="a", init=init)
    fam = Normalize()
    assert fam.supports(p) is None, fam.supports(p)
    m = fam.matched(p)
    assert m.epilogue.body.strip()
    for c in fam.seeds(p):
        cand = fam.render(c, p)
        assert "#define EPI_AT(v, i) epilogue(" in cand.source
        compile_cuda(cand.source, arch="sm_90a")


def test_a_compile_only_worker_loads_the_staged_module_and_builds_both_kernels(tmp_path):
    from cuforge.sandbox.protocol.evaluation import EvalConfig
    from cuforge.sandbox.driver.executor import LocalExecutor

    p = problem_from_expr(tmp_path, CONV_GN[0], CONV_GN[1], args="a", init=CONV_GN[2])
    fam = families_for(p)[0][0]
    good = fam.render(fam.seeds(p)[0], p)
    assert "block_sum(double v" in good.source  # the tail's (normalize's) kernel, the second stage
    broken = Candidate(good.source.replace("block_sum(double v", "block_sum(double v;"), "module")
    config = EvalConfig(device="cpu", compile_only=True, baselines=("torch",))
    ex = LocalExecutor(["0"], compile_only=True)
    try:
        ev, bad = ex.evaluate(p, good, config), ex.evaluate(p, broken, config)
    finally:
        ex.close()
    assert ev.status == "compiled", ev.message
    assert bad.status == "compile_error", bad.message  # the second stage is built too


RNN_STEPS = 3000


@pytest.mark.timeout(240)
def test_coverage_of_a_long_recurrent_graph_is_decided(tmp_path):
    """A recurrent cell over many steps traces to a graph of ~20k nodes (KernelBench's LSTMs: 40k-86k).
    Cutting it at every node and checking each cut from scratch, or rebuilding the set of values read
    for every node, never finished there; the cut points come from one pass and coverage is decided."""
    from cuforge.kernels.staged import cut_points

    f = tmp_path / "rnn.py"
    f.write_text(f"""
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.u = nn.Parameter(torch.randn(8, 8))
    def forward(self, x):
        h = x[0] * 0
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] @ self.w + h @ self.u)
        return h
def get_inputs():
    return [torch.randn({RNN_STEPS}, 4, 8)]
def get_init_inputs():
    return []
""")
    from cuforge.problems.loader import load_files

    (p,), skipped = load_files([f], timeout_s=200)
    assert not skipped and len(p.graph) > 5 * RNN_STEPS
    families, why = families_for(p)
    assert families or "not covered offline" in why
    tail = len(p.graph) - 400  # the brute-force check, over the last 400 cuts only
    brute = [k for k in range(len(p.graph) - 1, tail, -1) if not isinstance(cut_at(p, k), str)]
    assert brute == [k for k in cut_points(p) if k > tail and not isinstance(cut_at(p, k), str)]


def test_cut_points_are_every_cut_the_graph_allows(tmp_path):
    from cuforge.kernels.staged import cut_points

    for expr, inputs, args, init in ((CONV_GN[0], CONV_GN[1], "a", CONV_GN[2]),
                                     ("torch.relu(a @ b) * a.sum() + b.mean()", "torch.randn(16, 16), torch.randn(16, 16)",
                                      "a, b", "        pass")):
        p = problem_from_expr(tmp_path, expr, inputs, args=args, init=init)
        allowed = [k for k in range(len(p.graph) - 1, 0, -1) if not isinstance(cut_at(p, k), str)]
        points = cut_points(p)
        assert allowed and points == sorted(points, reverse=True)
        assert allowed == [k for k in points if not isinstance(cut_at(p, k), str)]


def test_a_staged_forward_reads_the_parameters_named_parameters_gives_every_forward():
    """The module tree is walked once, the tensors read each forward: a shared module and a tied
    weight appear once, a None bias not at all, and a buffer replaced by .double() or a parameter
    assigned anew is the one the next forward reads."""
    import types

    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            shared = nn.Linear(3, 3, bias=False)
            self.a, self.b = shared, nn.Sequential(shared, nn.BatchNorm1d(3))
            self.c = nn.Linear(3, 3)
            self.c.weight = self.a.weight  # tied
            self.register_buffer("scale", torch.ones(3), persistent=False)

    part = TorchGraph("def part(inputs, params):\n    return (inputs[0] * 2,)\n", "double")
    ns = {"__cuforge_problem__": types.SimpleNamespace(Model=Model)}
    exec(compile(wrap_stages([part], [None]), "<staged>", "exec"), ns)
    model = ns["ModelNew"]()

    def expected():
        return list(model.ref.named_parameters()) + list(model.ref.named_buffers())

    def got():
        return list(ns["_model_params"](model))

    def same(xs, ys):
        return [n for n, _ in xs] == [n for n, _ in ys] and all(x is y for (_, x), (_, y) in zip(xs, ys))

    assert same(got(), expected()) and "c.weight" not in dict(got()) and "b.1.running_mean" in dict(got())
    model.double()  # buffers replaced by new tensors
    assert same(got(), expected()) and dict(got())["scale"].dtype == torch.float64
    model.ref.c.bias = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    assert same(got(), expected()) and dict(got())["c.bias"] is model.ref.c.bias
    assert model(torch.ones(2))[0].tolist() == [2.0, 2.0]


def _bare_stage(plan, args):
    """A kernel stage of a real wrapped module with its kernel replaced by a recorder of its launches
    (nothing compiled): (stage, launches)."""
    import types

    import torch

    part = TorchGraph("def part(inputs, params):\n    return (inputs[0],)\n", "same")
    ns = {"__cuforge_problem__": types.SimpleNamespace(Model=torch.nn.Identity)}
    exec(compile(wrap_stages([part], [None]), "<staged>", "exec"), ns)
    stage = ns["_Stage"]("", (), (), "k", [], plan, args)
    launches = []
    stage.kernel = lambda grid, block, *a, shared_mem, cooperative: launches.append((grid, block, a, shared_mem))
    stage.pre = []
    return stage, launches


PLAN_TAIL = "_scratch_specs = []\n_block = (128,)\n_shared = 0\n_cooperative = False\n_pre_grids = []\n_pre_blocks = []\n"


def test_a_stage_plans_once_per_layout_it_reads_and_never_keeps_a_tensor():
    """A kernel stage's launch plan (bindings, outputs, grid) is evaluated once per layout of the
    tensors it reads: the same layout reuses it, another shape or dtype plans afresh; a plan that
    reads more than layouts (a data pointer) or binds a tensor is evaluated every call."""
    import torch

    plan = "n = in0.shape[0] * in0.shape[1]\n_out_specs = [((n,), 'float32', 'empty')]\n_grid = (cdiv(n, 128),)\n" + PLAN_TAIL
    stage, launches = _bare_stage(plan, "(in0, out0, n, )")
    a, b = torch.ones(4, 100), torch.zeros(4, 100)
    out = stage([a], [])
    out2 = stage([b], [])
    assert len(stage.plans) == 1 and out is not out2 and out.shape == (400,)  # outputs are new every call
    (g1, _, args1, _), (g2, _, args2, _) = launches
    assert g1 == g2 == (4,) and args1[0] is a and args2[0] is b and args2[1] is out2 and args2[2] == 400
    stage([torch.ones(2, 100)], [])
    stage([torch.ones(4, 100, dtype=torch.float64)], [])
    stage([torch.ones(100, 4).t()], [])  # the same shape, other strides
    assert len(stage.plans) == 4 and launches[2][0] == (2,) and launches[2][2][2] == 200

    alias = "x = in0\n_out_specs = [(x.shape, 'float32', 'empty')]\n_grid = (1,)\n" + PLAN_TAIL
    stage, launches = _bare_stage(alias, "(x, out0, )")
    stage([a], [])
    stage([b], [])
    assert stage.plans == {} and launches[0][2][0] is a and launches[1][2][0] is b

    pointer = "ptr = in0.data_ptr()\n_out_specs = [((1,), 'float32', 'empty')]\n_grid = (1,)\n" + PLAN_TAIL
    stage, launches = _bare_stage(pointer, "(ptr, out0, )")
    stage([a], [])
    stage([b], [])
    assert stage.plans is None and [x[2][0] for x in launches] == [a.data_ptr(), b.data_ptr()]


def test_a_replayed_module_runs_its_stages_eagerly_where_there_is_no_gpu():
    """REPLAY's module on CPU tensors: no graph is made, the stages run as written, every call."""
    import types

    import torch

    part = TorchGraph("def part(inputs, params):\n    return (inputs[0] * 2,)\n", "double")
    ns = {"__cuforge_problem__": types.SimpleNamespace(Model=torch.nn.Identity)}
    exec(compile(wrap_stages([part], [None], replay=True), "<staged>", "exec"), ns)
    model = ns["ModelNew"]()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5)
            assert torch.equal(model(x)[0], x * 2)  # a PyTorch part returns a tuple
    assert model.__dict__["_replay"].graph is None and ns["_REPLAY"] is True
