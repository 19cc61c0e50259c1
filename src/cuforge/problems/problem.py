"""The Problem vocabulary: what a KernelBench-format file declares and what cuforge derives from it.

Everything here is plain data (JSON-friendly), because problem files are user code that is only
ever imported in a subprocess; the parent process sees the results through these dataclasses.
"""

from __future__ import annotations

import math

from dataclasses import replace, asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuforge.op_graph import OpNode

FAMILIES = ("gemm", "conv", "elementwise", "reduction", "norm", "softmax", "scan", "fused")
POLICIES = ("custom", "mixed", "any")
BASELINES = ("torch", "torch.compile", "cublas", "cublaslt")

# Per-dtype correctness defaults: allclose (atol, rtol) plus a bound on the relative Frobenius
# error ||out - ref|| / ||ref|| against a float64 reference. The norm bounds sit a few times above
# what correct code with full-precision accumulation reaches (fp32 ~1e-7, fp16 output rounding
# ~3e-4, bf16 ~1e-3) and below what reduced-precision arithmetic gives (TF32 ~5e-4, fp16
# accumulation >= 1.5e-3 for K >= 64), so both allclose and the norm check must pass.
DEFAULT_TOLERANCES: dict[str, tuple[float, float, float]] = {
    "float64": (1e-8, 1e-8, 1e-10),
    "float32": (1e-4, 1e-4, 1e-5),
    "float16": (1e-2, 1e-2, 1e-3),
    "bfloat16": (1e-2, 1e-2, 8e-3),
}

KNOWN_META_KEYS = {
    "dtype", "atol", "rtol", "rel_norm", "flops", "bytes", "families", "baselines", "policy",
    "small", "description", "precision", "cast", "dtypes",
}

# --dtype / CUFORGE "cast": the dtypes an fp32 problem can be run in, by their short and long names.
CAST_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


def cast_dtype(name: str) -> str:
    """The torch dtype name of a --dtype value; an unknown one is one line naming the valid ones."""
    key = str(name).strip().lower()
    if key not in CAST_DTYPES:
        raise ProblemError(f"unknown dtype {name!r}: use bf16 or fp16 (an fp32 problem runs in it with its inputs and weights cast)")
    return CAST_DTYPES[key]


class ProblemError(ValueError):
    """A problem file or metadata that cannot be used; the message is one line naming the cause."""


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    rel_norm: float

    @staticmethod
    def for_dtype(dtype: str | None) -> Tolerance:
        atol, rtol, rel = DEFAULT_TOLERANCES.get(dtype or "float32", DEFAULT_TOLERANCES["float32"])
        return Tolerance(atol, rtol, rel)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor input or output; or, with `value`, a number passed to forward as it is."""

    shape: tuple[int, ...]
    dtype: str
    value: bool | int | float | None = None
    contiguous: bool = True  # row-major in memory (False: a transposed or expanded view)

    @property
    def is_scalar(self) -> bool:
        return self.value is not None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return 0 if self.is_scalar else self.numel * dtype_size(self.dtype)

    def describe(self) -> str:
        if self.is_scalar:
            return f"{type(self.value).__name__}={self.value!r}"
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


# Full-size inputs the CPU test mode (and `problems validate`'s reference run) accepts from a
# problem that declares no small sizes.
CPU_FULL_SIZE_BYTES = 256 * 2**20


def dtype_size(dtype: str) -> int:
    sizes = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
             "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
    if dtype not in sizes:
        raise ProblemError(f"unsupported dtype {dtype!r}")
    return sizes[dtype]


@dataclass(frozen=True)
class ProblemMeta:
    """cuforge metadata: declared in the file's CUFORGE dict, or derived, or unknown (listed)."""

    dtype: str | None
    tolerance: Tolerance
    flops: float | None
    bytes: float | None
    families: tuple[str, ...]
    baselines: tuple[str, ...]
    policy: str
    small: dict[str, int] = field(default_factory=dict)
    description: str = ""
    precision: str | None = None  # the problem's own precision contract (protocol/precision.py); None: the run's
    # An fp32 problem run in another dtype (--dtype, CUFORGE "cast"): its floating inputs and its
    # Model's parameters cast to this torch dtype name, as KernelBench's precision option does.
    cast: str | None = None
    traced_in_cast: bool = False  # the graph was traced with the cast applied (loader.load_in_dtype)
    # Which fields were derived rather than declared, and which could not be known at all.
    derived: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def arithmetic_intensity(self) -> float | None:
        if self.flops is None or not self.bytes:
            return None
        return self.flops / self.bytes


@dataclass(frozen=True)
class Problem:
    """One operator to make faster: its source (KernelBench format) and what cuforge knows of it."""

    id: str
    source: str
    meta: ProblemMeta
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] | None
    init_inputs: tuple[Any, ...] = ()
    params: tuple[TensorSpec, ...] = ()
    path: Path | None = None
    suite: str | None = None
    ops: tuple[str, ...] = ()  # compute aten ops of one forward, in order (from the meta-device trace)
    graph: tuple[OpNode, ...] = ()  # every op of that trace with its operands (see cuforge.op_trace)
    graph_outputs: tuple[str | None, ...] = ()  # the refs forward returned

    @property
    def name(self) -> str:
        tail = self.id.rsplit("/", 1)[-1]
        return tail[:-3] if tail.endswith(".py") else tail

    def shapes_summary(self) -> str:
        ins = ", ".join(t.describe() for t in self.inputs)
        outs = ", ".join(t.describe() for t in self.outputs) if self.outputs else "?"
        return f"({ins}) -> {outs}"

    def cpu_mode_refusal(self) -> str | None:
        """Why the CPU test mode will not run this problem, or None. It runs a problem at its declared
        small sizes; without them, only where the full-size inputs are at most CPU_FULL_SIZE_BYTES
        (the limit `problems validate` also runs references under): never a silent full-size run
        that takes minutes."""
        if self.meta.small:
            return None
        try:
            size = sum(math.prod(t.shape) * dtype_size(t.dtype) for t in self.inputs if not t.is_scalar)
        except ProblemError:
            return None
        if size <= CPU_FULL_SIZE_BYTES:
            return None
        return (f"--cpu runs a problem at its declared small sizes, and {self.id} declares none while its inputs are "
                f"{size / 2**20:.0f} MiB at full size (over {CPU_FULL_SIZE_BYTES // 2**20} MiB): declare them in the file, "
                "e.g. CUFORGE = {'small': {'N': 64}}, naming the module constants that set its sizes")

    def contract(self, asked: str | None = None) -> str:
        """The precision contract this problem is judged under: the one asked for (a run's or a
        command's --precision), else its own CUFORGE precision, else fp32."""
        return asked or self.meta.precision or "fp32"

    def under(self, contract: str) -> Problem:
        """This problem judged under another precision contract (a run's --precision): the families
        read it to know what they may compute (one TF32 product where the contract allows TF32)."""
        return replace(self, meta=replace(self.meta, precision=contract))

    def in_dtype(self, name: str) -> Problem:
        """This fp32 problem run in another dtype: inputs and weights cast (cuforge.sandbox.protocol.loading
        casts them wherever the problem loads), judged by that dtype's tolerance and by how far PyTorch's
        own result in it lies from float64; its id says the dtype. A problem already in that dtype is
        itself; one in any dtype but fp32 cannot be cast (one line)."""
        dtype = cast_dtype(name)
        if self.meta.cast == dtype or (self.meta.cast is None and self.meta.dtype == dtype):
            return self
        if self.meta.cast is not None or self.meta.dtype not in (None, "float32"):
            raise ProblemError(f"{self.id} is {self.meta.cast or self.meta.dtype}: --dtype casts fp32 problems only")

        def spec(t: TensorSpec) -> TensorSpec:
            return replace(t, dtype=dtype) if t.dtype == "float32" and not t.is_scalar else t

        # Half the bytes where every tensor was fp32; where some were not, fewer bytes than that are
        # claimed, never more (the roofline's floor stays below what an honest kernel reaches).
        nbytes = self.meta.bytes * dtype_size(dtype) / 4 if self.meta.bytes else self.meta.bytes
        meta = replace(self.meta, dtype=dtype, cast=dtype, bytes=nbytes, tolerance=Tolerance.for_dtype(dtype))
        return replace(self, id=f"{self.id}@{SHORT_DTYPE[dtype]}", meta=meta, inputs=tuple(map(spec, self.inputs)),
                       outputs=tuple(map(spec, self.outputs)) if self.outputs is not None else None,
                       params=tuple(map(spec, self.params)))

    def for_cpu_test_mode(self) -> Problem:
        """The problem as the harness's CPU test mode judges it: no custom kernel can run without a
        GPU, so any correct implementation is accepted there (policy 'any'); CPU results are never
        timings a leaderboard uses."""
        if self.meta.policy == "any":
            return self
        return replace(self, meta=replace(self.meta, policy="any"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path) if self.path else None
        d["meta"]["arithmetic_intensity"] = self.meta.arithmetic_intensity
        return d


@dataclass(frozen=True)
class SkippedProblem:
    """A problem file that could not be loaded, with a one-line cause."""

    path: str
    reason: str


def tensor_spec_from_dict(d: dict[str, Any]) -> TensorSpec:
    return TensorSpec(tuple(int(s) for s in d["shape"]), str(d["dtype"]), d.get("value"), bool(d.get("contiguous", True)))


def meta_from_inspection(declared: dict[str, Any], derived: dict[str, Any]) -> ProblemMeta:
    """Merge a file's declared CUFORGE dict with what inspection derived; declared values win."""
    unknown_keys = set(declared) - KNOWN_META_KEYS
    if unknown_keys:
        raise ProblemError(f"CUFORGE has unknown keys: {', '.join(sorted(unknown_keys))}")
    derived_fields: list[str] = []
    unknown: list[str] = []

    def pick(key: str) -> Any:
        if declared.get(key) is not None:
            return declared[key]
        if derived.get(key) is not None:
            derived_fields.append(key)
            return derived[key]
        unknown.append(key)
        return None

    dtype = pick("dtype")
    flops = pick("flops")
    nbytes = pick("bytes")
    families = declared.get("families") or derived.get("families") or []
    if not declared.get("families"):
        (derived_fields if families else unknown).append("families")
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ProblemError(f"CUFORGE families {bad} not among {', '.join(FAMILIES)}")
    # A file in plain KernelBench format (no CUFORGE dict) is judged by KernelBench's rule: PyTorch may
    # compute beside the candidate's own kernels. cuforge's own problem files declare metadata and
    # keep the stricter "custom" unless they say otherwise.
    policy = declared.get("policy", "custom" if declared else "mixed")
    if policy not in POLICIES:
        raise ProblemError(f"CUFORGE policy {policy!r} must be one of {', '.join(POLICIES)}")
    baselines = declared.get("baselines") or default_baselines(families)
    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise ProblemError(f"CUFORGE baselines {bad} not among {', '.join(BASELINES)}")
    precision = declared.get("precision")
    if precision is not None:
        from cuforge.sandbox.protocol.precision import UnknownContract, contract

        try:
            precision = contract(str(precision)).name
        except UnknownContract as e:
            raise ProblemError(f"CUFORGE precision: {e}") from None
    tol = Tolerance.for_dtype(dtype)
    tol = Tolerance(
        float(declared.get("atol", tol.atol)),
        float(declared.get("rtol", tol.rtol)),
        float(declared.get("rel_norm", tol.rel_norm)),
    )
    return ProblemMeta(
        dtype=dtype,
        tolerance=tol,
        flops=float(flops) if flops is not None else None,
        bytes=float(nbytes) if nbytes is not None else None,
        families=tuple(families),
        baselines=tuple(baselines),
        policy=policy,
        small={str(k): int(v) for k, v in (declared.get("small") or {}).items()},
        description=str(declared.get("description", "")),
        precision=precision,
        derived=tuple(derived_fields),
        unknown=tuple(unknown),
    )


def default_baselines(families: list[str] | tuple[str, ...]) -> list[str]:
    base = ["torch", "torch.compile"]
    if list(families) == ["gemm"]:
        base += ["cublas", "cublaslt"]
    return base
