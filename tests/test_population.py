import pytest

from cuforge.agent.population import Member, Population, register_bucket, source_key, technique_tags


def member(cid, fitness, status="ok", island=0, cell=("plain", "regs:?"), parents=(), speedup=None):
    return Member(cid, f"k{cid}", status, fitness, speedup if speedup is not None else (fitness if status == "ok" else None),
                  island, 0, cell, parents)


def test_archive_keeps_the_best_per_cell_and_failures_apart():
    pop = Population(islands=2, migration_interval=0)
    assert pop.mode() == "SEED"
    assert not pop.add(member(1, -2.0, "wrong_output"))
    assert pop.mode() == "FIX" and pop.fix_target(0).candidate_id == 1
    assert pop.add(member(2, 0.1))
    assert not pop.add(member(3, 0.05))  # same cell, worse
    assert pop.add(member(4, 0.3))  # same cell, better: replaces
    assert pop.add(member(5, 0.2, cell=("shared_memory", "regs<=64")))  # new cell
    assert {m.candidate_id for m in pop.correct_members(0)} == {4, 5}
    assert pop.mode() == "IMPROVE" and pop.best().candidate_id == 4


def test_fix_mode_prefers_failures_closest_to_working():
    pop = Population(islands=1)
    pop.add(member(1, -1.0, "compile_error"))
    pop.add(member(2, -2.0, "wrong_output"))
    assert all(pop.fix_target(0).candidate_id == 2 for _ in range(20))


def test_selection_favours_fit_parents_and_penalises_prolific_ones():
    pop = Population(islands=1, migration_interval=0, seed=1)
    pop.add(member(1, 0.0))
    pop.add(member(2, 1.0, cell=("vectorized", "regs:?")))
    picks = [pop.select_parent(0).candidate_id for _ in range(400)]
    assert picks.count(2) > picks.count(1)
    for i in range(30):  # member 2 has had many children now
        pop.add(member(100 + i, -2.0, "compile_error", parents=(2,)))
    picks = [pop.select_parent(0).candidate_id for _ in range(400)]
    assert picks.count(1) > picks.count(2)


def test_migration_moves_elites_around_the_ring():
    pop = Population(islands=3, migration_interval=0)
    pop.add(member(1, 0.5, island=0))
    assert not pop.correct_members(1)
    pop.migrate()
    assert [m.candidate_id for m in pop.correct_members(1)] == [1]
    pop.migrate()
    assert [m.candidate_id for m in pop.correct_members(2)] == [1]


def test_dedup_ignores_whitespace_and_comments():
    pop = Population()
    src = "class ModelNew:  # v1\n    pass\n"
    pop.add(Member(1, source_key(src), "ok", 0.1, 1.1, 0, 0, ("plain",)))
    assert pop.is_duplicate("class ModelNew:\n        pass   # v2\n")
    assert not pop.is_duplicate("class ModelNew:\n    x = 1\n")


def test_descriptors():
    assert technique_tags("__global__ void k() { __shared__ float s[32]; float4 v; }") == ("shared_memory", "vectorized")
    assert technique_tags("x = 1") == ("plain",)
    assert register_bucket({"kernels": [{"registers": 40}]}) == "regs<=64"
    assert register_bucket(None) == "regs:?"
    with pytest.raises(ValueError):
        Population(islands=0)
