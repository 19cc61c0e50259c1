"""A partition's kernels part by part, on the GPU: each kernel part of a file's offline partition
(kernels/partition.py) run on the values PyTorch makes for it, beside PyTorch running the same part, so
a wrong kernel is found by its part and each part's speed is a ratio of its own.

Per part: the kernel's and PyTorch's relative error norm against the same part in float64 (fed
float64 values), and each one's median time (triton's do_bench: L2 flushed). Per file: the whole
forward of eager PyTorch, of the partition with every kernel (the search's first seed), and of the
partition with each part run by whichever of the two was faster here ("faster parts"; the TORCH knob
of the others), each checked against the float64 forward. The kernels are cuforge's own templates, run
here outside the sandbox: this is a probe of the template library, not an evaluation of candidates.

    python benchmarks/partition_parts.py ../shared/kernelbench/level3/24_EfficientNetB2.py --name NAME
    python benchmarks/partition_parts.py --table NAME    # the record as docs/benchmarks.md's tables
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from pathlib import Path
from typing import Any

from _common import ROOT, write_result


def rel_err(got: Any, want: Any) -> float | None:
    """||got - want|| / ||want|| in float64; None where the shapes differ."""
    if got.shape != want.shape:
        return None
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def timed(fn: Any) -> float:
    """Median milliseconds of fn() (L2 flushed before each call)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=1, rep=6, return_mode="median"))


def candidate_module(source: str, model: type, name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__["__cuforge_problem__"] = types.SimpleNamespace(Model=model)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


def gather(results: list[Any], feed: list | None, inputs: list[Any]) -> list[Any]:
    if feed is None:
        return list(inputs)
    return [inputs[f[1]] if f[0] == "in" else results[f[1]] if len(f) == 2 else results[f[1]][f[2]] for f in feed]


def copies(xs: list[Any]) -> list[Any]:
    return [x.clone() if hasattr(x, "clone") else x for x in xs]


def as_double(x: Any) -> Any:
    import torch

    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def loaded(path: Path, precision: str) -> dict | types.SimpleNamespace:
    """A file as the probes take it, on the GPU: its problem, the partition's first seed and its module
    source, the file's namespace, init and inputs (seed 1), and eager under seed 0; or the row of a
    file that did not load. Flags as the contract says (fp32: TF32 off everywhere)."""
    import torch

    from cuforge.kernels.families import PARTITION
    from cuforge.problems.loader import load_files

    torch.backends.cudnn.allow_tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = False
    problems, skipped = load_files([path], timeout_s=600)
    if skipped:
        return {"file": path.name, "outcome": "not loaded", "why": skipped[0].reason.splitlines()[0]}
    problem = problems[0]
    seed = PARTITION.seeds(problem)[0]
    ns: dict = {"__name__": "problem"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    init = ns["get_init_inputs"]()
    torch.manual_seed(0)
    eager = ns["Model"](*init).cuda()
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    return types.SimpleNamespace(problem=problem, seed=seed, source=PARTITION.render(seed, problem).source,
                                 Model=ns["Model"], init=init, inputs=inputs, eager=eager)


def probe(path: Path, precision: str) -> dict:
    import torch

    from cuforge.kernels.families import PARTITION
    from cuforge.kernels.partition import TORCH_KNOB

    f = loaded(path, precision)
    if isinstance(f, dict):
        return f
    problem, seed, kernels_src, init, inputs, eager = f.problem, f.seed, f.source, f.init, f.inputs, f.eager
    parts = PARTITION.matched(problem)
    k_mod = candidate_module(kernels_src, f.Model, "kernels")
    t_mod = candidate_module(PARTITION.in_pytorch(problem), f.Model, "pytorch")
    torch.manual_seed(0)
    holder = t_mod.ModelNew(*init).cuda()
    inputs64 = [as_double(x) for x in inputs]
    params = t_mod._model_params(holder)
    params64 = t_mod._Params([(n, as_double(t.detach().clone())) for n, t in params])

    rows, results, results64 = [], [], []
    with torch.no_grad():
        for i, (stage, feed) in enumerate(zip(t_mod._STAGES, t_mod._FEEDS)):
            # Fresh copies for every call: a PyTorch part's in-place op (a residual add_) writes its input.
            xs, xs64 = gather(results, feed, inputs), gather(results64, feed, inputs64)
            out, out64 = stage(copies(xs), params), stage(copies(xs64), params64)
            results.append(out)
            results64.append(out64)
            part = parts[i] if i < len(parts) else None
            if part is None or part.family is None:
                continue
            kernel = k_mod._STAGES[i]
            got = kernel(copies(xs), params)
            got = got[0] if isinstance(got, (tuple, list)) else got
            row = {"part": i, "family": part.family.name, "ops": sorted({n.op for n in part.nodes})[:6],
                   "shape": list(out[0].shape), "err_kernel": rel_err(got, out64[0]), "err_torch": rel_err(out[0], out64[0]),
                   "ms_kernel": timed(lambda: kernel(xs, params)), "ms_torch": timed(lambda: stage(xs, params))}
            rows.append(row)
            print(f"  part {i} {row['family']} {row['ops']} {row['shape']}: err {row['err_kernel']:.2e} "
                  f"(torch {row['err_torch']:.2e}), {row['ms_kernel']:.3f} ms vs torch {row['ms_torch']:.3f} ms", flush=True)
        want64 = results64[-1]
        want64 = want64[0] if isinstance(want64, (tuple, list)) else want64
        slower = {f"p{r['part']}.{TORCH_KNOB}": 1 for r in rows if r["ms_kernel"] >= r["ms_torch"]}
        faster_src = PARTITION.render({**seed, **slower}, problem).source if len(slower) < len(rows) else None
        whole = {"eager": eager, "kernels": None, "faster_parts": None}
        torch.manual_seed(0)
        whole["kernels"] = candidate_module(kernels_src, f.Model, "kernels_whole").ModelNew(*init).cuda()
        if faster_src is not None:
            torch.manual_seed(0)
            whole["faster_parts"] = candidate_module(faster_src, f.Model, "faster").ModelNew(*init).cuda()
        forward = {}
        for name, model in whole.items():
            if model is None:
                continue
            out = model(*inputs)
            out = out[0] if isinstance(out, (tuple, list)) else out
            forward[name] = {"ms": timed(lambda m=model: m(*inputs)), "err": rel_err(out, want64)}
    kernel_ms = sum(r["ms_kernel"] for r in rows)
    torch_ms = sum(r["ms_torch"] for r in rows)
    return {"file": path.name, "outcome": "probed", "parts": len(parts), "kernel_parts": len(rows),
            "parts_slower_than_torch": len(slower), "sum_ms_kernel_parts": kernel_ms, "sum_ms_same_parts_torch": torch_ms,
            "sum_ms_faster_of_each": sum(min(r["ms_kernel"], r["ms_torch"]) for r in rows),
            "worst_part": max(rows, key=lambda r: r["err_kernel"] if r["err_kernel"] is not None else float("inf"), default=None),
            "forward": forward, "rows": rows}


def table(name: str) -> None:
    """A record as markdown: each file's whole forward three ways, then each family's parts."""
    import json

    record = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    files = [f for f in record["files"] if f.get("outcome") == "probed"]

    def ms(f: dict, key: str) -> str:
        got = f["forward"].get(key)
        return "-" if got is None else f"{got['ms']:.2f}"

    print("| file | kernel parts | parts faster than PyTorch's | eager ms | every kernel ms | faster parts ms | "
          "eager's error norm |")
    print("|---|---|---|---|---|---|---|")
    for f in files:
        faster = f["kernel_parts"] - f["parts_slower_than_torch"]
        print(f"| {f['file']} | {f['kernel_parts']} | {faster} | {ms(f, 'eager')} | {ms(f, 'kernels')} | "
              f"{ms(f, 'faster_parts')} | {f['forward']['eager']['err']:.2g} |")
    by_family: dict[str, list[dict]] = {}
    for f in files:
        for r in f["rows"]:
            by_family.setdefault(r["family"], []).append(r)
    print("\n| family | parts | faster than PyTorch's | sum of kernel ms | sum of PyTorch ms |")
    print("|---|---|---|---|---|")
    for fam, rows in sorted(by_family.items(), key=lambda kv: -len(kv[1])):
        print(f"| {fam} | {len(rows)} | {sum(r['ms_kernel'] < r['ms_torch'] for r in rows)} | "
              f"{sum(r['ms_kernel'] for r in rows):.2f} | {sum(r['ms_torch'] for r in rows):.2f} |")
    print(f"\n{record.get('gpu', 'unknown GPU')}, torch {record.get('torch', '?')}, contract {record['precision']}; "
          "'faster parts': each kernel part run by whichever of the kernel and PyTorch was faster alone.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--table", metavar="NAME", help="print record NAME as markdown tables (no GPU)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "pytorch"),
                    help="fp32: TF32 off everywhere (PyTorch's parts and eager); pytorch: cuDNN's TF32 on")
    ap.add_argument("--name", default="partition_parts")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    if not a.files:
        ap.error("name the problem files to probe (or --table NAME)")
    out = []
    for path in a.files:
        t0 = time.monotonic()
        print(f"{path.name}:", flush=True)
        try:
            row = probe(path, a.precision)
        except Exception as e:  # noqa: BLE001 - one file's failure is its row, and the others still run
            row = {"file": path.name, "outcome": "error", "why": f"{type(e).__name__}: {str(e)[:500]}"}
        row["probe_s"] = round(time.monotonic() - t0, 1)
        fw = row.get("forward", {})
        print(f"  {path.name}: {row['outcome']} {row.get('why', '')} forward {fw}", flush=True)
        out.append(row)
        write_result(a.name, {"precision": a.precision, "files": out}, echo=False)
    errs = [r["worst_part"]["err_kernel"] for r in out if r.get("worst_part")]
    print(f"{len(out)} files; median worst part error {statistics.median(errs) if errs else None}", flush=True)


if __name__ == "__main__":
    main()
