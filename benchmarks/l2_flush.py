"""What the judge's L2 flush costs the launch it precedes: the same memory-bound launches timed by the
judge's event timer (spin, start event, launch, end event) after a flush that writes a buffer of twice
the L2 (dirty lines left behind, written back while the timed launch evicts them) and after one that
reads it (clean lines, dropped for free), the two interleaved in one process. The launches are eager
PyTorch's: the models suite's decode GEMV (1 x 4096 through an 11008 x 4096 weight) in bf16 and fp32,
a read of as many bytes as the bf16 weight (a sum), a copy of as many, and a 1 GiB copy, whose fixed
cost is negligible and whose rate is the bandwidth the others are compared with.

    python benchmarks/l2_flush.py --name l2_flush

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per launch and flush, the median time
(p20, p80) and GB/s; write-flush time over read-flush time.
"""

from __future__ import annotations

from _common import parser, spread, write_result

GEMV_N, GEMV_K = 11008, 4096


def launches() -> dict[str, tuple[object, int]]:
    """Each launch, as a callable of the input-set index, and the bytes it must move."""
    import torch
    import torch.nn.functional as F

    out: dict[str, tuple[object, int]] = {}
    for name, dtype in (("gemv_bf16", torch.bfloat16), ("gemv_fp32", torch.float32)):
        x = torch.randn(1, GEMV_K, device="cuda", dtype=dtype)
        w = torch.randn(GEMV_N, GEMV_K, device="cuda", dtype=dtype)
        out[name] = ((lambda k, x=x, w=w: F.linear(x, w)), w.numel() * w.element_size())
    nbytes = GEMV_N * GEMV_K * 2
    src = torch.randn(nbytes // 4, device="cuda")
    out["read_90MB"] = ((lambda k, s=src: torch.sum(s)), nbytes)
    half = torch.randn(nbytes // 8, device="cuda")
    dst = torch.empty_like(half)
    out["copy_90MB"] = ((lambda k, s=half, d=dst: d.copy_(s)), nbytes)
    big = torch.randn((1 << 30) // 8, device="cuda")
    big_dst = torch.empty_like(big)
    out["copy_1GiB"] = ((lambda k, s=big, d=big_dst: d.copy_(s)), 1 << 30)
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--name", default="l2_flush")
    ap.add_argument("--rounds", type=int, default=10, help="interleaving rounds")
    ap.add_argument("--batch", type=int, default=10, help="samples per launch and flush in each round")
    a = ap.parse_args()
    import torch

    from cuforge.sandbox.judge.timing import EventTimer, L2Flusher

    read = L2Flusher(torch.device("cuda"))
    dirty = torch.zeros_like(read.buffer)
    flushes = {"write": dirty.zero_, "read": read}
    runs = launches()
    timers = {(op, f): EventTimer(fn, 1, flush) for op, (fn, _) in runs.items() for f, flush in flushes.items()}
    for t in timers.values():
        t.samples(3)  # warm-up: cuBLAS's handles, the spin's fit
    times: dict[tuple[str, str], list[float]] = {k: [] for k in timers}
    for _ in range(a.rounds):
        for key, t in timers.items():
            times[key] += t.samples(a.batch)
    rows = []
    for op, (_, nbytes) in runs.items():
        row: dict[str, object] = {"launch": op, "bytes": nbytes}
        for f in flushes:
            s = spread(times[(op, f)])
            row[f] = {**s, "gbs": nbytes / (s["median_ms"] * 1e-3) / 1e9}
        row["write_over_read"] = row["write"]["median_ms"] / row["read"]["median_ms"]  # type: ignore[index]
        rows.append(row)
        print(row, flush=True)
    write_result(a.name, {"l2_bytes": read.nbytes // 2, "rows": rows})


if __name__ == "__main__":
    main()
