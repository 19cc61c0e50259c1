"""benchmarks/stage_times.py finds a built-in suite's problem by id, in the dtype the id names (as the judge
loads it: cast), or a problem file by path; anything else exits naming it."""


import pytest

from conftest import ROOT, benchmark_module


def test_a_suite_problem_by_id_in_its_dtype_or_a_file_by_path():
    st = benchmark_module("stage_times")
    half = st.load("models/resnet_bottleneck@bf16")
    assert half.id == "models/resnet_bottleneck@bf16" and half.meta.cast == "bfloat16"
    assert st.load("models/resnet_bottleneck").meta.cast is None
    path = ROOT / "src" / "cuforge" / "problems" / "builtin" / "models" / "rotary_half.py"
    own = st.load(str(path))  # the file lists fp32, bf16 and fp16: its own dtype is the one profiled
    assert own.source == path.read_text() and own.meta.cast is None
    with pytest.raises(SystemExit, match="models/nope: no such file, nor a problem of the 'models' suite"):
        st.load("models/nope")


def test_one_call_s_launches_in_order_averaged_over_the_calls():
    st = benchmark_module("stage_times")
    # two calls of a partition: its three convolutions share a name and come apart only by their order
    seen = [(t0 + dt, name, ms * scale) for t0, scale in ((0.0, 1.0), (100.0, 3.0))
            for dt, name, ms in ((1, "pad", 0.5), (2, "conv", 2.0), (3, "conv", 1.0), (4, "conv", 4.0))]
    assert st.in_launch_order(list(reversed(seen)), 2) == [
        {"kernel": "pad", "ms": 1.0}, {"kernel": "conv", "ms": 4.0}, {"kernel": "conv", "ms": 2.0}, {"kernel": "conv", "ms": 8.0}]
    assert st.in_launch_order(seen[:-1], 2) is None  # the calls launched different counts
    swapped = seen[:4] + [seen[5], seen[4]] + seen[6:]
    assert st.in_launch_order([(s[0], n, s[2]) for s, n in zip(seen, [k[1] for k in swapped])], 2) is None  # different orders
    assert st.in_launch_order([], 1) is None
