"""The chunked top-k family (two kernels: a radix select a chunk, then a sort of the chunks' candidates a row) on
the CPU: what it covers and refuses, its launch, every seed compiled for sm_90a, and the template's own
two kernels run on the host (a block of one thread) against a stable sort of each row: ties lowest index
first, NaN greatest, chunks shorter than k, a last chunk shorter than the others, the smallest."""

import ctypes

import pytest

from cuforge.kernels.topk_chunks import TopkChunks, widths
from cuforge.problems.suites import load_suite
from template_helpers import HOST_CONVERT, HOST_CUDA, host_library, problem_from_expr, smoke_compile

HOST_PRELUDE = HOST_CUDA + HOST_CONVERT + r"""
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
"""
# Each block's THREADS threads at once as host threads (template_helpers.HOST_CUDA), every block in turn.
HOST_RUN = r"""
extern "C" void run(int rows, const float* x, unsigned long long* candidates, float* values, long long* indices) {
    host_grid(rows * CHUNKS, 1, 1, THREADS, 1, [=] { topk_chunks_chunks(x, candidates); });
    host_grid(rows, 1, 1, THREADS, 1, [=] { topk_chunks(x, candidates, values, indices); });
}
"""


def on_host(tmp_path, fam, p, config, x, threads=1):
    """The rendered kernels compiled for the host with `threads` threads a block, every block in order."""
    import torch

    source = fam.render(config, p).source
    body = source[source.index("typedef float elem_t;"):].replace(f"#define THREADS {config['THREADS']}", f"#define THREADS {threads}")
    lib = host_library(tmp_path, HOST_PRELUDE + body + HOST_RUN)
    m = fam.matched(p)
    _, kc, _, _ = widths(m, config["CHUNKS"])
    x = x.contiguous()
    candidates = torch.zeros(m.rows * config["CHUNKS"] * kc, dtype=torch.int64)
    values, indices = torch.empty(m.rows, m.k), torch.empty(m.rows, m.k, dtype=torch.int64)
    lib.run(ctypes.c_int(m.rows), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(candidates.data_ptr()),
            ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(indices.data_ptr()))
    return values, indices


@pytest.mark.parametrize("threads", [1, 32])
@pytest.mark.parametrize("n, k, largest, chunks, ties", [(1000, 10, True, 8, True), (100, 20, True, 8, True),
                                                           (997, 50, False, 16, True), (64, 64, True, 4, True),
                                                           (5000, 3, True, 64, True), (3000, 50, True, 16, False)])
def test_the_two_kernels_compute_a_stable_top_k_on_the_host(tmp_path, n, k, largest, chunks, ties, threads):
    """Values with many ties (the radix select then narrows into the index bits) or few (it stops at the
    key's), NaN among them; a block of one thread and of 32 running at once."""
    import torch

    p = problem_from_expr(tmp_path, f"torch.topk(x, {k}, largest={largest})", f"torch.randn(5, {n})", "x")
    fam = TopkChunks()
    config = dict(CHUNKS=chunks, THREADS=128)
    assert fam.valid(config, p)
    g = torch.Generator().manual_seed(n + k)
    x = torch.randint(-20, 20, (5, n), generator=g).float() / 4 if ties else torch.randn(5, n, generator=g)
    x[1, torch.randint(0, n, (3,), generator=g)] = float("nan")
    values, indices = on_host(tmp_path, fam, p, config, x, threads)
    want_v, want_i = torch.sort(x, dim=-1, descending=largest, stable=True)
    assert torch.equal(indices, want_i[:, :k]), (indices, want_i[:, :k])
    assert torch.allclose(values, want_v[:, :k], equal_nan=True)


def test_covers_the_models_suite_s_sampling_and_compiles_every_seed(tmp_path):
    p = next(q for q in load_suite("models").problems if q.id == "models/topk_sampling")
    fam = TopkChunks()
    assert fam.supports(p) is None
    seeds = fam.seeds(p)
    assert seeds[0] == dict(CHUNKS=8, THREADS=512)
    launch = fam.launch(fam.complete(seeds[0]), p)
    assert launch.pre == (("topk_chunks_chunks", "(512,)", "(512,)", "(in0, scratch0)"),)
    assert launch.scratch == (("(25600,)", "int64", "empty"),)  # 64 rows x 8 chunks x 50 candidates
    assert launch.outputs == (("(64, 50)", "float32"), ("(64, 50)", "int64")) and launch.args == ("in0", "scratch0", "out0", "out1")
    smoke_compile(fam, p, 2)
    half = problem_from_expr(tmp_path, "torch.topk(x, 7, largest=False).values", "torch.randn(3, 1001, dtype=torch.bfloat16)", "x")
    assert fam.supports(half) is None
    launch = fam.launch(fam.complete(fam.seeds(half)[0]), half)
    assert launch.outputs == (("(3, 7)", "bfloat16"),) and launch.args[-2:] == ("out0", "scratch1")  # indices unread: scratch
    smoke_compile(fam, half, 1)


def test_leads_top_k_only_over_rows_too_few_for_the_sms(tmp_path):
    """The offline search tries the preferred family's seeds first: the chunked kernels where the rows
    are fewer than an H100's SMs (the models suite's sampling: 64 rows), a block a row from 128 rows."""
    from cuforge.kernels.families import families_for

    sampling = next(q for q in load_suite("models").problems if q.id == "models/topk_sampling")
    assert [f.name for f in families_for(sampling)[0]] == ["topk_chunks", "topk_rows"]
    many = problem_from_expr(tmp_path, "torch.topk(x, 50)", "torch.randn(128, 32000)", "x")
    assert [f.name for f in families_for(many)[0]] == ["topk_rows", "topk_chunks"]


def test_refuses_what_no_chunking_sorts_in_shared_memory(tmp_path):
    fam = TopkChunks()
    huge_k = problem_from_expr(tmp_path, "torch.topk(x, 1000)", "torch.randn(2, 70000)", "x")
    assert "no chunking sorts in one block's shared memory" in fam.supports(huge_k)
    many_rows = problem_from_expr(tmp_path, "torch.topk(x, 500)", "torch.randn(2**20, 2000)", "x")
    assert "candidates under 1024 MiB" in fam.supports(many_rows)
    assert "not one top-k" in fam.supports(problem_from_expr(tmp_path, "torch.topk(x, 3).values * 2", "torch.randn(4, 64)", "x"))
