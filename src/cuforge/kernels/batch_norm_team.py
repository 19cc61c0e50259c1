"""Batch norm with training statistics over channels too large for `batch_norm`'s two passes to be cheap:
KernelBench's BatchNorm2d has 64 MiB channels, and reading each twice caps a two-pass kernel at 2/3 of
the copy bandwidth. Here every SM's block works on one channel at a time (a cooperative grid), keeps
as much of its share of the channel as its shared memory (and, optionally, registers) hold, and reads
only the rest twice, the second time right after the channel's barrier so that it can still be in L2.
Channels smaller than `MIN_CHANNEL_BYTES` are left to `batch_norm`: a whole-GPU barrier a channel
costs more than the second read saves there. KernelBench's level1/33 on the H100: 3.67 ms against 4.48 (0.78 of the copy
bandwidth against 0.64), 2.4x eager."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily, sm_count
from cuforge.kernels.batch_norm import BatchNormMatch, match_batch_norm, template_values
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family

# Against batch_norm's two passes on the H100 (batch_norm_channels.json, 1 GiB inputs): 0.78x at 4 MiB
# channels, 1.05x at 8, 1.19x at 16, 1.25x at 32, 1.22x at 64. A channel boundary costs ~3 us (the
# barrier, the pipeline drained), about what a second read of a 4-8 MiB channel costs.
MIN_CHANNEL_BYTES = 8 << 20
HOLD_LIMIT = SMEM_LIMIT - 4 * 1024  # a block's kept vectors, with room for its static shared memory


def match_team_batch_norm(problem: Problem) -> BatchNormMatch | str:
    found = match_batch_norm(problem)
    if isinstance(found, str):
        return found
    if found.n * found.span * 4 < MIN_CHANNEL_BYTES:
        return f"channels of {found.n * found.span * 4 >> 10} KiB: batch_norm's two passes"
    return found


@family(260)
class BatchNormTeam(GraphFamily):
    """One block an SM, BLOCK threads, UNROLL VEC-wide loads each in flight, REGS vectors a thread kept in
    registers (before the shared-memory part); KEEP: how a tail's first read is cached (0 streamed, 1
    normally, 2 with an L2 evict-last hint); BACK: the tail reread last batch first."""

    template = "batch_norm_team"
    anchors = frozenset({"native_batch_norm"})  # batch_norm's match, then its own conditions

    def __init__(self) -> None:
        super().__init__("batch_norm_team", {"BLOCK": (256, 512, 1024), "UNROLL": (2, 4, 8), "VEC": (1, 4), "KEEP": (0, 1, 2),
                                           "REGS": (0, 8, 16, 24, 32), "BACK": (0, 1)})

    def match(self, problem: Problem) -> BatchNormMatch | str:
        return match_team_batch_norm(problem)

    def runs_on(self, compute_capability: str) -> bool:
        return tuple(int(x) for x in compute_capability.split(".")) >= (9, 0)  # 227 KiB of shared memory a block

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.matched(problem)
        if c["VEC"] == 4 and m.span % 4:
            return False
        if m.n * m.c * (m.span // c["VEC"]) >= 2**32 - 2**24:  # 64-bit indices: their registers leave none for REGS
            return c["BLOCK"] == 256 and c["UNROLL"] <= 4 and c["REGS"] == 0
        # What compiles without spilling (ptxas -v, sm_90a): the register part, three batches of UNROLL
        # vectors in flight (the next channel's first, the current one, the one ahead) and the indices.
        return {256: c["UNROLL"] <= 4 or c["REGS"] == 0,
                512: c["UNROLL"] <= 4 and c["REGS"] == 0,
                1024: c["VEC"] == 1 and c["UNROLL"] <= 2 and c["REGS"] == 0}[c["BLOCK"]]

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        vec = 4 if self.matched(problem).span % 4 == 0 else 1
        # KernelBench's BatchNorm2d on the H100 (kb_s24_bnt2-4): 3.67-3.68 ms for the first, 3.74-3.77 with 32
        # vectors a thread in registers (fewer threads: fewer loads in flight), 3.75-3.80 for the third; with
        # the tail streamed (KEEP 0) 3.99 (the register seed), reread first batch first 3.74 (the first).
        return [dict(BLOCK=512, UNROLL=4, VEC=vec, KEEP=1, REGS=0, BACK=1), dict(BLOCK=256, UNROLL=4, VEC=vec, KEEP=1, REGS=32, BACK=1),
                dict(BLOCK=256, UNROLL=8, VEC=vec, KEEP=1, REGS=0, BACK=1)]

    def extra(self, problem: Problem) -> dict[str, Any]:
        return template_values(self.matched(problem))

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        affine = tuple(r for r in (m.weight, m.bias) if r is not None)
        per_channel, vec_bytes = m.n * m.span // c["VEC"], 4 * c["VEC"]
        in_regs = c["REGS"] * c["BLOCK"]
        return LaunchSpec(
            entry=self.name, grid="(SMS,)", block=f"({c['BLOCK']},)", shared_mem=f"hold * {vec_bytes}", cooperative=True,
            args=("in0", "out0", *affine, *m.epilogue.launch_args(), "hold", "scratch0", "scratch1"),
            outputs=(("in0.shape", "float32"),),
            scratch=(("(4 * SMS,)", "float64", "empty"), ("(1,)", "int32", "zeros")),
            bindings=(sm_count("in0"), ("hold", f"min(max(cdiv({per_channel}, SMS) - {in_regs}, 0), {HOLD_LIMIT // vec_bytes})")))
