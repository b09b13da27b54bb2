"""Which candidate a task's export takes: a run or candidate id resolved, and per task the
confirmed champion, else the best correct candidate, else skipped with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from evo.results.export.errors import ExportError

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store

__all__ = ["Choice", "resolve_target", "choose_champions"]


@dataclass(frozen=True)
class Choice:
    """The candidate chosen for a task and why (``selection`` is shown to people)."""

    task: str
    candidate_id: str
    selection: str
    confirmation: dict[str, Any] = field(default_factory=dict)


def resolve_target(store: "Store", target: str) -> tuple[str, str | None]:
    """``(run_id, candidate_id or None)`` for a run id / candidate id (or unique prefix).

    A run match wins; then a candidate match (its run: the latest run that evaluated it).
    When neither matches, raises :class:`~evo.store.UnknownIdError` naming near matches of
    both kinds; an ambiguous prefix raises :class:`~evo.store.AmbiguousIdError`.
    """
    from evo.store import AmbiguousIdError, UnknownIdError

    from evo.results.status import resolve_run

    try:
        return resolve_run(store, target), None
    except AmbiguousIdError:
        raise
    except UnknownIdError as run_err:
        try:
            cid = store.resolve_id(target)
        except AmbiguousIdError:
            raise
        except UnknownIdError as cand_err:
            near_runs = ", ".join(run_err.near[:5]) or "none"
            near_cands = ", ".join(n[:16] for n in cand_err.near[:5]) or "none"
            raise UnknownIdError(
                f"{target!r} is neither a run nor a candidate id; near runs: {near_runs}; "
                f"closest candidate ids: {near_cands} (see `evo runs` and `evo top RUN`)",
                query=target, near=tuple(run_err.near) + tuple(cand_err.near), kind="run or candidate",
            ) from None
    rows = store.db.execute(
        "SELECT run_id FROM evaluations WHERE candidate_id = ? ORDER BY rowid DESC LIMIT 1", [cid]
    ).fetchall()
    if not rows:
        raise ExportError(f"candidate {cid[:16]} has no evaluation in any run; only evaluated, correct "
                          "kernels can be exported")
    return rows[0][0], cid


def choose_champions(store: "Store", run_id: str, tasks: Sequence[str] | None = None
                     ) -> tuple[list[Choice], dict[str, str]]:
    """Per task of the run (or of ``tasks``): the candidate to export, and skipped tasks.

    Order of preference: the confirmed champion; the best correct candidate (noting an
    unconfirmed champion); a task with no correct candidate is skipped with the reason.
    """
    run_tasks = sorted({c.task for c in store.candidates(run_id)})
    wanted = list(tasks) if tasks else run_tasks
    unknown = [t for t in wanted if t not in run_tasks]
    if unknown:
        raise ExportError(f"run {run_id} has no task {', '.join(map(repr, unknown))}; its tasks: "
                          f"{', '.join(run_tasks) or 'none'}")
    champs = {c["task"]: c for c in store.champions(run_id)}
    best = store.best_per_task(run_id)
    chosen: list[Choice] = []
    skipped: dict[str, str] = {}
    for task in wanted:
        ch = champs.get(task)
        if ch and ch["confirmation"].get("confirmed"):
            ev = store.get_evaluation(ch["candidate_id"], run_id)
            if ev is not None and ev.correct:
                chosen.append(Choice(task, ch["candidate_id"], "confirmed champion", dict(ch["confirmation"])))
                continue
        if task in best:
            cand, _ = best[task]
            if ch is None:
                why = "best correct kernel (no champion recorded)"
            elif ch["candidate_id"] == cand.id:
                why = "best correct kernel (champion not confirmed by re-timing)"
            else:
                why = "best correct kernel (the recorded champion is not confirmed)"
            chosen.append(Choice(task, cand.id, why, dict(ch["confirmation"]) if ch else {}))
            continue
        n = len(store.candidates(run_id, task))
        skipped[task] = (f"no correct candidate for {task} in run {run_id} ({n} candidates, none passed "
                         "every stage); nothing to export")
    return chosen, skipped
