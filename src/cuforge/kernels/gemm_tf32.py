"""fp32 GEMM on Hopper's wgmma tensor cores at fp32-level accuracy (3xTF32): the problems gemm_f32
matches (transposes, batches, merged rows, the traced epilogue and row sums), with each operand first
split into TF32 big and small planes by a preparing kernel, then multiplied by a TMA + wgmma kernel."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import SEED_SMS, SMEM_LIMIT, GraphFamily, tiles
from cuforge.kernels.chains import per_16_bytes
from cuforge.kernels.fp32 import GemmMatch, gemm_launch_names, match_gemm
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec
from cuforge.kernels.registry import family


@family(50)
class GemmTf32x3Sm90(GraphFamily):
    """3xTF32 GEMM, sm_90a: 128 x BN tiles, two consumer warpgroups, a TMA producer, STAGES stages of
    four k-tiles (A and B, big and small), a fresh tensor-core sum per k-tile added to the fp32
    accumulator, grouped rasterization, batches over gridDim.y."""

    anchors = frozenset({"mm", "bmm", "addmm"})

    BM = 128
    BK = 32  # elements a k-tile: its rows are 128 bytes
    PLANES = 2  # planes a preparing pass writes per operand: TF32 big and small

    template = "gemm_tf32_sm90"

    def __init__(self) -> None:
        super().__init__("gemm_tf32x3_sm90", {"BN": (64, 128, 192), "STAGES": (2, 3, 4, 5), "GROUP_M": (1, 8, 16),
                                                 "SPLIT_K": (1, 2, 4, 8, 16, 32, 64), "SPLIT": ("pass", "smem")})

    # SPLIT "smem": operands whose rows TMA can read (16-byte aligned) are split by the consumers in shared
    # memory instead of by a preparing pass over global memory. A K-major operand (rows of K floats) is
    # split in place; an R-major one (stored [K, R]: B of a plain A @ B, A used transposed) arrives as a
    # raw [32 k][rows] tile and is transposed as it is split. The pass over a large weight is what costs
    # the M = 128 linear layers (level2 56, 59, 68) their win, and over both 512 MB operands of
    # level1/6 (K = 524288) as much as cuBLAS's whole product.
    DEFAULTS = {"SPLIT_K": 1, "SPLIT": "pass"}

    @staticmethod
    def kmajor(f: GemmMatch) -> tuple[bool, bool]:
        """Whether A and B are stored K-major with TMA-aligned rows."""
        return (not f.ta and f.k % 4 == 0), (f.tb and f.k % 4 == 0)

    @staticmethod
    def rmajor(f: GemmMatch) -> tuple[bool, bool]:
        """Whether A and B are stored R-major ([K, M] / [K, N]) with TMA-aligned rows."""
        return (f.ta and f.m % 4 == 0), (not f.tb and f.n % 4 == 0)

    def modes(self, c: dict[str, Any], f: GemmMatch) -> tuple[int, int]:
        """How A and B reach the wgmmas: 0 planes from the preparing pass, 1 split in place in shared
        memory, 2 transposed and split in shared memory."""
        if c.get("SPLIT", "pass") != "smem":
            return 0, 0
        return tuple(1 if k else 2 if r else 0 for k, r in zip(self.kmajor(f), self.rmajor(f)))  # type: ignore[return-value]

    def runs_on(self, compute_capability: str) -> bool:
        return compute_capability == "9.0"  # wgmma and setmaxnreg exist only on sm_90a

    def match(self, problem: Problem) -> GemmMatch | str:
        found = match_gemm(problem)
        if isinstance(found, str):
            return found
        if found.n < 8 or found.m < 16:
            return "too few rows or columns for tensor-core tiles (the FFMA and GEMV kernels take these)"
        return found

    @classmethod
    def stage_bytes(cls, c: dict[str, Any]) -> int:
        return 2 * (cls.BM + c["BN"]) * 128  # big and small k-tiles of A and B, rows of 128 bytes

    @classmethod
    def smem_bytes(cls, c: dict[str, Any]) -> int:
        return c["STAGES"] * cls.stage_bytes(c) + 1024 + 16 * c["STAGES"]  # alignment slack, the barriers

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        f = self.match(problem)
        if isinstance(f, str):
            return False
        modes = self.modes(c, f)
        if c.get("SPLIT", "pass") == "smem" and not any(modes):  # else the same kernel as "pass"
            return False
        if modes[1] == 2 and c["BN"] > 128:  # ptxas -v: 192 columns' transposing split uses a stack frame
            return False
        if c.get("SPLIT_K", 1) > 1:  # partial sums added into C: only where C is the product itself
            if f.epilogue.body.strip() or f.epilogue.rowsum or c["SPLIT_K"] > -(-f.k // self.BK):
                return False
        return self.smem_bytes(c) <= SMEM_LIMIT

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        f = self.matched(problem)
        batch = f.batch()
        out = []
        for bn in (128, 64, 192):
            stages = max(s for s in self.knobs["STAGES"] if self.valid({"BN": bn, "STAGES": s, "GROUP_M": 8, "SPLIT_K": 1}, problem))
            out.append({"BN": bn, "STAGES": stages, "GROUP_M": 8, "SPLIT_K": 1, "SPLIT": "pass"})
        wide = out[0]
        # Fewer, wider tiles when the output is large; narrower first when 128-wide ones leave SMs idle.
        if tiles(f.m, f.n, self.BM, 128) * batch < SEED_SMS:
            out[0], out[1] = out[1], out[0]
        # A few tiles over a long K: split K until the splits fill the GPU (each keeps >= 8 k-tiles), on
        # 128-wide tiles (each operand is read N / BN or M / BM times over). Such a product moves far more
        # bytes per flop than a square one, and a preparing pass moves each operand three more times
        # (level1/6, K = 524288: 2.71 ms with it, 0.84 without, H100), so it goes first without the pass.
        few = tiles(f.m, f.n, self.BM, 128) * batch
        split = 1
        while few * split * 2 <= SEED_SMS and -(-f.k // self.BK) // (split * 2) >= 8 and split * 2 in self.knobs["SPLIT_K"]:
            split *= 2
        if split > 1 and self.valid({**wide, "SPLIT_K": split}, problem):
            lead = {**wide, "SPLIT_K": split}
            out.insert(0, lead)
            if self.valid({**lead, "SPLIT": "smem"}, problem):
                out.insert(0, {**lead, "SPLIT": "smem"})
                return out
        # Operands TMA can read as they lie: the same tiles without the preparing pass, tried second
        # (on square products the consumers' split costs more than the pass: 1.64 against 1.10 ms, 4096^3).
        if self.valid({**out[0], "SPLIT": "smem"}, problem):
            out.insert(1, {**out[0], "SPLIT": "smem"})
        return out

    def extra(self, problem: Problem) -> dict[str, Any]:
        f = self.matched(problem)
        return {"EPI": f.epilogue, "KMAJOR": self.kmajor(f), "RMAJOR": self.rmajor(f), "HALF": 0, "BK": self.BK}

    def dtype(self, problem: Problem) -> str:
        """The operands' and the output's dtype."""
        return "float32"

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        f = self.matched(problem)
        bindings, (out_shape, _) = gemm_launch_names(f)
        dtype = self.dtype(problem)
        out = (out_shape, dtype)
        align = per_16_bytes(dtype)
        bindings.append(("KP", f"(K + {align - 1}) // {align} * {align}"))  # TMA: rows of the planes 16-byte aligned
        split = f"{self.name}_split"
        a_mode, b_mode = self.modes(c, f)
        # Each operand: its raw rows (split in shared memory), or planes from a preparing pass.
        # A is read K-major unless stored [K, M]; B is [K, N] (N-major) unless stored [N, K].
        pre, scratch, descs = [], [], []
        for ref, rows, mode, r_major, box in ((f.a, "M", a_mode, f.ta, self.BM), (f.b, "N", b_mode, not f.tb, c["BN"])):
            if mode == 1:
                descs.append(f"tma_2d({ref}, {self.BK}, {box})")  # rows of K: a batch is one tall matrix
                continue
            if mode == 2:
                descs.append(f"tma_2d({ref}, {box}, {self.BK}, 0)")  # rows of R, k-tiles of 32, no swizzle
                continue
            name = f"scratch{len(scratch)}"
            scratch.append((f"({self.PLANES} * BATCH * {rows}, KP)", dtype, "empty"))
            pre.append((split, f"(cdiv(KP, 32), cdiv({rows}, 32), BATCH)", "(32, 8)", f"({ref}, {name}, {rows}, K, KP, {int(r_major)})"))
            descs.append(f"tma_2d({name}, {self.BK}, {box})")
        split_k = c.get("SPLIT_K", 1)
        zeros = f.epilogue.rowsum or split_k > 1  # accumulated into by atomics
        return LaunchSpec(entry=self.name, grid=f"(cdiv(M, {self.BM}) * cdiv(N, {c['BN']}) * {split_k}, BATCH)", block="(384,)",
                          shared_mem=str(self.smem_bytes(c)),
                          args=(*descs, "out0",
                                "M", "N", "K", "KP", "BATCH * M", "BATCH * N", *f.epilogue.launch_args()),
                          outputs=((*out, "zeros"),) if zeros else (out,), bindings=tuple(bindings),
                          scratch=tuple(scratch), pre=tuple(pre))
