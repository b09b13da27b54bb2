"""A newcomer's first hour (issue 34): argument checks, id prefixes and ambiguity, progress
callbacks, where log records go, structured task shapes, the demo config's header.

No GPU, no nvcc, no Ray (except the one test that starts a local Ray instance to see where
its start-up notices go).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _inspect_run import BAD_TASK, TASK, build_run
from evo.cli import app
from evo.cli.common import distinguishable_ids, setup_logging
from evo.core.records import Candidate, StageResult, Status
from evo.store import Store

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


@pytest.fixture()
def built(tmp_path):
    return build_run(tmp_path / "evo.db", tmp_path / "cache")


# --------------------------------------------------------------------------- evo top


@pytest.mark.parametrize("args, needle", [
    (["-k", "0"], "-k 0: must be at least 1"),
    (["-k", "-3"], "-k -3: must be at least 1"),
    (["--task", "nope"], "--task 'nope': run "),
])
def test_top_rejects_bad_arguments_with_one_line(built, args, needle):
    res = runner.invoke(app, ["top", built.run_id, "--db", str(built.db), *args])
    assert res.exit_code == 2, res.output
    lines = _error_lines(res.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output
    if "--task" in args:
        assert f"its tasks: {TASK}, {BAD_TASK}" in lines[0]


def test_top_takes_a_run_prefix(built):
    res = runner.invoke(app, ["top", built.run_id[:10], "--db", str(built.db), "--json"])
    assert res.exit_code == 0, res.output
    assert [d["id"] for d in json.loads(res.output)] == [built.llm.id, built.knobs.id, built.seed.id]
    res = runner.invoke(app, ["top", built.run_id[:10], "--db", str(built.db), "--task", TASK, "-k", "1"])
    assert res.exit_code == 0 and built.llm.id[:12] in res.output and built.run_id in res.output


def test_ambiguous_run_prefix_lists_distinguishable_full_ids(tmp_path):
    db = tmp_path / "evo.db"
    ids = ["r-20261203-0730-ab12", "r-20261203-0730-cd34"]
    with Store(db) as store:
        for rid in ids:
            store.create_run("x", {}, seed=0, config_hash="", run_id=rid)
    for cmd in (["top", "r-20261203-0730"], ["status", "r-20261203"], ["report", "r-2026", "--out", str(tmp_path / "r")],
                ["export", "r-2026", "--out", str(tmp_path / "e")]):
        res = runner.invoke(app, [*cmd, "--db", str(db)])
        assert res.exit_code == 2, (cmd, res.output)
        flat = " ".join(res.output.split())
        assert "ambiguous" in flat and all(i in flat for i in ids), (cmd, res.output)


def test_ambiguous_candidate_prefix_lists_ids_that_differ(tmp_path):
    db = tmp_path / "evo.db"
    with Store(db) as store:
        rid = store.create_run("x", {}, seed=0, config_hash="")
        by_first: dict[str, list[str]] = {}
        i = 0
        while not any(len(v) > 1 for v in by_first.values()):
            c = Candidate.create(TASK, f"// k{i}\n", operator="seed")
            store.add_candidate(rid, c)
            by_first.setdefault(c.id[0], []).append(c.id)
            i += 1
    first, pair = next((k, v) for k, v in by_first.items() if len(v) > 1)
    res = runner.invoke(app, ["show", first, "--db", str(db)])
    assert res.exit_code == 2
    shown = re.findall(r"\b[0-9a-f]{12,64}\b", res.output)
    assert len(shown) >= 2 and len(set(shown)) == len(shown), res.output
    assert {s for s in shown} == {p[:len(shown[0])] for p in pair}, res.output


def test_distinguishable_ids_grow_until_they_differ():
    a, b = "0123456789abcdef" + "0" * 48, "0123456789abcdef" + "1" * 48
    assert distinguishable_ids([a, b]) == [a[:17], b[:17]]
    assert distinguishable_ids(["abc", "abd"]) == ["abc", "abd"]
    assert distinguishable_ids(["r-1", "r-2"], min_len=12) == ["r-1", "r-2"]


# --------------------------------------------------------------------------- evo tasks


def test_tasks_family_user_without_task_file_says_how():
    res = runner.invoke(app, ["tasks", "--family", "user"])
    assert res.exit_code == 2
    flat = " ".join(res.output.split())
    assert "--task-file" in flat and "unknown family" not in flat, res.output
    res = runner.invoke(app, ["tasks", "--family", "modren"])
    assert res.exit_code == 2 and "unknown family 'modren'" in res.output


def test_tasks_json_gives_structured_shapes():
    res = runner.invoke(app, ["tasks", "--json", "--gpu", "H200", "--family", "modern"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)["tasks"]}
    g = rows["gemm_bf16"]
    assert g["bench_shapes"][0] == {"M": 8192, "N": 8192, "K": 8192}
    assert len(g["shapes"]) == g["n_shapes"] and len(g["bench_shapes"]) == g["n_bench"]
    for r in rows.values():
        assert all(isinstance(s, dict) and all(isinstance(v, int) for v in s.values()) for s in r["shapes"])


# --------------------------------------------------------------------------- dry run checks


@pytest.mark.parametrize("extra, needle", [
    (["--resume", "nope"], "--resume nope"),
    (["--db", "/nonexistent/dir/evo.db"], "/nonexistent"),
])
def test_dry_run_fails_fast_on_a_missing_run_or_unusable_db(tmp_path, extra, needle):
    args = ["search", "configs/demo.toml", "--dry-run", "--no-progress"]
    if "--db" not in extra:
        args += ["--db", str(tmp_path / "evo.db")]
    t0 = time.monotonic()
    res = runner.invoke(app, args + extra)
    assert time.monotonic() - t0 < 20, "the checks come before any compile"
    assert res.exit_code == 2, res.output
    lines = _error_lines(res.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output
    assert not Path("/nonexistent").exists()


def test_dry_run_resume_of_an_unknown_run_in_an_existing_db_lists_recent_runs(built):
    res = runner.invoke(app, ["search", "configs/demo.toml", "--dry-run", "--no-progress", "--db", str(built.db),
                              "--resume", "nope"])
    assert res.exit_code == 2
    assert "--resume nope" in res.output and built.run_id in " ".join(res.output.split())


def test_db_location_checks(tmp_path):
    from evo.core.paths import LocationError, check_db_location

    assert check_db_location(tmp_path / "evo.db") == tmp_path / "evo.db"
    assert check_db_location(tmp_path / "runs" / "evo.db")  # one new directory is fine
    assert not (tmp_path / "runs").exists(), "the check creates nothing"
    with pytest.raises(LocationError, match="does not exist"):
        check_db_location(tmp_path / "a" / "b" / "evo.db")
    with pytest.raises(LocationError, match="not a file"):
        check_db_location(tmp_path)
    if Path("/proc/self").is_dir():  # not writable, even for root
        with pytest.raises(LocationError, match="not writable"):
            check_db_location("/proc/evo.db")


def test_dry_run_reports_progress_per_seed(monkeypatch):
    import evaluators.compile as comp
    from evo.engine import search
    from evo.config import load_config
    from evo.core.records import StageResult

    class Outcome:  # the two fields dry_run reads of a CompileOutcome
        cached = False

        def __init__(self) -> None:
            self.result = StageResult("compile", Status.OK, seconds=0.01)

    seen: list[str] = []

    def fake_compile(cand, settings):
        seen.append(cand.task)
        return Outcome()

    monkeypatch.setattr(comp, "compile_candidate", fake_compile)
    cfg = load_config(ROOT / "configs" / "demo.toml")
    calls: list[tuple[str, int, int]] = []
    rep = search.dry_run(cfg, on_progress=lambda t, i, n: calls.append((t, i, n)))
    names = [r["task"] for r in rep["seeds"]]
    n = len(names)
    assert calls == [(t, i, n) for i, t in enumerate(names)] + [("", n, n)]
    assert seen == names and rep["ok"]


# --------------------------------------------------------------------------- progress


def test_step_progress_draws_only_when_enabled():
    import io

    from rich.console import Console

    from evo.engine.progress import StepProgress, progress_enabled

    assert not progress_enabled(True), "pytest captures stdout: not a terminal, so no bar"
    assert not progress_enabled(False)
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80)
    with StepProgress("dry run: policy + nvcc", 4, enabled=True, console=con) as bar:
        bar.update("gelu_bf16", 2)
    assert "gelu_bf16" in buf.getvalue() and "2/4" in buf.getvalue()
    buf2 = io.StringIO()
    with StepProgress("x", 4, enabled=False, console=Console(file=buf2, force_terminal=True)) as bar:
        bar.update("y", 1)
    assert buf2.getvalue() == ""


def test_bench_reports_compile_and_measure_progress(monkeypatch, tmp_path):
    import evaluators.compile as comp
    import evaluators.pipeline as pipeline
    from evaluators.base import CompileSettings, HarnessSettings
    from evo.results.bench import bench, seed_candidates

    class Outcome:
        cached = False
        so_bytes = b""  # nothing built: each kernel becomes one "compile" row, no GPU run

        def __init__(self) -> None:
            self.result = StageResult("compile", Status.COMPILE_ERROR, "fake: not built", seconds=0.0)

    monkeypatch.setattr(comp, "compile_candidate", lambda c, s: Outcome())
    monkeypatch.setattr(pipeline, "judge_job", lambda *a, **k: pytest.fail("nothing to run"))
    cands = seed_candidates(["kb19_relu", "kb21_sigmoid"])
    calls: list[tuple[str, int, int]] = []
    rows = bench(cands, CompileSettings(), HarnessSettings(), table=tmp_path / "R.md", command="test", title="t",
                 jobs=2, on_progress=lambda s, i, n: calls.append((s, i, n)))
    assert len(rows) == 2
    assert calls == [("compile", 0, 2), ("compile", 1, 2), ("compile", 2, 2), ("kb19_relu", 0, 2),
                     ("kb21_sigmoid", 1, 2), ("done", 2, 2)]


# --------------------------------------------------------------------------- logging


def test_third_party_records_go_to_the_log_file_only(tmp_path, monkeypatch, capsys):
    log_file = tmp_path / "logs" / "evo.log"
    monkeypatch.setenv("EVO_LOG", str(log_file))
    setup_logging(0)
    try:
        logging.getLogger("ray._private.worker").warning("Token authentication is enabled for this Ray cluster")
        logging.getLogger("optuna").info("A new study created")
        long = ("SANDBOX: running as root: RLIMIT_NPROC is not enforced for root, so a fork bomb is bounded "
                "only by the wall-clock timeout; run the search as a dedicated non-root user")
        logging.getLogger("evaluators.sandbox").warning(long)
        logging.getLogger("ray").error("a real Ray error")
        err = capsys.readouterr().err
    finally:
        for h in list(logging.getLogger().handlers):
            h.close()
            logging.getLogger().removeHandler(h)
    assert "Token authentication" not in err and "new study" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [f"warning: {long}", "error: a real Ray error"], err  # one line each, however long
    text = log_file.read_text()
    for s in ("Token authentication is enabled", "A new study created", "RLIMIT_NPROC", "a real Ray error"):
        assert s in text


def test_ray_start_up_notices_stay_off_the_terminal(tmp_path):
    """A real local Ray start through Runtime.start, in a fresh process: Ray's INFO/WARNING
    start-up lines (it prints them to stderr itself otherwise) land in the log file."""
    script = (
        "from evo.cli.common import setup_logging\n"
        "setup_logging(0)\n"
        "from evaluators.base import CompileSettings, HarnessSettings\n"
        "from evo.engine.runtime import Runtime, real_stages\n"
        "rt = Runtime(stages=real_stages(), compile_settings=CompileSettings(), harness_settings=HarnessSettings(),\n"
        "             num_cpus=1, num_gpus=1).start()\n"
        "rt.shutdown()\n"
        "print('STARTED')\n"
    )
    env = {**os.environ, "EVO_LOG": str(tmp_path / "evo.log")}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0 and "STARTED" in r.stdout, r.stderr[-3000:]
    assert "Started a local Ray instance" not in r.stderr and "worker.py" not in r.stderr, r.stderr
    assert "Started a local Ray instance" in (tmp_path / "evo.log").read_text()


# --------------------------------------------------------------------------- demo config


def test_demo_config_header_agrees_with_its_body():
    from evo.config import load_config

    text = (ROOT / "configs" / "demo.toml").read_text()
    header = " ".join(ln.lstrip("# ") for ln in text.splitlines()[:8] if ln.startswith("#"))
    cfg = load_config(ROOT / "configs" / "demo.toml")
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    m = re.search(r"(\w+) tasks, (\w+) islands each, (\d+) evaluations", header)
    assert m, header
    assert words[m.group(1)] == len(cfg.tasks.include)
    assert words[m.group(2)] == cfg.search.islands_per_task
    assert int(m.group(3)) == cfg.search.max_evaluations


@pytest.mark.skipif(os.geteuid() != 0, reason="the root warning is only given to root")
def test_sandbox_root_warning_is_one_terminal_line(tmp_path, monkeypatch, capsys):
    from evaluators import sandbox

    monkeypatch.setenv("EVO_LOG", str(tmp_path / "evo.log"))
    setup_logging(0)
    sandbox.reset_probe()
    try:
        sandbox.probe()
        err = capsys.readouterr().err
    finally:
        sandbox.reset_probe()
        for h in list(logging.getLogger().handlers):
            h.close()
            logging.getLogger().removeHandler(h)
    root_lines = [ln for ln in err.splitlines() if "root" in ln]
    assert len(root_lines) == 1 and len(root_lines[0]) <= 80, err
    assert "fork bomb" in (tmp_path / "evo.log").read_text()  # the detail is in the log file
