"""benchmarks/search_power.py on CPU: config generation, the dry run, reading a run's store."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status
from evo.store import Store

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "search_power.py"


@pytest.fixture(scope="module")
def sp():
    spec = importlib.util.spec_from_file_location("search_power", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["search_power"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_default_tasks_cover_every_template_family_and_have_cold_seeds(sp):
    from evo.tasks.seeds import SEEDS, cold_task

    fams = {SEEDS[t].template for t in sp.DEFAULT_TASKS}
    assert fams == {"elementwise", "rowreduce", "gemm_bf16_sm90", "gemm_f32_3xtf32", "matvec"}
    assert {"gelu_bf16", "gemm_bf16", "gemm_bf16_irregular"} <= set(sp.DEFAULT_TASKS)
    for t in sp.DEFAULT_TASKS:
        assert cold_task(t).name == f"{t}_cold"


def test_generated_config_turns_on_tuning_and_profiling_for_the_cold_task(sp, tmp_path):
    from evo.config import load_config, load_tasks

    args = sp.parse_args(["--tasks", "kb23_softmax", "--budget", "60", "--wall-minutes", "6"])
    cfg_path = sp.write_inputs("kb23_softmax", tmp_path, args)
    cfg = load_config(cfg_path)
    assert list(cfg.tasks.include) == ["kb23_softmax_cold"]
    assert cfg.mutator.kind == "knobs" and cfg.tuning.enabled and cfg.profile.enabled
    assert cfg.search.max_evaluations == 60 and cfg.search.max_wall_minutes == 6
    from evo.engine.search import seed_for
    from evo.tasks.seeds import cold_params

    assert seed_for("kb23_softmax_cold", load_tasks(cfg))[1] == cold_params("kb23_softmax")


def test_dry_run_runs_evo_search_dry_run_per_task(sp, tmp_path):
    rc = sp.main(["--dry-run", "--tasks", "kb19_relu", "--work", str(tmp_path), "--out", str(tmp_path / "t.md")])
    log = (tmp_path / "kb19_relu" / "commands.log").read_text()
    assert rc == 0, log
    assert "search" in log and "--dry-run" in log and "kb19_relu_cold" in log and "ok" in log
    assert not (tmp_path / "t.md").exists()  # a dry run measures nothing, so it writes no table


def test_unknown_task_fails_before_any_run(sp, tmp_path):
    from evo.tasks.seeds import UnknownSeedError
    from evo.tasks.registry import UnknownTaskError

    with pytest.raises((UnknownSeedError, UnknownTaskError)):
        sp.main(["--dry-run", "--tasks", "nope", "--work", str(tmp_path)])


def test_bench_speedup_reads_evo_bench_tables(sp, tmp_path):
    from evo.results.bench import BenchRow, results_table

    rows = [BenchRow("kb19_relu", "n=1", "fp32", 1.0, 0.5, 2.0, "-", 50.0, "ok"),
            BenchRow("kb19_relu", "n=2", "fp32", 1.0, 0.125, 8.0, "-", 50.0, "ok"),
            BenchRow("kb19_relu", "n=3", "fp32", 1.0, None, None, "-", None, "incorrect"),
            BenchRow("other", "n=1", "fp32", 1.0, 0.1, 10.0, "-", 50.0, "ok")]
    f = tmp_path / "b.md"
    f.write_text("# t\n\n" + "\n".join(results_table(rows)) + "\n")
    assert sp.bench_speedup(f, "kb19_relu") == pytest.approx(4.0)
    assert sp.bench_speedup(f, "missing") is None


def _timing(fit):
    return Evaluation("", (StageResult("timing", Status.OK),), fit)


def test_read_row_reports_improvements_by_operator_reach_profiles_and_trials(sp, tmp_path):
    db = tmp_path / "evo.db"
    store = Store(db)
    rid = store.create_run("r", {}, seed=0, config_hash="")
    t = "kb19_relu_cold"
    seed = Candidate.create(t, "// s\n", {}, operator=Operator.SEED, island=-1)
    knob = Candidate.create(t, "// k\n", {}, parents=(seed.id,), operator=Operator.KNOBS, island=0)
    bad = Candidate.create(t, "// b\n", {}, parents=(seed.id,), operator=Operator.KNOBS, island=0)
    opt = Candidate.create(t, "// o\n", {}, parents=(knob.id,), operator=Operator.OPTUNA, island=0)
    cross = Candidate.create(t, "// c\n", {}, parents=(knob.id, opt.id), operator=Operator.CROSSOVER, island=1)
    fits = {seed.id: 1.0, knob.id: 1.5, opt.id: 1.9, cross.id: 2.05}
    for c in (seed, knob, bad, opt, cross):
        store.add_candidate(rid, c)
        if c is bad:
            store.add_evaluation(rid, Evaluation(c.id, (StageResult("compile", Status.COMPILE_ERROR, "x"),)))
        else:
            store.add_evaluation(rid, Evaluation(c.id, (StageResult("compile", Status.OK, seconds=9.0),
                                                        StageResult("correctness", Status.OK, seconds=0.5),
                                                        StageResult("timing", Status.OK, seconds=1.5)), fits[c.id]))
    store.add_profile(knob.id, shape="n=1", gpu="H200", metrics={"bound": "memory"})
    store.add_profile(cross.id, shape="n=1", gpu="H200", metrics={"bound": "memory"})
    store.add_tuning_trial(rid, knob.id, 0, {"A": "1"}, 1.5, "complete", knob.id)
    store.add_tuning_trial(rid, knob.id, 1, {"A": "2"}, 1.9, "complete", opt.id)
    store.log_event(rid, "tuning_done", {"parent": knob.id})
    store.log_event(rid, "profile", {"id": knob.id, "status": "ok", "ncu_wall_s": 4.25})
    store.log_event(rid, "profile", {"id": cross.id, "status": "ok", "ncu_wall_s": 4.5})
    store.log_event(rid, "profiling_off", {"reason": "ncu captured no kernel from the candidates' calls"})
    store.set_champion(rid, t, cross.id, 2.05, {"confirmed": True, "baseline_id": seed.id, "verdict": "faster",
                                                  "gain": {"ratio": 2.0, "low": 1.9, "high": 2.1, "confidence": 0.95,
                                                           "rounds": 3, "method": "paired-t-log"}})
    store.close()
    row = sp.read_row(sp.Row(task="kb19_relu", budget=60, hand_bench=2.0), db)
    assert row.run_id == rid and row.evaluations == 5 and row.correct == 4 and row.cold == 1.0 and row.best == 2.05
    assert row.improvements == [(2, "knobs", 1.5), (4, "optuna", 1.9), (5, "crossover", 2.05)]
    assert row.evals_to_reach == 4  # 1.9 >= 0.95 * 2.0
    assert row.profiled == 2 and row.profiled_outside_topk == 0
    # a store whose studies logged no counts: read from the trial records, where trial 0 (the
    # parent's own point, a candidate of operator knobs) is a known point and was not asked
    assert (row.optuna_trials, row.optuna_evaluated, row.optuna_told, row.studies, row.studies_finished) \
        == (1, 1, 0, 1, 1)
    assert row.optuna_sized is None and "optuna counts read from the trial records" in " ".join(row.notes)
    assert any(n.startswith("profiling off: ncu captured no kernel") for n in row.notes)
    assert row.funnel == {"compile:compile_error": 1} and row.verdict == "faster"
    assert any("5 of 60" in n for n in row.notes)
    text = sp.table([row], command="x", budget=60)
    assert "| kb19_relu | 1.000x | 2.050x |" in text and "faster 2.000 [1.900, 2.100]" in text
    # GPU seconds: correctness + timing (not compile) of 3 mutations and 1 trial; ncu's wall of 2 profiles
    assert row.gpu_s == {"mutations": 6.0, "trials": 2.0, "profiles": 8.8}
    assert "| 2 / 4 | 1 / 1 / 0 / -; 1 / 1 | 6 / 2 / 9 |" in text
    assert "optuna trials asked / evaluated / told / sized; studies / finished" in text
    assert "2: knobs 1.500, 4: optuna 1.900, 5: crossover 2.050" in text


def test_a_search_short_of_the_hand_tuned_seed_says_why(sp, tmp_path):
    db = tmp_path / "evo.db"
    store = Store(db)
    rid = store.create_run("r", {}, seed=0, config_hash="")
    seed = Candidate.create("x_cold", "// s\n", {}, operator=Operator.SEED, island=-1)
    store.add_candidate(rid, seed)
    store.add_evaluation(rid, Evaluation(seed.id, (StageResult("timing", Status.OK),), 1.0))
    store.close()
    row = sp.read_row(sp.Row(task="x", budget=1, hand_bench=2.0), db)
    assert row.evals_to_reach is None
    assert any("50% of hand-tuned" in n and "no child beat the cold seed" in n and "no optuna" in n for n in row.notes)


def test_rows_of_earlier_calls_are_kept(sp, tmp_path):
    out = tmp_path / "r.md"
    sp.save([sp.Row(task="a", budget=60, improvements=[(3, "knobs", 1.2)])], out, command="c", budget=60)
    (r,) = sp.load_rows(out)
    assert r.task == "a" and r.improvements == [(3, "knobs", 1.2)]


def test_checkpoint_folds_the_write_ahead_log_into_the_database_file(sp, tmp_path):
    import shutil
    import sqlite3

    db = tmp_path / "evo.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    con.commit()
    sp.checkpoint(db)
    shutil.copy(db, tmp_path / "copy.db")   # the file alone, as a GPU call brings it back
    assert sqlite3.connect(tmp_path / "copy.db").execute("SELECT count(*) FROM t").fetchone() == (100,)
    con.close()


def test_versus_hand_pairs_the_champion_with_the_hand_tuned_seed_of_the_cold_task(sp):
    """The champion is timed against the hand-tuned seed (built for the cold task) in paired
    rounds, on the runtime it is given: fake stages whose fitness follows the tunables, so a
    champion with better tunables is `faster` and one with worse is `slower`."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from evaluators.base import CompileSettings, HarnessSettings
    from evo.engine.local_runtime import LocalRuntime
    from evo.engine.seams import Stages
    from fakes import stages as fake

    rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False),
                      compile_settings=CompileSettings(), harness_settings=HarnessSettings(),
                      num_gpus=1, num_cpus=1).start()
    try:
        good = Candidate.create("kb19_relu_cold", fake.SOURCE, {"TILE": "128", "STAGES": "4", "VEC": "4"})
        bad = Candidate.create("kb19_relu_cold", fake.SOURCE, {"TILE": "16", "STAGES": "1", "VEC": "1"})
        up = sp.versus_hand(rt, "kb19_relu", good, fake.fitness_of(good.params_dict))
        assert up["verdict"] == "faster" and up["gain"]["ratio"] > 1 and up["gain"]["rounds"] == fake.PAIRED_REPS, up
        from evo.tasks.seeds import seed_params, seed_source

        hand = fake.fitness_of(seed_params("kb19_relu"), seed_source("kb19_relu"))
        assert up["gain"]["ratio"] == pytest.approx(fake.fitness_of(good.params_dict) / hand, rel=1e-6)
        down = sp.versus_hand(rt, "kb19_relu", bad, fake.fitness_of(bad.params_dict))
        assert down["verdict"] in ("slower", "no significant gain") and down["gain"]["ratio"] <= 1, down
    finally:
        rt.shutdown()
    text = sp.table([sp.Row(task="kb19_relu", budget=60, vs_hand=up)], command="x", budget=60)
    assert f"| faster {up['gain']['ratio']:.3f} [" in text


def test_the_gap_to_the_hand_tuned_point_names_tunables_never_evaluated(sp):
    hand = {"BLOCK": "512", "CLUSTER": "8", "VEC": "4"}
    best = {"BLOCK": "1024", "CLUSTER": "4", "VEC": "4"}
    values = {"BLOCK": {"128", "512", "1024"}, "CLUSTER": {"1", "2", "4"}, "VEC": {"4"}}
    assert sp.hand_gap(best, hand, values) == ("best vs hand-tuned: BLOCK 1024 vs 512, CLUSTER 4 vs 8; "
                                               "never evaluated: CLUSTER=8")
    assert sp.hand_gap(hand, hand, values) == "the best point has the hand-tuned tunables"
    assert sp.hand_gap(best, {}, values) == ""


def test_a_short_row_of_a_built_in_task_compares_its_best_point_with_the_hand_tuned_one(sp, tmp_path):
    from evo.tasks.seeds import cold_params, seed_params

    db = tmp_path / "evo.db"
    store = Store(db)
    rid = store.create_run("r", {}, seed=0, config_hash="")
    seed = Candidate.create("kb23_softmax_cold", "// s\n", cold_params("kb23_softmax"), operator=Operator.SEED,
                            island=-1)
    store.add_candidate(rid, seed)
    store.add_evaluation(rid, Evaluation(seed.id, (StageResult("timing", Status.OK),), 1.0))
    store.close()
    row = sp.read_row(sp.Row(task="kb23_softmax", budget=1, hand_bench=2.0), db)
    hand = seed_params("kb23_softmax")
    assert row.best_params == {k: str(v) for k, v in cold_params("kb23_softmax").items()}
    assert row.hand_gap.startswith("best vs hand-tuned: ") and f"BLOCK 128 vs {hand['BLOCK']}" in row.hand_gap
    assert "never evaluated: BLOCK=512" in row.hand_gap and row.hand_gap in row.notes[-1]
