"""The implicit-GEMM convolution family on the CPU: which traced graphs it matches (and the reason it
gives for those it does not), its per-channel epilogue operands, its launch geometry, and NVRTC
compiles of its seeds and random configs over 1-D, 2-D and 3-D, strided, padded and dilated shapes."""

import pytest

from cuforge.kernels.leaves import channel_kind
from cuforge.kernels.conv import ConvTf32x3Sm90, flat_lead, flat_pitch, macs_per_output, per_value_epilogue
from cuforge.kernels.conv_match import match_conv
from cuforge.kernels.families import families_for
from cuforge.runtime import compile_cuda
from template_helpers import CHECK_COMPILE, conv_problem, problem_from_expr, smoke_compile

FAM = ConvTf32x3Sm90()


@pytest.mark.parametrize("shape, full, kind", [
    ((64, 1, 1), (8, 64, 30, 30), "ch"), ((1, 64, 1, 1), (8, 64, 30, 30), "ch"), ((64,) + (1,) * 3, (2, 64, 5, 6, 7), "ch"),
    ((8, 64, 30, 30), (8, 64, 30, 30), "rc"), ((1,), (8, 64, 30, 30), "s"), ((30,), (8, 64, 30, 30), None),
    ((64,), (8, 64, 30, 30), None), ((64, 30, 1), (8, 64, 30, 30), None), ((8, 1, 1, 1), (8, 64, 30, 30), None),
])
def test_operands_broadcast_per_channel_per_element_or_as_one_value(shape, full, kind):
    assert channel_kind(shape, full) == kind


def test_a_conv_with_bias_and_a_per_channel_chain_is_matched(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3)", "(2, 64, 34, 35)", "torch.relu(y) + self.bias")
    assert families_for(p)[0][0].name == FAM.name
    f = match_conv(p)
    assert (f.n, f.c, f.c_out, f.spatial, f.kernel, f.out_spatial, f.taps) == (2, 64, 128, (34, 35), (3, 3), (32, 33), 9)
    assert [kind for _, kind in f.epilogue.tensors] == ["ch", "ch"]  # the conv's bias, then self.bias
    assert f.epilogue.body.splitlines()[0] == "v = v + e0[(r % 128)];"
    seeds = FAM.seeds(p)
    launch = FAM.render(next(c for c in seeds if not c.get("FLAT")), p).launch
    assert [pre[0] for pre in launch.pre] == ["conv_tf32x3_sm90_split"] * 2
    assert launch.outputs == (("(NB, CO, OH, OW)", "float32"),)
    # a 32 x 33 output: FLAT tiles (35-column planes) cover 92% of their pixels, TH x TW ones at most 69%
    assert seeds[0]["FLAT"] == 1
    assert [pre[0] for pre in FAM.render(seeds[0], p).launch.pre] == ["conv_tf32x3_sm90_pad_x", "conv_tf32x3_sm90_split"]


@pytest.mark.parametrize("layer, x_shape, tail, why", [
    ("nn.Conv2d(8, 16, 3, groups=2)", "(2, 8, 10, 10)", "y", "grouped"),
    ("nn.Conv2d(8, 16, 3)", "(2, 8, 10, 10)", "torch.softmax(y, dim=1)", "epilogue"),
])
def test_what_is_not_an_implicit_gemm_convolution_says_why(tmp_path, layer, x_shape, tail, why):
    p = conv_problem(tmp_path, layer, x_shape, tail)
    reason = FAM.supports(p)
    assert reason is not None and why in reason.replace("does not broadcast", "broadcast").replace("not an elementwise epilogue", "epilogue"), reason


def test_an_operand_per_image_column_is_read_at_its_broadcast_index(tmp_path):
    # Neither per element nor per channel (refused before): read at the index the flat one gives.
    p = conv_problem(tmp_path, "nn.Conv2d(8, 16, 3)", "(2, 8, 18, 18)", "y + self.bias.view(1, 1, 1, 16)")
    f = match_conv(p)
    assert [kind for _, kind in f.epilogue.tensors] == ["ch", "b1x1x1x16"]
    assert "e1[((r * (long long)cols + c) % 16LL)]" in f.epilogue.body, f.epilogue.body
    smoke_compile(FAM, p, 1)


def test_strided_padded_dilated_geometry_reaches_the_launch(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 3, 40, 41)")
    f = match_conv(p)
    assert (f.stride, f.padding, f.dilation, f.out_spatial) == ((2, 1), (1, 2), (2, 1), (19, 41))
    c = FAM.seeds(p)[0]
    launch = FAM.render(c, p).launch
    _, th, tw = FAM.tile(c, 2)
    assert launch.args[0] == f"tma_nd(scratch0, (32, {tw * 1}, {th * 2}, 1), (1, 1, 2, 1))"  # innermost first: W, H
    assert ("OH", "(IH + 2 - 4 - 1) // 2 + 1") in launch.bindings
    assert not FAM.valid({**c, "TW": 8, "TH": 16, "BN": 16}, p) or 16 * 2 <= 256


def test_a_transposed_convolution_runs_as_one_ordinary_convolution_per_output_phase(tmp_path):
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(8, 24, 3, stride=2, padding=1, output_padding=1)", "(2, 8, 10, 11)",
                     "torch.clamp(y + self.bias, -1, 1)")
    f = match_conv(p)
    assert f.transposed and (f.c, f.c_out, f.out_spatial, f.output_padding) == (8, 24, (20, 22), (1, 1))
    c = FAM.seeds(p)[0]
    launch = FAM.render(c, p).launch
    _, th, tw = FAM.tile(c, 2)
    assert ("CO", "param1.shape[1]") in launch.bindings  # the weight is [C, C_out, kh, kw]
    assert ("OH", "(IH - 1) * 2 - 2 + 2 + 1 + 1") in launch.bindings
    assert launch.args[0] == f"tma_nd(scratch0, (32, {tw}, {th}, 1), (1, 1, 1, 1))"  # a phase reads its input densely
    assert f"cdiv(cdiv(OH, 2), {th}) * 2" in launch.grid  # four phases
    assert launch.pre[1][3] == "(param1, scratch1, CO * 9, C, CP, 1)"  # [C][C_out * taps] -> [C_out][tap][C]
    assert "#define TRANSPOSED 1" in FAM.render(c, p).source


def test_few_input_channels_fold_the_inner_taps_into_the_channel_vector(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 3, 40, 41)")
    seeds = FAM.seeds(p)
    assert seeds[0]["FOLD"] == 2 and seeds[1] == {**seeds[0], "FOLD": 0}  # 15 taps x 3 channels: one k-tile of 48
    launch = FAM.render(seeds[0], p).launch
    binds = dict(launch.bindings)
    assert binds["CP"] == "(15 * C + 3) // 4 * 4" and binds["XH"] == "IH + 1" and binds["XW"] == "IW + 2"
    assert [pre[0] for pre in launch.pre] == ["conv_tf32x3_sm90_fold_x", "conv_tf32x3_sm90_fold_w"]
    assert launch.scratch[0][0] == "(2 * NB, XH, XW, CP)" and launch.scratch[1][0] == "(2 * CO, 1, CP)"
    assert not FAM.valid({**seeds[0], "FOLD": 2}, conv_problem(tmp_path, "nn.ConvTranspose2d(3, 8, 3)", "(2, 3, 9, 9)"))


def test_a_one_d_tile_is_loaded_in_boxes_the_stride_allows(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv1d(64, 128, 3, stride=3, dilation=4)", "(2, 64, 3000)")
    seeds = FAM.seeds(p)
    assert seeds and all(c["TW"] * 3 <= 256 for c in seeds)
    launch = FAM.render(seeds[0], p).launch
    assert launch.args[0] == f"tma_nd(scratch0, (32, {seeds[0]['TW'] * 3}, 1), (1, 3, 1))"
    assert "cdiv(OW, 128)" in launch.grid


@pytest.mark.parametrize("layer, x_shape", [
    ("nn.ConvTranspose1d(6, 10, 4, stride=3, padding=1, dilation=2)", "(2, 6, 50)"),
    ("nn.ConvTranspose3d(4, 8, 3, stride=2, padding=1, output_padding=1)", "(2, 4, 5, 6, 7)"),
    ("nn.Conv1d(5, 24, 7, stride=3, padding=2)", "(3, 5, 500)"),
    ("nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 3, 40, 41)"),
    ("nn.Conv3d(9, 32, 3, padding=1)", "(2, 9, 9, 10, 11)"),
])
def test_seeds_and_random_configs_compile(tmp_path, layer, x_shape):
    p = conv_problem(tmp_path, layer, x_shape)
    assert FAM.supports(p) is None, FAM.supports(p)
    for c in FAM.seeds(p):
        td, th, tw = FAM.tile(c, x_shape.count(",") - 1)
        assert td * th * tw == 128 and FAM.valid(c, p)
    smoke_compile(FAM, p, 2)


def test_the_input_read_as_it_lies_needs_no_planes(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(20, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 20, 40, 44)")
    c = {**FAM.seeds(p)[0], "DIRECT": 1, "FOLD": 0}
    assert FAM.valid(c, p)
    launch = FAM.render(c, p).launch
    _, th, tw = FAM.tile(c, 2)
    # x itself, innermost first (W densely with 4 floats of slack for the aligned start, H strided, its channels,
    # the image), unswizzled; only the weight is split before
    assert launch.args[0] == f"tma_nd(in0, ({tw + 4}, {th * 2}, 32, 1), (1, 2, 1, 1), 0)"
    assert [pre[0] for pre in launch.pre] == ["conv_tf32x3_sm90_split"] and launch.scratch[0][0] == "(1,)"
    assert "#define DIRECT 1" in FAM.render(c, p).source
    # a stage: the weight's two tiles and the raw boxes (32 channels x TH rows of TW + 4 floats, to whole KiB);
    # the split tiles (2 x 128 rows x 128 bytes) past the ring
    raw = -(-32 * th * (tw + 4) * 4 // 1024) * 1024
    assert int(launch.shared_mem) == c["STAGES"] * (2 * c["BN"] * 128 + raw) + 2 * 128 * 128 + 1024 + 16 * c["STAGES"]
    assert not FAM.valid({**c, "FOLD": 1}, p)  # folded planes are built from x
    odd = conv_problem(tmp_path, "nn.Conv2d(20, 16, 3)", "(2, 20, 30, 30)")  # rows of 120 bytes: no TMA stride
    assert not FAM.valid({**FAM.seeds(odd)[0], "DIRECT": 1, "FOLD": 0}, odd)
    # W read every 5th: the box reads W densely from the boundary, 5 floats an output (5 x 31 + 4 to 16 bytes),
    # and a tile of 64 outputs would need rows past TMA's 256
    strided = conv_problem(tmp_path, "nn.Conv1d(40, 16, 3, stride=5)", "(2, 40, 2000)")
    direct = [c for c in FAM.seeds(strided) if c.get("DIRECT")]
    assert direct == [{**direct[0], "TW": 32}], FAM.seeds(strided)
    assert FAM.render(direct[0], strided).launch.args[0] == "tma_nd(in0, (160, 32, 1), (1, 1, 1), 0)"
    assert "#define XW (TRANSPOSED ? 1 : SW)" in FAM.render(direct[0], strided).source
    assert not FAM.valid({**direct[0], "TW": 64}, strided)


def test_dense_w_tiles_span_every_phase_of_w(tmp_path):
    # DENSE_W: a transposed convolution's tile is TW consecutive pixels along W (all phases), one box of the
    # inputs they reach ((TW - 1) / S + 2 floats and the aligned start's 3, to 16 bytes); H keeps its phases.
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(32, 64, 3, stride=5, padding=1, dilation=2)", "(2, 32, 12, 16)")
    c = {"BN": 64, "TW": 128, "TH": 1, "GROUP_M": 8, "FOLD": 0, "STAGES": 4, "DIRECT": 1, "DENSE_W": 1}
    assert FAM.valid(c, p)
    launch = FAM.render(c, p).launch
    assert launch.args[0] == "tma_nd(in0, (32, 1, 32, 1), (1, 1, 1, 1), 0)"
    assert launch.grid == "(NB * cdiv(cdiv(OH, 5), 1) * 5 * cdiv(OW, 128) * cdiv(CO, 64),)"
    assert "#define DENSE_W 1" in FAM.render(c, p).source
    assert not FAM.valid({**c, "DIRECT": 0}, p)  # the split gives unreached pixels their zeros
    assert FAM.valid({**c, "TW": 32, "TH": 4}, p)  # a 2-D tile is one box whatever its width
    one_d = conv_problem(tmp_path, "nn.ConvTranspose1d(32, 64, 3, stride=2, padding=1, dilation=2)", "(2, 32, 1000)")
    assert FAM.valid(c, one_d) and not FAM.valid({**c, "TW": 64}, one_d)  # a 1-D tile is one box of 128
    plain = conv_problem(tmp_path, "nn.ConvTranspose1d(32, 64, 3)", "(2, 32, 1000)")  # stride 1: no phases
    assert not FAM.valid(c, plain)
    assert not FAM.valid(c, conv_problem(tmp_path, "nn.Conv1d(32, 64, 3, stride=2)", "(2, 32, 1000)"))
    for q in (p, one_d):
        assert FAM.name in compile_cuda(FAM.render(c, q).source, arch="sm_90a", options=CHECK_COMPILE).signatures
    # Seeded second where an output value takes few multiply-adds (32 channels x 9 / 25 taps here): its stores,
    # not its MACs, bound it; not where it takes many (64 x 9 / 4)
    assert macs_per_output(FAM.matched(p)) == 32 * 9 / 25 and FAM.seeds(p)[1].get("DENSE_W") == 1
    heavy = conv_problem(tmp_path, "nn.ConvTranspose2d(64, 64, 3, stride=2, padding=1)", "(2, 64, 16, 16)")
    assert macs_per_output(FAM.matched(heavy)) == 144 and not any(s.get("DENSE_W") for s in FAM.seeds(heavy))


def test_the_first_seed_tile_covers_the_output_with_least_waste(tmp_path):
    # level1/69's width: a 128-wide tile computes 384 pixels a row for 260 output pixels; 32 x 4 tiles compute
    # 288 (and 12 rows for 10). The widest shape leads only while no other covers the output 5% better.
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(64, 128, (3, 5))", "(1, 64, 8, 256)")
    f = FAM.matched(p)
    assert f.out_spatial == (10, 260)
    assert FAM.covered_share({"TW": 128, "TH": 1}, f) == pytest.approx(260 / 384)
    assert FAM.covered_share({"TW": 32, "TH": 4}, f) == pytest.approx(260 / 288 * 10 / 12)
    assert FAM.tile_shapes(f, 128) == [(32, 4), (128, 1), (16, 8)]
    # (FLAT tiles over padded planes cover 2600 of 2688 and lead; the TH x TW tiles follow)
    assert [(s["TW"], s["TH"], s.get("FLAT", 0)) for s in FAM.seeds(p)[:2]] == [(128, 1, 1), (32, 4, 0)]
    # 3-D (level1/61's 66-wide phases): 16 x 4 x 2 tiles cover 80%, 128-wide rows 52%
    cube = FAM.matched(conv_problem(tmp_path, "nn.ConvTranspose3d(8, 16, 3)", "(1, 8, 64, 64, 64)"))
    assert FAM.tile_shapes(cube, 128)[0] == (16, 4)
    # a width the wide tile divides keeps it first
    even = FAM.matched(conv_problem(tmp_path, "nn.Conv2d(32, 64, 3, padding=1)", "(1, 32, 16, 256)"))
    assert FAM.covered_share({"TW": 128, "TH": 1}, even) == 1.0 and FAM.tile_shapes(even, 128)[0] == (128, 1)


@pytest.mark.parametrize("layer, x_shape", [
    ("nn.Conv1d(40, 16, 5, padding=2, dilation=3)", "(2, 40, 2000)"),
    ("nn.Conv3d(9, 32, 3, padding=1)", "(2, 9, 9, 10, 12)"),
    ("nn.ConvTranspose2d(32, 64, 3, stride=2, padding=1, output_padding=1)", "(3, 32, 17, 16)"),
    ("nn.Conv1d(64, 128, 3, stride=3, dilation=4)", "(2, 64, 4000)"),  # W every 3rd (KernelBench level1/76's)
    ("nn.Conv2d(32, 32, 3, stride=2)", "(2, 32, 33, 68)"),
])
def test_direct_configs_compile(tmp_path, layer, x_shape):
    p = conv_problem(tmp_path, layer, x_shape)
    direct = [d for d in ({**c, "DIRECT": 1, "FOLD": 0} for c in FAM.seeds(p)) if FAM.valid(d, p)]
    assert direct
    for d in direct:
        cand = FAM.render(d, p)
        assert FAM.name in compile_cuda(cand.source, arch="sm_90a", options=CHECK_COMPILE).signatures


def test_flat_tiles_run_over_padded_planes(tmp_path):
    # level2/11's transposed convolution, fewer images: a 34 x 34 output fills at most 60% of any TH x TW tile's
    # pixels; FLAT tiles are 128 flat indices of planes padded to 38 columns (34 + the kernel's reach), of which
    # the columns past 34 and the last tile's end are dropped: 1156 of 1408 computed pixels are outputs.
    p = conv_problem(tmp_path, "nn.ConvTranspose2d(64, 128, 5, stride=1, padding=1)", "(2, 64, 32, 32)")
    f = FAM.matched(p)
    seed = FAM.seeds(p)[0]
    assert seed["FLAT"] == 1 and (seed["TW"], seed["TH"]) == (128, 1) and FAM.valid(seed, p)
    assert FAM.covered_share(seed, f) == pytest.approx(1156 / 1408)
    assert FAM.seeds(p)[-1] == {**seed, "EPI_RUNS": 1}  # the flat tile again, its epilogue by runs
    assert max(FAM.covered_share(c, f) for c in FAM.seeds(p)[1:-1]) == pytest.approx(34 / 48 * 34 / 40)
    # the transposed tap k reaches output o from x[o + P - k D]: the plane starts D (K - 1) - P = 3 before x
    assert (flat_pitch(f), flat_lead(f, 0), flat_lead(f, 1)) == (38, 3, 3)
    launch = FAM.render(seed, p).launch
    assert launch.pre[0] == ("conv_tf32x3_sm90_pad_x", "(cdiv(1444, 32), cdiv(CP, 32), NB * 1)", "(32, 8)",
                             "(in0, scratch0, C, CP, 1, IH, IW, 1, 38, 0, 3, 3)")
    assert launch.scratch[0][0] == "(2 * NB, 1444, CP)" and launch.args[0] == "tma_nd(scratch0, (32, 128, 1))"
    assert launch.grid == "(NB * cdiv(OH * 38, 128) * cdiv(CO, 64),)"
    assert "#define FLAT 1" in FAM.render(seed, p).source and "#define WP 38" in FAM.render(seed, p).source
    # an ordinary convolution's plane starts P before x; a tile of four boxes of 32 pixels
    plain = conv_problem(tmp_path, "nn.Conv2d(16, 24, (3, 5), padding=(2, 1), dilation=(2, 3))", "(2, 16, 19, 23)")
    g = FAM.matched(plain)
    assert (flat_pitch(g), flat_lead(g, 0), flat_lead(g, 1)) == (g.out_spatial[1] + 12, 2, 1)
    four = {**seed, "TW": 32, "BN": 32}
    assert FAM.valid(four, plain) and FAM.render(four, plain).launch.args[0] == "tma_nd(scratch0, (32, 32, 1))"
    for c, q in ((seed, p), (four, plain), ({**four, "PERSIST": 1, "OVERLAP": 1}, plain)):
        assert FAM.name + "_pad_x" in compile_cuda(FAM.render(c, q).source, arch="sm_90a", options=CHECK_COMPILE).signatures
    # 3-D: planes of padded depths, a tile 128 flat pixels of one depth (the depth a TMA coordinate of its own)
    cube = conv_problem(tmp_path, "nn.ConvTranspose3d(16, 24, (2, 3, 3), padding=(0, 1, 1))", "(2, 16, 5, 20, 24)")
    h = FAM.matched(cube)
    assert h.out_spatial == (6, 20, 24) and (flat_lead(h, 0), flat_lead(h, 1), flat_lead(h, 2)) == (1, 1, 1)
    flat3 = {**seed, "BN": 32}
    assert FAM.valid(flat3, cube) and FAM.covered_share(flat3, h) == pytest.approx(480 / 640)
    launch = FAM.render(flat3, cube).launch
    assert launch.pre[0][1:] == ("(cdiv(572, 32), cdiv(CP, 32), NB * 7)", "(32, 8)",
                                 "(in0, scratch0, C, CP, ID, IH, IW, 7, 22, 1, 1, 1)")
    assert launch.scratch[0][0] == "(2 * NB, 7, 572, CP)" and launch.args[0] == "tma_nd(scratch0, (32, 128, 1, 1))"
    assert launch.grid == "(NB * OD * cdiv(OH * 26, 128) * cdiv(CO, 32),)"
    assert FAM.name + "_pad_x" in compile_cuda(FAM.render(flat3, cube).source, arch="sm_90a", options=CHECK_COMPILE).signatures
    # not where a stride, a single dim, folded channels or x read as it lies breaks the fixed tap offsets
    for layer, x_shape in (("nn.Conv2d(16, 24, 3, stride=(1, 2))", "(2, 16, 20, 24)"),
                           ("nn.ConvTranspose2d(16, 24, 3, stride=2)", "(2, 16, 20, 24)"),
                           ("nn.Conv3d(16, 24, 3, stride=(2, 1, 1))", "(2, 16, 6, 20, 24)"), ("nn.Conv1d(16, 24, 3)", "(2, 16, 200)")):
        assert not FAM.valid({**seed, "BN": 32}, conv_problem(tmp_path, layer, x_shape)), layer
    assert not FAM.valid({**four, "DIRECT": 1}, plain) and not FAM.valid({**four, "FOLD": 1}, plain)
    assert not FAM.valid({**seed, "TH": 2, "TW": 64}, p)
    # where TH x TW tiles already fill the output, no FLAT seed
    even = conv_problem(tmp_path, "nn.Conv2d(32, 64, 3, padding=1)", "(1, 32, 16, 256)")
    assert not any(c.get("FLAT") for c in FAM.seeds(even))


@pytest.mark.parametrize("layer, x_shape", [
    ("nn.Conv2d(64, 128, 3, padding=1)", "(2, 64, 30, 30)"),
    ("nn.Conv2d(16, 32, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1))", "(4, 16, 40, 41)"),
    ("nn.ConvTranspose2d(32, 64, 3, stride=2, padding=1, output_padding=1)", "(3, 32, 17, 16)"),
    ("nn.Conv2d(20, 16, 3)", "(4, 20, 40, 44)"),
    ("nn.Conv1d(40, 16, 3, stride=5, dilation=2)", "(2, 40, 2000)"),
    ("nn.Conv3d(16, 32, 3, padding=1)", "(2, 16, 12, 20, 24)"),
])
def test_one_tf32_pass_only_where_the_contract_allows_tf32(tmp_path, layer, x_shape):
    # Under PyTorch's default flags cuDNN computes a convolution of 16 or more input channels in TF32: the
    # family leads with one TF32 product per k-tile (PASSES 1) there, in half the shared memory a stage,
    # never under fp32.
    strict = conv_problem(tmp_path, layer, x_shape)
    assert all(c.get("PASSES", 3) == 3 for c in FAM.seeds(strict))
    assert not FAM.valid({**FAM.seeds(strict)[0], "PASSES": 1}, strict)
    assert all(c.get("PASSES", 3) == 3 for c in FAM.seeds(strict.under("kernelbench")))  # 1e-4 against cuDNN's TF32
    default = strict.under("pytorch")
    seeds = FAM.seeds(default)
    ones = [c for c in seeds if c.get("PASSES") == 1]
    def without_stages(c):  # noqa: ANN001, ANN202
        return {k: v for k, v in c.items() if k not in ("STAGES", "PASSES")}

    assert seeds[0]["PASSES"] == 1 and [without_stages(c) for c in ones] == [without_stages(c) for c in seeds[len(ones):]]
    assert all(a["STAGES"] >= b["STAGES"] for a, b in zip(ones, seeds[len(ones):]))
    assert all(FAM.smem_bytes(c) < FAM.smem_bytes({**c, "PASSES": 3}) for c in ones if not c.get("DIRECT"))
    for c in ones:
        cand = FAM.render(c, default)
        assert "#define PASSES 1" in cand.source
        mod = compile_cuda(cand.source, arch="sm_90a", options=(*cand.launch.options, *CHECK_COMPILE))
        assert FAM.name in mod.signatures and len(mod.cubin) > 0, c


def test_few_input_channels_are_not_seeded_with_one_tf32_pass(tmp_path):
    # cuDNN keeps 3-channel convolutions in fp32 under the default flags: a TF32 kernel would be a downgrade.
    p = conv_problem(tmp_path, "nn.Conv3d(3, 64, 3, padding=1)", "(2, 3, 12, 20, 24)").under("pytorch")
    assert all(c.get("PASSES", 3) == 3 for c in FAM.seeds(p))
    assert FAM.seeds(conv_problem(tmp_path, "nn.Conv3d(16, 32, 3, padding=1)", "(2, 16, 12, 20, 24)").under("pytorch"))[0]["PASSES"] == 1


def test_the_search_drops_one_tf32_pass_where_it_was_judged_a_downgrade(tmp_path):
    # cuDNN picks TF32 per shape: where PyTorch's default computation stayed fp32, the judge calls a TF32
    # kernel a downgrade, and the search then proposes only 3xTF32 configs for that problem.
    from cuforge.agent.template_proposer import TemplateProposer

    p = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3, padding=1)", "(2, 64, 30, 30)").under("pytorch")
    assert families_for(p)[0][0].name == FAM.name
    search = TemplateProposer(seed=1)
    first = search.propose_candidate(p, "IMPROVE", None, [], "9.0")
    assert first.meta["config"]["PASSES"] == 1
    search.learn(p, first.source, "wrong_output")  # any other failure: nothing learned
    assert search.propose_candidate(p, "IMPROVE", None, [], "9.0").meta["config"].get("PASSES") == 1
    search.learn(p, first.source, "cheat:precision_downgrade")
    fp32 = [c for c in FAM.seeds(p) if c.get("PASSES", 3) == 3]
    proposed = [search.propose_candidate(p, "IMPROVE", None, [], "9.0").meta for _ in fp32 * 2]
    covering = {f.name: f for f in families_for(p)[0]}
    # the implicit GEMM's 3xTF32 configs among other covering families' configs, none of one TF32 product
    ours = [m["config"]["PASSES"] for m in proposed if m["family"] == FAM.name]
    assert ours and set(ours) == {3}
    assert not any(covering[m["family"]].reduced_precision(m["config"]) for m in proposed)


def test_the_epilogue_by_runs_stages_both_consumers_tiles_and_compiles_over_every_layout(tmp_path):
    # EPI_RUNS: each consumer warpgroup's 64 pixels x BN channels staged as fp32 rows of 68: in the stage ring
    # where a block has one tile (no more shared memory), past the barriers where it walks tiles (PERSIST)
    p = conv_problem(tmp_path, "nn.Conv2d(64, 256, 1, bias=False)", "(2, 64, 20, 20)", "torch.relu(y + self.bias)")
    seed = {**FAM.seeds(p)[0], "STAGES": 2}
    runs = {**seed, "EPI_RUNS": 1}
    assert FAM.smem_bytes(runs) == FAM.smem_bytes(seed)
    assert FAM.smem_bytes({**runs, "PERSIST": 1}) == FAM.smem_bytes({**seed, "PERSIST": 1}) + 2 * seed["BN"] * 68 * 4
    assert FAM.valid(runs, p) and "#define EPI_RUNS 1" in FAM.render(runs, p).source
    assert "#define EPI_RUNS 0" in FAM.render(seed, p).source  # a config from before the knob: fragment order
    # a pooled output's sums never reach the output value by value
    pooled = conv_problem(tmp_path, "nn.Conv2d(16, 32, 3)", "(2, 16, 12, 12)", "torch.relu(y).mean(dim=(2, 3))")
    pool_seed = FAM.seeds(pooled)[0]
    assert FAM.valid(pool_seed, pooled) and not FAM.valid({**pool_seed, "EPI_RUNS": 1}, pooled)
    # flat planes, tiles of rows, the persistent grid with the epilogue beside the next tile's products, x read
    # as it lies, a transposed convolution's phases; fp32 (three TF32 products) and one TF32 product
    transposed = conv_problem(tmp_path, "nn.ConvTranspose2d(48, 32, 3, stride=2, padding=1, output_padding=1)", "(2, 48, 9, 11)")
    cases = [(p, {**seed, "FLAT": 1, "TW": 128, "TH": 1}), (p.under("pytorch"), {**seed, "FLAT": 0, "TW": 32, "TH": 4, "PASSES": 1}),
             (p, {**seed, "FLAT": 0, "TW": 16, "TH": 8, "PERSIST": 1, "OVERLAP": 1, "BN": 64}),
             (p, {**seed, "FLAT": 0, "TW": 32, "TH": 4, "DIRECT": 1}), (transposed, {**FAM.seeds(transposed)[0], "STAGES": 2})]
    for q, c in cases:
        c = {**c, "EPI_RUNS": 1}
        assert FAM.valid(c, q), c
        assert FAM.name in compile_cuda(FAM.render(c, q).source, arch="sm_90a", options=CHECK_COMPILE).signatures



def test_the_epilogue_by_runs_leads_where_the_epilogue_works_per_value(tmp_path):
    # a bias and an activation: fp32 fragments store whole sectors already, so the first seed with it comes last
    light = conv_problem(tmp_path, "nn.Conv2d(64, 128, 3)", "(2, 64, 20, 20)", "torch.relu(y) + self.bias")
    seeds = FAM.seeds(light)
    assert not per_value_epilogue(FAM.matched(light)) and len(seeds) > 2
    assert not any(c.get("EPI_RUNS") for c in seeds[:-1]) and seeds[-1] == {**seeds[0], "EPI_RUNS": 1}
    # a batch norm's parameters (and, under PyTorch's flags, the one-TF32-product copies): every seed with it,
    # then the first without
    init = "        self.conv = nn.Conv2d(64, 128, 3)\n        self.bn = nn.BatchNorm2d(128)\n        self.eval()"
    heavy = problem_from_expr(tmp_path, "torch.relu(self.bn(self.conv(a)))", "torch.randn(2, 64, 20, 20)", args="a", init=init)
    assert per_value_epilogue(FAM.matched(heavy))
    seeds = FAM.seeds(heavy)
    assert "EPI_RUNS" not in seeds[-1] and seeds[0] == {**seeds[-1], "EPI_RUNS": 1}
    # all but the persistent seed, whose staged tiles would need shared memory its stages leave no room for
    assert [c.get("EPI_RUNS", 0) for c in seeds[:-1]] == [1 - c.get("PERSIST", 0) for c in seeds[:-1]]
    ones = FAM.seeds(heavy.under("pytorch"))
    assert ones[0] == {**seeds[0], "PASSES": 1, "STAGES": ones[0]["STAGES"]} and ones[len(seeds):] == seeds


def test_x_laid_out_16_bytes_a_thread_access_as_flat_or_plain_planes(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(72, 16, 3, padding=1)", "(2, 72, 13, 21)")
    flat = {**next(c for c in FAM.seeds(p) if c.get("FLAT")), "XVEC": 1}
    rows = {**flat, "FLAT": 0, "TW": 32, "TH": 4}
    assert FAM.valid(flat, p) and FAM.valid(rows, p)
    assert not FAM.valid({**rows, "DIRECT": 1}, p) and not FAM.valid({**rows, "FOLD": 1}, p)  # no planes / folded planes
    launch = FAM.render(flat, p).launch  # padded planes, rows of 23
    assert launch.pre[0] == ("conv_tf32x3_sm90_pad_xv", "(cdiv(345, 64), cdiv(CP, 64), NB * 1)", "(256,)",
                             "(in0, scratch0, C, CP, 1, IH, IW, 1, 15, 0, 1, 1, 23)")
    launch = FAM.render(rows, p).launch  # _split's plain planes: no padding, rows of IW
    assert launch.pre[0] == ("conv_tf32x3_sm90_pad_xv", "(cdiv(IH * IW, 64), cdiv(CP, 64), NB * 1)", "(256,)",
                             "(in0, scratch0, C, CP, 1, IH, IW, 1, IH, 0, 0, 0, IW)")
    for c in (flat, rows):
        assert FAM.name + "_pad_xv" in compile_cuda(FAM.render(c, p).source, arch="sm_90a", options=CHECK_COMPILE).signatures
