"""`cuforge results export`: a run's evaluations (joined with their candidates) as CSV or Parquet."""

from __future__ import annotations

import io
import json

import pandas as pd

from cuforge.results.store import Store, StoreError

FORMATS = ("csv", "parquet")


def run_frame(store: Store, run_id: str) -> pd.DataFrame:
    store.run(run_id)  # a clear error for a missing run
    rows = store.evaluations(run_id)
    for r in rows:
        for name, value in (r.pop("speedups") or {}).items():
            r[f"speedup_vs_{name}"] = value
        r["parents"] = json.dumps(r["parents"])
        r["profile"] = json.dumps(r["profile"]) if r["profile"] else None
        r["device"] = r["device"].get("name") if isinstance(r["device"], dict) else r["device"]
    return pd.DataFrame(rows)


def render_run(store: Store, run_id: str, fmt: str) -> bytes:
    """The export's bytes: written by the caller through outputs.write_file, the one guarded path."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    frame = run_frame(store, run_id)
    if fmt == "csv":
        return frame.to_csv(index=False).encode()
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()
