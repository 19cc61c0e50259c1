"""benchmarks/family_configs.py's --vary: the keys that set a knob in a family, a pipeline's stages or a
partition's kernel parts, and a varied config that takes more shared memory given fewer stages where
only that fits (one part's count lowered alone when that is enough); --precision refuses a contract it
does not know."""

import sys

from conftest import ROOT, benchmark_module

from cuforge.kernels.families import families_for
from cuforge.problems.suites import load_problem


def test_a_knob_is_varied_in_every_part_that_has_it_with_the_stages_that_fit():
    fc = benchmark_module("family_configs")
    p = load_problem("models/resnet_bottleneck@bf16")  # a partition: three convolutions, each with its batch norm and activation
    fam = families_for(p)[0][0]
    assert fam.name == "partition" and fc.knob_keys(fam, p, "EPI_RUNS") == ["p1.EPI_RUNS", "p2.EPI_RUNS", "p3.EPI_RUNS"]
    # the widest channel tile with every stage that fits, on a persistent grid (its staged tiles then need
    # shared memory of their own; a block of one tile stages them in its idle stage ring)
    first = fam.seeds(p)[0]  # the half convolutions' seeds lead with the epilogue by runs
    assert [first[k] for k in fc.knob_keys(fam, p, "EPI_RUNS")] == [1, 1, 1]
    seed = {**{k: v for k, v in first.items() if not k.endswith(".EPI_RUNS")}, "p3.PERSIST": 1}
    assert seed["p3.BN"] == 128 and seed["p3.STAGES"] == 5 and fam.valid(seed, p)
    off, on = fc.varied([seed], fam, p, "EPI_RUNS", [0, 1])
    assert off == {**seed, "p1.EPI_RUNS": 0, "p2.EPI_RUNS": 0, "p3.EPI_RUNS": 0}
    # the persistent 128-channel part runs one stage fewer; the others keep theirs
    assert on == {**seed, "p1.EPI_RUNS": 1, "p2.EPI_RUNS": 1, "p3.EPI_RUNS": 1, "p3.STAGES": 4}
    assert fam.valid(on, p) and not fam.valid({**on, "p3.STAGES": 5}, p)
    assert fc.knob_keys(fam, p, "NO_SUCH_KNOB") == []
    assert fc.varied([seed], fam, p, "NO_SUCH_KNOB", [0, 1]) == [seed]


def test_an_unknown_contract_is_refused_in_one_line_before_any_gpu_work():
    import subprocess

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "family_configs.py"), "models/gru_cell", "--precision", "tf16"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == "--precision tf16: not a contract (one of fp32, pytorch, kernelbench)"
