"""Shared by the benchmark scripts: where results go, and the GPU/software stamp on each."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser, its docstring the help: --help prints what it does before it runs anything,
    and an option it does not take is refused in one line."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def stamp() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def spread(times_ms: list[float]) -> dict[str, float]:
    """Median, p20 and p80 of a list of times (ms), as the result files name them."""
    import statistics

    q = statistics.quantiles(times_ms, n=5)
    return {"median_ms": statistics.median(times_ms), "p20_ms": q[0], "p80_ms": q[3]}


def write_result(name: str, data: dict[str, Any], echo: bool = True) -> Path:
    """benchmarks/results/NAME.json, and a copy under $OUT when the device tool runs us; printed too
    unless `echo` is False."""
    data = {"benchmark": name, **stamp(), **data}
    text = json.dumps(data, indent=2, default=str)
    path = ROOT / "benchmarks" / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(text)
    if echo:
        print(text)
    return path
