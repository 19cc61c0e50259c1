"""Top-k over the last dim in two kernels, for rows fewer than the GPU's SMs (LLM sampling: 64 rows of a
32,000-token vocabulary). Each row is cut into CHUNKS chunks, a block a chunk: its first K (key, index)
pairs chosen by a radix select over them, held in registers, and handed on; then a block a row sorts
those candidates and writes the first K. A row's top K are each among their own chunk's top K, so
nothing is lost, and ties keep the lowest index first as one sort of the row would. topk_rows' block a
row ran the models suite's top-k at 0.59x eager on an H200: 64 blocks on 132 SMs, four radix passes each."""

from __future__ import annotations

from typing import Any

from cuforge.kernels.base import GraphFamily
from cuforge.kernels.chains import CTYPES
from cuforge.kernels.registry import family
from cuforge.kernels.topk_rows import TopkMatch, match_topk, topk_outputs
from cuforge.problems.problem import Problem
from cuforge.sandbox.protocol.candidate import LaunchSpec

MAX_SORT = 4096  # 64-bit values a block sorts in static shared memory (32 KB), or holds in registers (a chunk)
MAX_CANDIDATE_BYTES = 2**30  # the candidates' buffer: the family is for few rows, not for millions
FEW_ROWS = 128  # rows that leave an H100's or H200's 132 SMs idle with a block a row


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def widths(m: TopkMatch, chunks: int) -> tuple[int, int, int, int]:
    """(elements a chunk, candidates it hands on, the first sort's width, the second's)."""
    cw = -(-m.n // chunks)
    kc = min(m.k, cw)
    return cw, kc, pow2(cw), pow2(chunks * kc)


@family(301)
class TopkChunks(GraphFamily):
    """CHUNKS blocks a row for the selection; THREADS (a multiple of 32) a block in both kernels."""

    anchors = frozenset({"topk"})
    template = "topk_chunks"

    def __init__(self) -> None:
        super().__init__("topk_chunks", {"CHUNKS": (2, 4, 8, 16, 32, 64), "THREADS": (128, 256, 512)})

    def match(self, problem: Problem) -> TopkMatch | str:
        m = match_topk(problem)
        if isinstance(m, str):
            return m
        if not any(self._fits(m, chunks) for chunks in self.knobs["CHUNKS"]):
            return (f"a top-{m.k} of {m.rows} rows of {m.n}: no chunking sorts in one block's shared memory "
                    f"with its candidates under {MAX_CANDIDATE_BYTES // 2**20} MiB")
        return m

    @staticmethod
    def _fits(m: TopkMatch, chunks: int) -> bool:
        cw, kc, p1, p2 = widths(m, chunks)
        return (cw >= 1 and p1 <= MAX_SORT and p2 <= MAX_SORT and (chunks - 1) * cw < m.n  # no chunk empty
                and m.rows * chunks < 2**31 and m.rows * chunks * kc * 8 <= MAX_CANDIDATE_BYTES)

    def leads(self, problem: Problem) -> bool:
        # Ahead of topk_rows where a block a row leaves SMs idle: on an H200 the models suite's 64 rows
        # of 32,000 ran at 0.68x eager chunked and 0.58x a block a row. Where the rows fill the SMs, a
        # block a row does the work in one kernel.
        m = self.match(problem)
        return not isinstance(m, str) and m.rows < FEW_ROWS

    def valid(self, c: dict[str, Any], problem: Problem) -> bool:
        return self._fits(self.matched(problem), c["CHUNKS"])

    def seeds(self, problem: Problem) -> list[dict[str, Any]]:
        # Chunks enough that the first kernel's blocks cover the SMs several times over, each selecting from
        # a few thousand values held in registers; the second sorts CHUNKS x K candidates, so fewer, larger
        # chunks lead: on the H200, 64 rows of 32,000 (k = 50) took 32 us at 8 chunks of 512 threads, 42 us
        # at 16 of 256 and 58 us at 32 of 256.
        out = [dict(CHUNKS=8, THREADS=512), dict(CHUNKS=16, THREADS=256), dict(CHUNKS=32, THREADS=256),
               dict(CHUNKS=4, THREADS=512), dict(CHUNKS=64, THREADS=128), dict(CHUNKS=2, THREADS=512)]
        return [c for c in out if self.valid(c, problem)][:3]

    def extra(self, problem: Problem) -> dict[str, Any]:
        m = self.matched(problem)
        # WIDTHS(CHUNKS): the template's sort widths, from widths() as the launch's.
        return {"CTYPE": CTYPES[m.dtype], "N": m.n, "K": m.k, "LARGEST": m.largest, "WIDTHS": lambda chunks: widths(m, chunks)}

    def launch(self, c: dict[str, Any], problem: Problem) -> LaunchSpec:
        m = self.matched(problem)
        _, kc, _, _ = widths(m, c["CHUNKS"])
        candidates = (f"({m.rows * c['CHUNKS'] * kc},)", "int64", "empty")
        outputs, scratch, args = topk_outputs(m, (candidates,))
        threads = f"({c['THREADS']},)"
        return LaunchSpec(entry=self.name, grid=f"({m.rows},)", block=threads, args=(m.x, "scratch0", *args),
                          outputs=outputs, scratch=scratch,
                          pre=((f"{self.name}_chunks", f"({m.rows * c['CHUNKS']},)", threads, f"({m.x}, scratch0)"),))
