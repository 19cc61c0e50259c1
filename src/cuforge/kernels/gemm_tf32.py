"""fp32 GEMM on Hopper's wgmma tensor cores at fp32-level accuracy (3xTF32): the problems gemm_f32
matches (transposes, batches, merged rows, the traced epilogue and row sums), with each operand first
split into TF32 big and small planes by a preparing kernel, then multiplied by a TMA + wgmma kernel."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, Family, tiles
from cuforge.kernels.fp32 import GemmMatch, _shape_expr, match_gemm
from cuforge.kernels.chains import leaf_spec
from cuforge.problems.problem import Problem
from cuforge.sandbox.candidate import LaunchSpec


class GemmTf32x3Sm90(Family):
    """3xTF32 GEMM, sm_90a: 128 x BN tiles, two consumer warpgroups, a TMA producer, STAGES stages of
    four k-tiles (A and B, big and small), a fresh tensor-core sum per k-tile added to the fp32
    accumulator, grouped rasterization, batches over gridDim.y."""

    BM = 128
    BK = 32

    template = "gemm_tf32_sm90"

    def __init__(self) -> None:
        super().__init__("gemm_tf32x3_sm90", {"BN": (64, 128, 192), "STAGES": (2, 3, 4, 5), "GROUP_M": (1, 8, 16)})

    def runs_on(self, compute_capability: str) -> bool:
        return compute_capability == "9.0"  # wgmma and setmaxnreg exist only on sm_90a

    @staticmethod
    def match(problem: Problem) -> GemmMatch | str:
        found = match_gemm(problem)
        if isinstance(found, str):
            return found
        if found.n < 8 or found.m < 16:
            return "too few rows or columns for tensor-core tiles (the FFMA and GEMV kernels take these)"
        return found

    def supports(self, problem: Problem) -> str | None:
        found = self.match(problem)
        return found if isinstance(found, str) else None

    @classmethod
    def stage_bytes(cls, c: dict[str, Any]) -> int:
        return 2 * (cls.BM + c["BN"]) * cls.BK * 4

    @classmethod
    def smem_bytes(cls, c: dict[str, Any]) -> int:
        return c["STAGES"] * cls.stage_bytes(c) + 1024 + 16 * c["STAGES"]  # alignment slack, the barriers

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return self.smem_bytes(c) <= SMEM_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = self.match(problem)
        assert not isinstance(f, str)
        batch = leaf_spec(problem, f.a).shape[0] if f.batched else 1  # type: ignore[union-attr]
        out = []
        for bn in (128, 64, 192):
            stages = max(s for s in self.knobs["STAGES"] if self.valid({"BN": bn, "STAGES": s, "GROUP_M": 8}, problem))
            out.append({"BN": bn, "STAGES": stages, "GROUP_M": 8})
        # Fewer, wider tiles when the output is large; narrower first when 128-wide ones leave SMs idle.
        if tiles(f.m, f.n, self.BM, 128) * batch < SEED_SMS:
            out[0], out[1] = out[1], out[0]
        return out

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.match(problem)
        assert not isinstance(f, str)
        return {"EPI": f.epilogue}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.match(problem)
        assert not isinstance(f, str)
        bindings = [("M", f"{f.a}.numel() // {f.a}.shape[-1]" if f.a_merged else f"{f.a}.shape[-1]" if f.ta else f"{f.a}.shape[-2]"),
                    ("K", f"{f.a}.shape[-2]" if f.ta else f"{f.a}.shape[-1]"),
                    ("N", f"{f.b}.shape[-2]" if f.tb else f"{f.b}.shape[-1]"),
                    ("BATCH", f"{f.a}.shape[0]" if f.batched else "1"),
                    ("KP", "(K + 3) // 4 * 4")]  # TMA: rows of the planes 16-byte aligned
        out = (repr(f.out_shape) if f.a_merged else _shape_expr("M", "N", f.batched, f.epilogue.rowsum, f.epilogue.keepdim), "float32")
        split = f"{self.name}_split"
        # A is read K-major unless stored [K, M]; B is [K, N] (N-major) unless stored [N, K].
        pre = ((split, "(cdiv(KP, 32), cdiv(M, 32), BATCH)", "(32, 8)", f"({f.a}, scratch0, M, K, KP, {int(f.ta)})"),
               (split, "(cdiv(KP, 32), cdiv(N, 32), BATCH)", "(32, 8)", f"({f.b}, scratch1, N, K, KP, {int(not f.tb)})"))
        return LaunchSpec(entry=self.name, grid=f"(cdiv(M, {self.BM}) * cdiv(N, {c['BN']}), BATCH)", block="(384,)",
                          shared_mem=str(self.smem_bytes(c)),
                          args=(f"tma_2d(scratch0, {self.BK}, {self.BM})", f"tma_2d(scratch1, {self.BK}, {c['BN']})", "out0",
                                "M", "N", "KP", "BATCH * M", "BATCH * N", *f.epilogue.launch_args()),
                          outputs=((*out, "zeros"),) if f.epilogue.rowsum else (out,), bindings=tuple(bindings),
                          scratch=(("(2 * BATCH * M, KP)", "float32", "empty"), ("(2 * BATCH * N, KP)", "float32", "empty")),
                          pre=pre)
