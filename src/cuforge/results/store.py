"""The SQLite results store (default results/cuforge.db): WAL mode, a versioned schema.

This module owns the schema and its migrations; each later table arrives as a new migration.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuforge.results.schema import MIGRATIONS

DEFAULT_PATH = Path("results") / "cuforge.db"

class StoreError(RuntimeError):
    pass


SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite_file(path: Path) -> None:
    """An existing non-empty file must be an SQLite database: never treat (or overwrite) another file as a store."""
    try:
        if path.is_dir():
            raise StoreError(f"{path}: is a directory, not a results store file")
        if not path.exists() or path.stat().st_size == 0:
            return
        with open(path, "rb") as f:
            head = f.read(16)
    except PermissionError:
        raise StoreError(f"{path}: permission denied") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot read ({e.strerror or e})") from None
    if head != SQLITE_HEADER:
        raise StoreError(f"{path}: not an SQLite database, so not a results store")


def is_sqlite_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_HEADER
    except OSError:
        return False


def _open_readonly(path: Path) -> sqlite3.Connection:
    """mode=ro. With no -wal file beside the store no connection has it open, so it is read as
    immutable: SQLite then makes no -wal/-shm files next to it. With one (a run writing now, or a
    crash's leftover), a plain read-only connection sees what is in it."""
    uri = path.resolve().as_uri()
    wal = path.with_name(path.name + "-wal")
    if not wal.exists():
        conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=30, isolation_level=None)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, isolation_level=None)
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    return conn


def _in_memory_copy(conn: sqlite3.Connection) -> sqlite3.Connection:
    mem = sqlite3.connect(":memory:", isolation_level=None)
    conn.backup(mem)
    conn.close()
    return mem


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
    """The store. `readonly` opens the file with SQLite's mode=ro: nothing is written, converted
    (no WAL switch) or migrated in place; an older schema is migrated in a private in-memory copy."""

    def __init__(self, path: Path | str = DEFAULT_PATH, create: bool = True, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if (readonly or not create) and not self.path.exists():
            raise StoreError(f"{self.path}: no results store there (run `cuforge run` first, or pass --results)")
        check_sqlite_file(self.path)
        try:
            if readonly:
                self.conn = _open_readonly(self.path)
                self._check_cuforge_schema()
                if self.conn.execute("PRAGMA user_version").fetchone()[0] < len(MIGRATIONS):
                    self.conn = _in_memory_copy(self.conn)
                    self._migrate()
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout=30000")
            if self.path.stat().st_size and not self._has_table("runs") and self._has_any_table():
                raise StoreError(f"{self.path}: an SQLite database, but not a cuforge results store (no runs table)")
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except PermissionError as e:
            raise StoreError(f"{self.path}: permission denied ({e.strerror})") from None
        except OSError as e:
            raise StoreError(f"{self.path}: cannot open ({e.strerror or e})") from None
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "readonly" in msg or "read-only" in msg or "unable to open" in msg:
                raise StoreError(f"{self.path}: cannot write to the results store ({msg}); read-only commands "
                                 "(leaderboard, report, results list) can still read it") from None
            if "locked" in msg:
                raise StoreError(f"{self.path}: the results store is locked by another process ({msg})") from None
            raise StoreError(f"{self.path}: not a usable cuforge store ({msg})") from None
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a usable cuforge store ({e})") from None

    def _has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None

    def _has_any_table(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table'").fetchone() is not None

    def _check_cuforge_schema(self) -> None:
        try:
            if not self._has_table("runs"):
                raise StoreError(f"{self.path}: not a cuforge results store (no runs table)")
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

    # -------------------------------------------------------------- runs

    def create_run(self, run_id: str, suite: str | None, config: dict[str, Any], gpu: str | None = None,
                   software: str | None = None) -> None:
        now = time.time()
        with self.transaction() as c:
            c.execute("INSERT INTO runs (id, created_at, updated_at, status, suite, config, gpu, software) "
                      "VALUES (?,?,?,?,?,?,?,?)", (run_id, now, now, "running", suite, json.dumps(config), gpu, software))
        self.claim_run(run_id)

    def claim_run(self, run_id: str, config: dict[str, Any] | None = None) -> None:
        """This process drives the run from now on (host, pid, the pid's start time, a first heartbeat)."""
        pid = os.getpid()
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = 'running', host = ?, pid = ?, pid_start = ?, heartbeat_at = ?, "
                      "updated_at = ?, config = COALESCE(?, config) WHERE id = ?",
                      (socket.gethostname(), pid, process_start(pid), time.time(), time.time(),
                       json.dumps(config) if config is not None else None, run_id))

    def heartbeat(self, run_id: str) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET heartbeat_at = ? WHERE id = ?", (time.time(), run_id))

    def set_run_status(self, run_id: str, status: str, gpu: str | None = None, software: str | None = None) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, updated_at = ?, gpu = COALESCE(?, gpu), software = COALESCE(?, software) "
                      "WHERE id = ?", (status, time.time(), gpu, software, run_id))

    _RUN_COLUMNS = "id, created_at, updated_at, status, suite, config, gpu, software, host, pid, pid_start, heartbeat_at"

    def run(self, run_id: str) -> RunRow:
        row = self.conn.execute(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r.id for r in self.runs()][:5]
            raise StoreError(f"no run {run_id!r} in {self.path}" + (f" (latest: {', '.join(known)})" if known else " (it holds no runs)"))
        return _run_row(row)

    def runs(self) -> list[RunRow]:
        rows = self.conn.execute(f"SELECT {self._RUN_COLUMNS} FROM runs ORDER BY created_at DESC").fetchall()
        return [_run_row(r) for r in rows]

    def latest_run(self) -> RunRow:
        runs = self.runs()
        if not runs:
            raise StoreError(f"{self.path} holds no runs yet: start one with `cuforge run`")
        return runs[0]

    def add_run_problem(self, run_id: str, problem_id: str, source: str, meta: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR IGNORE INTO run_problems (run_id, problem_id, problem_hash, meta, source) "
                      "VALUES (?,?,?,?,?)", (run_id, problem_id, problem_hash(source), json.dumps(meta, default=str), source))

    def note_run_problem(self, run_id: str, problem_id: str, **notes: Any) -> None:
        """Merge notes (why the search of a problem ended, say) into its stored meta."""
        with self.transaction() as c:
            row = c.execute("SELECT meta FROM run_problems WHERE run_id = ? AND problem_id = ?", (run_id, problem_id)).fetchone()
            if row is not None:
                meta = {**json.loads(row[0] or "{}"), **notes}
                c.execute("UPDATE run_problems SET meta = ? WHERE run_id = ? AND problem_id = ?",
                          (json.dumps(meta, default=str), run_id, problem_id))

    def add_run_skipped(self, run_id: str, path: str, reason: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO run_skipped (run_id, path, reason) VALUES (?,?,?)", (run_id, path, reason))

    def run_skipped(self, run_id: str) -> list[tuple[str, str]]:
        """(path, reason) of each problem file the run's suite could not load."""
        return [(r[0], r[1]) for r in self.conn.execute(
            "SELECT path, reason FROM run_skipped WHERE run_id = ? ORDER BY path", (run_id,))]

    def run_problem_sources(self, run_id: str) -> dict[str, tuple[str, str | None]]:
        """problem id -> (hash, source); the source is None for runs stored before it was kept."""
        return {r[0]: (r[1], r[2]) for r in self.conn.execute(
            "SELECT problem_id, problem_hash, source FROM run_problems WHERE run_id = ?", (run_id,))}

    def run_problems(self, run_id: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT problem_id FROM run_problems WHERE run_id = ? ORDER BY problem_id", (run_id,))]

    def run_problem_metas(self, run_id: str) -> dict[str, dict[str, Any]]:
        return {r[0]: json.loads(r[1]) for r in self.conn.execute(
            "SELECT problem_id, meta FROM run_problems WHERE run_id = ?", (run_id,))}

    def add_candidate(self, run_id: str, problem_id: str, candidate: dict[str, Any], candidate_hash: str,
                      parents: list[int] | None = None, prompt: str | None = None, island: int | None = None,
                      generation: int | None = None, meta: dict[str, Any] | None = None) -> int:
        with self.transaction() as c:
            return _insert_candidate(c, run_id, problem_id, candidate, candidate_hash, parents, prompt, island,
                                     generation, meta)

    def add_evaluation(self, candidate_id: int, run_id: str, evaluation: dict[str, Any], reward: float | None) -> int:
        """One per candidate (a unique index makes a repeated write after a crash an error, not a duplicate)."""
        with self.transaction() as c:
            return _insert_evaluation(c, candidate_id, run_id, evaluation, reward)

    def add_llm_call(self, run_id: str, problem_id: str | None, provider: str, model: str, status: str,
                     tokens_in: int = 0, tokens_out: int = 0, tokens_cached: int = 0, cost_usd: float = 0.0,
                     latency_s: float | None = None, prompt: str | None = None, response: str | None = None) -> int:
        with self.transaction() as c:
            return _insert_llm_call(c, run_id, problem_id, provider, model, status, tokens_in, tokens_out,
                                    tokens_cached, cost_usd, latency_s, prompt, response)

    def record_proposal(self, run_id: str, problem_id: str, call: dict[str, Any], candidate: dict[str, Any] | None = None,
                        evaluation: dict[str, Any] | None = None, reward: float | None = None) -> int | None:
        """An LLM reply and what it became (a candidate; for a parse error, also its verdict), in one
        transaction: a kill can never leave a consumed reply without its candidate."""
        with self.transaction() as c:
            _insert_llm_call(c, run_id, problem_id, **call)
            if candidate is None:
                return None
            cid = _insert_candidate(c, run_id, problem_id, **candidate)
            if evaluation is not None:
                _insert_evaluation(c, cid, run_id, evaluation, reward)
            return cid

    def evaluations(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Evaluations joined with their candidates, oldest first."""
        q = ("SELECT e.id, e.run_id, e.problem_id, e.status, e.failure_kind, e.message, e.median_ms, e.p20_ms, e.p80_ms,"
             " e.n, e.speedups, e.reward, e.wall_s, e.created_at, c.id, c.proposer, c.parents, c.candidate_hash,"
             " c.generation, c.island, e.profile, e.device FROM evaluations e JOIN candidates c ON c.id = e.candidate_id"
             " WHERE (? IS NULL OR e.run_id = ?) ORDER BY e.id")
        cols = ("evaluation_id", "run_id", "problem_id", "status", "failure_kind", "message", "median_ms", "p20_ms",
                "p80_ms", "n", "speedups", "reward", "wall_s", "created_at", "candidate_id", "proposer", "parents",
                "candidate_hash", "generation", "island", "profile", "device")
        out = []
        for row in self.conn.execute(q, (run_id, run_id)):
            d = dict(zip(cols, row))
            d["speedups"] = json.loads(d["speedups"])
            d["parents"] = json.loads(d["parents"])
            d["profile"] = json.loads(d["profile"]) if d["profile"] else None
            d["device"] = json.loads(d["device"])
            out.append(d)
        return out

    def mark_started(self, candidate_id: int, started: bool = True) -> None:
        """Set (before a worker gets the candidate) or clear (the user stopped its evaluation) the
        candidate's start time; see pending_candidates."""
        with self.transaction() as c:
            c.execute("UPDATE candidates SET started_at = ? WHERE id = ?", (time.time() if started else None, candidate_id))

    def pending_candidates(self, run_id: str) -> list[dict[str, Any]]:
        """Candidates stored but never evaluated (the run was killed while they were in flight);
        `started_at` is set for one a worker had already received."""
        q = ("SELECT c.id, c.problem_id, c.source, c.format, c.launch, c.proposer, c.parents, c.island, c.generation, "
             "c.started_at FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id "
             "WHERE c.run_id = ? AND e.id IS NULL ORDER BY c.id")
        cols = ("candidate_id", "problem_id", "source", "format", "launch", "proposer", "parents", "island", "generation",
                "started_at")
        out = []
        for row in self.conn.execute(q, (run_id,)):
            d = dict(zip(cols, row))
            d["launch"] = json.loads(d["launch"]) if d["launch"] else None
            d["parents"] = json.loads(d["parents"])
            out.append(d)
        return out

    def candidate_source(self, candidate_id: int) -> dict[str, Any]:
        row = self.conn.execute("SELECT source, format, launch, proposer FROM candidates WHERE id = ?",
                                (candidate_id,)).fetchone()
        if row is None:
            raise StoreError(f"no candidate {candidate_id} in {self.path}")
        return {"source": row[0], "format": row[1], "launch": json.loads(row[2]) if row[2] else None, "proposer": row[3]}

    def llm_usage(self, run_id: str) -> dict[str, float]:
        row = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(tokens_in),0), COALESCE(SUM(tokens_out),0),"
                                " COALESCE(SUM(tokens_cached),0), COALESCE(SUM(cost_usd),0), COALESCE(SUM(estimated),0),"
                                " COALESCE(SUM(status IN ('ok', 'duplicate')),0), COALESCE(SUM(status LIKE 'error:%'),0)"
                                " FROM llm_calls WHERE run_id = ?", (run_id,)).fetchone()
        return {"calls": row[0], "tokens_in": row[1], "tokens_out": row[2], "tokens_cached": row[3], "cost_usd": row[4],
                "estimated_calls": row[5], "replies": row[6], "errors": row[7]}

    def llm_calls_without_candidate(self, run_id: str) -> dict[str, int]:
        """Per problem, requests that yielded no candidate (provider errors, duplicates): they used
        their proposal slots all the same."""
        return {r[0]: r[1] for r in self.conn.execute(
            "SELECT problem_id, COUNT(*) FROM llm_calls WHERE run_id = ? AND status != 'ok' GROUP BY problem_id",
            (run_id,))}

    def llm_errors(self, run_id: str) -> dict[str, int]:
        """Failed requests of a run by kind."""
        return {r[0].split(":", 1)[1]: r[1] for r in self.conn.execute(
            "SELECT status, COUNT(*) FROM llm_calls WHERE run_id = ? AND status LIKE 'error:%' GROUP BY status",
            (run_id,))}


@dataclass(frozen=True)
class RunRow:
    id: str
    created_at: float
    updated_at: float
    status: str  # as stored, except that a 'running' run whose driver is gone reads 'died'
    suite: str | None
    config: dict[str, Any]
    gpu: str | None
    software: str | None
    host: str | None = None
    pid: int | None = None


HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0  # a driver on another host is taken as dead after this long without a heartbeat


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid,
    it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def driver_alive(host: str | None, pid: int | None, pid_start: str | None, heartbeat_at: float | None) -> bool:
    if host == socket.gethostname() and pid is not None:
        return pid_start is not None and process_start(pid) == pid_start
    return heartbeat_at is not None and time.time() - heartbeat_at < STALE_AFTER_S


def _run_row(r: tuple[Any, ...]) -> RunRow:
    status = r[3]
    if status == "running" and not driver_alive(r[8], r[9], r[10], r[11]):
        status = "died"
    return RunRow(r[0], r[1], r[2], status, r[4], json.loads(r[5]), r[6], r[7], r[8], r[9])


def _insert_candidate(c: sqlite3.Connection, run_id: str, problem_id: str, candidate: dict[str, Any], candidate_hash: str,
                      parents: list[int] | None = None, prompt: str | None = None, island: int | None = None,
                      generation: int | None = None, meta: dict[str, Any] | None = None) -> int:
    cur = c.execute(
        "INSERT INTO candidates (run_id, problem_id, candidate_hash, source, format, launch, proposer, parents,"
        " prompt, island, generation, meta, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (run_id, problem_id, candidate_hash, candidate["source"], candidate.get("format", "module"),
         json.dumps(candidate.get("launch")) if candidate.get("launch") else None, candidate.get("proposer", ""),
         json.dumps(parents or []), prompt, island, generation, json.dumps(meta or {}, default=str), time.time()))
    return int(cur.lastrowid)


def _insert_evaluation(c: sqlite3.Connection, candidate_id: int, run_id: str, evaluation: dict[str, Any],
                       reward: float | None) -> int:
    status = evaluation["status"]
    cand = (evaluation.get("timings") or {}).get("candidate") or {}
    cur = c.execute(
        "INSERT INTO evaluations (candidate_id, run_id, problem_id, status, failure_kind, message, median_ms,"
        " p20_ms, p80_ms, n, speedups, timings, correctness, profile, device, reward, wall_s, created_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (candidate_id, run_id, evaluation["problem_id"], status,
         None if status == "ok" else status.split(":", 1)[-1], evaluation.get("message", ""),
         cand.get("median_ms"), cand.get("p20_ms"), cand.get("p80_ms"), cand.get("n"),
         json.dumps(evaluation.get("speedups") or {}), json.dumps(evaluation.get("timings") or {}),
         json.dumps(evaluation.get("correctness") or {}, default=str),
         json.dumps(evaluation["profile"], default=str) if evaluation.get("profile") else None,
         json.dumps(evaluation.get("device") or {}), reward, evaluation.get("wall_s"), time.time()))
    return int(cur.lastrowid)


def _insert_llm_call(c: sqlite3.Connection, run_id: str, problem_id: str | None, provider: str, model: str, status: str,
                     tokens_in: int = 0, tokens_out: int = 0, tokens_cached: int = 0, cost_usd: float = 0.0,
                     latency_s: float | None = None, prompt: str | None = None, response: str | None = None,
                     estimated: bool = False) -> int:
    cur = c.execute(
        "INSERT INTO llm_calls (run_id, problem_id, provider, model, status, tokens_in, tokens_out, tokens_cached,"
        " cost_usd, latency_s, prompt, response, created_at, estimated) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (run_id, problem_id, provider, model, status, tokens_in, tokens_out, tokens_cached, cost_usd, latency_s,
         prompt, response, time.time(), int(estimated)))
    return int(cur.lastrowid)
