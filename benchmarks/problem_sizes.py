"""Eager PyTorch time of every built-in level1/level2 problem at full size (the sizing rule asks
for 0.5-15 ms on an H100, so launch overhead does not decide results)."""

from __future__ import annotations

import statistics

from _common import parser, write_result


def main() -> None:
    parser(__doc__).parse_args()
    import torch

    from cuforge.problems.suites import BUILTIN_DIR
    from cuforge.sandbox.protocol.precision import set_strict_precision
    from cuforge.sandbox.protocol.loading import module_from_source
    from cuforge.sandbox.judge.timing import L2Flusher, Event, synchronize

    set_strict_precision()
    dev = torch.device("cuda")
    flush = L2Flusher(dev)
    rows = {}
    for path in sorted(BUILTIN_DIR.glob("level*/*.py")):
        mod = module_from_source(path.read_text(), f"size_{path.parent.name}_{path.stem}")
        torch.manual_seed(0)
        with torch.device(dev):
            inputs = [x.to(dev) for x in mod.get_inputs()]
            model = mod.Model(*mod.get_init_inputs()).to(dev)
        times = []
        with torch.no_grad():
            model(*inputs)
            for _ in range(10):
                flush()
                s, e = Event(enable_timing=True), Event(enable_timing=True)
                s.record()
                model(*inputs)
                e.record()
                synchronize()
                times.append(s.elapsed_time(e))
        ms = statistics.median(times)
        rows[f"{path.parent.name}/{path.stem}"] = {"eager_ms": ms, "in_range": 0.5 <= ms <= 15}
        del inputs, model
        torch.cuda.empty_cache()
    write_result("problem_sizes", {"problems": rows, "all_in_range": all(r["in_range"] for r in rows.values())})


if __name__ == "__main__":
    main()
