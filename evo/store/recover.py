"""Salvage what is readable of a damaged lineage database into a new file.

``python -m evo.store.recover BROKEN FIXED`` (the command a
:class:`~evo.store.errors.CorruptDatabaseError` names). It needs only Python's own
``sqlite3``, because the ``sqlite3`` shell's ``.recover`` is missing or broken in some
builds (Debian's 3.40.1 fails with "SQL logic error" even on a healthy file).

How: the schema is read from ``sqlite_master``; every table is copied row by row, scanning
forward by rowid until the first damaged page and then backward from the end until it meets
the forward part, which is how ``sqlite3 .dump`` reads past a damaged subtree; rows that
point at a lost row (foreign keys: an evaluation of a lost candidate, a candidate whose
source is lost) are dropped, and so is half an evaluation (its summary without all its
stage rows, or stage rows without their summary), so the result is consistent; then indexes, triggers and the
schema version are restored and the copy is integrity-checked. What was lost is gone: a
lost evaluation's candidate is pending again, so ``--resume`` evaluates it anew.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["recover", "TableReport"]


@dataclass
class TableReport:
    """What :func:`recover` did to one table."""

    table: str
    copied: int = 0
    dropped: int = 0  # rows that referenced a lost row
    errors: list[str] = field(default_factory=list)  # read errors met while scanning

    @property
    def damaged(self) -> bool:
        return bool(self.errors)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> TableReport:
    rep = TableReport(table)
    cols = [r[1] for r in src.execute(f"PRAGMA table_info({_q(table)})")]
    col_list = ", ".join(_q(c) for c in cols)
    select = f"SELECT rowid, {col_list} FROM {_q(table)} ORDER BY rowid"
    insert = f"INSERT OR IGNORE INTO {_q(table)} (rowid, {col_list}) VALUES ({', '.join('?' * (len(cols) + 1))})"
    last_forward = None
    try:
        for row in src.execute(select):
            dst.execute(insert, row)
            rep.copied += 1
            last_forward = row[0]
        return rep
    except sqlite3.DatabaseError as e:
        rep.errors.append(f"forward scan: {e}")
    try:
        for row in src.execute(select + " DESC"):
            if last_forward is not None and row[0] <= last_forward:
                break
            dst.execute(insert, row)
            rep.copied += 1
    except sqlite3.DatabaseError as e:
        rep.errors.append(f"backward scan: {e}")
    return rep


def _drop_dangling(dst: sqlite3.Connection, reports: dict[str, TableReport]) -> None:
    """Delete rows whose foreign key points at a row that was lost, until none is left."""
    for _ in range(32):  # each pass removes a layer (candidate -> its evaluations -> ...)
        bad = dst.execute("PRAGMA foreign_key_check").fetchall()
        if not bad:
            return
        for table, rowid, _parent, _fk in bad:
            if rowid is None:
                continue
            cur = dst.execute(f"DELETE FROM {_q(table)} WHERE rowid = ?", [rowid])
            if table in reports:
                reports[table].dropped += cur.rowcount


#: The lineage store's own invariants that no foreign key states: an evaluation is its
#: summary row plus exactly ``n_stages`` stage rows, written together, so a half that lost
#: its other half is dropped (the candidate is then pending again: resume re-evaluates it).
_LINEAGE_FIXES = (
    ("evaluations",
     "DELETE FROM evaluations WHERE n_stages != (SELECT COUNT(*) FROM stage_results sr "
     "WHERE sr.run_id = evaluations.run_id AND sr.candidate_id = evaluations.candidate_id)"),
    ("stage_results",
     "DELETE FROM stage_results WHERE NOT EXISTS (SELECT 1 FROM evaluations e "
     "WHERE e.run_id = stage_results.run_id AND e.candidate_id = stage_results.candidate_id)"),
)


def _lineage_fixes(dst: sqlite3.Connection, reports: dict[str, TableReport]) -> None:
    if not {"evaluations", "stage_results"} <= set(reports):
        return
    for table, sql in _LINEAGE_FIXES:
        reports[table].dropped += dst.execute(sql).rowcount


def recover(broken: str | Path, fixed: str | Path) -> list[TableReport]:
    """Copy what is readable of ``broken`` into the new file ``fixed`` (see the module
    docstring). Raises ``FileExistsError`` if ``fixed`` exists and ``sqlite3.DatabaseError``
    when not even the schema is readable."""
    broken, fixed = Path(broken), Path(fixed)
    if not broken.is_file():
        raise FileNotFoundError(f"no database file {broken}")
    if fixed.exists():
        raise FileExistsError(f"{fixed} exists; name a new file for the recovered database")
    src = sqlite3.connect(broken.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        schema = src.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid"
        ).fetchall()
        version = int(src.execute("PRAGMA user_version").fetchone()[0])
        dst = sqlite3.connect(fixed, isolation_level=None)
        try:
            dst.execute("PRAGMA foreign_keys = OFF")
            dst.execute("BEGIN")
            reports: dict[str, TableReport] = {}
            for kind, name, sql in schema:
                if kind == "table":
                    dst.execute(sql)
                    reports[name] = _copy_table(src, dst, name)
            _drop_dangling(dst, reports)
            _lineage_fixes(dst, reports)
            for kind, _name, sql in schema:  # after the data: triggers would refuse the clean-up
                if kind in ("index", "trigger", "view"):
                    dst.execute(sql)
            dst.execute(f"PRAGMA user_version = {version}")
            dst.execute("COMMIT")
            problems = [r[0] for r in dst.execute("PRAGMA integrity_check")]
            if problems != ["ok"]:  # pragma: no cover - a fresh file written by SQLite itself
                raise sqlite3.DatabaseError(f"the recovered copy fails integrity_check: {problems[:3]}")
        finally:
            dst.close()
    finally:
        src.close()
    return list(reports.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m evo.store.recover",
        description="Copy what is readable of a damaged cute-evo lineage database into a new file.",
        epilog="Example: python -m evo.store.recover runs/evo.db runs/evo-recovered.db",
    )
    ap.add_argument("broken", help="the damaged database (left untouched)")
    ap.add_argument("fixed", help="the new file to write (must not exist)")
    args = ap.parse_args(argv)
    try:
        reports = recover(args.broken, args.fixed)
    except (OSError, sqlite3.DatabaseError) as e:
        print(f"error: cannot recover {args.broken}: {e}", file=sys.stderr)
        return 2
    for r in reports:
        note = "damaged: rows past the damage are lost" if r.damaged else "complete"
        drop = f", {r.dropped} dropped (they belonged to lost rows)" if r.dropped else ""
        print(f"{r.table}: {r.copied} rows copied{drop}; {note}")
    print(f"recovered into {args.fixed} (integrity ok); stop using {args.broken} and point run.db / --db "
          f"at the new file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
