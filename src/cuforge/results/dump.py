"""`cuforge results export`: a run's evaluations (joined with their candidates) as CSV or Parquet."""

from __future__ import annotations

import json
from pathlib import Path

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


def export_run(store: Store, run_id: str, fmt: str, out: Path) -> Path:
    if fmt not in FORMATS:
        raise StoreError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")
    frame = run_frame(store, run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if fmt == "csv":
        frame.to_csv(tmp, index=False)
    else:
        frame.to_parquet(tmp, index=False)
    tmp.replace(out)  # never a half-written file under the final name
    return out
