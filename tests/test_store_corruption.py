"""A damaged lineage database (interior page corruption) gives one line naming the file and
the recovery command, and that command salvages a consistent, resumable database.

The damage is real: a store-written file whose ``evaluations`` table is a two-level b-tree
gets its root (an interior page) overwritten on disk, past the page header.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import evo
from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.store import CorruptDatabaseError, Store, StoreReader, is_corruption, recovery_command

REPO_ROOT = Path(evo.__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
N = 300


def _build(path: Path) -> str:
    with Store(path) as s:
        rid = s.create_run("c", {}, seed=0, config_hash="")
        with s.transaction():
            for i in range(N):
                c = Candidate.create("gemm", f"// kernel {i}\n" + "x" * 200)
                s.add_candidate(rid, c)
                s.add_evaluation(rid, Evaluation(c.id, (StageResult("compile", Status.OK, metrics={"i": i}),
                                                        StageResult("timing", Status.OK)),
                                                 fitness=1.0 + i, env={"pad": "y" * 100}))
        s.set_run_status(rid, "finished")
    return rid


def _corrupt_interior_page(path: Path, table: str) -> None:
    with sqlite3.connect(path) as raw:
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    raw.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0  # all in the main file
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        assert f.read(1) == b"\x05", "the table's root must be an interior b-tree page for this test"
        f.seek((root - 1) * page_size + 12)  # keep the 12-byte header, trash the cell pointers
        f.write(b"\xff" * (page_size - 12))


@pytest.fixture
def damaged(tmp_path):
    db = tmp_path / "evo.db"
    rid = _build(db)
    _corrupt_interior_page(db, "evaluations")
    return db, rid


def test_reads_of_a_damaged_table_raise_one_line_with_the_recovery_command(damaged):
    db, rid = damaged
    with StoreReader(db) as r:
        assert len(r.candidates(rid)) == N  # undamaged tables still read
        with pytest.raises(CorruptDatabaseError) as ei:
            r.evaluations(rid)
    msg = str(ei.value)
    assert "\n" not in msg and str(db) in msg and "is corrupt" in msg
    assert recovery_command(db) in msg and "python -m evo.store.recover" in msg
    assert isinstance(ei.value.__cause__, sqlite3.DatabaseError) and is_corruption(ei.value.__cause__)
    with Store(db) as w, pytest.raises(CorruptDatabaseError):
        w.list_runs()


def test_the_cli_prints_one_line_not_a_traceback(damaged):
    db, rid = damaged
    res = subprocess.run([sys.executable, "-m", "evo.cli", "runs", "--db", str(db)], capture_output=True, text=True,
                         env=ENV, timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and recovery_command(db) in lines[0], res.stderr


def test_the_recovery_command_salvages_a_consistent_resumable_database(damaged):
    db, rid = damaged
    with StoreReader(db) as r, pytest.raises(CorruptDatabaseError) as ei:
        r.evaluations(rid)
    cmd = shlex.split(ei.value.recovery)
    assert cmd[:3] == ["python", "-m", "evo.store.recover"]
    res = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, env=ENV, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "evaluations:" in res.stdout and "damaged" in res.stdout
    fixed = Path(cmd[-1])
    with Store(fixed) as s:  # a writer opens it: same schema version, no migration needed
        assert s.integrity_check() == ["ok"]
        evs = s.evaluations(rid)
        assert 0 < len(evs) < N, "some evaluations were lost, some saved"
        assert all(len(ev.stages) == 2 for ev in evs), "no half evaluations"
        pending = s.pending_ids(rid)
        assert len(pending) + len(evs) == N == len(s.candidates(rid))
        # resumable: a lost evaluation is simply pending and can be recorded again
        again = Evaluation(pending[0], (StageResult("compile", Status.OK),), fitness=9.0)
        assert s.add_evaluation(rid, again) is True
    assert db.exists() and subprocess.run([sys.executable, *cmd[1:]], capture_output=True, env=ENV).returncode == 2


def test_other_sqlite_errors_are_not_called_corruption(tmp_path):
    assert not is_corruption(sqlite3.OperationalError("database is locked"))
    assert not is_corruption(sqlite3.IntegrityError("UNIQUE constraint failed: runs.id"))
    assert not is_corruption(ValueError("database disk image is malformed"))
    with sqlite3.connect(tmp_path / "a.db") as raw:
        raw.execute("CREATE TABLE t (x UNIQUE)")
        raw.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError) as ei:
            raw.execute("INSERT INTO t VALUES (1)")
    assert not is_corruption(ei.value)
