"""The write side of the lineage database: :class:`Store`, the single writer.

Concurrency model (the contract every caller relies on):

* **One writer.** The search driver owns the only writing :class:`Store` of a run, and
  holds the run's writer lease (:mod:`evo.store.lease`) while it writes: ``create_run``
  takes it for a new run, :meth:`Store.acquire_lease` for a resumed one; a second writer of
  the same run gets :class:`RunLeasedError` naming the holder. SQLite runs in WAL mode, so
  the writer never blocks readers and readers never block the writer. Each public write
  method is one transaction; :meth:`Store.transaction` groups several into one. Write
  transactions start with ``BEGIN IMMEDIATE`` so a second writing connection (another run's
  driver on the same file) waits on ``busy_timeout`` instead of failing half-way.
* **Many readers** (:class:`~evo.store.reader.StoreReader`; ``Store(path, readonly=True)``
  reads the same way, through the reader it holds, with write methods that raise
  :class:`ReadOnlyStoreError`).
* **Durability.** ``synchronous=FULL``: a transaction that returned is on disk; a writer
  killed mid-transaction (SIGKILL, OOM) loses that transaction only, never a committed one.
* **No phantom runs.** A run whose start or search raised is ended by
  :meth:`Store.abort_run` (``failed`` with the reason, resumable) and readers show a
  ``running`` run without a live writer as ``interrupted``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import sqlite3
from typing import Any, Iterator, Mapping

from evo.core.records import Candidate, Evaluation, Status, source_sha
from evo.store import lease as _lease
from evo.store.errors import CorruptDatabaseError, ReadOnlyStoreError, RunExistsError, UnknownIdError, is_corruption
from evo.store.reader import StoreReader
from evo.store.rows import LLM_FIELDS as _LLM_FIELDS
from evo.store.rows import RUN_ID_RE as _RUN_ID_RE
from evo.store.rows import dumps as _dumps
from evo.store.rows import float_or_none as _float_or_none
from evo.store.rows import new_run_id
from evo.store.rows import now as _now
from evo.store.schema import MIGRATIONS, RUN_STATUSES, Migration

__all__ = ["Store", "READS"]

log = logging.getLogger(__name__)


class Store:
    """The lineage database's writer (see the module docstring for the concurrency model).

    ``Store(path)`` opens (creating if needed) and migrates the database for writing;
    ``Store(path, readonly=True)`` or :meth:`open_reader` opens an existing one read-only.
    Usable as a context manager; :meth:`close` also releases the run leases it holds. All
    methods are thread-safe (one lock per store), but the design has one writing store per
    run, owned by the search driver.

    It *holds* a reader (:attr:`reader`, a :class:`~evo.store.reader.StoreReader` over the
    same connection) rather than being one: every public read of the reader
    (:data:`READS`) is answered by it, so ``store.candidates(run)`` reads as before, and code
    that only reads can be handed ``store.reader``. ``migrations`` (a subclass may extend
    them; tests do) are the schema the store creates and reads.
    """

    migrations: tuple[Migration, ...] = MIGRATIONS

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False):
        self._leases: dict[str, _lease.RunLease] = {}
        #: the reader over this store's connection (it sees the leases this store holds)
        self.reader = StoreReader._of_writer(path, readonly=readonly, migrations=self.migrations,
                                             leases=self._leases)

    @classmethod
    def open_reader(cls, path: str | os.PathLike[str]) -> "Store":
        """Open an existing database read-only (never creates, never migrates)."""
        return cls(path, readonly=True)

    # ---- the connection, the reader's -----------------------------------------------------

    @property
    def path(self) -> str:
        return self.reader.path

    @property
    def readonly(self) -> bool:
        return self.reader.readonly

    @property
    def code_version(self) -> int:
        return self.reader.code_version

    @property
    def db(self):
        """The ``sqlite_utils.Database`` over the connection."""
        return self.reader.db

    @property
    def schema_version(self) -> int:
        return self.reader.schema_version

    @property
    def _conn(self) -> sqlite3.Connection:
        return self.reader._conn

    @property
    def _lock(self):
        return self.reader._lock

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"{type(self).__name__}({self.path!r}, {mode}{', closed' if self.reader._closed else ''})"

    def close(self) -> None:
        """Close the connection (idempotent; an open transaction is rolled back), then
        release every run lease this store holds."""
        try:
            self.reader.close()
        finally:
            leases = list(self._leases.values())
            self._leases.clear()  # the reader's view of them too (one dict)
            for held in leases:
                held.release()

    def _check_writable(self, what: str) -> None:
        self.reader._check_open()
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
        and propagates (SQLite's damaged-page errors as :class:`CorruptDatabaseError`). Holds
        the store's lock, so other threads wait rather than join it.
        """
        with self._lock:
            self._check_writable("open a write transaction")
            try:
                with self._transaction():
                    yield self
            except sqlite3.DatabaseError as e:
                if is_corruption(e):
                    raise CorruptDatabaseError(self.path, e) from e
                raise

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._conn.in_transaction:
            name = f"evo_{secrets.token_hex(8)}"
            self._conn.execute(f"SAVEPOINT {name}")
            try:
                yield
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
            yield
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

    # ---- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        seed: int,
        config_hash: str,
        run_id: str | None = None,
        lease: bool = True,
    ) -> str:
        """Record a new run (status ``running``) and return its id; this store then holds
        the run's writer lease (``lease=False``: it does not, and readers show the run
        ``interrupted`` until some store takes it).

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
                    if not self.reader._run_exists(rid):
                        break
                else:  # pragma: no cover - 65536 ids per minute
                    raise RunExistsError("could not draw an unused run id; pass run_id=")
            elif self.reader._run_exists(rid):
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
            # Inside the transaction: a lease that cannot be taken leaves no run behind.
            got = _lease.RunLease.acquire(self.path, rid) if lease else None
        assert rid is not None
        if got is not None:
            self._leases[rid] = got
        return rid

    def set_run_status(self, run_id: str, status: str, *, reason: str = "") -> None:
        """Set a run's status (one of :data:`RUN_STATUSES`) and log a ``run_status`` event
        (``{"status": ..., "reason": ...}``; ``reason`` only when given). ``get_run`` /
        ``list_runs`` show the reason of the latest one. Any status stays resumable."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(RUN_STATUSES)}")
        self._check_writable("set a run status")
        payload: dict[str, Any] = {"status": status}
        if reason:
            payload["reason"] = str(reason)[:4000]
        with self.transaction():
            self.reader._require_run(run_id)
            self._conn.execute("UPDATE runs SET status = ?, updated = ? WHERE id = ?", [status, _now(), run_id])
            self._event(run_id, "run_status", payload)

    def abort_run(self, run_id: str, exc: BaseException) -> str | None:
        """End a run whose start or search raised ``exc``, unless it was already ended.

        A run still recorded ``running`` becomes ``failed`` with ``"<Type>: <message>"`` as
        its reason (``interrupted`` for Ctrl-C and SystemExit), so a failed start never
        leaves a phantom ``running`` run; ``--resume`` continues it as any other. Only the
        lease holder ends a run (a store that does not hold ``run_id``'s lease changes
        nothing). Returns the status set, or None. Never raises: failing to record this
        (a full or damaged disk) must not hide ``exc``, so it is logged instead.
        """
        held = self._leases.get(run_id)
        if held is None or not held.held or self.reader._closed or self.readonly:
            return None
        interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
        status = "interrupted" if interrupted else "failed"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        try:
            with self.transaction():
                row = self._conn.execute("SELECT status FROM runs WHERE id = ?", [run_id]).fetchone()
                if row is None or row[0] != "running":
                    return None
                self.set_run_status(run_id, status, reason=reason)
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.error("could not mark run %s %s (%s): %s", run_id, status, reason, e)
            return None
        return status

    # ---- the run's writer lease ---------------------------------------------------------

    def acquire_lease(self, run_id: str) -> _lease.LeaseHolder:
        """Become the run's one writer, or raise :class:`RunLeasedError` naming the live
        process that is (its pid, host, command and since when).

        Idempotent for the holder. A lease whose holder died without releasing it (SIGKILL,
        OOM, a crashed host process) is taken over with a warning and a ``writer_takeover``
        event naming the previous holder. Held until :meth:`release_lease` or :meth:`close`.
        """
        self._check_writable("take a run's writer lease")
        with self._lock:
            held = self._leases.get(run_id)
            if held is not None and held.held:
                return held.holder
            with self.reader._snapshot():
                self.reader._require_run(run_id)
            got = _lease.RunLease.acquire(self.path, run_id)
            self._leases[run_id] = got
        prev = got.previous
        if prev is not None and not prev.released:
            log.warning("run %s: taking over the writer lease of %s, which is gone without releasing it",
                        run_id, prev.describe())
            self.log_event(run_id, "writer_takeover", {"previous": prev.as_dict(), "by": got.holder.as_dict()})
        return got.holder

    def release_lease(self, run_id: str) -> None:
        """Stop being the run's writer (idempotent); readers then see it as it was left."""
        with self._lock:
            held = self._leases.pop(run_id, None)
        if held is not None:
            held.release()

    def holds_lease(self, run_id: str) -> bool:
        """Whether this store holds the run's writer lease now."""
        held = self._leases.get(run_id)
        return held is not None and held.held

    @contextlib.contextmanager
    def lease(self, run_id: str) -> Iterator[_lease.LeaseHolder]:
        """Hold the run's writer lease for the block (taking it unless this store already
        holds it), end the run with :meth:`abort_run` if the block raises, and release the
        lease at the end. ``evo search`` runs its whole start and search inside one."""
        holder = self.acquire_lease(run_id)
        try:
            yield holder
        except BaseException as e:
            self.abort_run(run_id, e)
            raise
        finally:
            self.release_lease(run_id)

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
            self.reader._require_run(run_id)
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

    # ---- evaluations --------------------------------------------------------------------

    def add_evaluation(self, run_id: str, ev: Evaluation) -> bool:
        """Record ``ev`` (its stage rows and summary, in one transaction) for run ``run_id``.

        Idempotent per (run, candidate): a second evaluation of the same candidate in the same
        run is a no-op and returns False. The candidate must already be stored
        (:class:`UnknownIdError` otherwise); it is linked to the run if it was not.
        """
        self._check_writable("add an evaluation")
        with self.transaction():
            self.reader._require_run(run_id)
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

    # ---- LLM calls ----------------------------------------------------------------------

    def add_llm_call(self, run_id: str, **fields: Any) -> int:
        """Record one LLM call; returns its row id. Fields: prompt, response, model, kind,
        tokens_in, tokens_out, cost, latency_s, error, prompt_hash, candidate_id, cached, and
        the outcome and request settings finish_reason, reasoning_tokens, cached_tokens,
        retries, api, max_output_tokens, reasoning_effort, timeout_s, and attempt_key (the
        caller's name for the attempt, see :meth:`link_llm_call`) (unset: NULL)."""
        unknown = sorted(set(fields) - set(_LLM_FIELDS))
        if unknown:
            raise TypeError(f"unknown llm_call field(s) {unknown}; valid: {', '.join(_LLM_FIELDS)}")
        if "cached" in fields and fields["cached"] is not None:
            fields["cached"] = int(bool(fields["cached"]))
        cols = ["run_id", "created", *fields]
        self._check_writable("record an LLM call")
        with self.transaction():
            self.reader._require_run(run_id)
            cur = self._conn.execute(
                f"INSERT INTO llm_calls ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [run_id, _now(), *fields.values()],
            )
            return int(cur.lastrowid or 0)

    def link_llm_call(self, run_id: str, attempt_key: str, candidate_id: str) -> int | None:
        """Link the call that answered attempt ``attempt_key`` of ``run_id`` to the candidate
        its answer became; returns the call's row id, or None when the run has no call of
        that key (the attempt was answered by no stored call).

        Keys repeat across a resumed run (the mutator numbers attempts afresh), so the
        newest call of the key is linked: a call is stored as it returns, before its answer
        is interpreted, so that is the attempt's own. ``candidate_id`` need not be stored yet
        (the engine stores a proposal after the mutator returns it)."""
        if not attempt_key:
            raise ValueError("link_llm_call: attempt_key is empty; the call must have been stored with its "
                             "attempt's key (LLMCall.attempt_key)")
        self._check_writable("link an LLM call to its candidate")
        with self.transaction():
            self.reader._require_run(run_id)
            row = self._conn.execute(
                "SELECT MAX(id) FROM llm_calls WHERE run_id = ? AND attempt_key = ?", [run_id, attempt_key]
            ).fetchone()
            if row is None or row[0] is None:
                return None
            self._conn.execute("UPDATE llm_calls SET candidate_id = ? WHERE id = ?", [candidate_id, row[0]])
            return int(row[0])

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
            self.reader._require_run(run_id)
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

    # ---- champions ----------------------------------------------------------------------

    def set_champion(
        self, run_id: str, task: str, cid: str, fitness: float, confirmation: Mapping[str, Any]
    ) -> None:
        """Make ``cid`` the run's champion for ``task`` (replacing the previous one) and log a
        ``champion`` event, so the history of champions stays in ``events``.

        A ``confirmation`` with a ``gain`` (``evo.engine.champions.SpeedupInterval.as_dict``: ratio,
        low, high, confidence, rounds, method) and ``baseline_id`` also fills the champion's
        gain columns, and its ``verdict``."""
        self._check_writable("set a champion")
        gain = confirmation.get("gain") or {}
        with self.transaction():
            self.reader._require_run(run_id)
            if self._conn.execute("SELECT 1 FROM candidates WHERE id = ?", [cid]).fetchone() is None:
                raise UnknownIdError(f"cannot crown unknown candidate {cid[:16]!r}: add it first", query=cid)
            conf = _dumps(dict(confirmation))
            self._conn.execute(
                "INSERT OR REPLACE INTO champions (run_id, task, candidate_id, fitness, confirmation, updated, "
                "gain_ratio, gain_low, gain_high, gain_confidence, gain_rounds, gain_method, gain_baseline, verdict) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, task, cid, _float_or_none(fitness), conf, _now(),
                 _float_or_none(gain.get("ratio")), _float_or_none(gain.get("low")),
                 _float_or_none(gain.get("high")), _float_or_none(gain.get("confidence")),
                 gain.get("rounds"), gain.get("method"), confirmation.get("baseline_id"),
                 confirmation.get("verdict")],
            )
            self._event(run_id, "champion", {"task": task, "candidate_id": cid, "fitness": fitness})

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
                self.reader._require_run(run_id)
            return self._event(run_id, kind, payload or {})


#: The reader's public reads, each answered by :attr:`Store.reader` (a method of the same
#: name, signature and docstring on :class:`Store`).
READS: tuple[str, ...] = tuple(n for n, v in vars(StoreReader).items()
                               if not n.startswith("_") and callable(v) and n != "close")


def _read(name: str):
    method = getattr(StoreReader, name)

    @functools.wraps(method)
    def read(self: Store, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.reader, name)(*args, **kwargs)

    return read


for _name in READS:
    setattr(Store, _name, _read(_name))
