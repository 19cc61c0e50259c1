"""The results store's schema, as an append-only list of migrations (PRAGMA user_version counts them)."""

from __future__ import annotations

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
    # 2: runs and everything they produce, written as it happens
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        status TEXT NOT NULL,
        suite TEXT,
        config TEXT NOT NULL DEFAULT '{}',
        gpu TEXT,
        software TEXT
    );
    CREATE TABLE run_problems (
        run_id TEXT NOT NULL REFERENCES runs(id),
        problem_id TEXT NOT NULL,
        problem_hash TEXT NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, problem_id)
    );
    CREATE TABLE candidates (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        problem_id TEXT NOT NULL,
        candidate_hash TEXT NOT NULL,
        source TEXT NOT NULL,
        format TEXT NOT NULL,
        launch TEXT,
        proposer TEXT NOT NULL DEFAULT '',
        parents TEXT NOT NULL DEFAULT '[]',
        prompt TEXT,
        island INTEGER,
        generation INTEGER,
        meta TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL
    );
    CREATE INDEX candidates_run ON candidates(run_id, problem_id);
    CREATE TABLE evaluations (
        id INTEGER PRIMARY KEY,
        candidate_id INTEGER NOT NULL REFERENCES candidates(id),
        run_id TEXT NOT NULL REFERENCES runs(id),
        problem_id TEXT NOT NULL,
        status TEXT NOT NULL,
        failure_kind TEXT,
        message TEXT NOT NULL DEFAULT '',
        median_ms REAL,
        p20_ms REAL,
        p80_ms REAL,
        n INTEGER,
        speedups TEXT NOT NULL DEFAULT '{}',
        timings TEXT NOT NULL DEFAULT '{}',
        correctness TEXT NOT NULL DEFAULT '{}',
        profile TEXT,
        device TEXT NOT NULL DEFAULT '{}',
        reward REAL,
        wall_s REAL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX evaluations_candidate ON evaluations(candidate_id);
    CREATE INDEX evaluations_run ON evaluations(run_id, problem_id);
    CREATE TABLE llm_calls (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        problem_id TEXT,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        status TEXT NOT NULL,
        tokens_in INTEGER NOT NULL DEFAULT 0,
        tokens_out INTEGER NOT NULL DEFAULT 0,
        tokens_cached INTEGER NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0,
        latency_s REAL,
        prompt TEXT,
        response TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX llm_calls_run ON llm_calls(run_id);
    """,
    # 3: the problem's source beside its hash, so a run's winners can be exported (and re-checked)
    # after its suite directory has moved or changed.
    """
    ALTER TABLE run_problems ADD COLUMN source TEXT;
    """,
    # 4: who drives a run (host, pid and the pid's start time, a heartbeat), so that a run whose
    # driver died shows as died rather than running; token counts estimated locally are marked.
    """
    ALTER TABLE runs ADD COLUMN host TEXT;
    ALTER TABLE runs ADD COLUMN pid INTEGER;
    ALTER TABLE runs ADD COLUMN pid_start TEXT;
    ALTER TABLE runs ADD COLUMN heartbeat_at REAL;
    ALTER TABLE llm_calls ADD COLUMN estimated INTEGER NOT NULL DEFAULT 0;
    """,
    # 5: when a candidate was handed to a worker: a candidate whose evaluation a dead driver never
    # finished (it may have killed the driver) is recorded as a crash on --resume, never re-run.
    """
    ALTER TABLE candidates ADD COLUMN started_at REAL;
    """,
    # 6: problem files a run's suite held but could not load, with why (a hang, an import error,
    # not a regular file): shown before the run starts, and in its report.
    """
    CREATE TABLE run_skipped (
        run_id TEXT NOT NULL REFERENCES runs(id),
        path TEXT NOT NULL,
        reason TEXT NOT NULL,
        PRIMARY KEY (run_id, path)
    );
    """,
]
