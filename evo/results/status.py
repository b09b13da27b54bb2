"""Where a run stands: counts, failures by stage, best per task, spend and live rates.

:func:`run_status` reads one run from a (read-only) :class:`~evo.store.Store` and returns a
plain, JSON-ready dict; ``evo status RUN`` prints it as tables (``--json`` prints the dict).
It works the same on a live run (the driver keeps writing; a reader sees a consistent
snapshot per query) and on a finished one.

Where the numbers come from:

* evaluations, correct, pending: the ``evaluations`` and ``run_candidates`` tables;
* failures by stage / the funnel: every evaluation's stage results (:func:`failure_funnel`);
* best per task: :meth:`Store.best_per_task`, marked with the champion row when there is one,
  with the fitness basis and the speedups against the eager and the compiled reference
  (:meth:`Store.reference_fitness`), and the champion confirmation's gain over the seed with
  its interval and verdict (:meth:`Store.champions`);
* spend: :meth:`Store.llm_totals` (the sum of the ``cost`` column of ``llm_calls``), and per
  model :func:`evo.results.llm_status.llm_status` (calls, attempts and stopped models);
* rates (evaluations per minute, slot occupancy, GPU activity, queues): the payload of the run's latest
  ``progress`` (or ``finish``) event, which the engine logs every few evaluations.

A run whose status is still ``running`` but whose last event is older than
:data:`STALE_AFTER_S` is reported ``stale``: its driver probably died without recording a
final status (``evo search --resume RUN`` continues it).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from evo.core.records import Evaluation, Status
from evo.results.llm_status import llm_status
from evo.results.tables import gain_fields, reference_fields

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store

__all__ = ["run_status", "resolve_run", "failure_funnel", "stage_order", "STALE_AFTER_S", "CANONICAL_STAGES"]

log = logging.getLogger(__name__)

#: A ``running`` run with no event for this long is reported as stale.
STALE_AFTER_S = 15 * 60.0
#: Cascade order; stages not listed here follow in order of first appearance.
CANONICAL_STAGES = ("policy", "compile", "correctness", "timing", "profile")
#: Progress-event keys copied into ``run_status()["progress"]``.
_PROGRESS_KEYS = (
    "evaluations", "correct", "proposed", "evals_per_min", "gpu_busy", "gpu_activity", "compile_queue",
    "gpu_queue", "in_flight", "elapsed_s",
)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def stage_order(evaluations: Iterable[Evaluation]) -> list[str]:
    """Stage names in cascade order: :data:`CANONICAL_STAGES` first (those that occur), then
    any other stage in order of first appearance."""
    seen: list[str] = []
    for ev in evaluations:
        for s in ev.stages:
            if s.stage not in seen:
                seen.append(s.stage)
    known = [s for s in CANONICAL_STAGES if s in seen]
    return known + [s for s in seen if s not in CANONICAL_STAGES]


def failure_funnel(evaluations: Sequence[Evaluation]) -> list[dict[str, Any]]:
    """Per stage, in cascade order: how many evaluations reached it (a non-``skipped``
    result), how many passed, and the failures by status.

    Returns ``[{"stage", "entered", "passed", "failed": {status: n}}]``. ``entered`` of a
    stage equals ``passed`` of the previous stage when every evaluation ran the full cascade;
    it is smaller when some evaluations stopped by design (e.g. ``profile`` runs only for
    survivors that enter the top-k).
    """
    order = stage_order(evaluations)
    rows = {name: {"stage": name, "entered": 0, "passed": 0, "failed": Counter()} for name in order}
    for ev in evaluations:
        for s in ev.stages:
            if s.status is Status.SKIPPED:
                continue
            row = rows[s.stage]
            row["entered"] += 1
            if s.passed:
                row["passed"] += 1
            else:
                row["failed"][s.status.value] += 1
    return [{**rows[n], "failed": dict(sorted(rows[n]["failed"].items()))} for n in order]


def resolve_run(store: "Store", text: str) -> str:
    """The full id of the run ``text`` names (an id or unique prefix).

    Like :meth:`Store.resolve_run`, but an unknown id's :class:`~evo.store.UnknownIdError`
    also lists the most recent runs (a mistyped id rarely shares a prefix with the right one),
    and an ambiguous prefix's :class:`~evo.store.AmbiguousIdError` lists the matching runs'
    full ids (run ids of one minute share their first 16 characters).
    """
    from evo.store import AmbiguousIdError, UnknownIdError

    try:
        return store.resolve_run(text)
    except AmbiguousIdError as e:
        more = " and more" if "and more" in str(e) else ""
        raise AmbiguousIdError(f"run id prefix {e.query!r} is ambiguous: it matches {', '.join(e.near)}{more}; "
                               "type more characters", query=e.query, near=e.near, kind="run") from None
    except UnknownIdError as e:
        recent = [r["id"] for r in store.list_runs()[:5]]
        hint = f"; recent runs: {', '.join(recent)}" if recent else "; the database has no runs yet"
        raise UnknownIdError(f"{e}{hint} (see `evo runs`)", query=text, near=tuple(e.near) or tuple(recent),
                             kind="run") from None


def run_status(store: "Store", run_id: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything ``evo status`` shows about one run, as a JSON-ready dict.

    ``run_id`` is a full run id or a unique prefix (:meth:`Store.resolve_run`; an unknown one
    raises :class:`~evo.store.UnknownIdError` naming recent runs). Keys:

    ``run`` (id, name, status, created, updated, seed, config_hash), ``stale`` (bool, see the
    module doc), ``evaluations`` / ``correct`` / ``pending`` / ``candidates`` (counts),
    ``by_task`` ({task: {evaluations, correct, pending}}), ``failures_by_stage``
    ({stage: {status: n}}, by the stage that stopped each evaluation), ``funnel``
    (:func:`failure_funnel`), ``best`` ({task: {id, fitness, operator, island, generation,
    champion, confirmed, reference, fitness_eager, fitness_compile, champion_id, gain,
    verdict}}: reference and the fitnesses None where the timing did not record them,
    ``fitness_compile`` None where the compiled reference was not timed; ``champion_id``,
    ``gain`` and ``verdict`` from the task's champion row, :func:`evo.results.tables.gain_fields`:
    the confirmed speedup of the task's best over its seed, None without a confirmation that
    measured one; a best not significantly faster leaves the seed champion, so
    ``champion_id`` is the seed's), ``spend`` (n_calls, n_errors, tokens_in, tokens_out, cost), ``llm``
    (:func:`evo.results.llm_status.llm_status`: per model calls, children, repairs, answers
    rejected before compiling by reason, spend, budget left, stopped models and why; None
    for a run without LLM activity),
    ``progress`` (the latest progress event's numbers plus ``at`` and ``age_s``; empty
    without one), ``events`` ({kind: count}), ``stop_reason`` (from the ``finish`` event).
    """
    rid = resolve_run(store, run_id)
    run = store.get_run(rid)
    now = now or datetime.now(timezone.utc)
    cands = {c.id: c for c in store.candidates(rid)}
    evals = store.evaluations(rid)
    pending = store.pending_ids(rid)

    by_task: dict[str, dict[str, int]] = {}

    def task_row(task: str) -> dict[str, int]:
        return by_task.setdefault(task, {"evaluations": 0, "correct": 0, "pending": 0})

    failures: dict[str, Counter] = {}
    for ev in evals:
        task = cands[ev.candidate_id].task if ev.candidate_id in cands else "?"
        row = task_row(task)
        row["evaluations"] += 1
        if ev.correct:
            row["correct"] += 1
        bad = ev.failed_stage
        if bad is not None:
            failures.setdefault(bad.stage, Counter())[bad.status.value] += 1
    for cid in pending:
        task_row(cands[cid].task if cid in cands else "?")["pending"] += 1

    champions = {c["task"]: c for c in store.champions(rid)}
    best_rows = store.best_per_task(rid)
    refs = store.reference_fitness(rid, [c.id for c, _ in best_rows.values()]
                                   + [c["candidate_id"] for c in champions.values()])
    best: dict[str, dict[str, Any]] = {}
    for task, (cand, fit) in sorted(best_rows.items()):
        champ = champions.get(task)
        best[task] = {
            "id": cand.id, "fitness": fit, "operator": cand.operator, "island": cand.island,
            "generation": cand.generation,
            "champion": bool(champ and champ["candidate_id"] == cand.id),
            "confirmed": bool(champ and champ["candidate_id"] == cand.id
                              and champ["confirmation"].get("confirmed")),
            **reference_fields(refs.get(cand.id)), **gain_fields(champ),
        }
    for task, champ in champions.items():  # a champion whose task has no 'best' row (unlikely)
        best.setdefault(task, {
            "id": champ["candidate_id"], "fitness": champ["fitness"], "operator": None,
            "island": None, "generation": None, "champion": True,
            "confirmed": bool(champ["confirmation"].get("confirmed")),
            **reference_fields(refs.get(champ["candidate_id"])), **gain_fields(champ),
        })

    events = store.events(rid)
    kinds = Counter(e["kind"] for e in events)
    progress: dict[str, Any] = {}
    last_prog = next((e for e in reversed(events) if e["kind"] in ("progress", "finish")), None)
    if last_prog is not None:
        p = last_prog["payload"]
        progress = {k: p[k] for k in _PROGRESS_KEYS if k in p}
        progress["at"] = last_prog["created"]
        t = _parse_time(last_prog["created"])
        progress["age_s"] = round((now - t).total_seconds(), 1) if t else None
    finish = next((e for e in reversed(events) if e["kind"] == "finish"), None)
    last_event = _parse_time(events[-1]["created"]) if events else _parse_time(run.get("updated"))
    last_age = (now - last_event).total_seconds() if last_event else None
    stale = run["status"] == "running" and last_age is not None and last_age > STALE_AFTER_S

    return {
        "run": {k: run.get(k) for k in ("id", "name", "status", "created", "updated", "seed", "config_hash")},
        "stale": stale,
        "last_event_age_s": round(last_age, 1) if last_age is not None else None,
        "candidates": len(cands),
        "evaluations": len(evals),
        "correct": sum(1 for ev in evals if ev.correct),
        "pending": len(pending),
        "by_task": dict(sorted(by_task.items())),
        "failures_by_stage": {s: dict(sorted(c.items())) for s, c in sorted(failures.items())},
        "funnel": failure_funnel(evals),
        "best": best,
        "spend": store.llm_totals(rid),
        "llm": llm_status(store, rid, run.get("config") or {}, events),
        "progress": progress,
        "events": dict(sorted(kinds.items())),
        "stop_reason": finish["payload"].get("reason") if finish else None,
    }
