"""The recurrent-cell family on the CPU: which graphs it takes (nn.LSTMCell, nn.GRUCell, a cell written
with chunk and Linear layers, in fp32, fp16 and bf16) and why it refuses others; its kernels compile
with NVRTC; and the gate chain it generates, compiled with the host's C++ compiler over projections
PyTorch computed, gives PyTorch's cell outputs (which gate is which, which projections share an
accumulator, the biases and the output order)."""

import ctypes
import re

import pytest
import torch

from cuforge.kernels.families import families_for
from cuforge.kernels.gated_cell import GatedCell
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from cuforge.runtime import compile_to_cubin
from template_helpers import host_library, problem_from_expr, smoke_compile

HAND_WRITTEN = ("(lambda g: torch.sigmoid(g[0]) * h + (1 - torch.sigmoid(g[0])) * torch.tanh(g[1]))"
                "((self.ih(x) + self.hh(h)).chunk(2, 1))")
HAND_INIT = "        self.ih = nn.Linear(24, 80)\n        self.hh = nn.Linear(40, 80, bias=False)"


@pytest.mark.parametrize("ref", ["models/lstm_cell", "models/gru_cell"])
def test_the_models_suite_s_cells_are_one_kernel_in_every_dtype(ref):
    fam = GatedCell()
    for dtype in ("fp32", "bf16", "fp16"):
        p = load_problem(ref) if dtype == "fp32" else load_in_dtype(load_problem(ref), dtype)
        m = fam.match(p)
        assert not isinstance(m, str), (dtype, m)
        assert families_for(p)[0][0].name == "gated_cell"
        # LSTM adds its two projections before the split (one accumulator); GRU's new gate needs them apart.
        assert (m.gates, m.sets) == ((4, ((0, 1),)) if "lstm" in ref else (3, ((0,), (1,))))
        assert fam.seeds(p) and all(fam.valid(c, p) for c in fam.seeds(p))
    smoke_compile(fam, p, 2)


def test_refusals_name_their_cause(tmp_path):
    fam = GatedCell()
    plain = problem_from_expr(tmp_path, "torch.relu(self.fc(x))", "torch.randn(5, 24)", args="x",
                              init="        self.fc = nn.Linear(24, 80)")
    assert fam.supports(plain) == "no gate split of a projection"
    odd = problem_from_expr(tmp_path, "torch.sigmoid(self.fc(x).split(30, 1)[0])", "torch.randn(5, 24)", args="x",
                            init="        self.fc = nn.Linear(24, 80)")
    assert "not whole gates" in fam.supports(odd) or "does not cut" in fam.supports(odd)
    other = problem_from_expr(tmp_path, "(lambda g: torch.sigmoid(g[0]) * torch.exp(g[1]))(self.fc(x).chunk(2, 1))",
                              "torch.randn(5, 24)", args="x", init="        self.fc = nn.Linear(24, 80)")
    assert fam.supports(other) == "exp is not a projection, a gate split or an elementwise op the cell kernel has"
    narrow = problem_from_expr(tmp_path, "torch.sigmoid(self.fc(x).chunk(2, 1)[0])", "torch.randn(5, 18)", args="x",
                               init="        self.fc = nn.Linear(18, 80)")
    assert fam.supports(narrow) == "needs input widths that are multiples of 4 (16-byte loads)"


HOST = """#include <cmath>
static inline float to_float(float x) { return x; }
static inline float sigmoid_f(float x) { return 1.f / (1.f + std::exp(-x)); }
#define HIDDEN H_
extern "C" void run(int M, const float* const* acc, const float* const* bias, const float* const* x, float* const* out) {
    for (int b = 0; b < M; ++b)
        for (int j = 0; j < HIDDEN; ++j) {
            const long long o = (long long)b * HIDDEN + j;
DECLS
BODY
STORES
        }
}
"""


def cell_on_host(tmp_path, p, acc_sets, biases, rows_in):
    """The match's generated chain run on the CPU: `acc_sets` are each accumulator's (batch, gates *
    hidden) sums as the kernel's tensor cores would leave them; biases and (batch, hidden) tensors as
    the kernel reads them."""
    m = GatedCell().match(p)
    width = m.gates * m.hidden
    body = re.sub(r"acc(\d+)\[(\d+)\]\[i\]\[jn\]\[q\]", lambda g: f"acc[{g[1]}][o / HIDDEN * {width} + {g[2]} * HIDDEN + j]",
                  m.body)
    decls = [f"const float* bias{k} = bias[{k}];" for k in range(len(m.projections))]
    decls += [f"const float* x{i} = x[{i}];" for i in range(len(m.rows_in))]
    stores = [f"out[{i}][o] = {r};" for i, r in enumerate(m.results)]
    text = (HOST.replace("H_", str(m.hidden)).replace("DECLS", "\n".join(decls)).replace("BODY", body)
            .replace("STORES", "\n".join(stores)))
    lib = host_library(tmp_path, text)

    def table(ts):
        held = [t.float().contiguous() for t in ts]
        return held, (ctypes.c_void_p * max(1, len(held)))(*[t.data_ptr() for t in held])

    outs = [torch.empty(m.batch, m.hidden) for _ in m.results]
    tables = [table(ts) for ts in (acc_sets, biases, rows_in, outs)]  # the tensors live until the call returns
    lib.run(ctypes.c_int(m.batch), *(ptrs for _, ptrs in tables))
    return tables[3][0]


def test_the_lstm_and_gru_chains_give_pytorch_s_cells(tmp_path):
    torch.manual_seed(0)
    x, h, c = torch.randn(5, 24), torch.randn(5, 40), torch.randn(5, 40)
    lstm, gru = torch.nn.LSTMCell(24, 40), torch.nn.GRUCell(24, 40)
    p = problem_from_expr(tmp_path, "self.cell(x, (h, c))", "torch.randn(5, 24), torch.randn(5, 40), torch.randn(5, 40)",
                          args="x, h, c", init="        self.cell = nn.LSTMCell(24, 40)")
    m = GatedCell().match(p)
    # The trace's projection order and the match's bias order are the graph's: read them off the match.
    weights = {"param0": lstm.weight_ih, "param1": lstm.weight_hh, "param2": lstm.bias_ih, "param3": lstm.bias_hh}
    inputs = {"in0": x, "in1": h, "in2": c}
    with torch.no_grad():
        acc = [sum(inputs[q.a] @ weights[q.w].T for q in m.projections)]
        got = cell_on_host(tmp_path, p, acc, [weights[q.bias] for q in m.projections], [inputs[r] for r in m.rows_in])
        want = lstm(x, (h, c))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)

    p = problem_from_expr(tmp_path, "self.cell(x, h)", "torch.randn(5, 24), torch.randn(5, 40)", args="x, h",
                          init="        self.cell = nn.GRUCell(24, 40)")
    m = GatedCell().match(p)
    weights = {"param0": gru.weight_ih, "param1": gru.weight_hh, "param2": gru.bias_ih, "param3": gru.bias_hh}
    with torch.no_grad():
        acc = [inputs[q.a] @ weights[q.w].T for q in m.projections]
        (got,) = cell_on_host(tmp_path, p, acc, [weights[q.bias] for q in m.projections], [inputs[r] for r in m.rows_in])
        torch.testing.assert_close(got, gru(x, h), atol=1e-5, rtol=1e-5)


def test_a_hand_written_cell_with_chunk_and_one_bias(tmp_path):
    torch.manual_seed(1)
    p = problem_from_expr(tmp_path, HAND_WRITTEN, "torch.randn(5, 24), torch.randn(5, 40)", args="x, h", init=HAND_INIT)
    m = GatedCell().match(p)
    assert m.sets == ((0, 1),) and [q.bias is not None for q in m.projections] == [True, False]
    ih, hh = torch.nn.Linear(24, 80), torch.nn.Linear(40, 80, bias=False)
    x, h = torch.randn(5, 24), torch.randn(5, 40)
    with torch.no_grad():
        acc = [x @ ih.weight.T + h @ hh.weight.T]
        (got,) = cell_on_host(tmp_path, p, acc, [ih.bias, torch.zeros(80)], [h])
        g = (ih(x) + hh(h)).chunk(2, 1)
        torch.testing.assert_close(got, torch.sigmoid(g[0]) * h + (1 - torch.sigmoid(g[0])) * torch.tanh(g[1]),
                                   atol=1e-5, rtol=1e-5)


def test_a_cluster_splits_the_k_tiles_and_never_leaves_a_block_without_one(tmp_path):
    """CL blocks of a cluster share the k tiles: the grid's z is the cluster, the kernel declares its
    cluster dims and compiles in every dtype, the shared memory holds every set's sums for the hand-over,
    and a cluster larger than the k tiles is not a valid config."""
    fam = GatedCell()
    for dtype in ("fp32", "bf16", "fp16"):
        p = load_in_dtype(load_problem("models/gru_cell"), dtype) if dtype != "fp32" else load_problem("models/gru_cell")
        c = dict(BM=64, BN=8, BK=64, WM=4, WN=1, KS=2, STAGES=2, CL=4)
        assert fam.valid(c, p)
        cand = fam.render(c, p)
        assert cand.launch.grid.endswith(", 4)") and "__cluster_dims__(1, 1, CL)" in cand.source
        sets = len(fam.match(p).sets)
        assert int(cand.launch.shared_mem) >= sets * 64 * 8 * 3 * 4
        cubin, _, _ = compile_to_cubin(cand.source, "sm_90a", cand.launch.options)
        assert cubin
    small = problem_from_expr(tmp_path, "self.cell(x, h)", "torch.randn(5, 24), torch.randn(5, 40)", args="x, h",
                              init="        self.cell = nn.GRUCell(24, 40)")
    # 24 + 40 inputs at 32 a tile: 1 + 2 tiles, so 2 blocks may share them and 4 may not.
    assert fam.valid(dict(BM=16, BN=8, BK=32, WM=1, WN=1, KS=1, STAGES=2, CL=2), small)
    assert not fam.valid(dict(BM=16, BN=8, BK=32, WM=1, WN=1, KS=1, STAGES=2, CL=4), small)
    assert "__cluster_dims__" not in fam.render(dict(BM=16, BN=8, BK=32, WM=1, WN=1, KS=1, STAGES=2, CL=1), small).source
