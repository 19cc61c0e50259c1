"""Attention in one kernel on Hopper's wgmma (sm_90a): flash_attention's match (scaled_dot_product_attention
as PyTorch decomposes it and the same written out: the scale, a causal or bool mask, a bias, grouped
key/value heads) and its online softmax, with the products on the warpgroup tensor cores instead of
mma.sync. A block is two warpgroups of 64 query rows; TMA brings Q's rows once and BN-key tiles of K and
V through an mbarrier ring; S = Q K^T reads both operands from shared memory, O += P V takes P from
registers and V's rows as they lie (N-major). fp16/bf16 with fp32 accumulation; head dims of 64 or 128
(whole 128-byte rows for the swizzled tiles)."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SMEM_LIMIT, GraphFamily
from cuforge.kernels.flash_attention import AttentionMatch, FlashAttention
from cuforge.kernels.registry import family
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

HEAD_DIMS = (64, 128)
BM = 128  # a block's query rows: two warpgroups of 64


@family(126)
class FlashAttentionSm90(FlashAttention):
    """Two consumer warpgroups of 64 query rows; BN-key tiles of K and V through a STAGES-deep TMA ring."""

    def __init__(self) -> None:
        GraphFamily.__init__(self, "flash_attention_sm90", {"BN": (64, 128), "STAGES": (2, 3)})

    def runs_on(self, compute_capability: str) -> bool:
        return compute_capability == "9.0"  # wgmma exists only on sm_90a

    def _match(self, problem: Problem) -> AttentionMatch | str:
        found = super()._match(problem)
        if not isinstance(found, str) and found.d not in HEAD_DIMS:
            return f"head dim {found.d}: the wgmma kernel takes rows of {' or '.join(map(str, HEAD_DIMS))} (flash_attention takes it)"
        return found

    def leads(self, problem: Problem) -> bool:
        """Ahead of flash_attention at head dim 128, where mma.sync's fragments of a 128-wide row crowd the
        registers: on an H200 the GQA prefill (bf16/fp16) took 129 us here against 202 us there, and
        eager's cuDNN 131 us. At head dim 64 the two were within 3% (GPT-2's attention)."""
        m = self.match(problem)
        return not isinstance(m, str) and m.d == 128

    @staticmethod
    def smem_bytes(c: dict[str, Any], d: int) -> int:
        """Q's rows, the stages of K and V tiles, the barriers and the slack that aligns them to 1024 bytes."""
        return (BM + 2 * c["STAGES"] * c["BN"]) * d * 2 + 8 * (c["STAGES"] + 1) + 1024

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        m = self.match(problem)
        return not isinstance(m, str) and self.smem_bytes(c, m.d) <= SMEM_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        """128-key tiles in two stages, then 64-key tiles in three, then 128 in three where they fit."""
        presets = (dict(BN=128, STAGES=2), dict(BN=64, STAGES=3), dict(BN=128, STAGES=3))
        return [c for c in presets if self.valid(c, problem)]

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        keep = (m.keep,) if m.keep else ()
        maps = (f"tma_2d({m.q}, 64, {BM})", f"tma_2d({m.k}, 64, {c['BN']})", f"tma_2d({m.v}, 64, {c['BN']})")
        return LaunchSpec(entry=self.name, grid=f"(cdiv(SQ, {BM}), {m.heads})", block="(256,)",
                          shared_mem=str(self.smem_bytes(c, m.d)),
                          args=(*maps, "out0", "SQ", "SK", *keep, *m.scores.launch_args()),
                          outputs=((str(m.out_shape), m.dtype),),
                          bindings=(("SQ", f"{m.q}.shape[-2]"), ("SK", f"{m.k}.shape[-2]")))
