"""Tensor conventions the judge and the candidate host both keep: the poison pattern of memory
nobody wrote, bit-for-bit equality, seeding, and what `.cuda()` means off a GPU."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from cuforge.sandbox.protocol.evaluation import cheat
from cuforge.sandbox.protocol.stop import Stop


def on_device(device: torch.device) -> Any:
    """Where the evaluation runs without CUDA (the CPU test mode), `.cuda()` in a problem's or a
    candidate's setup means that device; on a GPU it means what it says."""
    if device.type == "cuda":
        return contextlib.nullcontext()
    from cuforge.device_map import CudaTo

    return CudaTo(device)


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN equals NaN), unlike torch.equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
        return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
    return torch.equal(a, b)


def reseed(rng_seed: int | None) -> None:
    if rng_seed is not None:
        seed_all(rng_seed)


def seed_all(seed: int) -> None:
    """torch.manual_seed for the generators a problem can draw from (the CPU's and every GPU's), without
    its calls into other backends' lazy seeding, which format a stack trace each time (~1 ms)."""
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_available():  # immediate once CUDA is initialised; queued for its start before
        torch.cuda.manual_seed_all(seed)


POISON_BYTE = 0xFF  # all-ones bits: NaN in fp16, bf16, fp32 and fp64


def poison_fraction(t: torch.Tensor) -> float:
    """Share of elements whose bits are the poison pattern: memory nobody wrote."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or not t.is_floating_point():
        return 0.0
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()]
    return float((t.contiguous().view(ints) == -1).float().mean())


def poison_cached_blocks(device: torch.device, nbytes_each: int, count: int) -> None:
    """Poison the cached free blocks the next allocations of this size would get, without returning
    memory to the driver: unmapping memory flushes the GPU's TLBs, and on an H100 that was measured
    to slow the following memory-bound kernels by about 17% (0.83 ms vs 0.71 ms for a 1 GiB ReLU),
    so this is the variant used between timing batches."""
    if device.type != "cuda" or nbytes_each <= 0:
        return
    blocks = [torch.empty(nbytes_each, dtype=torch.uint8, device=device) for _ in range(count)]
    for b in blocks:
        b.fill_(POISON_BYTE)
    del blocks


def poison_free_memory(device: torch.device, min_bytes: int = 64 * 2**20) -> int:
    """Fill memory the caching allocator will hand out next with NaN bit patterns.

    Freed blocks are returned to the driver, re-taken in one allocation (likely the same pages),
    filled and released into torch's cache, so an output a candidate allocates and never writes reads
    as NaN, never as an earlier reference's result. The small-block pool is poisoned the same way.
    Returns the bytes poisoned.
    """
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    released = before - torch.cuda.memory_reserved(device)
    total = max(released, min_bytes)
    free, _ = torch.cuda.mem_get_info(device)
    total = min(total, max(free - 512 * 2**20, 0))
    # Free blocks inside segments that still hold live tensors cannot be released; the next
    # allocation of their size gets them back with whatever the last owner left there.
    poisoned = poison_cached_free_blocks(device)
    if total > 0:
        block = torch.empty(total, dtype=torch.uint8, device=device)
        block.fill_(POISON_BYTE)
        poisoned += total
        del block
    # Small pool: requests under 1 MiB come from 2 MiB segments that the big block never serves.
    smalls = [torch.empty(2**19, dtype=torch.uint8, device=device) for _ in range(16)]
    for s in smalls:
        s.fill_(POISON_BYTE)
    poisoned += 16 * 2**19
    del smalls
    torch.cuda.synchronize(device)
    return poisoned


def poison_cached_free_blocks(device: torch.device) -> int:
    """Poison every free block the caching allocator holds for `device`, re-taking each by its exact
    size (largest first, so best fit hands back that very block). Returns the bytes poisoned."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    sizes = sorted((b["size"] for seg in torch.cuda.memory_snapshot() if seg["device"] == index
                    for b in seg["blocks"] if b["state"] == "inactive"
                    # a large segment's remainder under 1 MiB serves no request (smaller ones use the small pool)
                    and (seg["segment_type"] == "small" or b["size"] > 2**20)), reverse=True)
    blocks = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
    for b in blocks:
        b.fill_(POISON_BYTE)
    del blocks
    return sum(sizes)


def output_violation(outputs: list[Any], device: torch.device) -> tuple[str, str] | None:
    """(cheat kind, message) for an output that is not a plain tensor on the evaluation's device: the
    only kind of output the judge compares and the wire carries."""
    for i, o in enumerate(outputs):
        if type(o) is not torch.Tensor:
            what = type(o).__name__
            return ("lazy_tensor", f"output {i} is a {what}, not a plain torch.Tensor")
        if o.device.type != device.type or o.is_meta:
            return ("lazy_tensor", f"output {i} lives on {o.device}, not on {device}")
    return None


def check_outputs(device: torch.device, outs: list[Any]) -> None:
    """An output that is not a tensor on the evaluation's device is a cheat, named."""
    v = output_violation(outs, device)
    if v:
        raise Stop(cheat(v[0]), v[1])


def make_inputs(problem_module: Any, seed: int, device: torch.device, gaussian: bool) -> list[Any]:
    """The problem's own inputs for `seed`; with `gaussian`, floating inputs redrawn as N(0, 1)."""
    seed_all(seed)
    with torch.device(device), on_device(device):  # drawn on the device: fast, and the same distribution
        inputs = list(problem_module.get_inputs())
    out = []
    gen = torch.Generator(device=device).manual_seed(seed + 7919)
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            if gaussian and x.is_floating_point():
                x = torch.randn(x.shape, generator=gen, device=device, dtype=torch.float32).to(x.dtype)
        out.append(x)
    return out
