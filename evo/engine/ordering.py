"""Ordered mode of the engine (``search.ordered``): finished work is taken in the order it
started, so that what the search decides does not depend on which result came first.

:class:`ItemOrder` numbers every proposal and candidate when it starts (an *item*). When an
item finishes, what it changes (an evaluation recorded, a failed attempt counted, the island
told of a child) is held until every older item has been taken; after each item taken the
engine proposes again (``on_taken``). Parent choices, repair queues and migrations then see
the same history in every run of the same configuration and answers, whatever the timing of
compiles, GPUs and model calls. Unordered, :meth:`ItemOrder.close` runs its action at once.
Used by the engine's thread only.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

__all__ = ["ItemOrder"]


class ItemOrder:
    """Items in the order they started; ``ordered=False`` runs every action at once."""

    def __init__(self, ordered: bool, on_taken: Callable[[], None]) -> None:
        self.ordered = ordered
        self._on_taken = on_taken
        self._next = 0
        self._open: deque[int] = deque()
        self._closed: dict[int, list[Callable[[], None]]] = {}
        self._before: dict[int, list[Callable[[], None]]] = {}
        self._of: dict[str, int] = {}
        self._taking = False

    def __len__(self) -> int:
        """Items started and not taken yet (ordered mode; 0 otherwise)."""
        return len(self._open)

    def start(self, candidate_id: str | None = None) -> int:
        """Number a new item (a proposal, or the candidate ``candidate_id``)."""
        item, self._next = self._next, self._next + 1
        if self.ordered:
            self._open.append(item)
            if candidate_id is not None:
                self._of[candidate_id] = item
        return item

    def bind(self, candidate_id: str, item: int) -> None:
        """The candidate a proposal item made: its record closes that item."""
        if self.ordered:
            self._of[candidate_id] = item

    def of(self, candidate_id: str) -> int:
        return self._of.pop(candidate_id, -1)

    def before(self, item: int, action: Callable[[], None]) -> None:
        """Run ``action`` on ``item``'s turn, before what closes it (ordered; else now)."""
        if self.ordered:
            self._before.setdefault(item, []).append(action)
        else:
            action()

    def close(self, item: int, action: Callable[[], None]) -> None:
        """``item`` finished: run ``action`` now, or (ordered) on its turn, once every older
        item has been taken; after each item taken, ``on_taken``."""
        if not self.ordered:
            action()
            return
        self._closed[item] = self._before.pop(item, []) + [action]
        if self._taking:  # an action closed another item: the loop below takes it in turn
            return
        self._taking = True
        try:
            while self._open and self._open[0] in self._closed:
                for act in self._closed.pop(self._open.popleft()):
                    act()
                self._on_taken()
        finally:
            self._taking = False
