"""benchmarks/stage_times.py finds a built-in suite's problem by id, in the dtype the id names (as the judge
loads it: cast), or a problem file by path; anything else exits naming it."""

import sys

import pytest

from conftest import ROOT


def stage_times():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import stage_times as module
    finally:
        sys.path.pop(0)
    return module


def test_a_suite_problem_by_id_in_its_dtype_or_a_file_by_path():
    st = stage_times()
    half = st.load("models/resnet_bottleneck@bf16")
    assert half.id == "models/resnet_bottleneck@bf16" and half.meta.cast == "bfloat16"
    assert st.load("models/resnet_bottleneck").meta.cast is None
    path = ROOT / "src" / "cuforge" / "problems" / "builtin" / "models" / "rotary_half.py"
    own = st.load(str(path))  # the file lists fp32, bf16 and fp16: its own dtype is the one profiled
    assert own.source == path.read_text() and own.meta.cast is None
    with pytest.raises(SystemExit, match="models/nope: no such file, nor a problem of the 'models' suite"):
        st.load("models/nope")
