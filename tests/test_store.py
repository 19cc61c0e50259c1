import sqlite3

import pytest

from cuforge.results.store import MIGRATIONS, Store, StoreError

TIMING = {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1, "n": 30, "method": "events+l2flush"}


def test_store_migrates_and_keeps_latest_baseline(tmp_path):
    db = tmp_path / "r" / "cuforge.db"
    s = Store(db)
    assert s.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.add_baseline("hgemm/64_64_64", "src", "H100", "torch 2.11", "cublas", TIMING)
    s.add_baseline("hgemm/64_64_64", "src", "H100", "torch 2.11", "cublas", dict(TIMING, median_ms=0.8))
    s.close()
    rows = Store(db).baselines("hgemm/64_64_64")  # reopening migrates nothing and loses nothing
    assert len(rows) == 1 and rows[0].median_ms == 0.8 and rows[0].gpu == "H100"


def test_corrupt_or_newer_store_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not an SQLite database, so not a results store"):
        Store(bad)
    newer = tmp_path / "newer.db"
    c = sqlite3.connect(newer)
    c.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    c.close()
    with pytest.raises(StoreError, match="newer than this cuforge"):
        Store(newer)
