"""The lineage database: every run, candidate, evaluation, profile, LLM call, tuning trial,
champion and event of a search, in one SQLite file (built on ``sqlite-utils``).

Concurrency model (the contract every caller relies on):

* **One writer.** The search driver owns the only writing :class:`Store`. SQLite runs in WAL
  mode, so the writer never blocks readers and readers never block the writer. Each public
  write method is one transaction; :meth:`Store.transaction` groups several into one.
  Write transactions start with ``BEGIN IMMEDIATE`` so a second writer (which the design does
  not have, but a user might start) waits on ``busy_timeout`` instead of failing half-way.
* **Many readers.** ``Store(path, readonly=True)`` / :meth:`Store.open_reader` opens the file
  through a ``file:...?mode=ro`` URI plus ``PRAGMA query_only``; its write methods raise
  :class:`ReadOnlyStoreError` before touching SQL. Multi-query reads run inside one read
  transaction, so a reader sees a consistent snapshot: never a candidate without its source,
  never an evaluation summary without all of its stage rows.
* **Durability.** ``synchronous=FULL``: a transaction that returned is on disk; a writer killed
  mid-transaction (SIGKILL, OOM) loses that transaction only, never a committed one.

Schema versioning: the schema is built by an ordered list of :class:`Migration` (version,
name, fn) applied through ``sqlite_utils.Migrations`` (set ``"cute-evo"``, recorded in
``_sqlite_migrations``); each migration runs in one transaction together with
``PRAGMA user_version = <version>`` and an ``events`` row of kind ``migration``. A database
whose version is newer than this code's raises :class:`SchemaTooNewError` instead of being
misread. See docs/store.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import sqlite_utils

from evo.records import Candidate, Evaluation, StageResult, Status, source_sha

__all__ = [
    "Store",
    "Migration",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "RUN_STATUSES",
    "StoreError",
    "StoreNotFoundError",
    "NotALineageDatabaseError",
    "SchemaTooNewError",
    "SchemaTooOldError",
    "MigrationError",
    "ReadOnlyStoreError",
    "UnknownIdError",
    "AmbiguousIdError",
    "RunExistsError",
]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0
MIGRATION_SET = "cute-evo"
RUN_STATUSES = ("running", "finished", "failed", "interrupted")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_LLM_FIELDS = (
    "prompt",
    "response",
    "model",
    "kind",
    "tokens_in",
    "tokens_out",
    "cost",
    "latency_s",
    "error",
    "prompt_hash",
    "candidate_id",
    "cached",
)


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class StoreError(Exception):
    """Base class of every error the lineage store raises on purpose."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """A reader was asked to open a database file that does not exist."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        super().__init__(
            f"lineage database not found: {self.path} (readers never create one; check the "
            f"path, or start a run with `evo search` which creates it)"
        )


class NotALineageDatabaseError(StoreError):
    """The file exists but is not a SQLite file, or is a SQLite file of some other program."""


class SchemaTooNewError(StoreError):
    """The database was written by a newer cute-evo whose schema this code does not know."""

    def __init__(self, path: str, db_version: int, code_version: int):
        self.path = path
        self.db_version = db_version
        self.code_version = code_version
        super().__init__(
            f"lineage database {path} has schema version {db_version}, but this cute-evo "
            f"only knows schema versions up to {code_version}; upgrade cute-evo "
            f"(pip install -U cute-evo) to open it. The file was left untouched."
        )


class SchemaTooOldError(StoreError):
    """A read-only store met a database that still needs migrations (readers never migrate)."""

    def __init__(self, path: str, db_version: int, code_version: int):
        self.path = path
        self.db_version = db_version
        self.code_version = code_version
        super().__init__(
            f"lineage database {path} has schema version {db_version}, this cute-evo expects "
            f"{code_version}; readers never migrate. Open it once for writing (e.g. "
            f"`evo search --resume RUN`, or Store(path) in Python) to upgrade it."
        )


class MigrationError(StoreError):
    """A schema migration failed; its transaction was rolled back and the DB is unchanged."""


class ReadOnlyStoreError(StoreError, PermissionError):
    """A write was attempted through a read-only store."""


class UnknownIdError(StoreError, LookupError):
    """No candidate (or run) matches an id or id prefix. ``near`` lists the closest ids."""

    def __init__(self, message: str, *, query: str = "", near: Sequence[str] = (), kind: str = "candidate"):
        self.query = query
        self.near = tuple(near)
        self.kind = kind
        super().__init__(message)


class AmbiguousIdError(UnknownIdError):
    """An id prefix matches more than one candidate (or run); ``near`` lists the matches."""


class RunExistsError(StoreError):
    """``create_run`` was given a run id that is already taken."""


# --------------------------------------------------------------------------------------
# Migrations
# --------------------------------------------------------------------------------------


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


MIGRATIONS: tuple[Migration, ...] = (Migration(1, "initial_schema", _m0001_initial),)


def _check_migrations(migrations: Sequence[Migration]) -> int:
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(
                f"migration versions must be 1..N without gaps; found {m.version} at "
                f"position {i} ({m.key})"
            )
    return len(migrations)


SCHEMA_VERSION: int = _check_migrations(MIGRATIONS)


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(
        f"value of type {type(obj).__name__} is not JSON-serialisable; the lineage store keeps "
        f"metrics/params/payloads as JSON, convert it to int/float/str/list/dict first"
    )


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False)


def _loads(text: str | None, default: Any = None) -> Any:
    if text is None:
        return default
    return json.loads(text)


def _float_or_none(x: Any) -> float | None:
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) else f


def _cannot_read(path: str, e: Exception) -> str:
    return (
        f"cannot use lineage database {path}: {e}. A WAL database needs its directory to be "
        f"writable (SQLite keeps {Path(path).name}-wal and -shm beside it, readers included); "
        f"if another process holds it locked for over {BUSY_TIMEOUT_S:.0f} s, stop that process"
    )


_CANDIDATE_COLS = (
    "c.id, c.task, s.text, c.params, c.parents, c.operator, c.island, c.generation, c.notes"
)


def _row_to_candidate(row: Sequence[Any]) -> Candidate:
    cid, task, text, params, parents, operator, island, generation, notes = row[:9]
    return Candidate(
        id=cid,
        task=task,
        source=text,
        params=tuple((str(k), str(v)) for k, v in _loads(params, [])),
        parents=tuple(_loads(parents, [])),
        operator=operator,
        island=int(island or 0),
        generation=int(generation or 0),
        notes=notes or "",
    )


def new_run_id(now: datetime | None = None) -> str:
    """A short, typable, practically unique run id: ``r-YYYYMMDD-HHMM-xxxx`` (UTC, 4 hex)."""
    now = now or datetime.now(timezone.utc)
    return f"r-{now:%Y%m%d-%H%M}-{secrets.token_hex(2)}"


# --------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------


class Store:
    """The lineage database (see the module docstring for the concurrency model).

    ``Store(path)`` opens (creating if needed) and migrates the database for writing;
    ``Store(path, readonly=True)`` or :meth:`open_reader` opens an existing one read-only.
    Usable as a context manager. All methods are thread-safe (one lock per store), but the
    design has one writing store per database, owned by the search driver.
    """

    #: The migrations this class applies; a subclass may extend it (tests do).
    migrations: tuple[Migration, ...] = MIGRATIONS

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False):
        self.path = str(path)
        self.readonly = readonly
        self.code_version = _check_migrations(self.migrations)
        self._lock = threading.RLock()
        self._closed = False
        self._conn = self._connect()
        try:
            self.db = sqlite_utils.Database(self._conn)
            self._prepare()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    @classmethod
    def open_reader(cls, path: str | os.PathLike[str]) -> "Store":
        """Open an existing database read-only (never creates, never migrates)."""
        return cls(path, readonly=True)

    # ---- connection and schema ---------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        p = Path(self.path)
        if self.readonly:
            if not p.is_file():
                raise StoreNotFoundError(self.path)
            target, uri = p.resolve().as_uri() + "?mode=ro", True
        else:
            if p.parent and not p.parent.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
            target, uri = self.path, False
        try:
            # isolation_level=None: no implicit BEGIN; transactions are explicit below.
            conn = sqlite3.connect(
                target,
                uri=uri,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.OperationalError as e:
            raise StoreError(f"cannot open lineage database {self.path}: {e}") from e
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if self.readonly:
                conn.execute("PRAGMA query_only = ON")
            else:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("journal_mode WAL refused for %s (got %s)", self.path, mode)
                conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.OperationalError as e:
            conn.close()
            raise StoreError(_cannot_read(self.path, e)) from e
        except sqlite3.DatabaseError as e:
            conn.close()
            raise NotALineageDatabaseError(
                f"{self.path} is not a SQLite database ({e}); point the store at a cute-evo "
                f"lineage database or at a new file name"
            ) from e
        return conn

    def _db_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _prepare(self) -> None:
        try:
            version = self._db_version()
            tables = set(self.db.table_names())
        except sqlite3.OperationalError as e:
            raise StoreError(_cannot_read(self.path, e)) from e
        except sqlite3.DatabaseError as e:
            raise NotALineageDatabaseError(
                f"{self.path} is not a SQLite database ({e}); point the store at a cute-evo "
                f"lineage database or at a new file name"
            ) from e
        ours = {m.key for m in self.migrations}
        applied = self._applied_migration_names(tables)
        unknown = [name for name in applied if name not in ours]
        if version > self.code_version or unknown:
            raise SchemaTooNewError(self.path, max(version, len(applied)), self.code_version)
        if version == 0 and not applied and tables - {"_sqlite_migrations"}:
            raise NotALineageDatabaseError(
                f"{self.path} is a SQLite database but not a cute-evo lineage database "
                f"(it has tables {sorted(tables)[:8]} and no cute-evo schema version); "
                f"use a new file name for the lineage database"
            )
        if version == self.code_version:
            return
        if self.readonly:
            if version == 0:
                raise NotALineageDatabaseError(
                    f"{self.path} is empty, not an initialised lineage database; open it once "
                    f"for writing (Store(path) or `evo search`) to create the schema"
                )
            raise SchemaTooOldError(self.path, version, self.code_version)
        self._migrate(version)

    def _applied_migration_names(self, tables: set[str]) -> list[str]:
        if "_sqlite_migrations" not in tables:
            return []
        rows = self._conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid",
            [MIGRATION_SET],
        ).fetchall()
        return [r[0] for r in rows]

    def _migrate(self, from_version: int) -> None:
        mset = sqlite_utils.Migrations(MIGRATION_SET)
        for m in self.migrations:
            mset(name=m.key)(self._wrap_migration(m))
        pending = [m.key for m in self.migrations if m.version > from_version]
        log.info("migrating %s from schema %d to %d: %s", self.path, from_version, self.code_version, pending)
        try:
            mset.apply(self.db)
        except Exception as e:
            raise MigrationError(
                f"schema migration of {self.path} failed ({type(e).__name__}: {e}); the failing "
                f"step was rolled back and the database is at version {self._db_version()}. "
                f"Report this with the file, or restore a backup."
            ) from e
        if self._db_version() != self.code_version:
            raise MigrationError(
                f"{self.path}: after migrating, schema version is {self._db_version()}, expected "
                f"{self.code_version}; the _sqlite_migrations table disagrees with "
                f"PRAGMA user_version (was the file edited by hand?)"
            )

    @staticmethod
    def _wrap_migration(m: Migration) -> Callable[[sqlite_utils.Database], None]:
        def apply(db: sqlite_utils.Database) -> None:
            before = int(db.execute("PRAGMA user_version").fetchone()[0])
            m.fn(db)
            db.execute(f"PRAGMA user_version = {int(m.version)}")
            db.execute(
                "INSERT INTO events (run_id, created, kind, payload) VALUES (NULL, ?, ?, ?)",
                [
                    _now(),
                    "migration",
                    _dumps({"version": m.version, "name": m.name, "from_version": before}),
                ],
            )

        apply.__name__ = m.key
        return apply

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the database file (``PRAGMA user_version``)."""
        with self._lock:
            self._check_open()
            return self._db_version()

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent). An open transaction is rolled back."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            finally:
                self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"Store({self.path!r}, {mode}{', closed' if self._closed else ''})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"lineage store {self.path} is closed")

    def _check_writable(self, what: str) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStoreError(
                f"cannot {what}: lineage store {self.path} was opened read-only; only the "
                f"search driver's Store(path) writes"
            )

    # ---- transactions -------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator["Store"]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); nested calls use savepoints.

        Everything written inside commits together or not at all; an exception rolls it back
        and propagates. Holds the store's lock, so other threads wait rather than join it.
        """
        with self._lock:
            self._check_writable("open a write transaction")
            if self._conn.in_transaction:
                name = f"evo_{secrets.token_hex(8)}"
                self._conn.execute(f"SAVEPOINT {name}")
                try:
                    yield self
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                        self._conn.execute(f"RELEASE SAVEPOINT {name}")
                    raise
                else:
                    self._conn.execute(f"RELEASE SAVEPOINT {name}")
                return
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            else:
                try:
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A consistent read: several SELECTs inside one read transaction."""
        with self._lock:
            self._check_open()
            if self._conn.in_transaction:
                yield self._conn
                return
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")

    # ---- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        seed: int,
        config_hash: str,
        run_id: str | None = None,
    ) -> str:
        """Record a new run (status ``running``) and return its id.

        Without ``run_id`` a fresh ``r-YYYYMMDD-HHMM-xxxx`` is drawn. A given ``run_id`` must
        match ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}`` and be unused (:class:`RunExistsError`).
        """
        if run_id is not None and not _RUN_ID_RE.match(run_id):
            raise ValueError(
                f"invalid run id {run_id!r}: use 1-64 characters from A-Z a-z 0-9 . _ -, "
                f"starting with a letter or digit"
            )
        self._check_writable("create a run")
        config_json = _dumps(dict(config))
        with self.transaction():
            rid = run_id
            if rid is None:
                for _ in range(50):
                    rid = new_run_id()
                    if not self._run_exists(rid):
                        break
                else:  # pragma: no cover - 65536 ids per minute
                    raise RunExistsError("could not draw an unused run id; pass run_id=")
            elif self._run_exists(rid):
                raise RunExistsError(
                    f"run {rid!r} already exists in {self.path}; pick another id or resume it"
                )
            now = _now()
            self._conn.execute(
                "INSERT INTO runs (id, name, created, updated, status, seed, config_hash, config) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
                [rid, name, now, now, int(seed), config_hash, config_json],
            )
            self._event(rid, "run_created", {"name": name, "seed": int(seed), "config_hash": config_hash})
        assert rid is not None
        return rid

    def _run_exists(self, run_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is not None

    def _require_run(self, run_id: str) -> None:
        if not self._run_exists(run_id):
            near = [r[0] for r in self._conn.execute("SELECT id FROM runs ORDER BY created DESC LIMIT 5")]
            raise UnknownIdError(
                f"no run {run_id!r} in {self.path}" + (f"; recent runs: {', '.join(near)}" if near else "; it has no runs"),
                query=run_id,
                near=near,
                kind="run",
            )

    _RUN_SUMMARY_SQL = (
        "SELECT r.id, r.name, r.created, r.updated, r.status, r.seed, r.config_hash, "
        "(SELECT COUNT(*) FROM run_candidates rc WHERE rc.run_id = r.id), "
        "(SELECT COUNT(*) FROM evaluations e WHERE e.run_id = r.id), "
        "(SELECT COUNT(*) FROM evaluations e WHERE e.run_id = r.id AND e.status = 'ok' "
        " AND e.fitness IS NOT NULL) "
        "FROM runs r"
    )

    def _run_summary(self, row: Sequence[Any]) -> dict[str, Any]:
        keys = ("id", "name", "created", "updated", "status", "seed", "config_hash",
                "n_candidates", "n_evaluated", "n_correct")
        d = dict(zip(keys, row))
        best = self._conn.execute(
            "SELECT c.task, MAX(e.fitness) FROM evaluations e JOIN candidates c ON c.id = e.candidate_id "
            "WHERE e.run_id = ? AND e.status = 'ok' AND e.fitness IS NOT NULL GROUP BY c.task ORDER BY c.task",
            [d["id"]],
        ).fetchall()
        d["best"] = {task: fit for task, fit in best}
        return d

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run as a dict: id, name, created, updated, status, seed, config_hash, config
        (dict), n_candidates, n_evaluated, n_correct, best ({task: best fitness})."""
        with self._snapshot() as conn:
            row = conn.execute(self._RUN_SUMMARY_SQL + " WHERE r.id = ?", [run_id]).fetchone()
            if row is None:
                self._require_run(run_id)
            d = self._run_summary(row)
            d["config"] = _loads(conn.execute("SELECT config FROM runs WHERE id = ?", [run_id]).fetchone()[0], {})
            return d

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first, as :meth:`get_run` dicts without ``config``."""
        with self._snapshot() as conn:
            rows = conn.execute(self._RUN_SUMMARY_SQL + " ORDER BY r.created DESC, r.rowid DESC").fetchall()
            return [self._run_summary(r) for r in rows]

    def resolve_run(self, prefix: str) -> str:
        """The one run id starting with ``prefix`` (exact ids win); see :meth:`resolve_id`."""
        return self._resolve("runs", "run", prefix)

    def set_run_status(self, run_id: str, status: str) -> None:
        """Set a run's status (one of :data:`RUN_STATUSES`) and log a ``run_status`` event."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        self._check_writable("set a run status")
        with self.transaction():
            self._require_run(run_id)
            self._conn.execute("UPDATE runs SET status = ?, updated = ? WHERE id = ?", [status, _now(), run_id])
            self._event(run_id, "run_status", {"status": status})

    # ---- candidates ---------------------------------------------------------------------

    def add_candidate(self, run_id: str, c: Candidate) -> bool:
        """Record ``c`` as a member of run ``run_id``; True if that is new, False if a no-op.

        The source text is stored once per content hash in ``sources``. A candidate's row is
        keyed by its content id and written on first sight only: proposing the same content
        again (from another parent, or in another run) keeps the first lineage fields and
        only links the candidate to the run.
        """
        if not c.id:
            raise ValueError("candidate has an empty id; build it with Candidate.create(...)")
        self._check_writable("add a candidate")
        with self.transaction():
            self._require_run(run_id)
            sha = source_sha(c.source)
            self._conn.execute(
                "INSERT OR IGNORE INTO sources (sha, text, bytes) VALUES (?, ?, ?)",
                [sha, c.source, len(c.source.encode("utf-8"))],
            )
            now = _now()
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO candidates (id, task, source_sha, params, parents, operator, "
                "island, generation, notes, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [c.id, c.task, sha, _dumps([list(p) for p in c.params]), _dumps(list(c.parents)),
                 c.operator, int(c.island), int(c.generation), c.notes, now],
            )
            if cur.rowcount:
                self._conn.executemany(
                    "INSERT INTO candidate_parents (child_id, idx, parent_id) VALUES (?, ?, ?)",
                    [(c.id, i, p) for i, p in enumerate(c.parents)],
                )
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO run_candidates (run_id, candidate_id, added) VALUES (?, ?, ?)",
                [run_id, c.id, now],
            )
            return bool(cur.rowcount)

    def get_candidate(self, cid: str) -> Candidate:
        """The candidate with full id ``cid`` (use :meth:`resolve_id` for prefixes)."""
        with self._snapshot() as conn:
            row = conn.execute(
                f"SELECT {_CANDIDATE_COLS} FROM candidates c JOIN sources s ON s.sha = c.source_sha "
                "WHERE c.id = ?",
                [cid],
            ).fetchone()
            if row is None:
                self._raise_not_full_id(cid)
            return _row_to_candidate(row)

    def _raise_not_full_id(self, cid: str) -> None:
        full = self._resolve("candidates", "candidate", cid)  # raises with near matches
        raise UnknownIdError(
            f"{cid!r} is not a full candidate id (it abbreviates {full[:16]}...); pass the full "
            f"id, or resolve a prefix with resolve_id() first",
            query=cid,
            near=[full],
        )

    def has_candidate(self, cid: str) -> bool:
        with self._snapshot() as conn:
            return conn.execute("SELECT 1 FROM candidates WHERE id = ?", [cid]).fetchone() is not None

    def resolve_id(self, prefix: str) -> str:
        """The one candidate id starting with ``prefix`` (case-insensitive, any length >= 1).

        Raises :class:`UnknownIdError` naming the closest ids when nothing matches, and
        :class:`AmbiguousIdError` (a subclass) listing the matches when several do.
        """
        return self._resolve("candidates", "candidate", prefix)

    def _resolve(self, table: str, kind: str, prefix: str) -> str:
        q = (prefix or "").strip()
        if kind == "candidate":
            q = q.lower()
        if not q:
            raise UnknownIdError(f"empty {kind} id; give at least one character", query=prefix, kind=kind)
        with self._snapshot() as conn:
            if conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", [q]).fetchone():
                return q
            matches = self._prefix_matches(conn, table, q, 11)
            if len(matches) == 1:
                return matches[0]
            if matches:
                shown = ", ".join(m[:16] for m in matches[:10])
                more = " and more" if len(matches) > 10 else ""
                raise AmbiguousIdError(
                    f"{kind} id prefix {q!r} is ambiguous: it matches {shown}{more}; "
                    f"type more characters",
                    query=q,
                    near=matches[:10],
                    kind=kind,
                )
            near: list[str] = []
            for n in range(len(q) - 1, 0, -1):
                near = self._prefix_matches(conn, table, q[:n], 5)
                if near:
                    break
            hint = (
                f"; closest: {', '.join(m[:16] for m in near)}"
                if near
                else f"; no {kind} id in {self.path} shares even its first character"
            )
            raise UnknownIdError(f"no {kind} id starts with {q!r}{hint}", query=q, near=near, kind=kind)

    @staticmethod
    def _prefix_matches(conn: sqlite3.Connection, table: str, prefix: str, limit: int) -> list[str]:
        # Range scan on the primary key: ids in [prefix, prefix + U+10FFFF).
        rows = conn.execute(
            f"SELECT id FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            [prefix, prefix + "\U0010ffff", limit],
        ).fetchall()
        return [r[0] for r in rows]

    def candidates(self, run_id: str, task: str | None = None) -> list[Candidate]:
        """The run's candidates (optionally of one task) in the order they joined the run."""
        sql = (
            f"SELECT {_CANDIDATE_COLS} FROM run_candidates rc JOIN candidates c ON c.id = rc.candidate_id "
            "JOIN sources s ON s.sha = c.source_sha WHERE rc.run_id = ?"
        )
        args: list[Any] = [run_id]
        if task is not None:
            sql += " AND c.task = ?"
            args.append(task)
        with self._snapshot() as conn:
            self._require_run(run_id)
            return [_row_to_candidate(r) for r in conn.execute(sql + " ORDER BY rc.rowid", args)]

    def pending_ids(self, run_id: str) -> list[str]:
        """Ids of the run's candidates without an evaluation yet (in-flight at a crash), in order."""
        with self._snapshot() as conn:
            self._require_run(run_id)
            rows = conn.execute(
                "SELECT rc.candidate_id FROM run_candidates rc LEFT JOIN evaluations e "
                "ON e.run_id = rc.run_id AND e.candidate_id = rc.candidate_id "
                "WHERE rc.run_id = ? AND e.candidate_id IS NULL ORDER BY rc.rowid",
                [run_id],
            ).fetchall()
            return [r[0] for r in rows]

    # ---- lineage ------------------------------------------------------------------------

    def ancestry(self, cid: str) -> list[Candidate]:
        """``cid`` first, then its ancestors breadth-first (parents in their listed order),
        each once. Parents missing from the store end the walk on that branch."""
        with self._snapshot() as conn:
            rows = conn.execute(
                "WITH RECURSIVE anc(id) AS (SELECT ? UNION "
                "SELECT p.parent_id FROM candidate_parents p JOIN anc ON p.child_id = anc.id) "
                f"SELECT {_CANDIDATE_COLS} FROM anc JOIN candidates c ON c.id = anc.id "
                "JOIN sources s ON s.sha = c.source_sha",
                [cid],
            ).fetchall()
            by_id = {r[0]: _row_to_candidate(r) for r in rows}
            if cid not in by_id:
                self._raise_not_full_id(cid)
        out: list[Candidate] = []
        seen = {cid}
        queue = deque([cid])
        while queue:
            c = by_id[queue.popleft()]
            out.append(c)
            for p in c.parents:
                if p in by_id and p not in seen:
                    seen.add(p)
                    queue.append(p)
        return out

    def children(self, cid: str) -> list[Candidate]:
        """Candidates that list ``cid`` among their parents, oldest first."""
        with self._snapshot() as conn:
            rows = conn.execute(
                f"SELECT {_CANDIDATE_COLS} FROM candidates c JOIN sources s ON s.sha = c.source_sha "
                "WHERE c.id IN (SELECT child_id FROM candidate_parents WHERE parent_id = ?) "
                "ORDER BY c.rowid",
                [cid],
            ).fetchall()
            return [_row_to_candidate(r) for r in rows]

    # ---- evaluations --------------------------------------------------------------------

    def add_evaluation(self, run_id: str, ev: Evaluation) -> bool:
        """Record ``ev`` (its stage rows and summary, in one transaction) for run ``run_id``.

        Idempotent per (run, candidate): a second evaluation of the same candidate in the same
        run is a no-op and returns False. The candidate must already be stored
        (:class:`UnknownIdError` otherwise); it is linked to the run if it was not.
        """
        self._check_writable("add an evaluation")
        with self.transaction():
            self._require_run(run_id)
            if self._conn.execute("SELECT 1 FROM candidates WHERE id = ?", [ev.candidate_id]).fetchone() is None:
                raise UnknownIdError(
                    f"cannot record an evaluation of unknown candidate {ev.candidate_id[:16]!r}: "
                    f"add_candidate() it first",
                    query=ev.candidate_id,
                )
            failed = ev.failed_stage
            fitness = _float_or_none(ev.fitness)
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO evaluations (run_id, candidate_id, status, fitness, failed_stage, "
                "reason, gpu, env, n_stages, seconds, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, ev.candidate_id, ev.status.value, fitness,
                 failed.stage if failed else None, failed.reason if failed else "",
                 ev.gpu, _dumps(dict(ev.env)), len(ev.stages),
                 float(sum(s.seconds for s in ev.stages)), _now()],
            )
            if not cur.rowcount:
                return False
            self._conn.executemany(
                "INSERT INTO stage_results (run_id, candidate_id, idx, stage, status, reason, metrics, "
                "artifacts, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, ev.candidate_id, i, s.stage, Status(s.status).value, s.reason,
                  _dumps(dict(s.metrics)), _dumps(dict(s.artifacts)), float(s.seconds))
                 for i, s in enumerate(ev.stages)],
            )
            self._conn.execute(
                "INSERT OR IGNORE INTO run_candidates (run_id, candidate_id, added) VALUES (?, ?, ?)",
                [run_id, ev.candidate_id, _now()],
            )
            return True

    def _load_evaluations(self, conn: sqlite3.Connection, where: str, args: Sequence[Any]) -> list[tuple[str, Evaluation]]:
        summaries = conn.execute(
            "SELECT e.run_id, e.candidate_id, e.fitness, e.gpu, e.env FROM evaluations e "
            f"WHERE {where} ORDER BY e.rowid",
            list(args),
        ).fetchall()
        if not summaries:
            return []
        stages: dict[tuple[str, str], list[StageResult]] = {}
        for run_id, cid, stage, status, reason, metrics, artifacts, seconds in conn.execute(
            "SELECT sr.run_id, sr.candidate_id, sr.stage, sr.status, sr.reason, sr.metrics, sr.artifacts, "
            "sr.seconds FROM stage_results sr JOIN evaluations e ON e.run_id = sr.run_id "
            f"AND e.candidate_id = sr.candidate_id WHERE {where} ORDER BY sr.run_id, sr.candidate_id, sr.idx",
            list(args),
        ):
            stages.setdefault((run_id, cid), []).append(
                StageResult(
                    stage=stage,
                    status=Status(status),
                    reason=reason or "",
                    metrics=_loads(metrics, {}),
                    artifacts=_loads(artifacts, {}),
                    seconds=float(seconds or 0.0),
                )
            )
        return [
            (run_id, Evaluation(
                candidate_id=cid,
                stages=tuple(stages.get((run_id, cid), ())),
                fitness=_float_or_none(fitness),
                gpu=gpu or "",
                env=_loads(env, {}),
            ))
            for run_id, cid, fitness, gpu, env in summaries
        ]

    def get_evaluation(self, cid: str, run_id: str | None = None) -> Evaluation | None:
        """The evaluation of ``cid`` in ``run_id`` (or its latest in any run); None if none."""
        with self._snapshot() as conn:
            if run_id is not None:
                got = self._load_evaluations(conn, "e.run_id = ? AND e.candidate_id = ?", [run_id, cid])
            else:
                row = conn.execute(
                    "SELECT run_id FROM evaluations WHERE candidate_id = ? ORDER BY rowid DESC LIMIT 1", [cid]
                ).fetchone()
                if row is None:
                    return None
                got = self._load_evaluations(conn, "e.run_id = ? AND e.candidate_id = ?", [row[0], cid])
            return got[0][1] if got else None

    def evaluations(self, run_id: str, task: str | None = None) -> list[Evaluation]:
        """All of a run's evaluations (optionally of one task's candidates), in recorded order."""
        where, args = "e.run_id = ?", [run_id]
        if task is not None:
            where += " AND e.candidate_id IN (SELECT id FROM candidates WHERE task = ?)"
            args.append(task)
        with self._snapshot() as conn:
            self._require_run(run_id)
            return [ev for _, ev in self._load_evaluations(conn, where, args)]

    def evaluated_ids(self, run_id: str) -> set[str]:
        """Ids of the run's candidates that have an evaluation (what resume must not redo)."""
        with self._snapshot() as conn:
            return {r[0] for r in conn.execute("SELECT candidate_id FROM evaluations WHERE run_id = ?", [run_id])}

    def top_k(self, run_id: str, task: str | None = None, k: int = 10) -> list[tuple[Candidate, float]]:
        """The ``k`` fittest correct candidates of the run, fittest first (ties: earliest
        evaluated first). With ``task=None``: the top ``k`` of each task, tasks in name order."""
        if k <= 0:
            return []
        task_filter = "" if task is None else " AND c.task = ?"
        args: list[Any] = [run_id] + ([] if task is None else [task]) + [int(k)]
        sql = (
            "WITH ranked AS (SELECT e.candidate_id, e.fitness, c.task, "
            "ROW_NUMBER() OVER (PARTITION BY c.task ORDER BY e.fitness DESC, e.rowid ASC) AS rk, "
            "e.rowid AS erow FROM evaluations e JOIN candidates c ON c.id = e.candidate_id "
            f"WHERE e.run_id = ? AND e.status = 'ok' AND e.fitness IS NOT NULL{task_filter}) "
            f"SELECT {_CANDIDATE_COLS}, ranked.fitness FROM ranked JOIN candidates c ON c.id = ranked.candidate_id "
            "JOIN sources s ON s.sha = c.source_sha WHERE ranked.rk <= ? ORDER BY ranked.task, ranked.rk"
        )
        with self._snapshot() as conn:
            return [(_row_to_candidate(r), float(r[9])) for r in conn.execute(sql, args)]

    def best_per_task(self, run_id: str) -> dict[str, tuple[Candidate, float]]:
        """``{task: (fittest correct candidate, fitness)}`` for every task with one."""
        return {c.task: (c, f) for c, f in self.top_k(run_id, None, 1)}

    # ---- profiles -----------------------------------------------------------------------

    def add_profile(self, cid: str, *, shape: str, gpu: str, metrics: Mapping[str, Any]) -> None:
        """Store (or replace) the profile of ``cid`` on ``shape`` and ``gpu``."""
        self._check_writable("add a profile")
        with self.transaction():
            if self._conn.execute("SELECT 1 FROM candidates WHERE id = ?", [cid]).fetchone() is None:
                raise UnknownIdError(f"cannot profile unknown candidate {cid[:16]!r}: add it first", query=cid)
            self._conn.execute(
                "INSERT OR REPLACE INTO profiles (candidate_id, shape, gpu, metrics, created) VALUES (?, ?, ?, ?, ?)",
                [cid, shape, gpu, _dumps(dict(metrics)), _now()],
            )

    def get_profile(self, cid: str, shape: str | None = None, *, gpu: str | None = None) -> dict[str, Any] | None:
        """The metrics of the latest profile of ``cid`` (on ``shape`` / ``gpu`` if given), or None."""
        sql, args = "SELECT metrics FROM profiles WHERE candidate_id = ?", [cid]
        if shape is not None:
            sql += " AND shape = ?"
            args.append(shape)
        if gpu is not None:
            sql += " AND gpu = ?"
            args.append(gpu)
        with self._snapshot() as conn:
            row = conn.execute(sql + " ORDER BY created DESC, rowid DESC LIMIT 1", args).fetchone()
            return _loads(row[0]) if row else None

    def profiles(self, cid: str) -> list[dict[str, Any]]:
        """Every profile of ``cid``: dicts with shape, gpu, metrics, created (oldest first)."""
        with self._snapshot() as conn:
            return [
                {"candidate_id": cid, "shape": s, "gpu": g, "metrics": _loads(m, {}), "created": t}
                for s, g, m, t in conn.execute(
                    "SELECT shape, gpu, metrics, created FROM profiles WHERE candidate_id = ? ORDER BY rowid",
                    [cid],
                )
            ]

    # ---- LLM calls ----------------------------------------------------------------------

    def add_llm_call(self, run_id: str, **fields: Any) -> int:
        """Record one LLM call; returns its row id. Fields: prompt, response, model, kind,
        tokens_in, tokens_out, cost, latency_s, error, prompt_hash, candidate_id, cached."""
        unknown = sorted(set(fields) - set(_LLM_FIELDS))
        if unknown:
            raise TypeError(f"unknown llm_call field(s) {unknown}; valid: {', '.join(_LLM_FIELDS)}")
        if "cached" in fields and fields["cached"] is not None:
            fields["cached"] = int(bool(fields["cached"]))
        cols = ["run_id", "created", *fields]
        self._check_writable("record an LLM call")
        with self.transaction():
            self._require_run(run_id)
            cur = self._conn.execute(
                f"INSERT INTO llm_calls ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [run_id, _now(), *fields.values()],
            )
            return int(cur.lastrowid or 0)

    def llm_calls(self, run_id: str) -> list[dict[str, Any]]:
        """The run's LLM calls, oldest first, as dicts with id, run_id, created and the fields."""
        with self._snapshot() as conn:
            cur = conn.execute("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY id", [run_id])
            names = [d[0] for d in cur.description]
            out = []
            for row in cur:
                d = dict(zip(names, row))
                d["cached"] = bool(d["cached"]) if d["cached"] is not None else False
                out.append(d)
            return out

    def llm_totals(self, run_id: str) -> dict[str, Any]:
        """Budget totals of a run: n_calls, n_errors, tokens_in, tokens_out, cost."""
        with self._snapshot() as conn:
            n, nerr, tin, tout, cost = conn.execute(
                "SELECT COUNT(*), SUM(CASE WHEN error IS NOT NULL AND error != '' THEN 1 ELSE 0 END), "
                "COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0), COALESCE(SUM(cost), 0.0) "
                "FROM llm_calls WHERE run_id = ?",
                [run_id],
            ).fetchone()
            return {"n_calls": n, "n_errors": nerr or 0, "tokens_in": tin, "tokens_out": tout, "cost": float(cost)}

    # ---- tuning -------------------------------------------------------------------------

    def add_tuning_trial(
        self,
        run_id: str,
        parent_id: str,
        trial: int,
        params: Mapping[str, Any],
        value: float | None,
        status: str,
        candidate_id: str | None = None,
    ) -> None:
        """Record (or update: same run, parent and trial number) one Optuna trial."""
        self._check_writable("record a tuning trial")
        now = _now()
        with self.transaction():
            self._require_run(run_id)
            self._conn.execute(
                "INSERT INTO tuning_trials (run_id, parent_id, trial, params, value, status, candidate_id, "
                "created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, parent_id, trial) DO UPDATE SET params = excluded.params, "
                "value = excluded.value, status = excluded.status, "
                "candidate_id = COALESCE(excluded.candidate_id, tuning_trials.candidate_id), "
                "updated = excluded.updated",
                [run_id, parent_id, int(trial), _dumps(dict(params)), _float_or_none(value), status,
                 candidate_id, now, now],
            )

    def tuning_trials(self, run_id: str, parent_id: str | None = None) -> list[dict[str, Any]]:
        """The run's tuning trials (of one parent if given), by parent then trial number."""
        sql, args = "SELECT * FROM tuning_trials WHERE run_id = ?", [run_id]
        if parent_id is not None:
            sql += " AND parent_id = ?"
            args.append(parent_id)
        with self._snapshot() as conn:
            cur = conn.execute(sql + " ORDER BY parent_id, trial", args)
            names = [d[0] for d in cur.description]
            out = []
            for row in cur:
                d = dict(zip(names, row))
                d["params"] = _loads(d["params"], {})
                out.append(d)
            return out

    # ---- champions ----------------------------------------------------------------------

    def set_champion(
        self, run_id: str, task: str, cid: str, fitness: float, confirmation: Mapping[str, Any]
    ) -> None:
        """Make ``cid`` the run's champion for ``task`` (replacing the previous one) and log a
        ``champion`` event, so the history of champions stays in ``events``."""
        self._check_writable("set a champion")
        with self.transaction():
            self._require_run(run_id)
            if self._conn.execute("SELECT 1 FROM candidates WHERE id = ?", [cid]).fetchone() is None:
                raise UnknownIdError(f"cannot crown unknown candidate {cid[:16]!r}: add it first", query=cid)
            conf = _dumps(dict(confirmation))
            self._conn.execute(
                "INSERT OR REPLACE INTO champions (run_id, task, candidate_id, fitness, confirmation, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [run_id, task, cid, _float_or_none(fitness), conf, _now()],
            )
            self._event(run_id, "champion", {"task": task, "candidate_id": cid, "fitness": fitness})

    def champions(self, run_id: str) -> list[dict[str, Any]]:
        """Current champions of the run, one per task (task order): run_id, task,
        candidate_id, fitness, confirmation (dict), updated."""
        with self._snapshot() as conn:
            return [
                {"run_id": run_id, "task": t, "candidate_id": c, "fitness": f,
                 "confirmation": _loads(conf, {}), "updated": u}
                for t, c, f, conf, u in conn.execute(
                    "SELECT task, candidate_id, fitness, confirmation, updated FROM champions "
                    "WHERE run_id = ? ORDER BY task",
                    [run_id],
                )
            ]

    # ---- events -------------------------------------------------------------------------

    def _event(self, run_id: str | None, kind: str, payload: Mapping[str, Any]) -> int:
        cur = self._conn.execute(
            "INSERT INTO events (run_id, created, kind, payload) VALUES (?, ?, ?, ?)",
            [run_id, _now(), kind, _dumps(dict(payload))],
        )
        return int(cur.lastrowid or 0)

    def log_event(self, run_id: str | None, kind: str, payload: Mapping[str, Any] | None = None) -> int:
        """Append an event (``run_id=None`` for store-wide events); returns its id. Events are
        append-only: the schema has triggers that abort any UPDATE or DELETE."""
        if not kind:
            raise ValueError("event kind must be a non-empty string")
        self._check_writable("log an event")
        with self.transaction():
            if run_id is not None:
                self._require_run(run_id)
            return self._event(run_id, kind, payload or {})

    def events(self, run_id: str | None, kind: str | None = None) -> list[dict[str, Any]]:
        """Events of a run (``None``: store-wide events such as migrations), oldest first,
        as dicts: id, run_id, created, kind, payload (dict)."""
        sql = "SELECT id, run_id, created, kind, payload FROM events WHERE "
        args: list[Any] = []
        if run_id is None:
            sql += "run_id IS NULL"
        else:
            sql += "run_id = ?"
            args.append(run_id)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        with self._snapshot() as conn:
            return [
                {"id": i, "run_id": r, "created": t, "kind": k, "payload": _loads(p, {})}
                for i, r, t, k, p in conn.execute(sql + " ORDER BY id", args)
            ]

    # ---- maintenance --------------------------------------------------------------------

    def integrity_check(self) -> list[str]:
        """``PRAGMA integrity_check`` + ``foreign_key_check``; ``["ok"]`` when healthy."""
        with self._snapshot() as conn:
            res = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            fk = conn.execute("PRAGMA foreign_key_check").fetchall()
            if fk:
                res = [x for x in res if x != "ok"] + [f"foreign key violation: {tuple(r)}" for r in fk]
            return res
