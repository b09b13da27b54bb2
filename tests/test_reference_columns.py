"""Speedups against eager and against torch.compile in every result view (issue 37), on CPU.

The timing metrics are made by the judge's own :func:`evaluators.judge.summary.summarize` from
fake samples, stored through the real store, and read back by the real ``evo`` commands
(typer's CliRunner) and by :mod:`evo.results.bench` from fake harness reports.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evaluators.base import HarnessSettings
from evaluators.judge.reference import COMPILE_MODE
from evaluators.judge.summary import ShapeSamples, summarize
from evaluators.harness_job import HarnessReport, ShapeTiming
from evo.cli import app
from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.store import Store

TASK = "kb19_relu"
SHAPE = {"R": 4096, "C": 393216}
runner = CliRunner()


def _timing(ours_ms: float, eager_ms: float, compile_ms: float | None, basis: str = "eager") -> StageResult:
    """The timing stage the harness records for one shape: 5 equal samples of each."""
    s = ShapeSamples(SHAPE, (ours_ms,) * 5, (eager_ms,) * 5, (), 0, 2.0,
                     compile_ref_ms=() if compile_ms is None else (compile_ms,) * 5)
    return summarize([s], basis)


def _run(tmp_path, timings: dict[str, StageResult], env: dict[str, str] | None = None) -> tuple:
    """A run with one correct kb19_relu candidate per entry of ``timings`` (name -> stage)."""
    db = tmp_path / "evo.db"
    cands = {}
    with Store(db) as store:
        rid = store.create_run("ref-test", {}, seed=1, config_hash="h")
        for i, (name, st) in enumerate(timings.items()):
            c = Candidate.create(TASK, f"// {name}\n", {"BLOCK": str(128 * (i + 1))}, operator="knobs",
                                 generation=i, island=0)
            store.add_candidate(rid, c)
            stages = (StageResult("policy", Status.OK), StageResult("compile", Status.OK),
                      StageResult("correctness", Status.OK), st)
            store.add_evaluation(rid, Evaluation(c.id, stages, st.metrics.get("fitness"), gpu="NVIDIA H200",
                                                env=env or {}))
            cands[name] = c
    return db, rid, cands


@pytest.fixture()
def both(tmp_path):
    # fast: 4.0 ms eager, 2.5 ms compiled, ours 2.0 ms -> 2.000 vs eager, 1.250 vs compile
    return _run(tmp_path, {"fast": _timing(2.0, 4.0, 2.5), "slow": _timing(3.2, 4.8, 2.4)})


def test_reader_returns_basis_and_both_fitnesses(both, tmp_path):
    db, rid, c = both
    with Store.open_reader(db) as store:
        refs = store.reference_fitness(rid)
        assert refs[c["fast"].id] == {"reference": "eager", "fitness_eager": pytest.approx(2.0),
                                      "fitness_compile": pytest.approx(1.25), "compile_mode": COMPILE_MODE}
        assert set(store.reference_fitness(rid, [c["slow"].id])) == {c["slow"].id}
    # a timing recorded before the basis existed (no "reference" key) is not listed
    old = StageResult("timing", Status.OK, metrics={"shapes": [], "fitness": 1.1})
    db2, rid2, c2 = _run(tmp_path / "old", {"old": old, "new": _timing(2.0, 3.0, None)})
    with Store.open_reader(db2) as store:
        refs = store.reference_fitness(rid2)
    assert set(refs) == {c2["new"].id} and refs[c2["new"].id]["fitness_compile"] is None


def test_status_top_show_and_report_show_both_speedups(both, tmp_path):
    db, rid, c = both
    res = runner.invoke(app, ["status", rid, "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "vs eager" in res.output and "vs compile" in res.output
    assert "2.000*" in res.output and "1.250" in res.output and "fitness basis" in res.output
    best = json.loads(runner.invoke(app, ["status", rid, "--db", str(db), "--json"]).output)["best"][TASK]
    assert (best["reference"], best["fitness_eager"], best["fitness_compile"]) == ("eager", 2.0, 1.25)

    res = runner.invoke(app, ["top", rid, "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "vs eager" in res.output and "vs compile" in res.output and "speedup" not in res.output
    assert "1.250" in res.output and "1.250*" not in res.output
    assert "1.500*" in res.output and "0.750" in res.output  # slow: 4.8 / 3.2 and 2.4 / 3.2
    rows = json.loads(runner.invoke(app, ["top", rid, "--db", str(db), "--json"]).output)
    assert [r["fitness_compile"] for r in rows] == pytest.approx([1.25, 0.75])

    res = runner.invoke(app, ["show", c["fast"].id, "--db", str(db), "--no-source"])
    assert res.exit_code == 0, res.output
    assert "vs eager 2.000*" in res.output and "vs compile 1.250" in res.output and COMPILE_MODE in res.output
    assert "vs compiled ref 2.5 ms (x1.250)" in res.output
    d = json.loads(runner.invoke(app, ["show", c["fast"].id, "--db", str(db), "--json", "--no-source"]).output)
    assert (d["reference"], d["fitness_compile"], d["compile_mode"]) == ("eager", 1.25, COMPILE_MODE)

    pytest.importorskip("matplotlib")
    from evo.results.report import build_report

    with Store.open_reader(db) as store:
        html = build_report(store, rid, tmp_path / "rep").index.read_text()
    assert "<th>vs eager</th><th>vs compile</th>" in html and "<td>2.000*</td><td>1.250</td>" in html


def test_compile_basis_marks_the_compiled_speedup(tmp_path):
    db, rid, c = _run(tmp_path, {"k": _timing(2.0, 4.0, 2.5, basis="compile")})
    res = runner.invoke(app, ["top", rid, "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "1.250*" in res.output and "2.000*" not in res.output and "2.000" in res.output


def test_eager_only_keeps_todays_views_and_json_says_so(tmp_path):
    db, rid, c = _run(tmp_path, {"k": _timing(2.0, 4.0, None)})
    for cmd in (["status", rid], ["top", rid], ["show", c["k"].id, "--no-source"]):
        res = runner.invoke(app, [*cmd, "--db", str(db)])
        assert res.exit_code == 0, res.output
        assert "speedup" in res.output and "vs compile" not in res.output and "vs eager" not in res.output, cmd
    best = json.loads(runner.invoke(app, ["status", rid, "--db", str(db), "--json"]).output)["best"][TASK]
    assert (best["reference"], best["fitness_eager"], best["fitness_compile"]) == ("eager", 2.0, None)
    (row,) = json.loads(runner.invoke(app, ["top", rid, "--db", str(db), "--json"]).output)
    assert row["reference"] == "eager" and row["fitness_compile"] is None


def test_show_says_when_the_reference_did_not_compile(tmp_path):
    db, rid, c = _run(tmp_path, {"k": _timing(2.0, 4.0, None)},
                      env={"reference": "eager", "reference_compile_error": "BackendCompilerFailed: boom\ntrace"})
    res = runner.invoke(app, ["show", c["k"].id, "--db", str(db), "--no-source"])
    assert res.exit_code == 0, res.output
    assert "compile failed: BackendCompilerFailed: boom" in res.output and "trace" not in res.output


# ---------------------------------------------------------------------------- evo bench


def _report(timings: tuple[ShapeTiming, ...], env: dict[str, str] | None = None) -> HarnessReport:
    return HarnessReport(stages=(StageResult("correctness", Status.OK), StageResult("timing", Status.OK)),
                         fitness=1.0, timings=timings, env=env or {})


def _bench_rows():
    from evo.results.bench import _rows_for

    relu = _rows_for(Candidate.create("kb19_relu", "// a", {}), _report((
        # compiled 3.2 ms, SOL 3.0 ms: within 10%
        ShapeTiming(SHAPE, 3.1, 0.01, 7.0, 0.01, 7.0 / 3.1, 3.0, 3.2, 0.01, 3.2 / 3.1),)))
    sig = _rows_for(Candidate.create("kb21_sigmoid", "// b", {}), _report((
        ShapeTiming(SHAPE, 3.5, 0.01, 7.0, 0.01, 2.0, 3.0, 4.375, 0.01, 1.25),)))
    tanh = _rows_for(Candidate.create("kb22_tanh", "// c", {}), _report(
        (ShapeTiming(SHAPE, 3.5, 0.01, 7.0, 0.01, 2.0, 3.0),),
        {"reference_compile_error": "BackendCompilerFailed: inductor raised LoweringException\nmore"}))
    return relu + sig + tanh


def test_bench_rows_table_families_and_sol_line(tmp_path):
    from evo.results.bench import family_summary, results_table, write_results

    rows = _bench_rows()
    assert (rows[0].compile_ms, rows[1].compile_speedup) == (3.2, 1.25)
    assert rows[2].compile_ms is None and rows[2].compile_error.startswith("BackendCompilerFailed")
    lines = results_table(rows)
    assert lines[0].startswith("| task | shape | dtype | torch ms | compile ms | ours ms | speedup | vs compile |")
    assert "| 7.0000 | 4.3750 | 3.5000 | 2.000 | 1.250 |" in lines[3]
    assert "| 7.0000 | compile failed | 3.5000 | 2.000 | compile failed |" in lines[4]
    (fam,) = [ln for ln in family_summary(rows) if ln.startswith("| kernelbench-l1")]
    # eager: geomean(2.258, 2.0, 2.0); compile: geomean(1.032, 1.25) over the 2 compiled tasks
    assert "| geomean speedup | geomean vs compile |" in family_summary(rows)[0]
    assert "| 3 | 2.083 | 1.136 over 2 (+1 compile failed) |" in fam

    path = tmp_path / "RESULTS.md"
    write_results(path, rows, {"reference_compile_mode": COMPILE_MODE}, "evo bench", HarnessSettings(), "Seeds")
    text = path.read_text()
    assert COMPILE_MODE in text and "vs compile = compile ms / ours" in text
    sol = [ln for ln in text.splitlines() if "reaches the speed of light" in ln]
    assert sol == ["torch.compile already reaches the speed of light (compiled median within 10% of the SOL "
                   "time, so no kernel can be more than 1.10x faster than it) on: kb19_relu "
                   "(R=4096 x C=393216)."]
    assert "- **kb22_tanh**: BackendCompilerFailed: inductor raised LoweringException" in text
    assert "LoweringException\nmore" not in text and text.endswith("LoweringException\n")


def test_bench_table_without_compiled_times_is_unchanged():
    from evo.results.bench import compile_at_sol, family_summary, results_table

    rows = [r.__class__(**{**r.__dict__, "compile_ms": None, "compile_speedup": None, "compile_error": ""})
            for r in _bench_rows()]
    assert results_table(rows)[0] == ("| task | shape | dtype | torch ms | ours ms | speedup | rate | % of SOL |"
                                      " status |")
    assert "vs compile" not in family_summary(rows)[0]
    assert compile_at_sol(_bench_rows()[1:]).endswith("on no timed shape.")


def test_cli_bench_times_the_compiled_reference(monkeypatch, tmp_path):
    import evaluators.pipeline as pipeline
    import evo.results.bench as bench_mod

    seen = {}

    def fake_bench(cands, cs, hs, **kw):
        seen["hs"] = hs
        rows = _bench_rows()
        for r in rows:
            kw["on_row"](r)
        return rows

    monkeypatch.setattr(pipeline, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_mod, "bench", fake_bench)
    res = runner.invoke(app, ["bench", "--task", "kb19_relu", "--out", str(tmp_path / "R.md"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert seen["hs"].time_compiled_reference is True and seen["hs"].reference == "eager"
    assert "(1.250x vs compile)" in res.output and "(vs compile: compile failed)" in res.output
