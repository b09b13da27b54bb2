"""The lineage database's schema: the ordered migrations that build it, and opening a file
at the right version (check, then migrate or refuse).

The schema is an ordered tuple :data:`MIGRATIONS` of :class:`Migration` (version, name, fn)
with versions 1, 2, 3, ... and no gaps, applied through ``sqlite_utils.Migrations`` (set
``"cute-evo"``, recorded in ``_sqlite_migrations``); each migration runs in one transaction
together with ``PRAGMA user_version = <version>`` and an ``events`` row of kind
``migration``. Only a writer migrates, on open; a reader meets an older file with
:class:`SchemaTooOldError`, and everyone meets a newer one with :class:`SchemaTooNewError`
instead of misreading it. To change the schema, append a migration (never edit a released
one) and describe it in docs/store.md.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Callable, Sequence

import sqlite_utils

from evo.store.errors import (
    CorruptDatabaseError,
    MigrationError,
    NotALineageDatabaseError,
    SchemaTooNewError,
    SchemaTooOldError,
    StoreError,
    is_corruption,
)
from evo.store.rows import dumps, now

__all__ = ["Migration", "MIGRATIONS", "MIGRATION_SET", "SCHEMA_VERSION", "RUN_STATUSES", "check_migrations",
           "prepare"]

log = logging.getLogger(__name__)

MIGRATION_SET = "cute-evo"
#: The values of ``runs.status``.
RUN_STATUSES = ("running", "finished", "failed", "interrupted")


@dataclass(frozen=True)
class Migration:
    """One schema step. ``fn(db)`` gets a ``sqlite_utils.Database`` inside a transaction.

    Versions are 1, 2, 3, ... without gaps; a migration, once released, never changes (add a
    new one instead): databases in the field have recorded its name as applied.
    """

    version: int
    name: str
    fn: Callable[[sqlite_utils.Database], None]

    @property
    def key(self) -> str:
        return f"{self.version:04d}_{self.name}"


def _m0001_initial(db: sqlite_utils.Database) -> None:
    db["runs"].create(
        {
            "id": str,
            "name": str,
            "created": str,
            "updated": str,
            "status": str,
            "seed": int,
            "config_hash": str,
            "config": str,
        },
        pk="id",
        not_null={"name", "created", "status", "config"},
    )
    db["sources"].create({"sha": str, "text": str, "bytes": int}, pk="sha", not_null={"text"})
    db["candidates"].create(
        {
            "id": str,
            "task": str,
            "source_sha": str,
            "params": str,
            "parents": str,
            "operator": str,
            "island": int,
            "generation": int,
            "notes": str,
            "created": str,
        },
        pk="id",
        not_null={"task", "source_sha", "params", "parents", "operator"},
        foreign_keys=[("source_sha", "sources", "sha")],
    )
    db["candidates"].create_index(["task"])
    # Parent edges, one row per (child, position): drives the recursive ancestry CTE and
    # children(). No foreign key on parent_id: a lineage may reference a parent from an
    # imported or pruned database; ancestry simply stops there.
    db["candidate_parents"].create(
        {"child_id": str, "idx": int, "parent_id": str},
        pk=("child_id", "idx"),
        foreign_keys=[("child_id", "candidates", "id")],
    )
    db["candidate_parents"].create_index(["parent_id"])
    db["run_candidates"].create(
        {"run_id": str, "candidate_id": str, "added": str},
        pk=("run_id", "candidate_id"),
        foreign_keys=[("run_id", "runs", "id"), ("candidate_id", "candidates", "id")],
    )
    db["run_candidates"].create_index(["candidate_id"])
    # Per-candidate summary of an evaluation (one per run and candidate) ...
    db["evaluations"].create(
        {
            "run_id": str,
            "candidate_id": str,
            "status": str,
            "fitness": float,
            "failed_stage": str,
            "reason": str,
            "gpu": str,
            "env": str,
            "n_stages": int,
            "seconds": float,
            "created": str,
        },
        pk=("run_id", "candidate_id"),
        not_null={"status", "env", "n_stages"},
        foreign_keys=[("run_id", "runs", "id"), ("candidate_id", "candidates", "id")],
    )
    db["evaluations"].create_index(["candidate_id"])
    db["evaluations"].create_index(["run_id", "status", "fitness"])
    # ... and its stage results, one row per stage, written in the same transaction.
    db["stage_results"].create(
        {
            "run_id": str,
            "candidate_id": str,
            "idx": int,
            "stage": str,
            "status": str,
            "reason": str,
            "metrics": str,
            "artifacts": str,
            "seconds": float,
        },
        pk=("run_id", "candidate_id", "idx"),
        not_null={"stage", "status", "metrics", "artifacts"},
        foreign_keys=[("run_id", "runs", "id"), ("candidate_id", "candidates", "id")],
    )
    db["profiles"].create(
        {"candidate_id": str, "shape": str, "gpu": str, "metrics": str, "created": str},
        pk=("candidate_id", "shape", "gpu"),
        not_null={"metrics"},
        foreign_keys=[("candidate_id", "candidates", "id")],
    )
    db["llm_calls"].create(
        {
            "id": int,
            "run_id": str,
            "created": str,
            "model": str,
            "kind": str,
            "prompt": str,
            "response": str,
            "tokens_in": int,
            "tokens_out": int,
            "cost": float,
            "latency_s": float,
            "error": str,
            "prompt_hash": str,
            "candidate_id": str,
            "cached": int,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["llm_calls"].create_index(["run_id"])
    db["llm_calls"].create_index(["prompt_hash"])
    db["tuning_trials"].create(
        {
            "run_id": str,
            "parent_id": str,
            "trial": int,
            "params": str,
            "value": float,
            "status": str,
            "candidate_id": str,
            "created": str,
            "updated": str,
        },
        pk=("run_id", "parent_id", "trial"),
        not_null={"params", "status"},
        foreign_keys=[("run_id", "runs", "id"), ("parent_id", "candidates", "id")],
    )
    db["champions"].create(
        {
            "run_id": str,
            "task": str,
            "candidate_id": str,
            "fitness": float,
            "confirmation": str,
            "updated": str,
        },
        pk=("run_id", "task"),
        not_null={"candidate_id", "confirmation"},
        foreign_keys=[("run_id", "runs", "id"), ("candidate_id", "candidates", "id")],
    )
    db["events"].create(
        {"id": int, "run_id": str, "created": str, "kind": str, "payload": str},
        pk="id",
        not_null={"created", "kind", "payload"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db["events"].create_index(["run_id", "kind"])
    db.execute(
        "CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events "
        "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END"
    )
    db.execute(
        "CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events "
        "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END"
    )


#: Columns of a champion's gain over its baseline (``evo.engine.champions.SpeedupInterval``).
CHAMPION_GAIN_COLUMNS: dict[str, type] = {
    "gain_ratio": float, "gain_low": float, "gain_high": float, "gain_confidence": float,
    "gain_rounds": int, "gain_method": str, "gain_baseline": str, "verdict": str,
}


def _m0002_champion_gain(db: sqlite_utils.Database) -> None:
    """Champions keep the confidence interval of their speedup over the baseline they were
    timed against (NULL: no baseline, e.g. the seed itself, or a run from before)."""
    for name, kind in CHAMPION_GAIN_COLUMNS.items():
        db["champions"].add_column(name, kind)


#: Columns of an LLM call's outcome and request settings (``mutators.llm.client.calls.LLMCall``).
LLM_CALL_SETTINGS_COLUMNS: dict[str, type] = {
    "finish_reason": str, "reasoning_tokens": int, "cached_tokens": int, "retries": int, "api": str,
    "max_output_tokens": int, "reasoning_effort": str, "timeout_s": float,
}


def _m0003_llm_call_settings(db: sqlite_utils.Database) -> None:
    """LLM calls keep their finish reason, reasoning and cached tokens, retries and the
    request settings as sent (NULL: a call recorded before)."""
    for name, kind in LLM_CALL_SETTINGS_COLUMNS.items():
        db["llm_calls"].add_column(name, kind)


def _m0004_llm_call_candidate(db: sqlite_utils.Database) -> None:
    """LLM calls keep the attempt they answered (``attempt_key``, the LLM mutator's proposal
    identity), so the call whose answer became a child can be linked to that candidate
    (``candidate_id``, set by :meth:`evo.store.Store.link_llm_call`); both are indexed for
    ``evo show``. NULL: a call recorded before, or one whose answer made no child."""
    db["llm_calls"].add_column("attempt_key", str)
    db["llm_calls"].create_index(["candidate_id"])
    db["llm_calls"].create_index(["run_id", "attempt_key"])


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial_schema", _m0001_initial),
    Migration(2, "champion_gain", _m0002_champion_gain),
    Migration(3, "llm_call_settings", _m0003_llm_call_settings),
    Migration(4, "llm_call_candidate", _m0004_llm_call_candidate),
)


def check_migrations(migrations: Sequence[Migration]) -> int:
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(
                f"migration versions must be 1..N without gaps; found {m.version} at "
                f"position {i} ({m.key})"
            )
    return len(migrations)


SCHEMA_VERSION: int = check_migrations(MIGRATIONS)


# --------------------------------------------------------------------------------------
# Opening a file at the right version
# --------------------------------------------------------------------------------------


def db_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the file (``PRAGMA user_version``)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def cannot_read(path: str, e: Exception, busy_timeout_s: float) -> str:
    from pathlib import Path

    return (
        f"cannot use lineage database {path}: {e}. A WAL database needs its directory to be "
        f"writable (SQLite keeps {Path(path).name}-wal and -shm beside it, readers included); "
        f"if another process holds it locked for over {busy_timeout_s:.0f} s, stop that process"
    )


def not_sqlite(path: str, e: Exception) -> StoreError:
    """The error for a file SQLite refuses: damaged pages, or not a SQLite file at all."""
    if is_corruption(e) and "not a database" not in str(e).lower():
        return CorruptDatabaseError(path, e)
    return NotALineageDatabaseError(
        f"{path} is not a SQLite database ({e}); point the store at a cute-evo "
        f"lineage database or at a new file name"
    )


def prepare(
    conn: sqlite3.Connection,
    db: sqlite_utils.Database,
    path: str,
    migrations: Sequence[Migration],
    *,
    readonly: bool,
    busy_timeout_s: float,
) -> None:
    """Bring the open file to ``len(migrations)``: nothing to do, migrate (writers only), or
    raise naming why not (too new, too old for a reader, not ours, empty, damaged)."""
    code_version = check_migrations(migrations)
    try:
        version = db_version(conn)
        tables = set(db.table_names())
    except sqlite3.OperationalError as e:
        raise StoreError(cannot_read(path, e, busy_timeout_s)) from e
    except sqlite3.DatabaseError as e:
        raise not_sqlite(path, e) from e
    ours = {m.key for m in migrations}
    applied = _applied_migration_names(conn, tables)
    unknown = [name for name in applied if name not in ours]
    if version > code_version or unknown:
        raise SchemaTooNewError(path, max(version, len(applied)), code_version)
    if version == 0 and not applied and tables - {"_sqlite_migrations"}:
        raise NotALineageDatabaseError(
            f"{path} is a SQLite database but not a cute-evo lineage database "
            f"(it has tables {sorted(tables)[:8]} and no cute-evo schema version); "
            f"use a new file name for the lineage database"
        )
    if version == code_version:
        return
    if readonly:
        if version == 0:
            raise NotALineageDatabaseError(
                f"{path} is empty, not an initialised lineage database; open it once "
                f"for writing (Store(path) or `evo search`) to create the schema"
            )
        raise SchemaTooOldError(path, version, code_version)
    _migrate(conn, db, path, migrations, version)


def _applied_migration_names(conn: sqlite3.Connection, tables: set[str]) -> list[str]:
    if "_sqlite_migrations" not in tables:
        return []
    rows = conn.execute(
        "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid",
        [MIGRATION_SET],
    ).fetchall()
    return [r[0] for r in rows]


def _migrate(
    conn: sqlite3.Connection, db: sqlite_utils.Database, path: str, migrations: Sequence[Migration], from_version: int
) -> None:
    code_version = len(migrations)
    mset = sqlite_utils.Migrations(MIGRATION_SET)
    for m in migrations:
        mset(name=m.key)(_wrap_migration(m))
    pending = [m.key for m in migrations if m.version > from_version]
    log.info("migrating %s from schema %d to %d: %s", path, from_version, code_version, pending)
    try:
        mset.apply(db)
    except Exception as e:
        raise MigrationError(
            f"schema migration of {path} failed ({type(e).__name__}: {e}); the failing "
            f"step was rolled back and the database is at version {db_version(conn)}. "
            f"Report this with the file, or restore a backup."
        ) from e
    if db_version(conn) != code_version:
        raise MigrationError(
            f"{path}: after migrating, schema version is {db_version(conn)}, expected "
            f"{code_version}; the _sqlite_migrations table disagrees with "
            f"PRAGMA user_version (was the file edited by hand?)"
        )


def _wrap_migration(m: Migration) -> Callable[[sqlite_utils.Database], None]:
    def apply(db: sqlite_utils.Database) -> None:
        before = int(db.execute("PRAGMA user_version").fetchone()[0])
        m.fn(db)
        db.execute(f"PRAGMA user_version = {int(m.version)}")
        db.execute(
            "INSERT INTO events (run_id, created, kind, payload) VALUES (NULL, ?, ?, ?)",
            [now(), "migration", dumps({"version": m.version, "name": m.name, "from_version": before})],
        )

    apply.__name__ = m.key
    return apply
