"""One writer per run: a run's writer lease is an exclusive ``flock`` on a small file next to
the database, ``<db>.leases/<run_id>.lock``, whose text names the holder.

Why a file lock and not a heartbeat row: the kernel drops a ``flock`` the moment its holder
dies, SIGKILL and OOM included, so liveness is exact with no heartbeat thread, no clock and
no pid-reuse guess; and a lineage database in WAL mode is only ever used from one host
(SQLite's WAL needs shared memory), so every process that could write the run sees the same
lock. The file stays after release (it is tiny) with ``released`` set, so the next holder can
tell a clean hand-over from taking over after a crash.

* The writer (:meth:`evo.store.Store.acquire_lease`, and ``create_run``, which takes the new
  run's lease) holds ``LOCK_EX`` until it releases or closes the store, or dies.
* A second writer gets :class:`~evo.store.errors.RunLeasedError` naming the holder.
* Readers probe with a non-blocking ``LOCK_SH`` they drop at once (:func:`probe`), to show a
  ``running`` run whose writer is gone as ``interrupted``. An acquirer retries for
  :data:`ACQUIRE_WAIT_S` so such a probe never makes it fail.

Limits (docs/store.md): a process forked (not exec'd) from the writer inherits the lock and
keeps it while it lives; a filesystem without ``flock`` makes the lease advisory only
(:attr:`RunLease.guarded` is False and a warning says so).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from evo.store.errors import RunLeasedError
from evo.store.rows import RUN_ID_RE, now

__all__ = ["LeaseHolder", "RunLease", "lease_path", "probe", "ACQUIRE_WAIT_S"]

log = logging.getLogger(__name__)

#: How long an acquirer retries a lock that is busy before it calls it held. Readers hold
#: their probe lock for microseconds; a real writer holds it for the whole run.
ACQUIRE_WAIT_S = 1.0
_POLL_S = 0.02
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP))


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or last held) a run's lease, as written in its lease file."""

    run_id: str
    pid: int
    host: str
    since: str
    command: str = ""
    released: bool = False
    released_at: str = ""

    @property
    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def describe(self) -> str:
        cmd = f" (`{self.command}`)" if self.command else ""
        return f"pid {self.pid} on {self.host}{cmd} since {self.since}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> "LeaseHolder | None":
        """The holder in a lease file's text; None for an empty or half-written file."""
        try:
            d = json.loads(text)
            return cls(run_id=str(d["run_id"]), pid=int(d["pid"]), host=str(d["host"]), since=str(d["since"]),
                       command=str(d.get("command", "")), released=bool(d.get("released", False)),
                       released_at=str(d.get("released_at", "")))
        except (ValueError, KeyError, TypeError):
            return None


def lease_path(db_path: str | os.PathLike[str], run_id: str) -> Path:
    """``<db>.leases/<run_id>.lock`` beside the database (an unusual id is hashed)."""
    db = Path(db_path).resolve()
    name = run_id if RUN_ID_RE.match(run_id) else "x-" + hashlib.sha256(run_id.encode()).hexdigest()[:24]
    return db.with_name(db.name + ".leases") / f"{name}.lock"


def _command() -> str:
    argv = list(sys.argv) or ["python"]
    argv[0] = os.path.basename(argv[0]) or "python"
    cmd = " ".join(argv)
    return cmd if len(cmd) <= 200 else cmd[:197] + "..."


def _read(fd: int) -> str:
    chunks, off = [], 0
    while True:
        b = os.pread(fd, 65536, off)
        if not b:
            return b"".join(chunks).decode("utf-8", "replace")
        chunks.append(b)
        off += len(b)


def _write(fd: int, holder: LeaseHolder) -> None:
    data = json.dumps(holder.as_dict()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def probe(db_path: str | os.PathLike[str], run_id: str) -> tuple[Literal["held", "free", "none", "unknown"],
                                                                 LeaseHolder | None]:
    """Whether some process holds the run's lease right now, and the holder its file names.

    ``held``: a live writer holds it (this process included). ``free``: the file exists and
    nobody holds it (the holder released it or died). ``none``: no writer ever took it.
    ``unknown``: the file cannot be read or locked here; callers must not call the run dead.
    """
    path = lease_path(db_path, run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "none", None
    except OSError:
        return "unknown", None
    try:
        holder = LeaseHolder.parse(_read(fd))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held", holder
        except OSError:
            return "unknown", holder
        fcntl.flock(fd, fcntl.LOCK_UN)
        return "free", holder
    finally:
        os.close(fd)


class RunLease:
    """A held lease (see the module docstring). Build with :meth:`acquire`; :meth:`release`
    is idempotent. ``previous`` is what the file said before this holder took it (None for a
    first lease); ``previous.released`` False means its holder died holding it."""

    def __init__(self, run_id: str, path: Path, fd: int | None, holder: LeaseHolder,
                 previous: LeaseHolder | None, guarded: bool):
        self.run_id = run_id
        self.path = path
        self.holder = holder
        self.previous = previous
        self.guarded = guarded
        self._fd = fd
        self._active = True

    @classmethod
    def acquire(cls, db_path: str | os.PathLike[str], run_id: str, *, wait_s: float = ACQUIRE_WAIT_S) -> "RunLease":
        """Take the run's lease, or raise :class:`RunLeasedError` naming the live holder."""
        path = lease_path(db_path, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        me = LeaseHolder(run_id=run_id, pid=os.getpid(), host=socket.gethostname(), since=now(),
                         command=_command())
        deadline = time.monotonic() + wait_s
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    os.close(fd)
                    time.sleep(_POLL_S)
                    continue
                holder = LeaseHolder.parse(_read(fd))
                os.close(fd)
                raise RunLeasedError(run_id, str(db_path), holder) from None
            except OSError as e:
                if e.errno not in _UNSUPPORTED:
                    os.close(fd)
                    raise
                log.warning("cannot lock %s (%s): this filesystem has no flock, so nothing stops a "
                            "second writer of run %s; keep the lineage database on a local disk", path,
                            os.strerror(e.errno or 0), run_id)
                previous = LeaseHolder.parse(_read(fd))
                _write(fd, me)
                os.close(fd)
                return cls(run_id, path, None, me, previous, guarded=False)
            except BaseException:
                os.close(fd)
                raise
            # Locked. The file must still be the one at `path` (not unlinked and replaced
            # between our open and our lock), or two holders could each lock a different one.
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = LeaseHolder.parse(_read(fd))
            try:
                _write(fd, me)
            except OSError as e:  # the lock is what counts; a full disk only loses the "who"
                log.debug("could not write the holder into %s: %s", path, e)
            return cls(run_id, path, fd, me, previous, guarded=True)

    @property
    def held(self) -> bool:
        return self._active

    def release(self) -> None:
        """Mark the file released and drop the lock (idempotent; never raises)."""
        self._active = False
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            _write(fd, replace(self.holder, released=True, released_at=now()))
        except OSError as e:  # a full disk must not keep the lock: closing drops it anyway
            log.debug("could not mark lease %s released: %s", self.path, e)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def __del__(self) -> None:
        # A store dropped without close(): let go like a closed sqlite3 connection does,
        # rather than hold the run until the process exits.
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass

    def __repr__(self) -> str:
        state = ("held" if self.guarded else "unguarded") if self._active else "released"
        return f"RunLease({self.run_id!r}, {state}, {self.path})"
