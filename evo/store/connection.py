"""Opening the SQLite connection every store uses: pragmas, WAL, the read-only URI.

Readers open ``file:<abs path>?mode=ro`` with ``PRAGMA query_only`` (never creating the
file); the writer opens the path itself with ``journal_mode=WAL`` and ``synchronous=FULL``
(a transaction that returned is on disk; a writer killed mid-transaction loses that
transaction only). Both use a 30 s busy timeout and foreign keys.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from evo.store.errors import StoreError, StoreNotFoundError
from evo.store.schema import cannot_read, not_sqlite

__all__ = ["BUSY_TIMEOUT_S", "connect"]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0


def connect(path: str, *, readonly: bool) -> sqlite3.Connection:
    """A connection to ``path`` in autocommit mode (``isolation_level=None``: transactions
    are explicit), or a :class:`StoreError` naming the file and the fix."""
    p = Path(path)
    if readonly:
        if not p.is_file():
            raise StoreNotFoundError(path)
        target, uri = p.resolve().as_uri() + "?mode=ro", True
    else:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        target, uri = path, False
    try:
        # isolation_level=None: no implicit BEGIN; the stores BEGIN explicitly.
        conn = sqlite3.connect(
            target,
            uri=uri,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.OperationalError as e:
        raise StoreError(f"cannot open lineage database {path}: {e}") from e
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        if readonly:
            conn.execute("PRAGMA query_only = ON")
        else:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("journal_mode WAL refused for %s (got %s)", path, mode)
            conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.OperationalError as e:
        conn.close()
        raise StoreError(cannot_read(path, e, BUSY_TIMEOUT_S)) from e
    except sqlite3.DatabaseError as e:
        conn.close()
        raise not_sqlite(path, e) from e
    return conn
