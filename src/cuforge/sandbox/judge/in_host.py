"""The host runner: the candidate runs in a candidate host, a separate confined process
(`host/host.py`) that only receives inputs and returns outputs; `core.evaluate` runs the steps. The
judge draws the inputs (from seeds the candidate never sees), runs the reference and the baselines,
compares, times and decides here: nothing the host says or writes sets a verdict, a timing or a
status; it can only fail its own candidate.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

import torch

from cuforge.sandbox.judge import brackets, context, core, hosts, steps, timing, verify
from cuforge.sandbox.judge.context import Context as CoreContext, References
from cuforge.sandbox.judge.output_judge import Judge, Trials
from cuforge.sandbox.judge.profile import build_profile, ceilings_for
from cuforge.sandbox.protocol import tensors
from cuforge.sandbox.protocol.evaluation import Diagnostic, EvalConfig, Evaluation, cheat
from cuforge.sandbox.protocol.stop import Stop, is_sticky

_POOLS: dict[str, hosts.HostPool] = {}


def host_pool(device: str) -> hosts.HostPool:
    """The worker's zygote and spare host for `device` ("none": compile-only, no CUDA)."""
    pool = _POOLS.get(device)
    if pool is None:
        pool = _POOLS[device] = hosts.HostPool(device)
    return pool


def helper_processes() -> set[int]:
    """The pools' zygotes still running: the worker's own children, each serving every evaluation."""
    return {pool.zygote.pid for pool in _POOLS.values() if pool.zygote.poll() is None}


@dataclass
class Context(context.Context):
    host: hosts.HostClient | None = None
    export: Any = None  # the memory pool inputs are drawn into: the only judge memory a host can map
    input_bytes: int = 0  # the largest input set drawn


class HostRunner:
    """The candidate in a host taken from the worker's pool. The worker itself never runs candidate code,
    so only a fault of its own (no host to start, its CUDA context broken) replaces it."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.pool: hosts.HostPool | None = None

    def context(self, ctx: CoreContext) -> Context:
        return Context(**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__})

    def start(self, ctx: CoreContext) -> None:
        assert isinstance(ctx, Context)
        config, phase = ctx.config, ctx.phase
        self.pool = host_pool("none" if config.compile_only else config.device)
        with phase("host"):
            ctx.host = self.pool.take()
        ctx.host.deadline = time.monotonic() + max(config.timeout_s * 0.85 - (time.perf_counter() - self.t0), 1.0)
        ctx.correctness["candidate_process"] = ctx.host.confinement
        if ctx.device.type == "cuda" and not config.compile_only:
            with phase("quiet"):  # no other host's start or exit may share the GPU with the calibration
                self.pool.wait_quiet()
            with phase("calibrate"):  # before the candidate is loaded, nothing of it can lengthen this
                ctx.correctness["bracket_overhead_ms"] = brackets.calibrate(ctx.host)
            ctx.export = _export_pool()

    def load(self, ctx: CoreContext) -> tuple[str, str, list[Diagnostic]]:
        assert isinstance(ctx, Context) and ctx.host is not None
        scale = ctx.problem["meta"].get("small") if ctx.config.device == "cpu" else None  # the sizes the judge loaded
        status, message, diags = ctx.host.load(ctx.problem, ctx.candidate, scale, ctx.correctness["init_seed"],
                                               ctx.config.precision)
        if ctx.host.prebuilt_used:
            ctx.correctness["prebuilt_extensions"] = ctx.host.prebuilt_used
        return status, message, [Diagnostic(**d) for d in diags if isinstance(d, dict)][:50] if diags else []

    def references(self, ctx: CoreContext) -> References:
        assert isinstance(ctx, Context)
        return build_models(ctx)

    def check_correctness(self, ctx: CoreContext, models: References) -> None:
        assert isinstance(ctx, Context)
        check_correctness(ctx, models)

    def time_contenders(self, ctx: CoreContext, models: References) -> None:
        assert isinstance(ctx, Context)
        time_contenders(ctx, models)

    def check_rules(self) -> None:
        pass  # the candidate's process is not this one: nothing of the judge's can be patched

    def failure(self, e: Exception) -> tuple[str, str] | None:
        if isinstance(e, hosts.HostStartError):
            return "crash", f"no candidate process: {e}"
        if is_sticky(e):
            return "runtime_error", f"the judge's CUDA context failed: {str(e).splitlines()[0]}"
        return None

    def finish(self, ctx: CoreContext) -> bool:
        assert isinstance(ctx, Context)
        restart = False
        if ctx.host is not None:
            ctx.host.kill()
        _keep_export_pool(ctx)
        if self.pool is not None:
            try:
                peak = int(torch.cuda.max_memory_allocated(ctx.device)) if ctx.device.type == "cuda" else 0
                self.pool.replenish(peak + max(int(ctx.correctness.get("host_peak_bytes", 0)), 0))  # the host's word: sizing only
            except hosts.HostStartError:  # the zygote is gone: this result stands; a new worker brings a new one
                restart = True
            if ctx.device.type == "cuda":
                with ctx.phase("host_exit"):
                    self.pool.wait_exited()
        if ctx.host is not None:
            if ctx.host.busy_discarded:
                ctx.correctness["busy_readings_discarded"] = ctx.host.busy_discarded
            # how much of it was the judge waiting on the candidate's process
            ctx.correctness["judge_phases_s"].update({f"waiting.{op}": round(s, 4) for op, s in ctx.host.waited.items()})
        return restart


def evaluate_request(problem: dict[str, Any], candidate: dict[str, Any], config: EvalConfig,
                     device_info: dict[str, Any]) -> tuple[Evaluation, bool]:
    """One evaluation with the candidate in a candidate host: (evaluation, whether to replace the worker)."""
    return core.evaluate(problem, candidate, config, device_info, HostRunner())


def draw_inputs(ctx: Context, seed: int, gaussian: bool) -> list[Any]:
    """Inputs the host may see: on a GPU from the export pool, whose segments hold nothing else."""
    if ctx.export is None:
        return tensors.make_inputs(ctx.module, seed, ctx.device, gaussian=gaussian)
    with torch.cuda.use_mem_pool(ctx.export):
        inputs = tensors.make_inputs(ctx.module, seed, ctx.device, gaussian=gaussian)
    ctx.input_bytes = max(ctx.input_bytes, sum(x.nbytes for x in inputs if isinstance(x, torch.Tensor)))
    return inputs


# The export pool is kept from one evaluation to the next (a new one costs ~18 ms on an H100) while
# the inputs it held were small; after big ones it goes, so that its cached memory returns to the device.
# It only ever holds inputs, which every host is shown anyway.
EXPORT_POOL_KEEP_BYTES = 256 * 2**20
_EXPORT: list[Any] = []


def _export_pool() -> Any:
    return _EXPORT.pop() if _EXPORT else torch.cuda.MemPool()


def _keep_export_pool(ctx: Context) -> None:
    if ctx.export is not None and ctx.input_bytes <= EXPORT_POOL_KEEP_BYTES:
        _EXPORT.append(ctx.export)
    ctx.export = None


def build_models(ctx: Context) -> References:
    with tensors.on_device(ctx.device):
        init = list(ctx.module.get_init_inputs())
        torch.manual_seed(ctx.correctness["init_seed"])
        # The reference stays in the mode a new Model is in (training, unless its __init__ says
        # otherwise), as KernelBench runs it and as the candidate's ModelNew is: a BatchNorm of an eval()
        # reference would normalise by running statistics while the candidate's uses the batch's.
        reference = ctx.module.Model(*init).to(ctx.device)
    return References(reference, verify.float64_model(reference))


# ---------------------------------------------------------------------------------- correctness

def check_correctness(ctx: Context, models: References) -> None:
    """Trials on fresh inputs. The reference runs first, on inputs the host cannot yet have touched;
    the host's memory and the judge's are apart, so no result of the judge's can reach the candidate."""
    assert ctx.host is not None
    record = Trials()
    out_bytes = sum(t["nbytes"] for t in steps.output_specs(ctx))
    for trial in range(ctx.config.trials):
        inputs = draw_inputs(ctx, ctx.seed + 1000 * (trial + 1), gaussian=trial % 2 == 1)
        seed = ctx.seed + 17 * trial
        remembered = [verify.Remembered(x, seed) for x in inputs]
        snapshots = [r.value for r in remembered]
        # Candidate and reference draw their random numbers (Dropout in training mode) from one
        # reseed, unrelated to the input seeds, as PyTorch's own implementation of the problem would.
        rng_seed = secrets.randbits(31)
        refs, native, ref_kind = verify.reference_outputs(models.reference64, models.reference, snapshots, rng_seed)
        if ctx.device.type == "cuda":
            timing.synchronize(ctx.device)
        outs, findings = ctx.host.forward(inputs, rng_seed, monitor=trial == 0, out_bytes=out_bytes)
        if trial == 0:
            ctx.correctness.update({k: v for k, v in findings.items() if k != "no_own_kernel"})
        for i, r in enumerate(remembered):
            if not r.unchanged():
                raise Stop(cheat("input_mutation"), f"input {i} was modified by the candidate")
        tensors.check_outputs(ctx.device, outs)
        returned = [verify.Remembered(o, seed + 1) for o in outs]
        if len(outs) != len(refs):
            raise Stop("wrong_output", f"returned {len(outs)} outputs, expected {len(refs)}")
        record.compare(ctx, models, snapshots, ref_kind, outs, refs, native, trial,
                       handed_back=lambda o, inputs=inputs: _same_memory(o, inputs))
        if not all(r.unchanged() for r in returned):
            raise Stop(cheat("aliasing"), "the candidate's output changed after it returned (it does not own its memory)")
        if trial == 0 and "no_own_kernel" in findings:
            raise Stop(cheat("library_call"), "no kernel of its own: under policy 'mixed' (KernelBench's rule) PyTorch "
                       "and library calls may compute beside the candidate's own kernels, not instead of them "
                       f"(kernels seen: {findings['no_own_kernel']})")
        record.passed(ctx, outs, refs, ref_kind, trial)
        del outs, native, refs, returned
        if trial == 0 and ctx.device.type == "cuda":
            ctx.correctness["eager_footprint_bytes"] = steps.eager_footprint(ctx, models.reference, snapshots)
        del inputs, remembered, snapshots  # before the next trial's are drawn: one set alive at a time
    ctx.correctness["trials"] = ctx.config.trials


def _same_memory(out: Any, inputs: list[Any]) -> bool:
    """A wrong output equal in bits to an input: the input handed back, not computed."""
    return any(isinstance(x, torch.Tensor) and x.shape == out.shape and x.dtype == out.dtype and tensors.same_bits(x, out)
               for x in inputs)


def timing_sets(ctx: Context, count: int, first: int = 0) -> list[list[Any]]:
    return [draw_inputs(ctx, ctx.seed + 7 + 31 * k, gaussian=False) for k in range(first, count)]


TIMING_REFERENCE64_BYTES = 2 * 2**30


def rotation_sets(per_set: int, l2_bytes: int, cap_bytes: int = 4 * 2**30) -> int:
    """Input sets rotated through so that each call finds its data out of the L2, with no flush the
    candidate's process could skip: together they move over twice the L2; one set where a set alone
    is far larger than it."""
    if per_set >= 4 * l2_bytes:
        return 1
    return max(1, min(timing.sets_for_graph(per_set, l2_bytes), cap_bytes // max(per_set, 1)))


def time_contenders(ctx: Context, models: References) -> None:
    """The candidate in its host and the baselines here, interleaved, each timed by the judge's own
    clock: events around a batch of calls on rotating input sets (see brackets.Bracket)."""
    assert ctx.host is not None
    cfg = ctx.config
    tcfg = timing.TimingConfig(min_samples=cfg.min_samples, max_samples=cfg.max_samples,
                               target_rse=cfg.target_rse, max_seconds=cfg.max_timing_s)
    out_bytes = sum(t["nbytes"] for t in steps.output_specs(ctx))
    host = ctx.host
    assert host is not None  # taken before correctness; timing never runs without one
    timers: dict[str, Any]
    if ctx.device.type != "cuda":
        sets = timing_sets(ctx, 2)
        check = _batch_check(ctx, models, sets, {k: _reference_of(models, sets[k]) for k in range(2)})
        _send_sets(ctx, sets)
        timers = {"candidate": brackets.RemoteWallTimer(host, len(sets), check)}
        timers.update({name: timing.WallTimer(fn, 2) for name, fn in steps.baseline_callables(ctx, models.reference, sets, None).items()})
        ctx.timings = timing.measure_interleaved(timers, tcfg)
        return
    phase = ctx.phase or core.Phases({})
    with phase("timing.inputs"):
        l2 = getattr(torch.cuda.get_device_properties(ctx.device), "L2_cache_size", 50 * 2**20) or 50 * 2**20
        sets = timing_sets(ctx, 1)
        per_set = sum(x.nbytes for x in sets[0] if isinstance(x, torch.Tensor)) + out_bytes
        n_sets = rotation_sets(per_set, l2)
        sets += timing_sets(ctx, n_sets, first=1)
        ctx.correctness["timing_input_sets"] = n_sets
        # References of the sets every batch ends on, before the host can touch those inputs; for
        # outputs of gigabytes, the native model's (a float64 copy would be kept through all of timing).
        checked = {0: _reference_of(models if 2 * out_bytes <= TIMING_REFERENCE64_BYTES else References(models.reference, None),
                                    sets[0])}
        _send_sets(ctx, sets)
    check = _batch_check(ctx, models, sets, checked)
    overhead = float(ctx.correctness.get("bracket_overhead_ms", 0.0))
    def remote(k: int, first_checked: int = 3) -> brackets.RemoteBracketTimer:
        return brackets.RemoteBracketTimer(host, n_sets, k, overhead, check, first_checked)

    with phase("timing.batch_size"):
        # Sizing and escape batches: each timer's first batch checked (the timed one's first three).
        k, per_call = brackets.calls_per_batch(lambda k: remote(k, 1), overhead)
    with phase("timing.escape"):
        # A few long batches first: work left running past 'done' outlasts a time slice there and shows.
        # No other host is starting or exiting here (spares start after an evaluation's timing, and the
        # judge waited for them and for killed hosts before calibrating), so every busy reading counts.
        remote(max(k, min(math.ceil(brackets.ESCAPE_BATCH_MS / max(per_call, 1e-4)), 64 * k)), 1).samples(3)
    with phase("timing.graph"):
        graph = _candidate_graph(ctx, remote, k, n_sets)
    timers = {"candidate": remote(k)}
    with phase("timing.baselines"):
        flush = timing.L2Flusher(ctx.device)
        for name, fn in steps.baseline_callables(ctx, models.reference, sets, flush).items():
            k, _ = brackets.calls_per_batch(lambda k, fn=fn: brackets.LocalBracketTimer(fn, n_sets, k), 0.0)
            timers[name] = brackets.LocalBracketTimer(fn, n_sets, k, graph=graph)
        del flush
    with phase("timing.recalibrate"):
        # The fixed cost again, just before the measurement, with the GPU's clocks where timing has
        # taken them: the first one (taken on a host with nothing loaded, possibly on an idle GPU or
        # beside a killed host's exit) can read high, and a fixed cost taken off too large makes the
        # candidate look faster (seen: an honest ReLU 7% under the roofline floor). The smaller one
        # counts: a loaded candidate can only lengthen this one, which the minimum ignores.
        again = brackets.calibrate(ctx.host)
        ctx.correctness["bracket_overhead_ms_before_measure"] = again
        timers["candidate"].overhead_ms = min(overhead, again)
    with phase("timing.measure"):
        ctx.timings = timing.measure_interleaved(timers, tcfg)
    ctx.correctness["calls_per_batch"] = {name: t.k for name, t in timers.items()}
    steps.check_roofline(ctx)
    if cfg.profile:
        ceilings = ceilings_for(ctx.device)
        meta = ctx.problem["meta"]
        ctx.profile = build_profile(ctx.timings["candidate"].median_ms, meta.get("flops"), meta.get("bytes"),
                                    meta.get("dtype"), ceilings, kernels=ctx.host.kernel_resources)


def _candidate_graph(ctx: Context, remote: Any, k: int, n_sets: int) -> bool:
    """Ask the host to capture its batch in one CUDA graph, and check a replayed batch: a kernel on the
    legacy default stream (load_inline's <<<>>>, as KernelBench's examples launch) is not captured,
    and an output the graph itself fills (zeros_like) then comes back wrong. Such a candidate is timed
    call by call, as KernelBench times it, and not accused."""
    assert ctx.host is not None
    start = brackets.first_set(k, n_sets)
    reply, _ = ctx.host.call({"op": "graph", "k": k, "start": start}, what="capturing a batch")
    if reply.get("graph") is not True:
        ctx.correctness["candidate_batch"] = f"call by call ({str(reply.get('why', ''))[:200]})"
        return False
    try:
        remote(k).samples(1)
    except Stop as s:
        if not s.status.startswith("cheat:result_caching"):
            raise
        ctx.host.call({"op": "graph", "k": 0, "start": 0}, what="dropping a batch graph")
        ctx.correctness["candidate_batch"] = f"call by call (a replayed batch was wrong: {s.message[:160]})"
        return False
    ctx.correctness["candidate_batch"] = "one CUDA graph"
    return True


def _send_sets(ctx: Context, sets: list[list[Any]]) -> None:
    """The timing sets to the host (IPC handles on a GPU); back, what its kernels use."""
    assert ctx.host is not None
    from cuforge.sandbox.protocol.wire import describe

    parts: list[bytes] = []
    descs = [[describe(x, parts) for x in s] for s in sets]
    reply, _ = ctx.host.call({"op": "sets", "sets": descs}, parts, what="receiving the timing inputs")
    ctx.host.kernel_resources = _resources(reply.get("resources"))


_RESOURCE_KEYS = {"name": str, "registers": int, "shared_static_bytes": int, "local_bytes": int,
                  "last_dynamic_shared": int, "last_block": list, "last_grid": list, "launches": int}


def _resources(raw: Any) -> list[dict[str, Any]]:
    """The candidate's kernels' resources (registers, shared memory) as its host reports them: prompt
    material, never a verdict; kept only in the expected shape."""
    out = []
    for r in raw if isinstance(raw, list) else []:
        if isinstance(r, dict) and all(isinstance(r.get(k), t) for k, t in _RESOURCE_KEYS.items()):
            out.append({k: (r[k][:120] if t is str else [int(x) for x in r[k][:3] if isinstance(x, int)] if t is list
                            else r[k]) for k, t in _RESOURCE_KEYS.items()})
    return out[:16]


def _reference_of(models: References, inputs: list[Any]) -> tuple[list[Any], list[Any], str]:
    return verify.reference_outputs(models.reference64, models.reference, inputs)


def _batch_check(ctx: Context, models: References, sets: list[list[Any]], checked: dict[int, Any]) -> Any:
    """What the judge does with a batch's last outputs: they must be right for the set the batch
    ended on (a candidate that stops computing once it is being timed is caught here)."""
    stochastic: list[bool] = []

    def check(end: int, outs: list[Any]) -> None:
        refs, native, ref_kind = checked[end]
        judge = Judge(ctx, models, sets[end], ref_kind)
        if len(outs) != len(refs):
            raise Stop(cheat("result_caching"), f"a timed call returned {len(outs)} outputs, not {len(refs)}")
        for i, (o, r, n) in enumerate(zip(outs, refs, native)):
            cmp = judge(i, o, r, n)
            if not cmp.ok:
                if not stochastic:
                    stochastic.append(steps.stochastic(models.reference, sets[end]))
                if stochastic[0]:
                    # Its random draws during timing are not reproducible: correctness was checked
                    # on reseeded trials; the timed outputs cannot be.
                    ctx.correctness["stochastic_reference"] = True
                    return
                raise Stop(cheat("result_caching"), f"output {i} of a timed call on input set {end} is wrong "
                           f"({cmp.reason}): results during timing do not follow the inputs")

    return check
