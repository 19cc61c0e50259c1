"""Row norms (instance, group, layer, RMS, L1, L2) over rows longer than a thread-block cluster's shared
memory holds (16 blocks x 227 KiB on Hopper): a group norm over 8 MiB groups, an RMS norm over 4 MiB
rows. `rows_cluster` reads such rows twice; here a team of blocks, one an SM, keeps a row in the
shared memory of many SMs and reads it once. The blocks meet through global memory, so the launch is
cooperative (all resident at once, or the driver refuses it). The problems are the ones `rows_cluster`
matches in its norm mode; softmax rows that long are left to it."""

from __future__ import annotations

from typing import Any, ClassVar

from cuforge.kernels.base import Family, sm_count
from cuforge.kernels.chains import Epilogue
from cuforge.kernels.rows_cluster import CLUSTERS, SLICE_LIMIT, RowsMatch, fits, match_rows
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

MIN_SMS = 114  # the smallest Hopper part (H100 PCIe): configs are valid when a team's slices fit there too


def match_team_rows(problem: Problem) -> RowsMatch | str:
    found = match_rows(problem)
    if isinstance(found, str):
        return found
    if found.mode != "norm":
        return "softmax rows: rows_cluster's"
    if fits(found.cols, max(CLUSTERS), 4):
        return f"rows of {found.cols} fit a cluster's shared memory (rows_cluster's)"
    if found.norm.kind == "layer" and (found.norm.weight is not None or found.norm.bias is not None):
        # A team walks rows one after another, so weight and bias as long as a row come from DRAM again
        # for every row (an L2 evict-last hint did not keep them); rows_cluster's rows run side by side
        # and share them in L2. KernelBench's layer norm: 0.46 ms here, 0.35 ms there (kb_s22_team2).
        return "a layer norm's weight and bias as long as a row: rows_cluster's rows share them in L2"
    return found


def slice_bytes(cols: int, team: int) -> int:
    """A block's share of a row in shared memory: whole float4s, as the kernel rounds it."""
    per_block = -(-cols // team)
    return -(-per_block // 4) * 16


def min_team(cols: int) -> int:
    """The fewest blocks whose shared memory holds a row."""
    return -(-cols * 4 // SLICE_LIMIT)


def team_size(cols: int, sms: int, teams: int) -> int:
    """Blocks per team: the SMs shared out among `teams` teams (at least as many as hold a row); the
    launch computes the same from the device's SMs."""
    return max(sms // teams, min_team(cols))


@family(70)
class RowsTeam(Family):
    """TEAMS teams of (SMs / TEAMS) blocks, BLOCK threads each, UNROLL float4 loads a thread in flight, or the
    slice brought in BULK pieces by bulk copies."""

    def __init__(self) -> None:
        super().__init__("rows_team", {"TEAMS": (1, 2, 3, 4, 6), "BLOCK": (256, 512, 1024), "UNROLL": (2, 4, 8),
                                       "BULK": (0, 8, 16, 32)})

    # BULK: the slice brought in that many bulk copies (TMA) where rows lie on 16-byte boundaries; 0: loads
    # through registers, UNROLL float4s a thread in flight (the only way before the knob).
    DEFAULTS: ClassVar[dict[str, Any]] = {"BULK": 0}

    def supports(self, problem: Problem) -> str | None:
        found = match_team_rows(problem)
        return found if isinstance(found, str) else None

    def runs_on(self, compute_capability: str) -> bool:
        return tuple(int(x) for x in compute_capability.split(".")) >= (9, 0)  # 227 KiB of shared memory a block

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = match_team_rows(problem)
        if isinstance(f, str):
            return False
        team = team_size(f.cols, MIN_SMS, c["TEAMS"])
        if c.get("BULK", 0) and (f.cols % 4 or c["UNROLL"] != self.knobs["UNROLL"][0]):
            return False  # rows off 16-byte boundaries take the loads anyway; UNROLL is unused with BULK
        return team * c["TEAMS"] <= MIN_SMS and slice_bytes(f.cols, team) <= SLICE_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        # The most teams first: rows side by side keep the memory busy while one team waits at its barrier.
        teams = [t for t in self.knobs["TEAMS"][::-1] if self.valid(dict(TEAMS=t, BLOCK=1024, UNROLL=4), problem)] or [1]
        # KernelBench's group norm on the H100 (kb_s22_team3): 5.89 ms at 512 x 8, 6.02 at 1024 x 4, 6.38 at 256 x 8;
        # in 16 bulk copies 5.70 / 5.85 ms against 5.93 / 6.08 for 512 x 8 in the same runs, 8 copies 6.00, 32
        # copies 6.23 (norm_bulk_probe_s33, _s33_b; 4 and 64 were slower still and are not offered); in the
        # judge's timing 5.52 against 5.75 ms, 0.908 of the copy bandwidth (kb_bw_s33).
        first = [dict(TEAMS=teams[0], BLOCK=512, UNROLL=self.knobs["UNROLL"][0], BULK=16)] if self.bulk_rows(problem) else []
        return first + ([dict(TEAMS=teams[0], BLOCK=512, UNROLL=8), dict(TEAMS=teams[0], BLOCK=1024, UNROLL=4),
                         dict(TEAMS=teams[0], BLOCK=256, UNROLL=8)] + [dict(TEAMS=t, BLOCK=512, UNROLL=8) for t in teams[1:3]])

    def bulk_rows(self, problem: Problem) -> bool:
        """Whether rows lie on 16-byte boundaries (whole float4s), where BULK applies."""
        f = match_team_rows(problem)
        return not isinstance(f, str) and f.cols % 4 == 0

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = match_team_rows(problem)
        assert not isinstance(f, str) and f.norm is not None
        m = f.norm
        return {"KIND": m.kind, "EPS": repr(float(m.eps)) + "f", "PRO": Epilogue(),
                "AFFINE_W": m.weight is not None, "AFFINE_B": m.bias is not None, "GROUPS": m.groups,
                "CPG_SPAN": m.channel_span, "CPG": m.reduced // m.channel_span, "EPI": m.epilogue,
                "LAST_DIM": problem.inputs[0].shape[-1]}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = match_team_rows(problem)
        assert not isinstance(f, str) and f.norm is not None
        m = f.norm
        affine = tuple(r for r in (m.weight, m.bias) if r is not None)
        return LaunchSpec(entry=self.name, grid="(team * teams,)", block=f"({c['BLOCK']},)",
                          shared_mem="cdiv(cdiv(cols, team), 4) * 16", cooperative=True,
                          args=("in0", "out0", "rows", "cols", *affine, *m.epilogue.launch_args(), "team", "scratch0", "scratch1"),
                          outputs=(("in0.shape", "float32"),),
                          scratch=(("(4 * team * teams,)", "float64", "empty"), ("(teams,)", "int32", "zeros")),
                          bindings=(("rows", str(m.outer)), ("cols", str(m.reduced)), sm_count("in0"),
                                    ("team", f"max(SMS // {c['TEAMS']}, {min_team(f.cols)})"), ("teams", "max(1, min(SMS // team, rows))")))
