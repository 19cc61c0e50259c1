"""benchmarks/kernelbench_search.py's choice of files: prefixes for every level or for one (`2/1_`),
shards that share the files out over several calls, and a malformed shard refused with its form.
Skips where ../shared/kernelbench is absent."""

import pytest

from conftest import benchmark_module

ks = benchmark_module("kernelbench_search")
pytestmark = pytest.mark.skipif(not ks.KB.is_dir(), reason="../shared/kernelbench is absent")


def names(chosen):
    return [f"{level}/{path.name.split('_')[0]}" for level, path in chosen]


def test_a_prefix_names_every_level_and_a_qualified_one_a_single_level():
    assert names(ks.files_of(["1", "2"], ["1_"])) == ["1/1", "2/1"]
    assert names(ks.files_of(["1", "2"], ["2/1_", "1/63_"])) == ["1/63", "2/1"]
    assert names(ks.files_of(["1"], ["2/1_"])) == []  # a level not chosen is not searched for its prefix


def test_shards_share_the_files_out_once_each():
    every = ks.files_of(["1", "2"], [])
    shards = [ks.files_of(["1", "2"], [], (i, 3)) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(every) and sum(map(len, shards)) == len(every) == 200
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("text", ["3/3", "1", "a/2", "-1/2", "1/0"])
def test_a_malformed_shard_is_refused_naming_the_form(text):
    with pytest.raises(SystemExit, match="expected I/N"):
        ks.parse_shard(text)
    assert ks.parse_shard("2/4") == (2, 4)
