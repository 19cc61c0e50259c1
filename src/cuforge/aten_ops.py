"""Which aten ops are compute and which only move, view or allocate memory.

Shared by problem inspection (family tags) and the sandbox (library-compute detection under the
"custom" kernel policy).
"""

from __future__ import annotations

# Ops that allocate, view, copy or fill: allowed inside a "custom" candidate.
NOT_COMPUTE = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze",
    "unsqueeze", "slice", "select", "detach", "alias", "as_strided", "empty", "empty_like",
    "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "fill",
    "zero", "clone", "copy", "_to_copy", "to", "lift_fresh", "lift_fresh_copy", "split", "chunk",
    "unbind", "contiguous", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_reshape_alias", "unflatten",
    "flatten", "randn", "rand", "normal", "uniform", "random", "arange", "is_same_size", "resize",
    "set_", "stride", "size", "numel", "dim", "_local_scalar_dense", "item", "record_stream",
    "_has_compatible_shallow_copy_type", "is_nonzero", "equal", "view_as", "expand_as", "narrow",
    "movedim", "swapaxes", "_conj", "conj", "resolve_conj", "resolve_neg", "_pin_memory",
})

FAMILY_OF_OP = {
    "mm": "gemm", "bmm": "gemm", "addmm": "gemm", "baddbmm": "gemm", "addbmm": "gemm",
    "mv": "gemm", "addmv": "gemm", "dot": "gemm", "matmul": "gemm", "_scaled_mm": "gemm",
    "linear": "gemm", "einsum": "gemm",
    "convolution": "conv", "_convolution": "conv", "cudnn_convolution": "conv",
    "_softmax": "softmax", "_log_softmax": "softmax", "_softmax_lastdim": "softmax", "_log_softmax_lastdim": "softmax",
    "_safe_softmax": "softmax", "_safe_softmax_lastdim": "softmax", "softmax": "softmax", "log_softmax": "softmax",
    "native_layer_norm": "norm", "native_batch_norm": "norm", "native_group_norm": "norm",
    "_fused_rms_norm": "norm", "rms_norm": "norm", "_native_batch_norm_legit_no_training": "norm",
    "sum": "reduction", "mean": "reduction", "amax": "reduction", "amin": "reduction",
    "max": "reduction", "min": "reduction", "argmax": "reduction", "argmin": "reduction",
    "prod": "reduction", "var": "reduction", "std": "reduction", "var_mean": "reduction",
    "norm": "reduction", "linalg_vector_norm": "reduction", "logsumexp": "reduction",
    "sum_lastdim": "reduction", "max_lastdim": "reduction", "argmax_lastdim": "reduction",
    "cumsum": "scan", "cumprod": "scan", "cummax": "scan", "logcumsumexp": "scan",
}


def compute_ops(ops: list[str]) -> list[str]:
    """The compute ops of a trace, in order (allocation, view and copy ops dropped)."""
    return [op for op in ops if is_compute(op)]


def base_name(op: str) -> str:
    """'add_' -> 'add', 'fill_' -> 'fill': in-place variants share their op's class."""
    return op[:-1] if op.endswith("_") and not op.startswith("_") else op


def is_compute(op: str) -> bool:
    return op not in NOT_COMPUTE and base_name(op) not in NOT_COMPUTE


def families_of_ops(ops: list[str]) -> list[str]:
    fams: list[str] = []
    for op in ops:
        if not is_compute(op):
            continue
        fam = FAMILY_OF_OP.get(op) or FAMILY_OF_OP.get(base_name(op)) or "elementwise"
        if fam not in fams:
            fams.append(fam)
    if len(fams) > 1:
        fams.append("fused")
    return fams
