"""The content ids a run has proposed, owned by the engine and lent read-only to its helpers.

:class:`SeenIds` is the engine's (:class:`evo.engine.engine.Engine`): only it adds an id, when
it submits a candidate or replays a run. Its helpers (the proposer, the tuning trials of
:mod:`evo.engine.survivors`) get :meth:`SeenIds.view`, a :class:`SeenView`: a live, read-only
set (``in``, iteration, ``len``) with no way to add, so that a child's content id is marked
seen in one place only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set

__all__ = ["SeenIds", "SeenView"]


class SeenView(Set):
    """A live, read-only view of :class:`SeenIds` (a :class:`collections.abc.Set`: ``in``,
    iteration, ``len``, comparisons, ``frozenset(view)`` for a snapshot)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: set[str]) -> None:
        self._ids = ids

    def __contains__(self, cid: object) -> bool:
        return cid in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"SeenView({len(self._ids)} ids)"


class SeenIds:
    """The run's proposed content ids (the engine's dedupe: a seen id is never compiled again)."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._view = SeenView(self._ids)

    def __contains__(self, cid: object) -> bool:
        return cid in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, cid: str) -> bool:
        """Mark ``cid`` seen; True when it was new."""
        if cid in self._ids:
            return False
        self._ids.add(cid)
        return True

    def update(self, ids: Iterable[str]) -> None:
        """Mark every id of ``ids`` seen (a resumed run's candidates)."""
        self._ids.update(ids)

    def view(self) -> SeenView:
        """The read-only view lent to the engine's helpers (always the same object)."""
        return self._view
