"""How long a candidate host's GPU start takes, where it goes, and whether starts overlap: N spares
of the split judge's pool (CPU part done) are told to start at once; the wall time until all N have
said hello, and each host's own account of its steps. Writes benchmarks/results/host_start.json.

    python benchmarks/host_start.py --counts 1 2 4 8 --rounds 3
"""

from __future__ import annotations

import argparse
import select
import statistics
import time

from _common import write_result


def start_together(n: int, settle_s: float) -> dict:
    import torch

    from cuforge.sandbox.judge.hosts import HostPool

    pool = HostPool("cuda", spares=n)  # its first batch starts at once: the zygote is then warm
    for c in [pool.take() for _ in range(n)]:
        c.kill()
    for _ in range(n):
        pool._order()  # the CPU part of their start, and no GPU part yet
    time.sleep(settle_s)
    free_before = torch.cuda.mem_get_info()[0]
    t = time.perf_counter()
    for ordered in pool.ready:
        pool._start(ordered)
    pending = {o.chan.sock for o in pool.ready}
    done_at = []
    while pending:
        ready = select.select(list(pending), [], [], 60.0)[0]
        if not ready:
            break
        for sock in ready:
            pending.discard(sock)
            done_at.append(time.perf_counter() - t)
    held = free_before - torch.cuda.mem_get_info()[0]
    clients = [pool.take() for _ in range(n)]
    steps = [c.start_s for c in clients]
    for c in clients:
        c.kill()
    pool.close()
    names = list(steps[0]) if steps else []
    return {"n": n, "wall_s": round(max(done_at), 4), "first_s": round(min(done_at), 4),
            "per_host_s": round(max(done_at) / n, 4), "device_bytes_per_host": held // n,
            "steps_median_s": {k: round(statistics.median(s.get(k, 0.0) for s in steps), 4) for k in names}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=2.0)
    a = ap.parse_args()
    import torch

    torch.zeros(1, device="cuda")  # the judge's own context exists, as in a worker
    rows = []
    for _ in range(a.rounds):
        for n in a.counts:
            rows.append(start_together(n, a.settle))
            print(rows[-1], flush=True)
    summary = {n: {"wall_s_median": statistics.median(r["wall_s"] for r in rows if r["n"] == n),
                   "per_host_s_median": statistics.median(r["per_host_s"] for r in rows if r["n"] == n)}
               for n in a.counts}
    write_result("host_start", {"rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
