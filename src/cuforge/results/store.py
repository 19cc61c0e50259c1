"""The SQLite results store (default results/cuforge.db): WAL mode, a versioned schema.

This module owns the schema and its migrations; each later table arrives as a new migration.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("results") / "cuforge.db"

MIGRATIONS: list[str] = [
    # 1: baseline timings per (problem source, GPU, software versions)
    """
    CREATE TABLE baselines (
        id INTEGER PRIMARY KEY,
        problem_id TEXT NOT NULL,
        problem_hash TEXT NOT NULL,
        gpu TEXT NOT NULL,
        software TEXT NOT NULL,
        baseline TEXT NOT NULL,
        median_ms REAL NOT NULL,
        p20_ms REAL NOT NULL,
        p80_ms REAL NOT NULL,
        n INTEGER NOT NULL,
        method TEXT NOT NULL,
        details TEXT NOT NULL DEFAULT '{}',
        measured_at REAL NOT NULL
    );
    CREATE INDEX baselines_key ON baselines(problem_hash, gpu, software, baseline);
    """,
]


class StoreError(RuntimeError):
    pass


def problem_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BaselineRow:
    problem_id: str
    baseline: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    method: str
    gpu: str
    software: str
    measured_at: float


class Store:
    def __init__(self, path: Path | str = DEFAULT_PATH) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a usable cuforge store ({e})") from None

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise StoreError(f"{self.path}: schema version {version} is newer than this cuforge ({len(MIGRATIONS)})")
        for i in range(version, len(MIGRATIONS)):
            # Statement by statement: executescript would commit the open transaction first.
            with self.transaction() as c:
                for stmt in MIGRATIONS[i].split(";"):
                    if stmt.strip():
                        c.execute(stmt)
                c.execute(f"PRAGMA user_version = {i + 1}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    # -------------------------------------------------------------- baselines

    def add_baseline(self, problem_id: str, source: str, gpu: str, software: str, baseline: str,
                     timing: dict[str, Any], details: dict[str, Any] | None = None) -> None:
        with self.transaction() as c:
            c.execute(
                "INSERT INTO baselines (problem_id, problem_hash, gpu, software, baseline, median_ms, p20_ms, p80_ms, n,"
                " method, details, measured_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (problem_id, problem_hash(source), gpu, software, baseline, timing["median_ms"], timing["p20_ms"],
                 timing["p80_ms"], timing["n"], timing["method"], json.dumps(details or {}), time.time()),
            )

    def baselines(self, problem_id: str | None = None, gpu: str | None = None) -> list[BaselineRow]:
        """The latest measurement of each (problem, baseline, GPU, software)."""
        q = ("SELECT problem_id, baseline, median_ms, p20_ms, p80_ms, n, method, gpu, software, MAX(measured_at) "
             "FROM baselines WHERE (? IS NULL OR problem_id = ?) AND (? IS NULL OR gpu = ?) "
             "GROUP BY problem_hash, baseline, gpu, software ORDER BY problem_id, baseline")
        rows = self.conn.execute(q, (problem_id, problem_id, gpu, gpu)).fetchall()
        return [BaselineRow(*r) for r in rows]
