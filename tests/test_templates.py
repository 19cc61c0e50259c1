"""The offline template proposer on the CPU: coverage, constraints, search moves, and every config
of a smoke set compiling with NVRTC."""

import json

import pytest

from cuforge.agent.population import Member
from cuforge.kernels.base import CONFIG_TAG
from cuforge.kernels.families import Elementwise, config_of, families_for, family_for
from cuforge.kernels.gemm import GemmSm80, GemmSm90
from cuforge.agent.template_proposer import NotCovered, TemplateProposer
from cuforge.problems.hgemm import hgemm_problem
from cuforge.problems.loader import load_in_dtype
from cuforge.problems.suites import load_problem
from template_helpers import problem_from_expr, smoke_compile


def test_coverage_and_clear_refusals(tmp_path):
    assert [f.name for f in families_for(hgemm_problem(1024, 512, 256))[0]] == ["gemm_sm90", "gemm_sm80"]
    assert family_for(load_problem("level1/matmul_fp16"))[0].name == "gemm_sm90"
    for name in ("gemm_bias_relu", "gemm_bias_silu"):  # fp16 linear + bias + activation: one fused kernel
        assert [f.name for f in families_for(load_problem(f"level2/{name}"))[0]] == ["linear_sm90"], name
    assert family_for(load_problem("level2/gemm_bias_gelu"))[0].name == "gemm_tf32x3_sm90"  # fp32: 3xTF32 (wgmma) + fused epilogue
    for name in ("relu", "gelu", "gelu_fp16", "silu", "sigmoid"):
        assert family_for(load_problem(f"level1/{name}"))[0].name == "elementwise", name
    for name in ("gelu", "relu"):  # run in bf16 (--dtype): traced cast, the same family in its bf16 kernel
        bf16 = load_in_dtype(load_problem(f"level1/{name}"), "bf16")
        fam = family_for(bf16)[0]
        assert fam.name == "elementwise" and "__nv_bfloat16" in fam.render(fam.seeds(bf16)[0], bf16).source
    assert family_for(load_problem("level1/softmax"))[0].name == "softmax_rows"
    assert family_for(load_problem("level1/log_softmax"))[0].name == "softmax_rows"
    for name in ("sum_dim", "max_dim", "argmax_dim"):
        assert family_for(load_problem(f"level1/{name}"))[0].name == "reduce_rows", name
    assert family_for(load_problem("level1/cumsum"))[0].name == "scan_rows"
    assert family_for(load_problem("level1/conv3x3"))[0].name == "conv_tf32x3_sm90"
    sort = problem_from_expr(tmp_path, "torch.sort(a, dim=-1)[0]", "torch.randn(64, 100)", args="a")
    fam, why = family_for(sort)
    assert fam is None and "not covered offline" in why and "use an LLM provider" in why
    # What a user reads first is the last resort's reason and the ops it looked at; each family's after.
    assert why.startswith("not covered offline: no run of its ops is one family's kernel (the graph's ops: sort)")
    # The families built around a GEMM or a convolution (the two-kernel ones too) say why once, together.
    assert why.count("built around _embedding_bag, _log_softmax_lastdim, _safe_softmax_lastdim, _softmax_lastdim, "
                     "addmm, bmm, chunk, convolution, mean, mm, mv, native_batch_norm, native_layer_norm, split, topk, unsafe_chunk, unsafe_split: none of these "
                     "ops is in the graph") == 1
    assert "staged: " not in why
    assert "multiples of 8" in GemmSm80().supports(hgemm_problem(100, 70, 33))
    with pytest.raises(NotCovered, match="not covered offline"):
        TemplateProposer().propose_candidate(sort, "SEED", None, [])


def test_constraints_prune_before_compiling():
    g, p = GemmSm80(), hgemm_problem(4096, 4096, 4096)
    assert g.valid(dict(BM=128, BN=256, BK=32, WM=2, WN=4, STAGES=4, GROUP_M=8), p)
    h = GemmSm90()
    big = dict(BM=128, BN=256, STAGES=4, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma")
    assert h.valid(big, p) and not h.valid({**big, "STAGES": 5}, p)  # shared memory
    assert not h.valid({**big, "BN": 192, "STAGES": 5}, p) and h.valid({**big, "BN": 192, "STAGES": 5, "EPI": "direct"}, p)  # no epilogue buffers: a stage more
    assert not h.valid({**big, "BM": 256}, p)  # 128 x 256 accumulators per thread
    assert not h.valid({**big, "SPLIT_K": 8}, p)  # 8 x 4096 x 4096 fp32 partials exceed the workspace cap
    assert h.valid({**big, "SPLIT_K": 16}, hgemm_problem(64, 64, 16384))
    assert not h.valid({**big, "SPLIT_K": 16}, hgemm_problem(64, 64, 512))  # more splits than k-tiles
    mid = hgemm_problem(1024, 1024, 16384)  # 32 tiles: split-K may fill the GPU
    assert h.valid({**big, "SPLIT_K": 4, "REDUCE": "atomic"}, mid) and not h.valid({**big, "SPLIT_K": 32}, mid)
    assert not h.valid({**big, "REDUCE": "atomic"}, p)  # nothing to reduce without split-K
    assert not g.valid(dict(BM=256, BN=256, BK=64, WM=2, WN=4, STAGES=6, GROUP_M=8), p)  # shared memory
    assert not g.valid(dict(BM=256, BN=256, BK=32, WM=2, WN=2, STAGES=2, GROUP_M=8), p)  # 256 accumulators
    assert not g.valid(dict(BM=64, BN=64, BK=32, WM=4, WN=4, STAGES=3, GROUP_M=8), p)  # 16 warps
    e = Elementwise()
    assert not e.valid(dict(VEC=8, BLOCK=256, WAVES=0), load_problem("level1/relu"))  # fp32: at most float4
    assert e.valid(dict(VEC=8, BLOCK=256, WAVES=0), load_problem("level1/gelu_fp16"))


def test_steps_of_several_vectors_a_thread(tmp_path):
    """UNROLL vectors a thread per step: the grid shrinks by that factor, and a config stored before the
    knob existed renders the kernel of one vector a step."""
    from cuforge.kernels.pointwise import PointwiseChain

    gelu = load_problem("level1/gelu")
    chain = problem_from_expr(tmp_path, "torch.tanh(a) * b", "torch.randn(17, 96), torch.randn(96)")
    for fam, p in ((Elementwise(), gelu), (PointwiseChain(), chain)):
        old = dict(VEC=4, BLOCK=256, WAVES=0)
        assert fam.render(old, p).source == fam.render({**old, "UNROLL": 1}, p).source
        assert fam.launch(fam.complete({**old, "UNROLL": 2}), p).grid == "(max(1, cdiv(cdiv(n, 8), 256)),)"
        src = fam.render({**old, "UNROLL": 4}, p).source
        assert "constexpr int UNROLL = 4;" in src and '"UNROLL": 4' in src.split("\n", 1)[0]
        # Eager's own kernel shape first (for the chain, its per-column operand read as vectors).
        assert fam.seeds(p)[0] == dict(VEC=4, BLOCK=128, WAVES=0, UNROLL=2, **({"OPVEC": 1} if p is chain else {}))


def test_search_seeds_then_mutates_without_repeats():
    p = hgemm_problem(2048, 2048, 2048)
    tp = TemplateProposer(seed=3)
    seeds = [config_of(tp.propose_candidate(p, "SEED", None, []).source) for _ in range(4)]
    # The preferred family's three best guesses, then the families' seeds interleave.
    assert [s["family"] for s in seeds] == ["gemm_sm90", "gemm_sm90", "gemm_sm90", "gemm_sm80"]
    assert (seeds[0]["BM"], seeds[0]["BN"]) == (128, 256)  # 16 x 8 tiles of 128 x 256 fill 132 SMs
    assert seeds[3]["BM"] == 128 and len({repr(s) for s in seeds}) == 4
    for fam, parent_cfg in ((GemmSm90(), seeds[0]), (GemmSm80(), seeds[3])):
        parent_cand = fam.render(parent_cfg, p)
        parent = Member(1, "k", "ok", 0.2, 1.2, 0, 0, ("tensor_core",), source=parent_cand.source)
        seen = set()
        for _ in range(8):
            child = config_of(tp.propose_candidate(p, "IMPROVE", parent, []).source)
            assert child["family"] == fam.name  # improving stays within the parent's family
            changed = [k for k in fam.knobs if child[k] != parent_cfg[k]]
            assert 1 <= len(changed) <= 3  # one or two mutated knobs
            assert repr(child) not in seen
            seen.add(repr(child))


def test_a_stored_parent_off_today_s_knob_space_is_improved_within_it():
    """A run resumed from a store written by an older version: its parent's config has a value its
    family's knob no longer takes. Improving it proposes configs of today's space, never that value."""
    p = hgemm_problem(2048, 2048, 2048)
    fam = GemmSm90()
    old = {**config_of(TemplateProposer(seed=3).propose_candidate(p, "SEED", None, []).source), "BN": 96}
    header = CONFIG_TAG + json.dumps(old, sort_keys=True) + "\n"
    parent = Member(1, "k", "ok", 0.2, 1.2, 0, 0, ("tensor_core",), source=header + "// an older version's kernel\n")
    tp = TemplateProposer(seed=5, seeds_first=0)  # improving from the first proposal
    for _ in range(4):
        child = config_of(tp.propose_candidate(p, "IMPROVE", parent, []).source)
        assert child["family"] == fam.name and child["BN"] != 96 and fam.config(child)


SMOKE = 6


@pytest.mark.parametrize("problem_ref", ["hgemm/1024_1024_1024", "level2/gemm_bias_silu", "level1/relu", "level1/gelu_fp16", "level1/silu",
                                         "level1/softmax", "level1/log_softmax", "level1/sum_dim", "level1/argmax_dim"])
def test_smoke_configs_compile_with_nvrtc(problem_ref):
    from cuforge.problems.suites import load_problem as lp

    p = lp(problem_ref)
    for fam in families_for(p)[0]:
        smoke_compile(fam, p, SMOKE)


def test_bf16_elementwise_configs_compile_with_nvrtc():
    for ref in ("level1/gelu", "level1/silu"):
        p = load_in_dtype(load_problem(ref), "bf16")
        fams, _ = families_for(p)
        assert [f.name for f in fams] == ["elementwise", "pointwise"]  # the one-op family first
        for fam in fams:
            smoke_compile(fam, p, SMOKE)


def test_half_pointwise_chains_load_16_bytes_and_index_operands_by_a_constant_row_length():
    """fp16/bf16 chains are seeded with 8-element (16-byte) loads, never wider, and the row length the
    per-row and per-column operands divide by is a compile-time constant (rotary's cos/sin tables)."""
    from cuforge.kernels.pointwise import PointwiseChain

    fam = PointwiseChain()
    for dtype in ("bf16", "fp16"):
        p = load_in_dtype(load_problem("models/rotary_half"), dtype)
        assert fam.supports(p) is None
        seeds = fam.seeds(p)
        assert seeds[0]["VEC"] == 8 and all(fam.valid(c, p) for c in seeds)
        assert "constexpr long long cols = 128LL;" in fam.render(seeds[0], p).source
        smoke_compile(fam, p, SMOKE)
    fp32 = load_problem("models/rotary_half")
    assert not fam.valid(dict(VEC=8, BLOCK=128, WAVES=0, UNROLL=1), fp32)  # 32 bytes: no such load


def test_gemm_sm90_seeds_split_k_only_where_tiles_are_few_and_k_is_long():
    g = GemmSm90()
    seeds = g.seeds(hgemm_problem(64, 64, 16384))
    # one 64 x 64 tile, 256 k-tiles: 64 x 16 tiles split 16 ways in one (non-portable) cluster fill 64
    # blocks; then 64 x 64 split about sqrt(256) ways; then the atomic split of the cost model
    assert [(c["BM"], c["BN"], c["SPLIT_K"], c["REDUCE"], c["EPI"]) for c in seeds[:2]] == [
        (64, 16, 16, "cluster", "direct"), (64, 64, 16, "cluster", "direct")]
    first = seeds[2]
    assert first["SPLIT_K"] == 64 and (first["BM"], first["BN"]) == (64, 64) and first["REDUCE"] == "atomic"
    assert {**first, "SPLIT_K": 1, "REDUCE": "ordered"} == seeds[3]  # the same tiles unsplit come next
    assert {**first, "REDUCE": "ordered"} in seeds  # and the deterministic reduction
    # "fill 64": the widest tile whose split (nearest sqrt(k-tiles)) makes 64 blocks: 64 x 32 in 8 splits
    assert [g.seeds(hgemm_problem(64, 256, 4096))[0][k] for k in ("BN", "SPLIT_K", "REDUCE")] == [32, 8, "cluster"]
    # ... unless that leaves a block 64 k-tiles: 64 x 64 split 8 (128 blocks) goes first
    assert [[c[k] for k in ("BN", "SPLIT_K")] for c in g.seeds(hgemm_problem(64, 1024, 16384))[:2]] == [[64, 8], [64, 4]]
    assert g.valid(seeds[0], hgemm_problem(64, 64, 16384)) and not g.valid({**seeds[0], "SPLIT_K": 32}, hgemm_problem(64, 64, 16384))
    # 16384 x 4096 in 128 x 256 tiles already fills the GPU: no split seeds, split configs pruned
    big = hgemm_problem(16384, 4096, 1024)
    assert all(c["SPLIT_K"] == 1 for c in g.seeds(big))
    assert not g.valid({**g.seeds(big)[0], "SPLIT_K": 2, "REDUCE": "atomic"}, big)
    # 64 tiles of 128 x 128 split 2 ways beat 128 one-wave tiles of 128 x 64 on a long K ...
    assert [g.seeds(hgemm_problem(1024, 1024, 16384))[0][k] for k in ("BM", "BN", "SPLIT_K")] == [128, 128, 2]
    # ... but not on K = 4096, where the atomic reduction's traffic costs more than the split saves
    assert [g.seeds(hgemm_problem(1024, 1024, 4096))[0][k] for k in ("BM", "BN", "SPLIT_K")] == [128, 64, 1]
    # few 64 x 64 tiles: split in a cluster (no workspace), 4+ k-tiles a split, direct stores
    few = g.seeds(hgemm_problem(256, 256, 1024))[0]
    assert (few["BM"], few["BN"], few["SPLIT_K"], few["REDUCE"], few["EPI"]) == (64, 64, 4, "cluster", "direct")
    # 64 tiles of 16 k-tiles: two 64 x 64 splits in a cluster are the second guess
    assert {**g.seeds(hgemm_problem(1024, 256, 1024))[1], "STAGES": 0} == {**g.seed_config(hgemm_problem(1024, 256, 1024), 64, 64, 2, "direct", "cluster"), "STAGES": 0}
    # short K on few tiles: narrow 64 x 16 tiles second (4x the blocks), direct stores, a stage per k-tile
    narrow = g.seeds(hgemm_problem(256, 256, 256))[1]
    assert (narrow["BM"], narrow["BN"], narrow["STAGES"], narrow["EPI"]) == (64, 16, 4, "direct")
    assert g.seeds(hgemm_problem(64, 64, 64))[0]["STAGES"] == 3  # one k-tile: 3 stages, not 8
    assert g.seeds(hgemm_problem(4096, 4096, 64))[0]["STAGES"] > 3  # 8 waves of tiles: deep, to prefetch the next
    assert all(c["BN"] >= 64 for c in g.seeds(hgemm_problem(64, 4096, 256)))  # 256 narrow tiles: not seeded
    assert all(c["SPLIT_K"] == 1 for c in g.seeds(hgemm_problem(4096, 4096, 4096)))
    assert all(c["SPLIT_K"] == 1 for c in g.seeds(hgemm_problem(64, 64, 256)))  # K too short to split
    for shape in ((64, 64, 64), (16384, 16384, 16384), (1000, 704, 336), (64, 16384, 1024)):
        p = hgemm_problem(*shape)
        assert g.seeds(p) and all(g.valid(c, p) for c in g.seeds(p))


def test_split_k_launch_allocates_zeroed_scratch_inside_the_call():
    g, p = GemmSm90(), hgemm_problem(64, 64, 16384)
    cand = g.render(g.seed_config(p, 64, 64, split=64, reduce="atomic"), p)
    # atomic: one zeroed buffer (one memset per call) holds the fp32 sum and the per-tile counters
    assert cand.launch.scratch == (("(M * N + cdiv(M, 64) * cdiv(N, 64),)", "float32", "zeros"),)
    ordered = g.render(g.seed_config(p, 64, 64, split=64), p)  # every split writes its own partial: only the counters are zeroed
    assert ordered.launch.scratch == (("(64, M, N)", "float32", "empty"), ("(cdiv(M, 64) * cdiv(N, 64),)", "int32", "zeros"))
    assert "scratch0" in cand.launch.args and "getattr(torch, init)" in cand.module_source()
    plain = g.render(g.seeds(hgemm_problem(4096, 4096, 4096))[0], hgemm_problem(4096, 4096, 4096))
    assert plain.launch.scratch == () and "scratch0" not in plain.launch.args


def test_families_for_another_gpu_are_left_out_once_the_gpu_is_known():
    p = hgemm_problem(2048, 2048, 2048)
    tp = TemplateProposer(seed=1)
    on_a100 = [config_of(tp.propose_candidate(p, "SEED", None, [], "8.0").source)["family"] for _ in range(3)]
    assert on_a100 == ["gemm_sm80"] * 3
    assert config_of(TemplateProposer().propose_candidate(p, "SEED", None, [], "9.0").source)["family"] == "gemm_sm90"
    with pytest.raises(NotCovered, match="not for compute capability 7.5"):
        TemplateProposer().propose_candidate(p, "SEED", None, [], "7.5")


def test_the_first_proposals_are_seeds_even_once_one_is_correct():
    """The population asks to IMPROVE as soon as one seed is correct; the template search still tries
    its next heuristic seeds first (here: the unsplit tiles after a split-K seed), then mutates."""
    p = hgemm_problem(1024, 64, 1024)
    tp = TemplateProposer(seed=0, seeds_first=4)
    first = tp.propose_candidate(p, "SEED", None, [], "9.0")
    parent = Member(1, "k", "ok", 0.2, 1.2, 0, 0, ("tensor_core",), source=first.source)
    nxt = [config_of(tp.propose_candidate(p, "IMPROVE", parent, [], "9.0").source) for _ in range(5)]
    seeds = [dict(c, family="gemm_sm90") for c in GemmSm90().seeds(p)]
    assert config_of(first.source) == seeds[0] and nxt[0] == seeds[1] and nxt[0]["SPLIT_K"] == 1
    assert nxt[1] == seeds[2] and nxt[2]["family"] == "gemm_sm80"  # our third guess, then the other family's best
    # four seeds, then mutations of the parent (one or two knobs changed; it may land on a later seed)
    changed = [k for k in GemmSm90().knobs if nxt[3][k] != seeds[0][k]]
    assert nxt[3]["family"] == "gemm_sm90" and 1 <= len(changed) <= 2 and nxt[3] not in nxt[:3]


def test_multicast_clusters_and_narrow_tiles_are_constrained_and_launched_to_match():
    g, p = GemmSm90(), hgemm_problem(1000, 704, 4104)
    base = dict(BM=128, BN=64, STAGES=6, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma")
    assert g.valid({**base, "CLUSTER_M": 2, "CLUSTER_N": 4}, p)  # 8 tiles x 11 tiles: room for 2 x 4
    assert not g.valid({**base, "CLUSTER_M": 4, "CLUSTER_N": 4}, p)  # past the portable cluster size of 8
    assert not g.valid({**base, "CLUSTER_M": 2, "SPLIT_K": 2, "REDUCE": "atomic"}, p)  # one tile a block, not split
    assert not g.valid({**base, "CLUSTER_N": 2}, hgemm_problem(1000, 64, 256))  # one tile column: nothing to share
    mc = g.render({**base, "CLUSTER_M": 2, "CLUSTER_N": 2}, p)
    # a block per tile, clusters of 2 x 2 tiles; each block loads half of A's rows and half of B's k-rows
    assert mc.launch.grid == "(cdiv(M, 256) * cdiv(N, 128) * 4,)"
    assert mc.launch.args[:2] == ("tma_2d(in0, 64, 64)", "tma_2d(in1, 64, 32)")
    assert "__cluster_dims__(CS, 1, 1)" in mc.source and "multicast::cluster" in mc.source
    # a config stored before the cluster knobs existed renders exactly as the 1 x 1 default
    assert g.render(base, p).source == g.render({**base, "CLUSTER_M": 1, "CLUSTER_N": 1}, p).source
    assert "multicast::cluster" not in g.render(base, p).source and "__cluster_dims__" not in g.render(base, p).source
    # narrow tiles: one 64-row consumer, direct stores, B's box swizzled by its row bytes (none for 16 bytes)
    narrow = {**base, "BM": 64, "BN": 16, "EPI": "direct", "STAGES": 16}
    assert g.valid(narrow, p) and not g.valid({**narrow, "EPI": "tma"}, p) and not g.valid({**narrow, "BM": 128}, p)
    for bn, box in ((8, "tma_2d(in1, 8, 64, 0)"), (16, "tma_2d(in1, 16, 64, 32)"), (32, "tma_2d(in1, 32, 64, 64)")):
        cand = g.render({**narrow, "BN": bn}, p)
        assert cand.launch.args[1] == box and cand.launch.block == "(256,)", bn
    tp = TemplateProposer(seed=5)  # mutating an old config fills the new knobs with their defaults
    child = tp.mutate(base, g, p)
    assert set(child) == set(g.knobs) and sum(child[k] != {**base, **g.DEFAULTS}[k] for k in g.knobs) in (1, 2)


def test_one_consumer_tiles_are_constrained_seeded_and_launched_to_match():
    g, p = GemmSm90(), hgemm_problem(1000, 704, 4104)
    base = dict(BM=64, BN=128, STAGES=8, GROUP_M=8, SPLIT_K=1, REDUCE="ordered", EPI="tma", CLUSTER_M=1, CLUSTER_N=1)
    one = {**base, "ONE_CONSUMER": True}
    assert g.valid(one, p) and g.valid({**one, "BM": 128, "BN": 64}, p) and g.valid({**one, "BN": 256, "STAGES": 4}, p)
    assert not g.valid({**one, "BN": 64}, p)  # already one consumer: a second spelling of the same kernel
    assert not g.valid({**one, "BM": 128, "BN": 256, "STAGES": 4}, p)  # 256 accumulators a thread would spill
    # one warpgroup of m64n128 wgmmas and the producer: 256 threads; two consumers: 384 threads of m64n64
    cand, two = g.render(one, p), g.render({**base, "ONE_CONSUMER": False}, p)
    assert cand.launch.block == "(256,)" and "m64n128k16" in cand.source and "setmaxnreg" not in cand.source
    assert two.launch.block == "(384,)" and "m64n64k16" in two.source
    # configs stored before the knob render as two consumers, as they always did
    assert "ONE_CONSUMER" not in base and g.render(base, p).source == two.source
    # the seeds put 64 x 128 and 128 x 64 tiles in one consumer, and no other tile
    seeds = g.seeds(hgemm_problem(1024, 1024, 1024))
    assert [(c["BM"], c["BN"]) for c in seeds if c["ONE_CONSUMER"]] and all(
        c["ONE_CONSUMER"] == ((c["BM"], c["BN"]) in ((64, 128), (128, 64))) for c in seeds)


def test_cluster_split_partials_travel_by_stores_or_bulk_copies_by_slice_size():
    """A cluster-reduced split sends each block's rows of its partial to the owner: slices under 1 KiB by
    st.async stores of the fragments, larger ones by one bulk copy per receiver; the received partials
    sit past the stages, and a 64 x 64 tile split 8 ways with 6 stages still leaves room for two blocks
    per multiprocessor (the seeds count on it: clusters of 8-16 blocks then fit in half the SMs)."""
    g, p = GemmSm90(), hgemm_problem(256, 256, 16384)
    base = dict(GROUP_M=8, REDUCE="cluster", EPI="direct", STAGES=6)
    by_stores = {**base, "BM": 64, "BN": 16, "SPLIT_K": 16}  # 4 rows x 24 floats: 384 bytes
    by_copies = {**base, "BM": 64, "BN": 64, "SPLIT_K": 8}  # 8 rows x 72 floats: 2304 bytes
    assert g.reduce_slice_bytes(by_stores) == 384 and g.reduce_slice_bytes(by_copies) == 2304
    stores_src, copies_src = g.render(by_stores, p).source, g.render(by_copies, p).source
    assert "st_async_f2(smem_u32(" in stores_src and "bulk_copy_to(smem_u32(" not in stores_src
    assert "bulk_copy_to(smem_u32(" in copies_src and "st_async_f2(smem_u32(" not in copies_src
    # the bytes each block expects: 15 others x 4 rows x 16 floats, or 7 others x 8 padded rows of 72
    assert "mbar_expect_tx(reduced, (SPLIT_K - 1) * (BM / SPLIT_K) * BN * 4)" in stores_src
    assert "mbar_expect_tx(reduced, (SPLIT_K - 1) * (BM / SPLIT_K) * RED_LD * 4)" in copies_src
    stages = 6 * (64 + 64) * 64 * 2
    assert g.recv_at(by_copies) == stages and g.pipe_bytes(by_copies) == stages + 7 * 8 * 72 * 4
    two_blocks = (228 * 1024) // 2 - 1024  # an H100 SM's shared memory, less the 1 KiB each block reserves
    assert g.smem_bytes(by_copies) <= two_blocks
    unsplit = {**by_copies, "SPLIT_K": 1, "REDUCE": "ordered"}
    assert "bulk_copy_to" not in g.render(unsplit, p).source and g.pipe_bytes(unsplit) == stages


def test_bf16_gemms_are_covered_by_the_half_precision_gemm_families_and_compile(tmp_path):
    from template_helpers import half_gemm_problem, half_linear_problem

    from cuforge.kernels.gemm import LinearSm90

    p = half_gemm_problem(tmp_path, 1000, 704, 336)
    assert [f.name for f in families_for(p)[0]][:2] == ["gemm_sm90", "gemm_sm80"]
    for fam in (GemmSm90(), GemmSm80()):
        smoke_compile(fam, p, SMOKE)  # random configs too: split-K in each reduction, multicast, narrow tiles
        cand = fam.render(fam.seeds(p)[0], p)
        assert "__nv_bfloat16" in cand.source and ".bf16.bf16" in cand.source and cand.launch.outputs[0][1] == "bfloat16"
    linear = half_linear_problem(tmp_path, 100, 136, 1032, "F.gelu(self.linear(x))")
    assert families_for(linear)[0][0].name == "linear_sm90"
    smoke_compile(LinearSm90(), linear, SMOKE)
    # an fp32 matmul run in bf16, as `--dtype bf16` casts it
    assert families_for(load_in_dtype(load_problem("level1/matmul_square"), "bf16"))[0][0].name == "gemm_sm90"
    mixed = half_gemm_problem(tmp_path, 64, 64, 64, dtype="float32")
    assert "fp16 or both bf16" in GemmSm90().supports(mixed)


def test_the_linear_family_takes_any_layer_of_a_model_with_or_without_bias(tmp_path):
    from template_helpers import problem_from_expr

    from cuforge.kernels.gemm import LinearSm90, match_linear

    fam = LinearSm90()
    half = "dtype=torch.bfloat16"
    no_bias = problem_from_expr(tmp_path, "F.gelu(self.l(x), approximate='tanh')", f"torch.randn(256, 512, {half})", "x",
                                f"        self.l = nn.Linear(512, 1024, bias=False, {half})")
    found = match_linear(no_bias)
    assert found.bias is None and found.act == "gelu_tanh" and found.weight == "param0"
    smoke_compile(fam, no_bias, 2)
    # LLaMA's MLP in fp16: each projection (no bias) is a part of its own, the second and third
    # reading parameters other than the model's first
    from cuforge.problems.suites import load_suite

    swiglu = next(p for p in load_suite("models").problems if p.id == "models/swiglu_mlp@fp16")
    assert families_for(swiglu)[0][0].describe(swiglu) == "4 kernels over 5 of 5 ops (linear_sm90 x3, pointwise)"
    fp32 = problem_from_expr(tmp_path, "self.l(x)", "torch.randn(64, 64)", "x", "        self.l = nn.Linear(64, 64)")
    assert "fp16 or all bf16" in fam.supports(fp32)
    scaled = problem_from_expr(tmp_path, "torch.relu(self.l(x)) * 2", f"torch.randn(64, 64, {half})", "x",
                               f"        self.l = nn.Linear(64, 64, {half})")
    assert "not a linear layer" in fam.supports(scaled)
    odd = problem_from_expr(tmp_path, "self.l(x)", f"torch.randn(64, 60, {half})", "x", f"        self.l = nn.Linear(60, 64, {half})")
    assert "multiples of 8" in fam.supports(odd)
