"""The champion confirmation's gain over the seed in `evo status`, `evo show` and the report.

The synthetic run (tests/_inspect_run.py) has a champion without a measured gain; these tests
replace it with a confirmed one: the LLM child significantly faster than the seed, or not
significantly faster, so that the seed stays champion (what evo.engine.engine stores then).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from _inspect_run import TASK, build_run
from evo.cli import app
from evo.results.status import run_status
from evo.store import Store

FASTER = {"ratio": 1.052, "low": 1.031, "high": 1.074, "confidence": 0.95, "rounds": 3, "method": "paired-t-log"}
NOISE = {"ratio": 1.004, "low": 0.991, "high": 1.017, "confidence": 0.95, "rounds": 3, "method": "paired-t-log"}


def _crown(built, cid: str, gain: dict, verdict: str) -> None:
    with Store(built.db) as store:
        store.set_champion(built.run_id, TASK, cid, 1.5, {
            "confirmed": True, "fitness_confirmed": 1.48, "ratio": 0.987, "baseline_id": built.seed.id,
            "gain": {**gain, "verdict": verdict}, "verdict": verdict})


@pytest.fixture()
def significant(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    _crown(built, built.llm.id, FASTER, "faster")
    return built


@pytest.fixture()
def seed_kept(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    _crown(built, built.seed.id, NOISE, "no significant gain")
    return built


def _words(out: str) -> str:
    """A table's text with box lines and wrapping undone (one space between words)."""
    return " ".join(out.replace("│", " ").split())


def _run(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_without_a_measured_gain_status_and_show_are_as_before(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        best = run_status(store, built.run_id)["best"][TASK]
    assert best["gain"] is None and best["verdict"] is None and best["champion_id"] == built.llm.id
    out = _run("status", built.run_id, "--db", str(built.db))
    assert "champion confirmation" not in out and "confirmed" in out
    out = _run("show", built.llm.id[:12], "--db", str(built.db), "--no-source")
    assert "gain over seed" not in out


def test_status_shows_a_significant_gain_with_its_interval(significant):
    b = significant
    with Store.open_reader(b.db) as store:
        best = run_status(store, b.run_id)["best"][TASK]
    assert best["champion"] and best["verdict"] == "faster"
    assert best["gain"]["ratio"] == pytest.approx(1.052) and best["gain"]["baseline"] == b.seed.id
    out = _run("status", b.run_id, "--db", str(b.db))
    assert "champion confirmation" in out
    row = next(line for line in out.splitlines() if "1.052x" in line)
    assert row.split() == [TASK, b.llm.id[:12], "1.052x", "[1.031,", "1.074]", "significant"]
    data = json.loads(_run("status", b.run_id, "--db", str(b.db), "--json"))
    got = data["best"][TASK]
    assert (got["verdict"], got["gain"]["low"], got["gain"]["high"]) == ("faster", 1.031, 1.074)


def test_status_says_the_seed_stays_without_a_significant_gain(seed_kept):
    b = seed_kept
    with Store.open_reader(b.db) as store:
        best = run_status(store, b.run_id)["best"][TASK]
    assert best["id"] == b.llm.id and not best["champion"] and best["champion_id"] == b.seed.id
    out = _run("status", b.run_id, "--db", str(b.db))
    assert "seed stays" in out
    row = next(line for line in out.splitlines() if "1.004x" in line)
    assert row.split() == [TASK, b.seed.id[:12], "1.004x", "[0.991,", "1.017]", "no", "significant", "gain"]


def test_show_of_a_champion_gives_its_gain_and_verdict(significant):
    b = significant
    out = _words(_run("show", b.llm.id[:12], "--db", str(b.db), "--no-source"))
    assert (f"gain over seed 1.052x [1.031, 1.074] significant (95% interval from 3 paired rounds, "
            f"over {b.seed.id[:12]})") in out
    shown = json.loads(_run("show", b.llm.id[:12], "--db", str(b.db), "--json"))
    (ch,) = shown["champion_of"]
    assert ch["verdict"] == "faster" and ch["gain"]["ratio"] == 1.052


def test_show_of_a_seed_that_stayed_champion(seed_kept):
    b = seed_kept
    out = _words(_run("show", b.seed.id[:12], "--db", str(b.db), "--no-source"))
    assert "best's gain over seed 1.004x [0.991, 1.017] no significant gain" in out
    assert "the seed stays champion" in out


def test_report_carries_the_gain_column(seed_kept, tmp_path):
    pytest.importorskip("matplotlib")
    from evo.results.report import build_report

    b = seed_kept
    with Store.open_reader(b.db) as store:
        res = build_report(store, b.run_id, tmp_path / "out")
    page = res.index.read_text()
    assert "<th>gain over seed</th>" in page and "1.004x [0.991, 1.017] no significant gain" in page
    assert f"no: seed {b.seed.id[:12]} stays" in page and 'id="gain-note"' in page
