"""The team-of-blocks family on the CPU: it takes norm rows longer than a cluster's shared memory and
nothing else, its teams' slices cover a row and fit a block's shared memory on the smallest Hopper
part, seeds and random configs compile with NVRTC for sm_90a, and the cooperative launch survives a
candidate's serialisation without changing the ids of candidates from before it existed."""

import pytest

from cuforge.kernels.families import families_for
from cuforge.kernels.rows_cluster import SLICE_LIMIT
from cuforge.kernels.rows_team import MIN_SMS, RowsTeam, match_team_rows, slice_bytes, team_size
from cuforge.sandbox.protocol.candidate import Candidate, LaunchSpec, launch_plan
from template_helpers import problem_from_expr, smoke_compile

AFFINE_GN = "        self.gn = nn.GroupNorm(2, 8)"


@pytest.mark.parametrize("expr, inputs, init, cols, kind", [
    ("self.gn(a)", "torch.randn(3, 8, 512, 512)", AFFINE_GN, 4 * 512 * 512, "group"),
    ("F.layer_norm(a, (4, 512, 513)) * 2.0 + 1.0", "torch.randn(2, 4, 512, 513)", "        pass", 4 * 512 * 513, "layer"),
    ("a / torch.sqrt(torch.mean(a ** 2, dim=1, keepdim=True) + 1e-5)", "torch.randn(5, 1000003)", "        pass", 1000003, "rms"),
    ("a / torch.mean(torch.abs(a), dim=1, keepdim=True)", "torch.randn(3, 4000000)", "        pass", 4000000, "l1"),
    ("F.instance_norm(a)", "torch.randn(2, 2, 1024, 1025)", "        pass", 1024 * 1025, "instance"),
])
def test_norm_rows_longer_than_a_cluster_are_taken_and_compile(tmp_path, expr, inputs, init, cols, kind):
    p = problem_from_expr(tmp_path, expr, inputs, args="a", init=init)
    found = match_team_rows(p)
    assert not isinstance(found, str), found
    assert (found.cols, found.norm.kind) == (cols, kind)
    fams, _ = families_for(p)
    assert fams[0].name == "rows_team" and "rows_cluster" in [f.name for f in fams]
    fam = RowsTeam()
    seeds = fam.seeds(p)
    assert seeds and all(fam.valid(c, p) for c in seeds)
    for c in seeds:
        team = team_size(cols, MIN_SMS, c["TEAMS"])
        assert team * c["TEAMS"] <= MIN_SMS and slice_bytes(cols, team) <= SLICE_LIMIT
        assert slice_bytes(cols, team) // 4 * team >= cols  # the team's slices cover the row
    launch = fam.render(seeds[0], p).launch
    assert launch.cooperative and len(launch.scratch) == 2
    smoke_compile(fam, p, 2)


@pytest.mark.parametrize("expr, inputs, why", [
    ("torch.softmax(a, dim=-1)", "torch.randn(2, 2000000)", "softmax rows"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(8, 65535)", "fit a cluster"),
    ("a / torch.norm(a, p=2, dim=1, keepdim=True)", "torch.randn(64, 4096)", "fit one block"),
    ("self.ln(a)", "torch.randn(2, 4, 512, 513)", "weight and bias as long as a row"),
])
def test_refusals_name_the_cause(tmp_path, expr, inputs, why):
    init = "        self.ln = nn.LayerNorm((4, 512, 513))" if "self.ln" in expr else "        pass"
    found = match_team_rows(problem_from_expr(tmp_path, expr, inputs, args="a", init=init))
    assert isinstance(found, str) and why in found, found


def test_teams_share_out_the_sms_and_never_shrink_below_a_row():
    assert team_size(2 * 2**20, 132, 3) == 44  # KernelBench's group norm: 8 MiB groups, three at once
    assert team_size(4 * 2**20, 132, 3) == -(-4 * 2**20 * 4 // SLICE_LIMIT)  # a 16 MiB row needs more than 44
    assert slice_bytes(1000003, 7) % 16 == 0 and slice_bytes(1000003, 7) * 7 >= 4 * 1000003


def test_cooperative_launch_round_trips_and_old_ids_stay():
    base = dict(entry="k", grid="(1,)", block="(32,)", args=("in0", "out0"), outputs=(("in0.shape", "float32"),))
    plain = Candidate("extern \"C\" __global__ void k(float* a, float* b) {}", "kernel", LaunchSpec(**base))
    coop = Candidate(plain.source, "kernel", LaunchSpec(**base, cooperative=True))
    assert Candidate.from_dict(coop.to_dict()).launch.cooperative
    assert not Candidate.from_dict({**plain.to_dict(), "launch": {k: v for k, v in plain.to_dict()["launch"].items()
                                                                  if k != "cooperative"}}).launch.cooperative
    assert coop.id != plain.id
    # A spec without the field hashes as it did before the field existed.
    from dataclasses import asdict
    import hashlib
    from cuforge.sandbox.protocol.candidate import normalize_source
    spec = asdict(plain.launch)
    for later in ("scratch", "pre", "cooperative"):
        del spec[later]
    h = hashlib.sha256(normalize_source(plain.source).encode())
    h.update(b"kernel")
    h.update(repr(spec).encode())
    assert plain.id == h.hexdigest()[:16]
    assert "_cooperative = True" in launch_plan(coop.launch) and "_cooperative = False" in launch_plan(plain.launch)


def test_export_refuses_a_cooperative_kernel_by_name(tmp_path):
    from cuforge.export.plan import NotExportable, lower

    p = problem_from_expr(tmp_path, "F.instance_norm(a)", "torch.randn(2, 2, 1024, 1025)", args="a")
    fam = RowsTeam()
    with pytest.raises(NotExportable, match="cooperative"):
        lower(p, fam.render(fam.seeds(p)[0], p), 132)


def test_bulk_copies_are_a_knob_for_rows_on_16_byte_boundaries(tmp_path):
    from cuforge.runtime import compile_cuda

    fam = RowsTeam()
    gn = problem_from_expr(tmp_path, "self.gn(a)", "torch.randn(3, 8, 512, 512)", args="a", init=AFFINE_GN)
    seed = fam.seeds(gn)[0]
    assert seed.get("BULK", 0) == 0 or seed["UNROLL"] == fam.knobs["UNROLL"][0]
    bulk = dict(seed, BULK=8, UNROLL=fam.knobs["UNROLL"][0])
    assert fam.valid(bulk, gn) and not fam.valid(dict(bulk, UNROLL=8), gn)  # UNROLL means nothing there
    # A config stored before the knob existed renders as it did: loads through registers.
    assert "cp.async.bulk" not in fam.render({k: v for k, v in seed.items() if k != "BULK"}, gn).source
    cand = fam.render(bulk, gn)
    assert "cp.async.bulk.shared::cluster.global" in cand.source
    assert "rows_team" in compile_cuda(cand.source, arch="sm_90a", options=cand.launch.options).signatures
    odd = problem_from_expr(tmp_path, "F.instance_norm(a)", "torch.randn(2, 2, 1023, 1025)", args="a")
    assert not fam.valid(dict(fam.seeds(odd)[0], BULK=8, UNROLL=fam.knobs["UNROLL"][0]), odd)
