"""How much of a tensor the GPU's L2 still holds when it is read again (issue #23). The whole-GPU norms
(`batch_norm_team`, `layer_norm_team`) keep what they can of a channel or row on chip and must read the
rest twice; the second read is cheap only if L2 still holds it. This measures that directly, with torch's
own kernels: for each size S, L2 is flushed (a 1 GiB write), S MiB are read (`sum`, cold), read again at
once (warm), and once more after S MiB of another tensor have been written (after_write: the output that
a norm writes between its two reads). A read served from L2 runs well above the cold read's speed.

    python benchmarks/l2_retention.py --name l2_retention

Results: benchmarks/results/NAME.json (and $OUT/NAME.json): per size, the median time (p20, p80) and GB/s
of each read over --reps repetitions, warm / after_write speed over the cold read's, and the share of the
tensor each reread found in L2: the time it saved over the cold read, over the time DRAM takes to deliver
the tensor (at the marginal rate of the two largest cold reads, which no L2 holds; a fixed cost per read,
the kernel's launch and tail, cancels in both differences).
"""

from __future__ import annotations

import argparse

from _common import spread, write_result

MIB = 1 << 20


def timed_reads(size_mib: int, reps: int) -> dict[str, dict[str, float]]:
    """Median, p20 and p80 (ms) of the cold, warm and after-write reads of a size_mib MiB tensor."""
    import torch

    flush = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB: more than any L2
    buf = torch.randn(size_mib * MIB // 4, device="cuda")
    other = torch.empty_like(buf)
    names = ("cold", "warm", "after_write")
    times: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(reps + 2):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
        flush.zero_()  # the GPU is busy with this while the host queues the rest, so no launch gap is timed
        ev[0].record()
        buf.sum()
        ev[1].record()
        buf.sum()
        ev[2].record()
        other.fill_(1.0)
        ev[3].record()
        buf.sum()
        ev[4].record()
        ev[4].synchronize()
        for k, (a, b) in zip(names, ((0, 1), (1, 2), (3, 4))):
            times[k].append(ev[a].elapsed_time(ev[b]))
    out = {}
    for k, t in times.items():
        s = spread(t[2:])  # the first two: warm-up
        out[k] = {**s, "gbs": size_mib * MIB / (s["median_ms"] * 1e-3) / 1e9}
    del flush, buf, other
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,12,16,20,24,28,32,40,48,64,96,160", help="comma list of sizes in MiB")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--name", default="l2_retention")
    a = ap.parse_args()
    import torch

    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        r = timed_reads(size, a.reps)
        row = {"mib": size, **r, "warm_speedup": r["cold"]["median_ms"] / r["warm"]["median_ms"],
               "after_write_speedup": r["cold"]["median_ms"] / r["after_write"]["median_ms"]}
        rows.append(row)
        print(f"{size:4d} MiB  cold {r['cold']['gbs']:6.0f} GB/s  warm {r['warm']['gbs']:6.0f} ({row['warm_speedup']:.2f}x)"
              f"  after {size} MiB written {r['after_write']['gbs']:6.0f} ({row['after_write_speedup']:.2f}x)", flush=True)
    big, bigger = sorted(rows, key=lambda r: r["mib"])[-2:]
    dram_gbs = (bigger["mib"] - big["mib"]) * MIB / ((bigger["cold"]["median_ms"] - big["cold"]["median_ms"]) * 1e-3) / 1e9
    print(f"DRAM read rate (marginal, {big['mib']} -> {bigger['mib']} MiB cold): {dram_gbs:.0f} GB/s")
    for r in rows:
        dram_ms = r["mib"] * MIB / (dram_gbs * 1e9) * 1e3
        r["warm_from_l2"] = (r["cold"]["median_ms"] - r["warm"]["median_ms"]) / dram_ms
        r["after_write_from_l2"] = (r["cold"]["median_ms"] - r["after_write"]["median_ms"]) / dram_ms
        print(f"{r['mib']:4d} MiB  found in L2: reread at once {r['warm_from_l2']:.2f}, after as much written {r['after_write_from_l2']:.2f}")
    props = torch.cuda.get_device_properties(0)
    write_result(a.name, {"l2_bytes": props.L2_cache_size, "reps": a.reps, "dram_read_gbs": dram_gbs, "rows": rows})


if __name__ == "__main__":
    main()
