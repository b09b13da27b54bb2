"""The lineage database: every run, candidate, evaluation, profile, LLM call, tuning trial,
champion and event of a search, in one SQLite file (built on ``sqlite-utils``).

One writer, many readers:

================  =============================================================================
``writer.py``     :class:`Store`, the single writer of a run (the search driver): every write
                  method, transactions, the run's writer lease, ending a failed run.
``reader.py``     :class:`StoreReader`, every query; any number of processes read at once.
                  ``Store`` holds one over its own connection (``store.reader``) and answers
                  every read through it, so both read the same way.
``lease.py``      one writer per run: an exclusive ``flock`` on ``<db>.leases/<run>.lock``.
``schema.py``     the ordered migrations that build the schema; version checks and migrating.
``rows.py``       records <-> rows (JSON columns, times, NaN), run ids.
``connection.py`` the SQLite connection: WAL, ``synchronous=FULL``, read-only URI, timeouts.
``errors.py``     every error raised on purpose (all :class:`StoreError`), one line each.
================  =============================================================================

The contract (WAL; one ``BEGIN IMMEDIATE`` transaction per write method; readers see
consistent snapshots; a committed transaction survives SIGKILL; a newer schema is refused;
damaged pages give :class:`CorruptDatabaseError` with the recovery command; a second writer
of a run gets :class:`RunLeasedError`) is in docs/store.md and tested in tests/test_store.py
and tests/test_store_lease.py.
"""

from __future__ import annotations

from evo.store.connection import BUSY_TIMEOUT_S
from evo.store.errors import (
    AmbiguousIdError,
    CorruptDatabaseError,
    MigrationError,
    NotALineageDatabaseError,
    ReadOnlyStoreError,
    RunExistsError,
    RunLeasedError,
    SchemaTooNewError,
    SchemaTooOldError,
    StoreError,
    StoreNotFoundError,
    UnknownIdError,
    is_corruption,
    recovery_command,
)
from evo.store.lease import LeaseHolder, lease_path
from evo.store.reader import StoreReader
from evo.store.rows import new_run_id
from evo.store.schema import MIGRATION_SET, MIGRATIONS, RUN_STATUSES, SCHEMA_VERSION, Migration
from evo.store.writer import Store

__all__ = [
    "Store",
    "StoreReader",
    "Migration",
    "MIGRATIONS",
    "MIGRATION_SET",
    "SCHEMA_VERSION",
    "RUN_STATUSES",
    "BUSY_TIMEOUT_S",
    "LeaseHolder",
    "lease_path",
    "new_run_id",
    "is_corruption",
    "recovery_command",
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
    "CorruptDatabaseError",
    "RunLeasedError",
]
