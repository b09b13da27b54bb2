"""Checks of user-given file locations, made before any work starts.

:func:`check_db_location` is what ``evo search --dry-run`` (and a search) asks of
``run.db`` / ``--db``: a typo'd or unwritable path must stop the command with one line
naming the path and the fix, not pass a dry run and fail later, and not create a tree of
directories somewhere unexpected.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_db_location", "LocationError"]


class LocationError(ValueError):
    """A path cannot be used; the message names it and says what to do."""


def _writable_dir(d: Path) -> str | None:
    """None when a file can be created in directory ``d`` (tried for real: as root,
    ``os.access`` says yes even on a read-only mount), else the reason."""
    try:
        fd, name = tempfile.mkstemp(prefix=".evo-write-check-", dir=d)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(name)
    return None


def check_db_location(path: str | os.PathLike[str]) -> Path:
    """Raise :class:`LocationError` unless the lineage database ``path`` can be opened or
    created: an existing file must be a file; its directory must exist and be writable, or
    be one new directory inside an existing, writable one (``runs/evo.db`` in a fresh
    checkout). Deeper missing trees (``/nonexistent/dir/evo.db``) are refused: usually a
    typo. Creates nothing. Returns the path."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise LocationError(f"database path {p} exists but is not a file; pass a file name such as {p / 'evo.db'}")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.is_dir():
        why = _writable_dir(parent)
        if why:
            raise LocationError(f"database directory {parent} is not writable ({why}); choose another --db "
                                "or fix the directory's permissions")
        return p
    if parent.exists():
        raise LocationError(f"database directory {parent} exists but is not a directory; choose another --db")
    grand = parent.parent
    if not grand.is_dir():
        missing = grand
        while not missing.parent.is_dir() and missing.parent != missing:
            missing = missing.parent
        raise LocationError(f"database directory {parent} does not exist and neither does {missing}; create it "
                            f"first (mkdir -p {parent}) or choose another --db")
    why = _writable_dir(grand)
    if why:
        raise LocationError(f"cannot create the database directory {parent}: {grand} is not writable ({why}); "
                            "choose another --db")
    return p
