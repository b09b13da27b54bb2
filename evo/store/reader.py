"""The read side of the lineage database: :class:`StoreReader`, which any number of processes
open at once (``evo runs/status/top/show/lineage/report``, your scripts), even while a search
writes the file.

A reader opens the file through a ``file:...?mode=ro`` URI plus ``PRAGMA query_only``, never
creates and never migrates it. Every multi-query read runs inside one read transaction
(:meth:`StoreReader._snapshot`), so a reader sees a consistent snapshot: never a candidate
without its source, never an evaluation summary without all of its stage rows. SQLite's
"damaged page" errors become one :class:`~evo.store.errors.CorruptDatabaseError` line with
the recovery command. The writer (:class:`evo.store.Store`) holds one of these over its own
connection (:meth:`StoreReader._of_writer`) and answers every read through it, so it reads
exactly the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections import deque
from typing import Any, Iterator, Sequence

import sqlite_utils

from evo.core.records import Candidate, Evaluation, StageResult
from evo.store import lease as _lease
from evo.store.connection import BUSY_TIMEOUT_S, connect
from evo.store.errors import AmbiguousIdError, CorruptDatabaseError, StoreError, UnknownIdError, is_corruption
from evo.store.rows import CANDIDATE_COLS as _CANDIDATE_COLS
from evo.store.rows import loads as _loads
from evo.store.rows import row_to_candidate as _row_to_candidate
from evo.store.rows import row_to_evaluation, row_to_stage
from evo.store.schema import MIGRATIONS, Migration, check_migrations, db_version, prepare

__all__ = ["StoreReader"]

log = logging.getLogger(__name__)


class StoreReader:
    """A read-only view of a lineage database (see the module docstring).

    ``StoreReader(path)`` opens an existing, current-schema file; it raises
    :class:`StoreNotFoundError`, :class:`NotALineageDatabaseError`,
    :class:`SchemaTooOldError` or :class:`SchemaTooNewError` otherwise. Usable as a context
    manager; thread-safe (one lock per store).
    """

    #: The migrations that define the schema this code reads; a subclass may extend it (tests do).
    migrations: tuple[Migration, ...] = MIGRATIONS

    def __init__(self, path: str | os.PathLike[str]):
        self._open(path, readonly=True)

    @classmethod
    def _of_writer(cls, path: str | os.PathLike[str], *, readonly: bool, migrations: tuple[Migration, ...],
                   leases: dict[str, "_lease.RunLease"]) -> "StoreReader":
        """The reader a writer (:class:`evo.store.Store`) holds: it opens the writer's one
        connection (writable unless ``readonly``; created and migrated to ``migrations``),
        so reads inside the writer's transaction see its writes, and it sees the run leases
        the writer holds (``leases``, the writer's own dict) as live."""
        reader = cls.__new__(cls)
        reader.migrations = migrations
        reader._open(path, readonly=readonly, leases=leases)
        return reader

    def _open(self, path: str | os.PathLike[str], *, readonly: bool,
              leases: dict[str, "_lease.RunLease"] | None = None) -> None:
        self.path = str(path)
        self.readonly = readonly
        self.code_version = check_migrations(self.migrations)
        self._lock = threading.RLock()
        self._closed = False
        self._leases: dict[str, _lease.RunLease] = {} if leases is None else leases  # a writer's, else none
        self._conn = connect(self.path, readonly=readonly)
        try:
            self.db = sqlite_utils.Database(self._conn)
            prepare(self._conn, self.db, self.path, self.migrations, readonly=readonly,
                    busy_timeout_s=BUSY_TIMEOUT_S)
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the database file (``PRAGMA user_version``)."""
        with self._snapshot() as conn:
            return db_version(conn)

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

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"{type(self).__name__}({self.path!r}, {mode}{', closed' if self._closed else ''})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"lineage store {self.path} is closed")

    # ---- consistent reads ---------------------------------------------------------------

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A consistent read: several SELECTs inside one read transaction. SQLite's
        damaged-page errors leave as :class:`CorruptDatabaseError`."""
        with self._lock:
            self._check_open()
            try:
                if self._conn.in_transaction:
                    yield self._conn
                    return
                self._conn.execute("BEGIN")
                try:
                    yield self._conn
                finally:
                    if self._conn.in_transaction:
                        self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                if is_corruption(e):
                    raise CorruptDatabaseError(self.path, e) from e
                raise

    # ---- runs ---------------------------------------------------------------------------

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
        last = self._conn.execute(
            "SELECT payload FROM events WHERE run_id = ? AND kind = 'run_status' ORDER BY id DESC LIMIT 1",
            [d["id"]],
        ).fetchone()
        d["reason"] = str(_loads(last[0], {}).get("reason", "")) if last else ""
        d["recorded_status"] = d["status"]
        d["writer"] = None
        if d["status"] == "running":
            self._live_or_interrupted(d)
        return d

    def _live_or_interrupted(self, d: dict[str, Any]) -> None:
        """A run recorded ``running`` is running only while a live process holds its writer
        lease; otherwise its writer died (or closed without ending it): report it
        ``interrupted``, with why in ``reason``, so no reader shows a phantom running run."""
        state, holder = self._writer_state(d["id"])
        if state == "held":
            d["writer"] = holder.as_dict() if holder else {}
            return
        if state == "unknown":  # cannot tell from here; do not call it dead
            return
        if holder is None:
            gone = "no process holds its writer lease"
        elif holder.released:
            gone = f"its writer ({holder.describe()}) closed the database without ending the run"
        else:
            gone = f"its writer ({holder.describe()}) died"
        d["status"] = "interrupted"
        d["reason"] = f"{gone}; continue it with `evo search CONFIG --resume {d['id']}`"

    def _writer_state(self, run_id: str) -> tuple[str, "_lease.LeaseHolder | None"]:
        held = self._leases.get(run_id)
        if held is not None and held.held:
            return "held", held.holder
        return _lease.probe(self.path, run_id)

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run as a dict: id, name, created, updated, status, seed, config_hash, config
        (dict), n_candidates, n_evaluated, n_correct, best ({task: best fitness}), reason,
        recorded_status, writer.

        ``status`` is what a reader should show: the recorded status, except that a run
        recorded ``running`` with no live writer reads ``interrupted`` (``recorded_status``
        keeps the column). ``reason`` says why a run failed or stopped (from its last
        ``run_status`` event, or why it reads interrupted); ``writer`` is the live lease
        holder (pid, host, since, command) of a running run, else None."""
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

    def run_writer(self, run_id: str) -> dict[str, Any] | None:
        """The live holder of the run's writer lease (pid, host, since, command), or None."""
        with self._snapshot():
            self._require_run(run_id)
        state, holder = self._writer_state(run_id)
        return (holder.as_dict() if holder else {}) if state == "held" else None

    # ---- candidates ---------------------------------------------------------------------

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
            stages.setdefault((run_id, cid), []).append(row_to_stage(stage, status, reason, metrics, artifacts, seconds))
        return [
            (run_id, row_to_evaluation(cid, stages.get((run_id, cid), ()), fitness, gpu, env))
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

    def reference_fitness(self, run_id: str, candidate_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """``{candidate id: {reference, fitness_eager, fitness_compile, compile_mode}}`` from
        the timing stage metrics of the run's evaluations (of ``candidate_ids`` only, if given).

        ``reference`` is the fitness basis (``"eager"`` or ``"compile"``);
        ``fitness_compile`` / ``compile_mode`` are None where the compiled reference was not
        timed. Only timings that name their basis are listed (those recorded before
        ``[evaluator] reference`` existed do not). Read in SQL (``json_extract``), so a large
        run's JSON metrics are never parsed in Python.
        """
        sql = (
            "SELECT candidate_id, json_extract(metrics, '$.reference'), json_extract(metrics, '$.fitness_eager'), "
            "json_extract(metrics, '$.fitness_compile'), json_extract(metrics, '$.compile_mode') "
            "FROM stage_results WHERE run_id = ? AND stage = 'timing' AND json_valid(metrics) "
            "AND json_extract(metrics, '$.reference') IS NOT NULL"
        )
        ids = None if candidate_ids is None else list(dict.fromkeys(candidate_ids))
        chunks = [None] if ids is None else [ids[i:i + 500] for i in range(0, len(ids), 500)]
        out: dict[str, dict[str, Any]] = {}
        with self._snapshot() as conn:
            for chunk in chunks:
                where, args = "", [run_id]
                if chunk is not None:
                    where = f" AND candidate_id IN ({', '.join('?' * len(chunk))})"
                    args += chunk
                for cid, ref, eager, comp, mode in conn.execute(sql + where + " ORDER BY idx", args):
                    out[cid] = {"reference": ref, "fitness_eager": None if eager is None else float(eager),
                                "fitness_compile": None if comp is None else float(comp), "compile_mode": mode}
        return out

    # ---- profiles -----------------------------------------------------------------------

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

    def llm_calls(self, run_id: str) -> list[dict[str, Any]]:
        """The run's LLM calls, oldest first, as dicts with id, run_id, created and the fields."""
        return self._llm_call_rows("run_id", run_id)

    def llm_calls_of(self, candidate_id: str) -> list[dict[str, Any]]:
        """The LLM calls whose answer became ``candidate_id`` (any run), oldest first, as
        :meth:`llm_calls` returns them; empty for a candidate no call made, or one made
        before calls were linked (schema version 4)."""
        return self._llm_call_rows("candidate_id", candidate_id)

    def _llm_call_rows(self, column: str, value: str) -> list[dict[str, Any]]:
        with self._snapshot() as conn:
            cur = conn.execute(f"SELECT * FROM llm_calls WHERE {column} = ? ORDER BY id", [value])
            names = [d[0] for d in cur.description]
            out = []
            for row in cur:
                d = dict(zip(names, row))
                d["cached"] = bool(d["cached"]) if d["cached"] is not None else False
                out.append(d)
            return out

    def llm_by_model(self, run_id: str) -> dict[str, dict[str, Any]]:
        """Per model name of the run's LLM calls: n_calls, n_errors, tokens_in, tokens_out,
        cost, retries (requests resent) and children (calls whose answer became a
        candidate); models in name order."""
        with self._snapshot() as conn:
            rows = conn.execute(
                "SELECT model, COUNT(*), SUM(CASE WHEN error IS NOT NULL AND error != '' THEN 1 ELSE 0 END), "
                "COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0), COALESCE(SUM(cost), 0.0), "
                "COALESCE(SUM(retries), 0), SUM(CASE WHEN candidate_id IS NOT NULL THEN 1 ELSE 0 END) "
                "FROM llm_calls WHERE run_id = ? GROUP BY model ORDER BY model",
                [run_id],
            ).fetchall()
        return {str(m): {"n_calls": n, "n_errors": nerr or 0, "tokens_in": tin, "tokens_out": tout,
                         "cost": float(cost), "retries": retries, "children": kids or 0}
                for m, n, nerr, tin, tout, cost, retries, kids in rows}

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

    def champions(self, run_id: str) -> list[dict[str, Any]]:
        """Current champions of the run, one per task (task order): run_id, task,
        candidate_id, fitness, confirmation (dict), updated, verdict, and gain: the speedup
        over the baseline it was timed against (ratio, low, high, confidence, rounds, method,
        baseline) or None when none was measured."""
        with self._snapshot() as conn:
            out = []
            for t, c, f, conf, u, ratio, low, high, level, rounds, method, base, verdict in conn.execute(
                    "SELECT task, candidate_id, fitness, confirmation, updated, gain_ratio, gain_low, gain_high, "
                    "gain_confidence, gain_rounds, gain_method, gain_baseline, verdict FROM champions "
                    "WHERE run_id = ? ORDER BY task",
                    [run_id]):
                gain = None if ratio is None else {"ratio": ratio, "low": low, "high": high, "confidence": level,
                                                   "rounds": rounds, "method": method, "baseline": base}
                out.append({"run_id": run_id, "task": t, "candidate_id": c, "fitness": f,
                            "confirmation": _loads(conf, {}), "updated": u, "verdict": verdict, "gain": gain})
            return out

    # ---- events -------------------------------------------------------------------------

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
