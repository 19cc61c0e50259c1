"""benchmarks/kernelbench_search.py's choice of files: prefixes for every level or for one (`2/1_`),
shards that share the files out over several calls, a malformed shard refused with its form, which
files the precision flags change; and kernelbench_search_summary's tables under another contract. The
tests that read KernelBench's files skip where ../shared/kernelbench is absent."""

import pytest

from conftest import ROOT, benchmark_module

ks = benchmark_module("kernelbench_search")
needs_kb = pytest.mark.skipif(not ks.KB.is_dir(), reason="../shared/kernelbench is absent")


def names(chosen):
    return [f"{level}/{path.name.split('_')[0]}" for level, path in chosen]


@needs_kb
def test_a_prefix_names_every_level_and_a_qualified_one_a_single_level():
    assert names(ks.files_of(["1", "2"], ["1_"])) == ["1/1", "2/1"]
    assert names(ks.files_of(["1", "2"], ["2/1_", "1/63_"])) == ["1/63", "2/1"]
    assert names(ks.files_of(["1"], ["2/1_"])) == []  # a level not chosen is not searched for its prefix


@needs_kb
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


summary = benchmark_module("kernelbench_search_summary")


@needs_kb
def test_the_coverage_records_which_files_the_flags_change_and_the_summary_reads_it():
    cov = ks.coverage(ks.files_of(["1", "2"], ["1/19_", "1/63_", "2/9_", "2/4_"]))
    assert [r["flags_matter"] for r in cov["rows"]] == [False, True, True, False]  # level1's first, then level2's
    ids = ["kernelbench/l1_19_ReLU", "kernelbench/l1_63_conv_standard_2D__square_input__square_kernel",
           "kernelbench/l2_9_Matmul_Subtract_Multiply_ReLU", "kernelbench/l2_4_Conv2d_Mish_Mish"]
    assert summary.flag_free(ids, cov) == {ids[0], ids[2]}  # an fp32 matmul keeps TF32 off under both flag sets


def test_the_stored_coverage_record_names_the_98_convolutions_as_changed_by_the_flags():
    rows = summary.load("kb_coverage")["coverage"]["rows"]
    changed = [r["file"] for r in rows if r["flags_matter"]]
    assert len(rows) == 200 and len(changed) == 98 and all("conv" in f.lower() for f in changed)
    ids = ["kernelbench/l1_19_ReLU", "kernelbench/l2_4_Conv2d_Mish_Mish"]
    assert summary.flag_free(ids, summary.load("kb_coverage")["coverage"]) == {ids[0]}


def test_a_file_the_coverage_record_does_not_know_is_named_with_the_command_that_records_it():
    with pytest.raises(SystemExit, match="l1_9999_Nothing: .*--coverage --levels 1,2 --name kb_coverage"):
        summary.flag_free(["kernelbench/l1_9999_Nothing"], {"rows": []})


def row(problem, vs):
    return {"problem": problem, "family": "pointwise", "correct": 1, "vs_torch": vs, "vs_torch_compile": vs,
            "best_ms": 1.0, "recheck": {}}


def test_rows_taken_from_fp32_are_counted_and_named_or_left_out_of_the_file_table(capsys):
    rows = [row("kernelbench/l1_19_ReLU", 2.0), row("kernelbench/l1_63_conv", 0.5)]
    filled = {"kernelbench/l1_19_ReLU": "fp32 (no op the flags change)"}
    summary.search_tables(rows, filled)
    out = capsys.readouterr().out
    assert "| all | 2 | 2 | 1 | 1 | 1.00 | 1.00 |" in out
    assert "| level1/19_ReLU | pointwise | 1.000 | 2.00 | 2.00 | fp32 (no op the flags change) |" in out
    assert "| level1/63_conv | pointwise | 1.000 | 0.50 | 0.50 | this contract |" in out
    summary.search_tables(rows, filled, own_rows_only=True)
    out = capsys.readouterr().out
    assert "| all | 2 | 2 | 1 |" in out and "level1/19_ReLU" not in out and "| level1/63_conv |" in out
    assert "1 files whose ops the flags cannot change" in out


def test_files_the_search_never_reached_are_named_and_keep_an_earlier_row(capsys, tmp_path, monkeypatch):
    reached = {**row("kernelbench/l3_9_ResNet18", 0.5), "evaluations": 1}
    wrong = {**row("kernelbench/l3_24_EfficientNetB2", None), "evaluations": 1, "correct": 0, "best_ms": None}
    unreached = {**row("kernelbench/l3_9_ResNet18", None), "evaluations": 0, "correct": 0, "best_ms": None}
    later = {**unreached, "problem": "kernelbench/l3_5_AlexNet"}
    summary.search_tables([wrong, later])
    out = capsys.readouterr().out
    assert "1 of the 2 files were not evaluated before their search's wall-clock limit" in out
    assert "| level3/5_AlexNet | pointwise | not reached |" in out and "| level3/24_EfficientNetB2 | pointwise | none correct |" in out
    import json

    for name, rows in (("a", [reached]), ("b", [unreached, later])):
        (tmp_path / f"{name}.json").write_text(json.dumps({"search": {"rows": rows}}))
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    final = summary.rows_of(["a", "b"], "3")
    assert final["kernelbench/l3_9_ResNet18"]["vs_torch"] == 0.5 and final["kernelbench/l3_5_AlexNet"]["evaluations"] == 0


@needs_kb
def test_the_flag_dependent_files_are_the_98_convolutions_and_shard_after_the_choice():
    chosen = ks.flag_dependent(ks.files_of(["1", "2"], []))
    assert len(chosen) == 98 and all("conv" in p.name.lower() for _, p in chosen)
    assert names(chosen[:2]) == ["1/50", "1/54"] and names(chosen[1::3][:2]) == ["1/54", "1/57"]


def test_the_gpus_of_a_table_s_rows_are_named_with_their_counts():
    rows = [{"gpu": "NVIDIA H200"}, {"gpu": "NVIDIA H100 80GB HBM3"}, {"gpu": "NVIDIA H200"}, {}]
    assert summary.gpus_line(rows) == ("Measured on NVIDIA H200 (2 files), NVIDIA H100 80GB HBM3 (1 files), "
                                       "unknown GPU (1 files); each ratio side by side on its GPU.")


def test_a_problem_that_turns_tf32_on_itself_counts_as_changed_by_the_flags(tmp_path):
    from template_helpers import problem_from_expr

    plain = problem_from_expr(tmp_path, "a @ b", "torch.randn(64, 32), torch.randn(32, 48)", args="a, b")
    assert not ks.flags_change(plain)  # an fp32 matmul: TF32 off under both flag sets
    own = problem_from_expr(tmp_path, "a @ b", "torch.randn(64, 32), torch.randn(32, 48)", args="a, b",
                            init="        torch.backends.cuda.matmul.allow_tf32 = True")
    assert ks.flags_change(own)


def test_each_family_s_fastest_correct_kernel_is_kept_per_problem(tmp_path):
    from fixture_store import evaluation

    from cuforge.kernels.base import CONFIG_TAG, PY_CONFIG_TAG
    from cuforge.results.store import Store

    s = Store(tmp_path / "c.db")
    s.create_run("r", "fixture", {"provider": "template"})
    rows = [("p", CONFIG_TAG + '{"family": "conv_direct"}', "ok", 2.0), ("p", CONFIG_TAG + '{"family": "conv_direct"}', "ok", 1.5),
            ("p", PY_CONFIG_TAG + '{"family": "partition:library"}', "ok", 1.2),
            ("p", PY_CONFIG_TAG + '{"family": "pipeline"}', "wrong_output", None),  # a wrong kernel has no time
            ("q", CONFIG_TAG + '{"family": "conv_direct"}', "ok", 0.1), ("p", "// hand-written", "ok", 3.0)]
    for i, (problem, first_line, status, ms) in enumerate(rows):
        cid = s.add_candidate("r", problem, {"source": first_line + "\nbody", "format": "module", "proposer": "template"}, f"h{i}")
        s.add_evaluation(cid, "r", evaluation(problem, status, ms, {"torch": 1.0}), reward=0.0)
    assert ks.best_ms_by_family(s, "r") == {"p": {"conv_direct": 1.5, "partition:library": 1.2, "?": 3.0}, "q": {"conv_direct": 0.1}}


def test_each_problem_s_evaluations_say_where_their_time_went(tmp_path):
    from fixture_store import evaluation

    from cuforge.results.store import Store

    s = Store(tmp_path / "c.db")
    s.create_run("r", "fixture", {"provider": "template"})
    phases = {"load": 20.5, "reference": 4.0, "correctness": 9.0, "timing": 3.0}
    for i, (problem, status, judged) in enumerate([("p", "ok", phases), ("p", "wrong_output", {}), ("q", "ok", None)]):
        cid = s.add_candidate("r", problem, {"source": f"src {i}", "format": "module", "proposer": "template"}, f"h{i}")
        ev = evaluation(problem, status, 1.0 if status == "ok" else None, {"torch": 1.0})
        s.add_evaluation(cid, "r", {**ev, "correctness": {"judge_phases_s": judged} if judged is not None else {}}, reward=0.0)
    assert ks.phases_by_problem(s, "r") == {
        "p": [{"status": "ok", "wall_s": 0.3, "phases_s": phases}, {"status": "wrong_output", "wall_s": 0.3, "phases_s": {}}],
        "q": [{"status": "ok", "wall_s": 0.3, "phases_s": {}}]}


def test_a_row_that_was_not_re_timed_keeps_the_earlier_re_timed_one(tmp_path, monkeypatch):
    import json

    def record(name, date, rows):
        (tmp_path / f"{name}.json").write_text(json.dumps({"date": date, "search": {"precision": "pytorch", "rows": rows}}))

    ok = {"problem": "kernelbench/l2_1_A", "vs_torch": 1.5, "vs_torch_compile": 0.8, "recheck": {"status": "ok"}}
    late = {"problem": "kernelbench/l2_1_A", "vs_torch": 1.7, "vs_torch_compile": None,
            "recheck": {"status": "not re-timed: past the benchmark's recheck deadline"}}
    record("kb_search_a", "2026-01-01", [ok])
    record("kb_search_b", "2026-01-02", [late, {**late, "problem": "kernelbench/l2_2_B"}])
    record("kb_search_c", "2026-01-03", [{**ok, "problem": "kernelbench/l2_2_B", "vs_torch_compile": 1.1}])
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    rows = summary.rows_of(summary.records("pytorch"), "2")
    assert rows["kernelbench/l2_1_A"]["vs_torch_compile"] == 0.8  # b's row has no side-by-side ratio
    assert rows["kernelbench/l2_2_B"]["vs_torch_compile"] == 1.1  # a re-timed row replaces one that was not


def test_a_later_row_timed_beside_torch_compile_in_its_search_replaces_a_re_timed_one(tmp_path, monkeypatch):
    import json

    def record(name, date, rows):
        (tmp_path / f"{name}.json").write_text(json.dumps({"date": date, "search": {"precision": "fp32", "rows": rows}}))

    record("kb_search_a", "2026-01-01", [{"problem": "kernelbench/l3_9_R", "vs_torch": 0.14, "vs_torch_compile": 0.2,
                                          "correct": 1, "evaluations": 1, "recheck": {"status": "ok"}}])
    record("kb_search_b", "2026-01-02", [{"problem": "kernelbench/l3_9_R", "vs_torch": 1.31, "vs_torch_compile": 1.33,
                                          "correct": 1, "evaluations": 1,
                                          "recheck": {"status": "not re-timed: the run ended before its recheck"}}])
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    rows = summary.rows_of(summary.records("fp32"), "3")
    assert (rows["kernelbench/l3_9_R"]["vs_torch"], rows["kernelbench/l3_9_R"]["vs_torch_compile"]) == (1.31, 1.33)


@needs_kb
def test_the_rows_a_recheck_left_un_timed_render_back_to_their_configs(tmp_path):
    import json
    import shutil

    from cuforge.kernels.base import config_of
    from cuforge.problems.suites import load_suite

    record = json.loads((ROOT / "benchmarks" / "results" / "kb_search_pytorch_library_rest_s66.json").read_text())
    rows = ks.unchecked_rows(record)
    assert len(rows) == 15 and all(r["recheck"]["status"].startswith("not re-timed") for r in rows)
    suite = tmp_path / "kernelbench"
    suite.mkdir()
    for level, path in ks.problem_files(rows):
        shutil.copy(path, suite / f"l{level}_{path.name}")
    problems = {p.id: p.under("pytorch") for p in load_suite(str(suite)).problems}
    sources = ks.rendered_best(rows, problems)
    assert set(sources) == {r["best_candidate_id"] for r in rows}
    for r in rows:
        rendered = config_of(sources[r["best_candidate_id"]]["source"])
        assert {k: rendered[k] for k in r["best_config"]} == r["best_config"]


def test_a_recheck_of_a_record_that_is_not_there_is_refused():
    with pytest.raises(SystemExit, match="--recheck: no record"):
        ks.recheck("kb_search_no_such_record")


def test_the_fp32_table_shows_default_flag_eager_where_the_flags_change_nothing_or_it_was_timed(capsys):
    def row(pid, vs, recheck=None):
        return {"problem": pid, "family": "f", "correct": 1, "best_ms": 1.0, "vs_torch": vs, "vs_torch_compile": 1.0,
                "recheck": recheck or {"status": "ok"}}

    rows = [row("kernelbench/l1_19_ReLU", 1.5), row("kernelbench/l1_63_conv", 2.0),
            row("kernelbench/l1_64_conv", 3.0, {"status": "ok", "vs_torch.default_flags": 0.9})]
    summary.search_tables(rows, flags_change_nothing={"kernelbench/l1_19_ReLU"})
    out = capsys.readouterr().out
    assert "| vs eager, default flags |" in out
    assert "| level1/19_ReLU | f | 1.000 | 1.50 | 1.00 | 1.50 |" in out  # eager is the same under both flag sets
    assert "| level1/63_conv | f | 1.000 | 2.00 | 1.00 | - |" in out  # cuDNN's TF32 under them: not timed, not guessed
    assert "| level1/64_conv | f | 1.000 | 3.00 | 1.00 | 0.90 |" in out  # re-timed under them


def test_level3_s_coverage_record_is_summed_as_a_search_record_s_coverage():
    cov = summary.coverage_of(summary.load("level3_coverage"))
    assert cov["summary"]["level3"]["files"] == 50 and cov["summary"]["level3"]["covered"] == 44
    assert cov["summary"]["level3"]["by_family"] == {"partition": 42, "pipeline": 2}
    own = {"coverage": {"summary": {}, "rows": []}}
    assert summary.coverage_of(own) is own["coverage"]
