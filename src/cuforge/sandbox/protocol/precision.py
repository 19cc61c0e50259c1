"""Precision contracts: what "correct" means for a run, and under which flags its reference and its
eager and torch.compile baselines run.

- `fp32` (the default): fp32 means fp32. TF32 and reduced-precision reductions off everywhere; a
  candidate is judged against float64 by what an honest fp32 kernel can reach.
- `pytorch`: what PyTorch's default flags compute. cuDNN convolutions may use TF32 (PyTorch's default),
  and matmuls where the problem itself turns TF32 on; fp16/bf16 GEMMs may use reduced-precision
  reductions. The reference and the baselines run under those flags, so the error bound comes from the
  error PyTorch's own default computation makes against float64: a TF32 kernel as accurate as cuDNN's
  passes, a less accurate one does not.
- `kernelbench`: KernelBench's own rule, for comparison with its published results: default flags,
  and a fixed tolerance (atol = rtol = 1e-4 for fp32, 1e-2 for fp16/bf16) with no error-norm bound.

Whatever the contract, the flags are the harness's: a candidate that changes any of them is
`cheat:precision_downgrade`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def precision_flags() -> dict[str, str]:
    """Global switches that trade accuracy for speed. Any change by a candidate is a downgrade."""
    import torch

    probes: dict[str, Callable[[], Any]] = {
        "matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "matmul.fp16_reduced": lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.bf16_reduced": lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        # fp16 GEMMs accumulating in fp16 (cuBLAS's faster, coarser path), off by default
        "matmul.fp16_accumulation": lambda: getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", None),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "matmul.fp32_precision": lambda: getattr(torch.backends.cuda.matmul, "fp32_precision", None),
        "cudnn.conv.fp32_precision": lambda: getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None),
        "default_dtype": torch.get_default_dtype,
    }
    return read_switches(probes)


def read_switches(probes: Mapping[str, Callable[[], Any]]) -> dict[str, str]:
    """Each switch's value as text; one that cannot be read (a mixed legacy/new TF32 state raises, a
    torch may lack a switch or a backend) is named unreadable, which compares like any value."""
    out = {}
    for name, probe in probes.items():
        try:
            out[name] = str(probe())
        except Exception as e:  # noqa: BLE001 - see the docstring
            out[name] = f"unreadable: {type(e).__name__}"
    return out


def set_strict_precision() -> None:
    """The harness's own settings: no TF32, no reduced-precision reductions, fp32 default dtype."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_default_dtype(torch.float32)


def set_pytorch_defaults() -> None:
    """PyTorch's own defaults: TF32 for cuDNN convolutions, not for matmuls; reduced-precision
    reductions allowed in fp16 and bf16 GEMMs; fp32 default dtype."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    torch.set_default_dtype(torch.float32)


@contextmanager
def flags_kept() -> Iterator[None]:
    """Whatever the body sets, this process's precision switches are as they were afterwards."""
    import torch

    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction,
             m.allow_bf16_reduced_precision_reduction, torch.get_default_dtype())
    try:
        yield
    finally:
        (m.allow_tf32, c.allow_tf32, m.allow_fp16_reduced_precision_reduction,
         m.allow_bf16_reduced_precision_reduction) = saved[:4]
        torch.set_default_dtype(saved[4])


@dataclass(frozen=True)
class Contract:
    name: str
    default_flags: bool  # reference and baselines under PyTorch's default flags (else all strict)
    # dtype -> (atol, rtol) replacing the problem's tolerance, with no error-norm bound (KernelBench's rule)
    fixed_tolerance: Mapping[str, tuple[float, float]] | None = None
    summary: str = ""


CONTRACTS = {
    "fp32": Contract("fp32", False, summary="fp32 accuracy, TF32 off everywhere"),
    "pytorch": Contract("pytorch", True, summary="PyTorch's default flags (cuDNN TF32 on)"),
    "kernelbench": Contract("kernelbench", True, {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2),
                                                  "bfloat16": (1e-2, 1e-2)},
                            summary="KernelBench's rule: default flags, atol = rtol = 1e-4 (fp32) or 1e-2 (fp16/bf16)"),
}
DEFAULT_CONTRACT = "fp32"


class UnknownContract(ValueError):
    pass


def contract(name: str | None) -> Contract:
    """The contract of that name (None: the default); an unknown one is one line naming the valid ones."""
    key = (name or DEFAULT_CONTRACT).strip().lower()
    if key not in CONTRACTS:
        raise UnknownContract(f"unknown precision contract {name!r}: use {', '.join(CONTRACTS)}")
    return CONTRACTS[key]


def apply_flags(name: str | None, problem_flags: Mapping[str, bool] | None = None) -> None:
    """Set the contract's flags in this process; under a default-flags contract, then the TF32 switches
    the problem's own code set when it was loaded (its reference keeps them)."""
    if not contract(name).default_flags:
        set_strict_precision()
        return
    import torch

    set_pytorch_defaults()
    for flag, on in (problem_flags or {}).items():
        if flag == "matmul.allow_tf32":
            torch.backends.cuda.matmul.allow_tf32 = bool(on)
        elif flag == "cudnn.allow_tf32":
            torch.backends.cudnn.allow_tf32 = bool(on)


TF32_SWITCHES = ("matmul.allow_tf32", "cudnn.allow_tf32")


def tf32_switches(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, bool]:
    """The TF32 switches a problem's code changed while it loaded (from two precision_flags readings)."""
    out = {k: after[k] == "True" for k in TF32_SWITCHES if k in before and k in after and before[k] != after[k]}
    key = "float32_matmul_precision"  # set_float32_matmul_precision("high") is TF32 for matmuls too
    if before.get(key) != after.get(key) and after.get(key) in ("high", "medium"):
        out["matmul.allow_tf32"] = True
    return out


CONV_OPS = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
                      "conv_transpose2d", "conv_transpose3d", "cudnn_convolution", "cudnn_convolution_transpose"})
MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "einsum", "addmv", "mv",
                        "dot", "tensordot", "_scaled_dot_product_efficient_attention",
                        "_scaled_dot_product_flash_attention", "scaled_dot_product_attention"})


# The eager baseline under the other flags, timed beside every evaluation: its name in the timings.
STRICT_EAGER = "torch.strict"  # eager with TF32 and reduced-precision reductions off (the fp32 contract's)
DEFAULT_EAGER = "torch.default_flags"  # eager under PyTorch's default flags (cuDNN TF32 on)


# torch.compile under the other flags, timed where the flags change what eager runs.
STRICT_COMPILED = "torch.compile.strict"
DEFAULT_COMPILED = "torch.compile.default_flags"
OTHER_FLAGS_BASELINES = (STRICT_EAGER, DEFAULT_EAGER, STRICT_COMPILED, DEFAULT_COMPILED)


def other_eager(name: str | None) -> str:
    """The name of eager under the flags the contract does not use."""
    return STRICT_EAGER if contract(name).default_flags else DEFAULT_EAGER


def other_compiled(name: str | None) -> str:
    """The name of torch.compile under the flags the contract does not use."""
    return STRICT_COMPILED if contract(name).default_flags else DEFAULT_COMPILED


def flags_matter(ops: list[str] | tuple[str, ...], dtype: str | None, problem_flags: Mapping[str, bool] | None = None) -> bool:
    """Whether the two contracts' flags can change what eager PyTorch runs for these ops: a convolution
    (cuDNN's TF32), a matmul in fp16/bf16 (reduced-precision reductions), a matmul the problem turned
    TF32 on for. Elsewhere both eagers run the same kernels."""
    names = {op.split("::")[-1].split(".")[0] for op in ops}
    if names & CONV_OPS:
        return True
    if names & MATMUL_OPS and (dtype in ("float16", "bfloat16") or (problem_flags or {}).get("matmul.allow_tf32")):
        return True
    return False


def tf32_allowed(name: str | None, ops: list[str] | tuple[str, ...], problem_flags: Mapping[str, bool] | None = None) -> bool:
    """Whether an fp32 output may carry TF32's rounding under the contract: where the reference's own
    default computation uses TF32 (a convolution under cuDNN's default, a matmul the problem turned TF32
    on for). Never under `fp32`."""
    if not contract(name).default_flags:
        return False
    flags = {"cudnn.allow_tf32": True, "matmul.allow_tf32": False, **(problem_flags or {})}
    names = {op.split("::")[-1].split(".")[0] for op in ops}
    return bool((flags["cudnn.allow_tf32"] and names & CONV_OPS) or (flags["matmul.allow_tf32"] and names & MATMUL_OPS))
