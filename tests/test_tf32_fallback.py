"""Where a precision contract allows one TF32 product (a convolution under PyTorch's default flags), the
search tries it first, but cuDNN picks TF32 per shape and the judge rules a TF32 kernel a downgrade
where PyTorch's own computation stayed fp32 (KernelBench level2's 3-D transposed convolutions). Every
cover then needs a full-precision config to fall back on, and a short search (its proposals run ahead
of the verdicts) must not spend every candidate on TF32 before the first ruling comes back."""

import pytest

from cuforge.agent.template_proposer import TemplateProposer
from cuforge.kernels.families import families_for
from template_helpers import conv_problem, problem_from_expr

COMPOSITES = {
    # a convolution's kernel, then a group norm's: two kernels (staged)
    "staged": ("self.gn(self.conv(a))", "torch.randn(2, 32, 20, 20)",
               "        self.conv = nn.Conv2d(32, 64, 3)\n        self.gn = nn.GroupNorm(8, 64)"),
    # a convolution, a training-mode batch norm, the spatial mean taken off: three kernels (pipeline)
    "pipeline": ("(lambda y: y - y.mean(dim=(2, 3), keepdim=True))(self.bn(self.conv(a)))", "torch.randn(2, 32, 20, 20)",
                 "        self.conv = nn.Conv2d(32, 64, 3)\n        self.bn = nn.BatchNorm2d(64)"),
}


def composite(tmp_path, kind, contract="pytorch"):
    expr, x, init = COMPOSITES[kind]
    p = problem_from_expr(tmp_path, expr, x, args="a", init=init).under(contract)
    fam = families_for(p)[0][0]
    assert fam.name.startswith(kind), fam.name
    return p, fam


@pytest.mark.parametrize("kind", COMPOSITES)
def test_a_composite_cover_whose_first_seeds_are_tf32_also_seeds_full_precision(tmp_path, kind):
    p, fam = composite(tmp_path, kind)
    reduced = [fam.reduced_precision(s, p) for s in fam.seeds(p)]
    assert reduced[0] and not all(reduced), reduced
    strict, fam32 = composite(tmp_path, kind, "fp32")
    assert not any(fam32.reduced_precision(s, strict) for s in fam32.seeds(strict))


def test_a_pipeline_asked_without_its_problem_says_it_needs_one(tmp_path):
    p, fam = composite(tmp_path, "pipeline")
    with pytest.raises(ValueError, match="depend on the problem"):
        fam.reduced_precision(fam.seeds(p)[0])


def test_until_the_judge_rules_a_second_tf32_config_waits_behind_a_full_precision_one(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3, padding=1)", "(2, 64, 30, 30)").under("pytorch")
    fams = {f.name: f for f in families_for(p)[0]}
    search = TemplateProposer(seed=1)

    def reduced(cand):
        return fams[cand.meta["family"]].reduced_precision(cand.meta["config"], p)

    first = search.propose_candidate(p, "IMPROVE", None, [], "9.0")
    second = search.propose_candidate(p, "IMPROVE", None, [], "9.0")
    assert reduced(first) and not reduced(second)
    # one full-precision candidate in hand: TF32 is tried further while the ruling is still out
    assert reduced(search.propose_candidate(p, "IMPROVE", None, [], "9.0"))
    search.learn(p, first.source, "ok")
    assert all(reduced(search.propose_candidate(p, "IMPROVE", None, [], "9.0")) for _ in range(2))


def test_a_fresh_problem_after_a_pass_elsewhere_is_hedged_again(tmp_path):
    # the ruling is per problem: TF32 passing on one shape says nothing of another
    a = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3, padding=1)", "(2, 64, 30, 30)").under("pytorch")
    b = conv_problem(tmp_path, "nn.Conv2d(32, 64, 3, padding=1)", "(2, 32, 24, 24)").under("pytorch")
    search = TemplateProposer(seed=1)
    search.learn(a, search.propose_candidate(a, "IMPROVE", None, [], "9.0").source, "ok")
    fams = {f.name: f for f in families_for(b)[0]}
    got = [search.propose_candidate(b, "IMPROVE", None, [], "9.0").meta for _ in range(2)]
    assert [fams[m["family"]].reduced_precision(m["config"], b) for m in got] == [True, False]


@pytest.mark.parametrize("kind", COMPOSITES)
def test_after_a_downgrade_a_composite_search_goes_on_in_full_precision(tmp_path, kind):
    p, fam = composite(tmp_path, kind)
    search = TemplateProposer(seed=3)
    first = search.propose_candidate(p, "IMPROVE", None, [], "9.0")
    assert fam.reduced_precision(first.meta["config"], p)
    search.learn(p, first.source, "cheat:precision_downgrade")
    later = [search.propose_candidate(p, "IMPROVE", None, [], "9.0").meta for _ in range(3)]
    covering = {f.name: f for f in families_for(p)[0]}
    assert not any(covering[m["family"]].reduced_precision(m["config"], p) for m in later)
