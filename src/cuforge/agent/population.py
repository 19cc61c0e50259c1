"""The evolutionary population of one problem: islands, each a MAP-Elites archive over feature
descriptors (technique tags x a register bucket); parent selection among correct members weighted by
fitness relative to the island median and penalised by children already had; FIX mode while nothing
is correct; ring migration of elites; dedup of identical or near-identical sources."""

from __future__ import annotations

import hashlib
import math
import random
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from cuforge.sandbox.protocol.candidate import normalize_source

# How close a failure is to working, for FIX mode: wrong output beats a runtime error beats a compile error.
_FIX_PREFERENCE = {"wrong_output": 3, "runtime_error": 2, "timeout": 1, "crash": 1, "compile_error": 1, "parse_error": 0}


def source_key(source: str) -> str:
    return hashlib.sha256(normalize_source(source).encode()).hexdigest()[:16]


def technique_tags(source: str) -> tuple[str, ...]:
    tags = []
    checks = [
        ("tensor_core", r"\bwgmma\b|\bmma\.sync\b|\bwmma::|\bmma_sync\b|ldmatrix"),
        ("async_copy", r"cp\.async|cp_async|cuda::memcpy_async|cp\.async\.bulk|TensorMap"),
        ("shared_memory", r"__shared__|extern\s+__shared__"),
        ("vectorized", r"\bfloat4\b|\bhalf2\b|\bint4\b|__half2|\bbfloat162\b|uint4"),
        ("warp_shuffle", r"__shfl_"),
        ("inline_load", r"load_inline"),
    ]
    for tag, pattern in checks:
        if re.search(pattern, source):
            tags.append(tag)
    return tuple(tags) or ("plain",)


def register_bucket(profile: dict[str, Any] | None) -> str:
    kernels = (profile or {}).get("kernels") or []
    regs = max((k.get("registers") or 0 for k in kernels), default=0)
    if not regs:
        return "regs:?"
    for limit in (32, 64, 128, 192):
        if regs <= limit:
            return f"regs<={limit}"
    return "regs>192"


@dataclass
class Member:
    candidate_id: int
    key: str
    status: str
    fitness: float
    speedup: float | None
    island: int
    generation: int
    cell: tuple[str, ...]
    parents: tuple[int, ...] = ()
    children: int = 0
    source: str = ""
    feedback: str = ""  # compiler diagnostics, correctness diff or profile summary, for prompts

    @property
    def correct(self) -> bool:
        return self.status == "ok"


@dataclass
class Island:
    archive: dict[tuple[str, ...], Member] = field(default_factory=dict)  # cell -> elite
    failures: list[Member] = field(default_factory=list)


class Population:
    def __init__(self, islands: int = 4, migration_interval: int = 10, seed: int = 0) -> None:
        if islands < 1:
            raise ValueError("a population needs at least one island")
        self.islands = [Island() for _ in range(islands)]
        self.migration_interval = migration_interval
        self.rng = random.Random(seed)
        self.keys: set[str] = set()
        self.members: dict[int, Member] = {}
        self.inserted = 0

    # -------------------------------------------------------------- insertion

    def is_duplicate(self, source: str) -> bool:
        return source_key(source) in self.keys

    def add(self, m: Member) -> bool:
        """Record a member; a correct one becomes its cell's elite if it beats the incumbent.
        Returns whether it entered an archive."""
        self.keys.add(m.key)
        self.members[m.candidate_id] = m
        for pid in m.parents:
            if pid in self.members:
                self.members[pid].children += 1
        self.inserted += 1
        island = self.islands[m.island % len(self.islands)]
        if not m.correct:
            island.failures.append(m)
            return False
        incumbent = island.archive.get(m.cell)
        if incumbent is None or m.fitness > incumbent.fitness:
            island.archive[m.cell] = m
            entered = True
        else:
            entered = False
        if self.migration_interval and self.inserted % self.migration_interval == 0:
            self.migrate()
        return entered

    def migrate(self) -> None:
        """Ring migration: each island's best elite is offered to the next island's archive."""
        bests = [max(isl.archive.values(), key=lambda m: m.fitness, default=None) for isl in self.islands]
        for i, best in enumerate(bests):
            if best is None:
                continue
            target = self.islands[(i + 1) % len(self.islands)]
            incumbent = target.archive.get(best.cell)
            if incumbent is None or best.fitness > incumbent.fitness:
                target.archive[best.cell] = best

    # -------------------------------------------------------------- selection

    def correct_members(self, island: int | None = None) -> list[Member]:
        isls = self.islands if island is None else [self.islands[island % len(self.islands)]]
        seen, out = set(), []
        for isl in isls:
            for m in isl.archive.values():
                if m.candidate_id not in seen:
                    seen.add(m.candidate_id)
                    out.append(m)
        return out

    def mode(self) -> str:
        """SEED with nothing evaluated; FIX while nothing is correct; else IMPROVE."""
        if not self.members:
            return "SEED"
        return "IMPROVE" if self.correct_members() else "FIX"

    def select_parent(self, island: int) -> Member | None:
        pool = self.correct_members(island) or self.correct_members()
        if not pool:
            return None
        median = statistics.median(m.fitness for m in pool)
        spread = statistics.pstdev([m.fitness for m in pool]) or 1.0
        weights = [1.0 / (1.0 + math.exp(-(m.fitness - median) / spread)) / (1.0 + m.children) for m in pool]
        return self.rng.choices(pool, weights=weights, k=1)[0]

    def fix_target(self, island: int) -> Member | None:
        isl = self.islands[island % len(self.islands)]
        pool = isl.failures or [m for i in self.islands for m in i.failures]
        if not pool:
            return None
        best_rank = max(_FIX_PREFERENCE.get(m.status, 0) for m in pool)
        top = [m for m in pool if _FIX_PREFERENCE.get(m.status, 0) == best_rank]
        weights = [1.0 / (1.0 + m.children) for m in top]
        return self.rng.choices(top, weights=weights, k=1)[0]

    def inspirations(self, exclude: int | None, k: int = 3) -> list[tuple[Member, Member | None]]:
        """Up to k (better, worse) pairs from the whole population, for contrastive prompts."""
        ranked = sorted((m for m in self.correct_members() if m.candidate_id != exclude),
                        key=lambda m: m.fitness, reverse=True)
        pairs = []
        for i in range(min(k, len(ranked))):
            worse = ranked[-(i + 1)] if len(ranked) > k + i else None
            pairs.append((ranked[i], worse if worse is not ranked[i] else None))
        return pairs

    def best(self) -> Member | None:
        return max(self.correct_members(), key=lambda m: (m.speedup or 0.0), default=None)

    def next_island(self) -> int:
        """Round-robin over islands by how many members each has had proposed from."""
        counts = [sum(1 for m in self.members.values() if m.island == i) for i in range(len(self.islands))]
        return counts.index(min(counts))
