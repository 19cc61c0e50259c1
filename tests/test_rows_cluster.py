"""The cluster-per-row family on the CPU: which problems it takes from softmax_rows and normalize (long
rows only), why it refuses the others, its seeds' shared-memory fit, and every seed plus random configs
compiling with NVRTC for sm_90a; the normalize family's register-held middle dim."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.layer_norm_team import match_layer_norm_team
from cuforge.kernels.normalize import HOLD_MAX, Normalize
from cuforge.kernels.rows_cluster import SLICE_LIMIT, RowsCluster, match_rows, slice_elements
from cuforge.kernels.rows_team import match_team_rows
from cuforge.runtime import compile_cuda
from template_helpers import problem_from_expr, smoke_compile

GN = "        self.gn = nn.GroupNorm(2, 8)"
LN = "        self.ln = nn.LayerNorm((4, 64, 64))"


@pytest.mark.parametrize("expr, inputs, init, mode, cols", [
    ("torch.softmax(a * 0.5, dim=-1)", "torch.randn(4, 393216)", "        pass", "softmax", 393216),
    ("torch.log_softmax(a, dim=-1)", "torch.randn(3, 70001, dtype=torch.float16)", "        pass", "softmax", 70001),
    ("a / torch.mean(torch.abs(a), dim=1, keepdim=True)", "torch.randn(8, 65535)", "        pass", "norm", 65535),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(8, 20001)", "        pass", "norm", 20001),
    ("self.gn(a)", "torch.randn(2, 8, 64, 64)", GN, "norm", 4 * 4096),
    ("self.ln(a) * 2.0", "torch.randn(2, 4, 64, 64)", LN, "norm", 4 * 4096),
    ("F.instance_norm(a)", "torch.randn(2, 3, 128, 129)", "        pass", "norm", 128 * 129),
    ("torch.softmax(a, dim=-1)", "torch.randn(2, 1000000)", "        pass", "softmax", 1000000),  # read twice
    ("self.ln(a)", "torch.randn(2, 64, 128, 128)", "        self.ln = nn.LayerNorm((64, 128, 128))", "norm", 64 * 128 * 128),
])
def test_long_rows_are_taken_and_compile(tmp_path, expr, inputs, init, mode, cols):
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    found = match_rows(p)
    assert not isinstance(found, str), found
    assert (found.mode, found.cols) == (mode, cols)
    fams, _ = families_for(p)
    held = slice_elements(cols, 16, 4) * 4 <= SLICE_LIMIT
    # Preferred over the one-block families it shares problems with; norm rows too long for a cluster
    # go to a team of blocks first (rows_team, or layer_norm_team for row-long affine parameters), and
    # rows_cluster comes next.
    team = next((name for name, m in (("rows_team", match_team_rows), ("layer_norm_team", match_layer_norm_team))
                 if not isinstance(m(p), str)), None)
    assert [f.name for f in fams][:2] == ([team, "rows_cluster"] if team else ["rows_cluster"] + [f.name for f in fams][1:2])
    assert not held or isinstance(match_team_rows(p), str)  # rows a cluster holds are never a team's
    fam = RowsCluster()
    for c in fam.seeds(p):
        assert c["RESIDENT"] == held  # on chip wherever the row fits a cluster
        assert not c["RESIDENT"] or slice_elements(cols, c["CLUSTER"], c["VEC"]) * 4 <= SLICE_LIMIT
        assert slice_elements(cols, c["CLUSTER"], c["VEC"]) * c["CLUSTER"] >= cols
    vec = fam.seeds(p)[0]["VEC"]
    assert fam.valid(dict(CLUSTER=2, BLOCK=512, VEC=vec, UNROLL=4, RESIDENT=True), p) == (slice_elements(cols, 2, vec) * 4 <= SLICE_LIMIT)
    assert fam.valid(dict(CLUSTER=2, BLOCK=512, VEC=vec, UNROLL=4, RESIDENT=False), p)
    # ONLINE (the sum of exp folded in while loading) is a resident softmax's alone, and leads its seeds
    seeds = [fam.complete(c) for c in fam.seeds(p)]
    assert seeds[0]["ONLINE"] == (mode == "softmax" and held)
    assert all(not c["ONLINE"] or (mode == "softmax" and c["RESIDENT"]) for c in seeds)
    assert not fam.valid(dict(seeds[0], RESIDENT=False, ONLINE=True), p)
    smoke_compile(fam, p, 3)
    if mode == "softmax" and held:  # the ONLINE kernel itself, also where the row is not a whole number of vectors
        cand = fam.render(dict(seeds[0], VEC=1), p)
        assert "fold<UNROLL * VEC>" in cand.source and "tsum += expf(buf[i]" not in cand.source
        compile_cuda(cand.source, arch="sm_90a", options=cand.launch.options)


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.softmax(a, dim=-1)", "torch.randn(64, 8192)", "fit one block"),
    ("torch.softmax(a, dim=-1)", "torch.randn(2, 65536)", "fit one block"),  # softmax_rows holds it in registers
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(64, 4096)", "fit one block"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(4, 64, 4096)", "middle dim"),
    ("torch.relu(a)", "torch.randn(4, 100000)", "not one softmax"),
])
def test_refusals_name_the_cause(tmp_path, expr, inputs, why):
    found = match_rows(problem_from_expr(tmp_path, expr, inputs, args="a"))
    assert isinstance(found, str) and why in found, found


def test_slices_cover_the_row_in_whole_vectors():
    for cols in (65535, 65536, 70001, 393216):
        for cluster in (2, 4, 8, 16):
            for vec in (1, 4, 8):
                s = slice_elements(cols, cluster, vec)
                assert s % max(vec, 4) == 0 and s * cluster >= cols and (s - max(vec, 4)) * cluster < cols


def test_a_short_middle_dim_is_held_in_registers(tmp_path):
    p = problem_from_expr(tmp_path, "a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)",
                          "torch.randn(4, 64, 16, 16)", args="a")
    fam = Normalize()
    seeds = fam.seeds(p)
    assert seeds[0]["HOLD"] and all(fam.valid(c, p) for c in seeds)
    assert "float v[64]" in fam.render(seeds[0], p).source
    smoke_compile(fam, p, 2)
    longer = problem_from_expr(tmp_path, "a / torch.norm(a, p=2, dim=1, keepdim=True)",
                               f"torch.randn(2, {HOLD_MAX + 1}, 8)", args="a")
    assert not any(c["HOLD"] for c in fam.seeds(longer))
    assert not fam.valid(dict(VEC=1, BLOCK=256, HOLD=True), longer)
    rows = problem_from_expr(tmp_path, "a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(8, 300)", args="a")
    assert not fam.valid(dict(VEC=1, BLOCK=256, HOLD=True), rows)  # rows are not columns
