"""CLI contract: every command documents itself with an example, and the inspection
commands work against a store built here (no GPU, no Ray)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evo.cli import app
from evo.core.records import Candidate, Evaluation, StageResult, Status

runner = CliRunner()


def _commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_root_help_lists_commands():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    for name in ("search", "runs", "top", "show", "lineage", "tasks", "check"):
        assert name in res.output


@pytest.mark.parametrize("name", _commands())
def test_every_command_has_help_with_example(name):
    res = runner.invoke(app, [name, "--help"])
    assert res.exit_code == 0, res.output
    assert "Example: evo " in res.output, f"`evo {name} --help` lacks an 'Example: evo ...' line"


@pytest.fixture()
def built_store(tmp_path):
    from evo.store import Store

    db = tmp_path / "evo.db"
    with Store(db) as store:
        run = store.create_run("cli-test", {"search": {"max_evaluations": 3}}, seed=1, config_hash="abc")
        src = "// @tunable BLOCK = 128 in {128, 256}\nextern \"C\" int evo_launch();\n"
        seed = Candidate.create("kb19_relu", src, {"BLOCK": 128}, operator="seed")
        child = Candidate.create("kb19_relu", src, {"BLOCK": 256}, parents=(seed.id,), operator="knobs",
                                 island=0, generation=1)
        bad = Candidate.create("kb19_relu", src + "//x\n", {"BLOCK": 256}, parents=(child.id,),
                               operator="knobs", island=0, generation=2)
        for c in (seed, child, bad):
            store.add_candidate(run, c)
        ok = lambda name: StageResult(name, Status.OK)  # noqa: E731
        store.add_evaluation(run, Evaluation(seed.id, (ok("policy"), ok("compile"), ok("correctness"), ok("timing")), 1.0))
        store.add_evaluation(run, Evaluation(child.id, (ok("policy"), ok("compile"), ok("correctness"), ok("timing")), 1.25))
        store.add_evaluation(run, Evaluation(bad.id, (ok("policy"), StageResult("compile", Status.COMPILE_ERROR, "error: x"))))
    return db, run, seed, child, bad


def test_runs_top_show_lineage_against_a_store(built_store):
    db, run, seed, child, bad = built_store
    res = runner.invoke(app, ["runs", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in json.loads(res.output)] == [run]

    res = runner.invoke(app, ["top", run, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    top = json.loads(res.output)
    assert [d["id"] for d in top] == [child.id, seed.id]
    assert top[0]["fitness"] == pytest.approx(1.25)

    res = runner.invoke(app, ["show", child.id[:10], "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["id"] == child.id and shown["params"] == {"BLOCK": "256"} and shown["status"] == "ok"

    res = runner.invoke(app, ["lineage", bad.id, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    chain = json.loads(res.output)
    assert [d["id"] for d in chain] == [bad.id, child.id, seed.id]
    assert chain[0]["status"] == "compile_error"

    res = runner.invoke(app, ["lineage", bad.id, "--db", str(db)])
    assert res.exit_code == 0 and "knobs" in res.output


def test_unknown_id_and_missing_db_are_clear_errors(built_store, tmp_path):
    db, run, *_ = built_store
    res = runner.invoke(app, ["show", "ffffffffffff", "--db", str(db)])
    assert res.exit_code == 2
    res = runner.invoke(app, ["runs", "--db", str(tmp_path / "nope.db")])
    assert res.exit_code == 2 and "nope.db" in res.output


def test_tasks_lists_the_suite():
    res = runner.invoke(app, ["tasks", "--json", "--gpu", "H200"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    names = {r["name"] for r in data["tasks"]}
    assert {"kb01_square", "kb32_hardtanh", "gemm_bf16", "rmsnorm_bf16"} <= names
    assert len(names) >= 41
    assert all(r["sol_ms"] > 0 for r in data["tasks"])


def test_search_without_gpu_points_at_dry_run(monkeypatch, tmp_path):
    import evaluators.pipeline as pipeline

    monkeypatch.setattr(pipeline, "gpu_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    res = runner.invoke(app, ["search", "configs/demo.toml", "--db", str(tmp_path / "x.db")])
    assert res.exit_code == 2
    assert "no CUDA GPU" in res.output and "--dry-run" in res.output


def test_bad_config_is_one_clear_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[search]\nislands_per_task = -1\n")
    res = runner.invoke(app, ["search", str(cfg)])
    assert res.exit_code == 2
    assert "search.islands_per_task" in res.output


def test_tune_explains_what_it_needs(built_store, monkeypatch):
    import evaluators.pipeline as pipeline

    db, run, seed, child, bad = built_store
    res = runner.invoke(app, ["tune", bad.id[:12], "--db", str(db)])
    assert res.exit_code == 2 and "no correct evaluation" in res.output
    monkeypatch.setattr(pipeline, "gpu_available", lambda: False)
    res = runner.invoke(app, ["tune", child.id[:12], "--db", str(db)])
    assert res.exit_code == 2 and "no CUDA GPU" in res.output
