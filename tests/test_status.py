"""evo.results.status.run_status and `evo status` over a synthetic run (tests/_inspect_run.py)."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
import typer
from typer.testing import CliRunner

from _inspect_run import BAD_TASK, TASK, build_run
from evo.cli import app as evo_app
from evo.results.status import failure_funnel, run_status
from evo.store import Store, UnknownIdError


@pytest.fixture()
def built(tmp_path):
    return build_run(tmp_path / "evo.db", tmp_path / "cache")


def _app() -> typer.Typer:
    return evo_app


def test_run_status_counts_failures_best_spend_and_rates(built):
    with Store.open_reader(built.db) as store:
        st = run_status(store, built.run_id[:10])  # a prefix resolves
    assert st["run"]["id"] == built.run_id and st["run"]["status"] == "finished" and not st["stale"]
    assert st["run"]["config_hash"] == "cfg-hash-123"
    assert (st["candidates"], st["evaluations"], st["correct"], st["pending"]) == (8, 8, 3, 0)
    assert st["by_task"] == {TASK: {"evaluations": 7, "correct": 3, "pending": 0},
                             BAD_TASK: {"evaluations": 1, "correct": 0, "pending": 0}}
    assert st["failures_by_stage"] == {"compile": {"compile_error": 1}, "correctness": {"incorrect": 2},
                                       "policy": {"rejected": 1}, "timing": {"timeout": 1}}
    funnel = {r["stage"]: r for r in st["funnel"]}
    assert [r["stage"] for r in st["funnel"]] == ["policy", "compile", "correctness", "timing"]
    assert (funnel["policy"]["entered"], funnel["policy"]["passed"]) == (8, 7)
    assert (funnel["compile"]["entered"], funnel["compile"]["passed"]) == (7, 6)  # the skipped one is not "entered"
    assert funnel["correctness"]["failed"] == {"incorrect": 2}
    assert (funnel["timing"]["entered"], funnel["timing"]["passed"]) == (4, 3)
    best = st["best"][TASK]
    assert best["id"] == built.llm.id and best["fitness"] == pytest.approx(1.5)
    assert best["champion"] and best["confirmed"] and best["operator"] == "llm:test-model"
    assert BAD_TASK not in st["best"]
    assert st["spend"]["cost"] == pytest.approx(0.75) and st["spend"]["n_calls"] == 2
    assert st["spend"]["tokens_in"] == 2700
    # the latest progress-like event is the finish event
    assert st["progress"]["evals_per_min"] == 12.0 and st["progress"]["gpu_busy"] == 0.9
    assert st["stop_reason"] == "max_evaluations"
    assert st["events"]["champion"] == 1 and st["events"]["progress"] == 2
    json.dumps(st)  # JSON-ready


def test_live_run_uses_last_progress_event_and_flags_staleness(tmp_path):
    b = build_run(tmp_path / "evo.db", tmp_path / "cache", finished=False)
    # A run is live while its writer holds the run's lease (without one it reads interrupted).
    with Store(b.db) as writer, Store.open_reader(b.db) as store:
        writer.acquire_lease(b.run_id)
        live = run_status(store, b.run_id)
        assert live["run"]["status"] == "running" and not live["stale"]
        assert live["progress"]["evals_per_min"] == 12.5 and live["progress"]["in_flight"] == 2
        assert live["progress"]["age_s"] is not None and live["progress"]["age_s"] < 60
        later = run_status(store, b.run_id, now=datetime.now(timezone.utc) + timedelta(hours=1))
        assert later["stale"] and later["last_event_age_s"] > 3000


def test_unknown_run_lists_recent_runs(built):
    with Store.open_reader(built.db) as store:
        with pytest.raises(UnknownIdError) as ei:
            run_status(store, "no-such-run")
    assert built.run_id in str(ei.value) and "recent runs" in str(ei.value)


def test_failure_funnel_of_nothing_is_empty():
    assert failure_funnel([]) == []


def test_cli_status_table_and_json(built):
    app, runner = _app(), CliRunner()
    res = runner.invoke(app, ["status", built.run_id, "--db", str(built.db)])
    assert res.exit_code == 0, res.output
    for text in ("finished", "best per task", TASK, "confirmed", "compile_error 1", "$0.7500", "12.00 evals/min"):
        assert text in res.output, text
    res = runner.invoke(app, ["status", built.run_id, "--db", str(built.db), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["correct"] == 3


def test_cli_errors_are_one_clean_line(built, tmp_path):
    app, runner = _app(), CliRunner()
    res = runner.invoke(app, ["status", "zzz", "--db", str(built.db)])
    assert res.exit_code == 2 and "error:" in res.output and "recent runs" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["status", "x", "--db", str(tmp_path / "missing.db")])
    assert res.exit_code == 2 and "not found" in res.output
    # a database written by a newer cute-evo
    newer = tmp_path / "newer.db"
    Store(newer).close()
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    for cmd in (["status", "r"], ["report", "r", "--out", str(tmp_path / "rep")], ["export", "r", "--out", str(tmp_path / "x")]):
        res = runner.invoke(app, [*cmd, "--db", str(newer)])
        assert res.exit_code == 2, (cmd, res.output)
        assert "schema version 99" in res.output and "upgrade cute-evo" in res.output
        assert "Traceback" not in res.output


@pytest.mark.parametrize("name", ["status", "report", "export"])
def test_every_inspect_command_has_help_with_example(name):
    res = CliRunner().invoke(_app(), [name, "--help"])
    assert res.exit_code == 0, res.output
    assert "Example: evo " in res.output
