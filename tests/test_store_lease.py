"""One writer per run, and no phantom runs (evo/store/lease.py, Store.acquire_lease / abort_run).

Contracts: a run has one writer at a time (a second one, in another process or in this one,
gets RunLeasedError naming the holder's pid); a writer that dies (SIGKILL) leaves a lease
the next writer takes over with a warning; readers show a ``running`` run without a live
writer as ``interrupted``; a run whose start fails ends ``failed`` with the reason, and
stays resumable. The process tests use real processes, real flocks and the real CLI.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import evo
from evo.store import ReadOnlyStoreError, RunLeasedError, Store, StoreReader, lease_path

REPO_ROOT = Path(evo.__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from evo.store import Store
    s = Store(sys.argv[1])
    rid = s.create_run("holder", {}, seed=0, config_hash="", run_id=sys.argv[2])
    print("READY", rid, flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def holder(tmp_path):
    """A second process that created run ``held-1`` and holds its lease until killed."""
    db = tmp_path / "evo.db"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(db), "held-1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline().split()
        assert line == ["READY", "held-1"], proc.stderr.read() if proc.poll() is not None else line
        yield proc, db, "held-1"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evo.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO_ROOT, timeout=timeout)


def test_second_writer_in_another_process_is_refused_then_takes_over_a_dead_one(holder, caplog):
    proc, db, rid = holder
    with StoreReader(db) as reader:
        run = reader.get_run(rid)
        assert run["status"] == "running" and run["writer"]["pid"] == proc.pid
        assert reader.run_writer(rid)["pid"] == proc.pid
    with Store(db) as second:
        with pytest.raises(RunLeasedError) as ei:
            second.acquire_lease(rid)
        msg = str(ei.value)
        assert ei.value.holder.pid == proc.pid and f"pid {proc.pid}" in msg and f"kill {proc.pid}" in msg
        assert "\n" not in msg and not second.holds_lease(rid)
        n_events = len(second.events(rid))

        _kill(proc)  # the writer dies without ending its run
        with StoreReader(db) as reader:
            run = reader.get_run(rid)
            assert run["recorded_status"] == "running" and run["status"] == "interrupted"
            assert f"pid {proc.pid}" in run["reason"] and "died" in run["reason"] and f"--resume {rid}" in run["reason"]
            assert [r["status"] for r in reader.list_runs()] == ["interrupted"]
            assert reader.run_writer(rid) is None

        with caplog.at_level(logging.WARNING, logger="evo.store.writer"):
            me = second.acquire_lease(rid)
        assert me.pid == os.getpid() and second.holds_lease(rid)
        assert any("taking over" in r.getMessage() and f"pid {proc.pid}" in r.getMessage() for r in caplog.records)
        takeover = second.events(rid, "writer_takeover")
        assert len(takeover) == 1 and takeover[0]["payload"]["previous"]["pid"] == proc.pid
        assert len(second.events(rid)) == n_events + 1
        assert second.get_run(rid)["status"] == "running"


def test_two_stores_of_one_process_are_two_writers(tmp_path):
    with Store(tmp_path / "e.db") as a, Store(tmp_path / "e.db") as b:
        rid = a.create_run("r", {}, seed=0, config_hash="")
        assert a.holds_lease(rid) and a.acquire_lease(rid).pid == os.getpid()  # idempotent for the holder
        with pytest.raises(RunLeasedError, match=f"pid {os.getpid()}"):
            b.acquire_lease(rid)
        a.release_lease(rid)
        b.acquire_lease(rid)
        with pytest.raises(RunLeasedError):
            a.acquire_lease(rid)


def test_clean_handover_has_no_warning_and_a_closed_writer_reads_interrupted(tmp_path, caplog):
    db = tmp_path / "e.db"
    with Store(db) as a:
        rid = a.create_run("r", {}, seed=0, config_hash="")
        other = a.create_run("done", {}, seed=0, config_hash="")
        a.set_run_status(other, "finished")
    assert json.loads(lease_path(db, rid).read_text())["released"] is True
    with StoreReader(db) as reader:
        left = reader.get_run(rid)
        assert left["status"] == "interrupted" and "closed the database without ending the run" in left["reason"]
        assert reader.get_run(other)["status"] == "finished"  # only `running` is re-read
    with Store(db) as b, caplog.at_level(logging.WARNING):
        b.acquire_lease(rid)
        assert not b.events(rid, "writer_takeover")
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
        assert b.get_run(rid)["status"] == "running"


def test_a_run_nobody_leased_reads_interrupted_and_readers_take_no_lease(tmp_path):
    db = tmp_path / "e.db"
    with Store(db) as w:
        rid = w.create_run("r", {}, seed=0, config_hash="", lease=False)
        assert not w.holds_lease(rid)
        got = w.get_run(rid)
        assert got["status"] == "interrupted" and "no process holds its writer lease" in got["reason"]
    with Store(db, readonly=True) as ro:
        with pytest.raises(ReadOnlyStoreError):
            ro.acquire_lease(rid)
    assert not lease_path(db, rid).exists()


def test_status_reason_and_abort_run(tmp_path):
    from evo.engine.engine import SearchError

    with Store(tmp_path / "e.db") as s:
        rid = s.create_run("r", {}, seed=0, config_hash="")
        with pytest.raises(SearchError):
            with s.lease(rid):
                raise SearchError("cannot reach the Ray cluster at '10.0.0.9:6379'")
        run = s.get_run(rid)
        assert run["status"] == "failed" and run["reason"] == "SearchError: cannot reach the Ray cluster at '10.0.0.9:6379'"
        assert s.events(rid, "run_status")[-1]["payload"] == {"status": "failed", "reason": run["reason"]}
        assert not s.holds_lease(rid)  # lease() released it
        # failed stays resumable: a new writer takes it and continues
        s.acquire_lease(rid)
        s.set_run_status(rid, "running")
        assert s.get_run(rid)["reason"] == ""
        with pytest.raises(KeyboardInterrupt):
            with s.lease(rid):
                raise KeyboardInterrupt
        assert s.get_run(rid)["status"] == "interrupted"
        # an already ended run keeps its status; a store without the lease changes nothing
        s.acquire_lease(rid)
        s.set_run_status(rid, "finished")
        assert s.abort_run(rid, RuntimeError("late")) is None and s.get_run(rid)["status"] == "finished"
        s.set_run_status(rid, "running", reason="")
        s.release_lease(rid)
        assert s.abort_run(rid, RuntimeError("not mine")) is None


def test_second_resume_via_the_cli_exits_with_one_line_and_writes_nothing(holder):
    proc, db, rid = holder
    with StoreReader(db) as r:
        before = r.events(rid)
    # --address skips the local-GPU check; the lease is checked before any cluster is contacted.
    res = _cli("search", "configs/demo.toml", "--db", str(db), "--resume", rid, "--address", "127.0.0.1:1",
               "--no-progress")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr, res.stderr
    assert f"pid {proc.pid}" in lines[0] and "already being written" in lines[0] and f"kill {proc.pid}" in lines[0]
    with StoreReader(db) as r:
        assert r.events(rid) == before, "the refused resume wrote to the run"
        assert r.get_run(rid)["status"] == "running"

    _kill(proc)
    res = _cli("runs", "--db", str(db), "--json")
    assert res.returncode == 0, res.stderr
    assert [(x["id"], x["status"]) for x in json.loads(res.stdout)] == [(rid, "interrupted")]
    # Now the resume takes the dead writer's lease over (warning), then fails to start
    # (nothing listens at 127.0.0.1:1): the run ends failed with that reason, not running.
    res = _cli("search", "configs/demo.toml", "--db", str(db), "--resume", rid, "--address", "127.0.0.1:1",
               "--no-progress")
    assert res.returncode == 2 and "taking over" in res.stderr and "cannot reach the Ray cluster" in res.stderr
    with StoreReader(db) as r:
        run = r.get_run(rid)
        assert run["status"] == "failed" and "cannot reach the Ray cluster" in run["reason"]
        assert r.events(rid, "writer_takeover")


def test_a_failed_start_leaves_no_running_run(tmp_path):
    db = tmp_path / "evo.db"
    res = _cli("search", "configs/demo.toml", "--db", str(db), "--address", "127.0.0.1:1", "--no-progress")
    assert res.returncode == 2 and "cannot reach the Ray cluster" in res.stderr, res.stderr
    if not db.exists():  # not created before the start succeeded: also no phantom
        return
    with StoreReader(db) as r:
        runs = r.list_runs()
    assert all(x["recorded_status"] != "running" for x in runs), runs
    for x in runs:
        assert x["status"] == "failed" and "cannot reach the Ray cluster" in x["reason"]
