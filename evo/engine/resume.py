"""Resume and replay: rebuilding a run's islands and in-flight work from the store.

``evo search CONFIG --resume RUN`` (and an island actor that died mid-run) must not
evaluate anything twice. The store has every candidate in the order it was proposed and
the evaluation of each one that finished, so:

- :func:`plan_replay` reads a run into a :class:`ReplayPlan`: the evaluated candidates in
  insertion order (the engine replays them into its islands, its best-per-task and its
  counters) and the candidates proposed but never evaluated (the engine submits them
  again: policy, compile, GPU);
- :func:`island_members` lists one island's evaluated members (its own and its task's
  seeds, in insertion order), which :meth:`evo.engine.islands.IslandSet.restore` puts into the new
  actor of an island whose actor died. What only the actor knew is lost and rebuilt over
  time: child counts (selection's novelty term) and members that had migrated in.

Reads go through :class:`evo.engine.seams.StoreWriter`'s read methods; nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evo.engine.bookkeeping import member_of
from evo.core.records import Candidate, Evaluation, Member

__all__ = ["ReplayPlan", "plan_replay", "island_members"]


@dataclass(frozen=True)
class ReplayPlan:
    """A run as the store has it: ``evaluated`` (candidate, evaluation) pairs and the
    ``pending`` candidates (no evaluation yet), each in the order they were proposed."""

    evaluated: tuple[tuple[Candidate, Evaluation], ...]
    pending: tuple[Candidate, ...]

    @property
    def proposed(self) -> int:
        return len(self.evaluated) + len(self.pending)

    @property
    def ids(self) -> list[str]:
        """Every candidate id of the run (the engine's "seen in this run")."""
        return [c.id for c, _ in self.evaluated] + [c.id for c in self.pending]

    @property
    def correct(self) -> int:
        return sum(1 for _, ev in self.evaluated if ev.correct)

    def best(self) -> dict[str, tuple[float, Candidate]]:
        """Each task's best correct candidate as ``(fitness, candidate)`` (the first of equals)."""
        best: dict[str, tuple[float, Candidate]] = {}
        for cand, ev in self.evaluated:
            if ev.correct and (cand.task not in best or ev.fitness > best[cand.task][0]):
                best[cand.task] = (ev.fitness, cand)
        return best


def plan_replay(store, run_id: str) -> ReplayPlan:
    """What to replay and what to submit again to resume ``run_id``."""
    cands = store.candidates(run_id)
    evals = {ev.candidate_id: ev for ev in store.evaluations(run_id)}
    return ReplayPlan(evaluated=tuple((c, evals[c.id]) for c in cands if c.id in evals),
                      pending=tuple(c for c in cands if c.id not in evals))


def island_members(store, run_id: str, task: str, idx: int,
                   descriptor: Callable[[dict[str, str]], tuple]) -> list[Member]:
    """The evaluated members of island ``idx`` of ``task`` (its own and the task's seeds,
    which every island of the task received), in insertion order."""
    evals = {ev.candidate_id: ev for ev in store.evaluations(run_id)}
    return [member_of(c, evals[c.id], descriptor) for c in store.candidates(run_id)
            if c.task == task and c.island in (idx, -1) and c.id in evals]
