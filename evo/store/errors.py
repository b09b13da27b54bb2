"""Every error the lineage store raises on purpose; all subclass :class:`StoreError`.

Each message is one line that names the file, what is wrong and what to do, so the CLI can
print it as it is (``error: ...``) instead of a traceback.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from evo.store.lease import LeaseHolder

__all__ = [
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
    "is_corruption",
    "recovery_command",
]


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
# Corruption
# --------------------------------------------------------------------------------------

#: SQLite primary result codes that mean "the file's pages are damaged" (SQLITE_CORRUPT,
#: SQLITE_NOTADB). Extended codes (SQLITE_CORRUPT_INDEX, ...) share the low byte.
_CORRUPT_CODES = (11, 26)


def is_corruption(err: BaseException) -> bool:
    """Whether ``err`` is SQLite reporting a damaged file (not a busy lock, a full disk or a
    constraint). Uses the result code Python 3.11+ attaches, else SQLite's fixed wording."""
    if not isinstance(err, sqlite3.DatabaseError):
        return False
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return (int(code) & 0xFF) in _CORRUPT_CODES
    text = str(err).lower()
    return "malformed" in text or "not a database" in text


def recovery_command(path: str | os.PathLike[str]) -> str:
    """The shell command that salvages what is readable of ``path`` into a new file
    (:mod:`evo.store.recover`; it needs no ``sqlite3`` shell, whose ``.recover`` some builds
    lack)."""
    p = Path(path)
    fixed = p.with_name(f"{p.stem}-recovered{p.suffix or '.db'}")
    return f"python -m evo.store.recover {shlex.quote(str(p))} {shlex.quote(str(fixed))}"


class CorruptDatabaseError(StoreError):
    """SQLite found damaged pages in the lineage database (``database disk image is
    malformed``). Nothing was written; the message carries the recovery command."""

    def __init__(self, path: str, cause: BaseException):
        self.path = str(path)
        self.recovery = recovery_command(self.path)
        super().__init__(
            f"lineage database {self.path} is corrupt ({cause}); stop every process using it, "
            f"salvage what is readable with `{self.recovery}`, then point run.db / --db at the "
            f"recovered file"
        )


# --------------------------------------------------------------------------------------
# One writer per run
# --------------------------------------------------------------------------------------


class RunLeasedError(StoreError):
    """Another live process holds the run's writer lease (it is searching or resuming it).

    ``holder`` describes that process (pid, host, command, since) when its lease file could
    be read; ``None`` when it was being rewritten at that instant.
    """

    def __init__(self, run_id: str, path: str, holder: "LeaseHolder | None"):
        self.run_id = run_id
        self.path = str(path)
        self.holder = holder
        if holder is None:
            who, stop = "another process", "stop it"
        else:
            who = holder.describe()
            stop = f"stop it (kill {holder.pid}" + (f" on {holder.host}" if not holder.on_this_host else "") + ")"
        super().__init__(
            f"run {run_id} in {self.path} is already being written by {who}; a run has one "
            f"writer: wait for that search to end, or {stop}, then resume with "
            f"`evo search CONFIG --resume {run_id}`"
        )
