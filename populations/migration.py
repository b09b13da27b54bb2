"""Ring migration between the islands of one task, triggered by evaluation counts.

Every ``every`` evaluations (counted by the engine, never wall-clock, so a run is
reproducible whatever the machine speed) each island sends copies of its best ``count``
members to the next island on the ring: ``i -> (i + 1) % n``. Islands of different tasks
never exchange members; the engine groups islands by task and plans a ring per group.

In-process use (tests, single-process runs): :func:`migrate`. With Ray actors the engine
follows :meth:`RingMigration.plan` itself: ``emigrants`` on each source actor first, then
``immigrate`` on each destination, so a member moves at most one hop per round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from .island import Island

__all__ = ["RingMigration", "Transfer", "ring_plan", "migrate"]

log = logging.getLogger(__name__)


def ring_plan(n_islands: int) -> list[tuple[int, int]]:
    """``[(i, (i + 1) % n) for i in range(n)]``; empty for fewer than two islands."""
    if n_islands < 0:
        raise ValueError(f"n_islands = {n_islands}: must be >= 0")
    if n_islands < 2:
        return []
    return [(i, (i + 1) % n_islands) for i in range(n_islands)]


@dataclass(frozen=True)
class Transfer:
    """One src -> dst hop of a migration round (positions in the island list, ids sent,
    how many the destination kept). The engine records these as events."""

    src: int
    dst: int
    sent: tuple[str, ...]
    accepted: int


class RingMigration:
    """When and where to migrate. Config: ``search.migration_every`` and
    ``search.migration_count``.

    :meth:`due` is stateful: it remembers the last multiple of ``every`` it reported, and
    returns True once each time the evaluation count reaches or crosses a new multiple (a
    jump over several multiples still gives one migration). ``count == 0`` disables migration
    (``due`` is always False). For resume, pass the restored evaluation count as
    ``start_evaluations`` so multiples already passed are not reported again.
    """

    def __init__(self, every: int, count: int, start_evaluations: int = 0) -> None:
        if int(every) < 1:
            raise ValueError(f"migration every = {every}: must be >= 1 (config search.migration_every)")
        if int(count) < 0:
            raise ValueError(f"migration count = {count}: must be >= 0 (config search.migration_count)")
        if int(start_evaluations) < 0:
            raise ValueError(f"start_evaluations = {start_evaluations}: must be >= 0")
        self.every = int(every)
        self.count = int(count)
        self._epoch = int(start_evaluations) // self.every

    def __repr__(self) -> str:
        return f"RingMigration(every={self.every}, count={self.count}, epoch={self._epoch})"

    @property
    def enabled(self) -> bool:
        return self.count > 0

    @property
    def epoch(self) -> int:
        """How many multiples of ``every`` have been reported (or skipped at start)."""
        return self._epoch

    def due(self, evaluations: int) -> bool:
        """True when ``evaluations`` (the global count so far) crossed a new multiple of
        ``every`` since the last call that returned True."""
        if evaluations < 0:
            raise ValueError(f"evaluations = {evaluations}: must be >= 0")
        epoch = int(evaluations) // self.every
        if epoch <= self._epoch:
            return False
        self._epoch = epoch
        return self.enabled

    def plan(self, n_islands: int) -> list[tuple[int, int]]:
        """src -> dst pairs for ``n_islands`` islands of one task (see :func:`ring_plan`)."""
        return ring_plan(n_islands)

    def migrate(self, islands: Sequence[Island]) -> list[Transfer]:
        """One round of :func:`migrate` with this policy's ``count`` (no-op when disabled)."""
        if not self.enabled:
            return []
        return migrate(islands, self.count)


def migrate(islands: Sequence[Island], count: int = 1) -> list[Transfer]:
    """One ring-migration round among in-process islands of the same task.

    All emigrants are taken before any island receives, so a member moves one hop per
    round. Raises ``ValueError`` when the islands hold different tasks.
    """
    tasks = {isl.task for isl in islands}
    if len(tasks) > 1:
        raise ValueError(
            f"migrate() got islands of several tasks {sorted(tasks)}; group islands by task "
            "and migrate each group separately"
        )
    pairs = ring_plan(len(islands))
    outgoing = {src: islands[src].emigrants(count) for src, _ in pairs}
    out = []
    for src, dst in pairs:
        sent = outgoing[src]
        accepted = islands[dst].immigrate(sent)
        out.append(Transfer(src, dst, tuple(m.id for m in sent), accepted))
        log.debug("migration %s: island %d -> %d sent %d kept %d", next(iter(tasks)),
                  islands[src].index, islands[dst].index, len(sent), accepted)
    return out
