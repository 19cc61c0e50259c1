"""A family's config is typed: one frozen dataclass per family with a field per knob, its values the
knob's choices. A config from anywhere (a seed, a mutation, a stored candidate's header) is checked
against it before a kernel is rendered; what is not a point of the knob space is one line naming why."""

import dataclasses
import json

import pytest

from cuforge.kernels import families as F
from cuforge.kernels.base import BadConfig, config_of


def _family(name: str):
    return next(f for f in F.FAMILIES if f.name == name)


def test_each_family_has_a_config_class_with_a_field_per_knob_and_its_choices():
    for fam in F.FAMILIES:
        if fam.name.startswith("staged:"):
            continue  # its head's config and its tail's: see the next test
        cls = fam.config_type
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert list(fields) == list(fam.knobs), fam.name
        for k, f in fields.items():
            assert f.metadata["choices"] == tuple(fam.knobs[k]) and f.type is type(fam.knobs[k][0]), (fam.name, k)
        assert cls.__dataclass_params__.frozen and cls.__name__.endswith("Config")
        for k, v in fam.DEFAULTS.items():  # a knob added later defaults to one of its own values
            assert k in fam.knobs and v in fam.knobs[k], (fam.name, k)
    assert _family("reduce_dim").config_type.__name__ == "ReduceDimConfig"


def test_a_config_is_checked_and_typed_and_survives_a_candidate_header():
    fam = _family("elementwise")
    values = {k: v[0] for k, v in fam.knobs.items()}
    cfg = fam.config(values)
    assert isinstance(cfg, fam.config_type) and dataclasses.asdict(cfg) == values
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.VEC = 2  # type: ignore[misc]
    header = json.dumps({"family": fam.name, **values})  # what a rendered candidate's first line carries
    assert fam.config(json.loads(header)) == cfg


@pytest.mark.parametrize("change, message", [
    ({"VEC": 3}, "elementwise: knob VEC = 3 is not one of 1, 2, 4, 8"),
    ({"VEC": True}, "elementwise: knob VEC = True is not one of 1, 2, 4, 8"),
    ({"VECTOR": 4}, "elementwise has no knob 'VECTOR' (its knobs: VEC, BLOCK, WAVES"),
    ({"family": "softmax_rows"}, "a config of family 'softmax_rows' given to elementwise"),
])
def test_a_config_off_the_knob_space_is_one_line_naming_why(change, message):
    fam = _family("elementwise")
    values = {k: v[0] for k, v in fam.knobs.items()} | change
    with pytest.raises(BadConfig, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as e:
        fam.config(values)
    assert "\n" not in str(e.value)


def test_a_knob_without_a_value_or_a_default_is_named():
    fam = _family("elementwise")
    values = {k: v[0] for k, v in fam.knobs.items()}
    values.pop("BLOCK")
    with pytest.raises(BadConfig, match="elementwise: the config sets no 'BLOCK'"):
        fam.config(values)


def test_rendering_checks_the_config_first(tmp_path):
    from cuforge.problems.suites import load_suite

    problem = next(p for p in load_suite("level1").problems if F.families_for(p)[0] and
                   F.families_for(p)[0][0].name == "elementwise")
    fam = F.families_for(problem)[0][0]
    seed = fam.seeds(problem)[0]
    assert config_of(fam.render(seed, problem).source)["family"] == "elementwise"
    with pytest.raises(BadConfig, match="knob BLOCK = 96"):
        fam.render(seed | {"BLOCK": 96}, problem)


def test_a_staged_family_s_config_is_its_head_s_and_its_tail_s():
    fam = next(f for f in F.FAMILIES if f.name == "staged:conv_tf32x3_sm90+pool")
    cls = fam.config_type
    assert cls.__name__ == "ConvTf32x3Sm90ThenPoolConfig"
    assert [(f.name, f.type) for f in dataclasses.fields(cls)] == [("head", fam.head.config_type), ("tail", fam.tail.config_type)]
    values = {f"h.{k}": v[0] for k, v in fam.head.knobs.items()} | {f"t.{k}": v[0] for k, v in fam.tail.knobs.items()}
    cfg = fam.config(values)
    assert cfg.head == fam.head.config({k[2:]: v for k, v in values.items() if k.startswith("h.")})
    with pytest.raises(BadConfig, match="^pool: knob"):
        fam.config(values | {f"t.{next(iter(fam.tail.knobs))}": -7})
    with pytest.raises(BadConfig, match=r"has no knob 'BN' \(its knobs: the head's as h\.\*"):
        fam.config(values | {"BN": 64})


def test_a_pipeline_s_config_is_its_stages_configs():
    """Which families a pipeline's stages are depends on the problem: its config keys each stage's knobs
    s0.*, s1.*, ..., and each stage's family checks its own part when it renders."""
    cfg = F.PIPELINE.config({"family": "pipeline", "s0.BX": 32, "s1.VEC": 4, "s0.TY": 8})
    assert cfg.stages == ((("BX", 32), ("TY", 8)), (("VEC", 4),))
    with pytest.raises(BadConfig, match=r"pipeline has no knob 'VEC' \(its knobs: each stage's as s0"):
        F.PIPELINE.config({"VEC": 4})
