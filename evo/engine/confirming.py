"""Champion confirmations started as soon as a task's search is settled.

A task is *settled* when the run will propose nothing more (its budget is proposed, or it has a
stop reason) and none of the task's candidates is compiling, queued or on a GPU: its best can
no longer change, so its confirmation (:func:`evo.engine.champions.confirm_champion`) can run
while the other tasks' last candidates still compile or are judged. Without this every
confirmation waited for the run's last verdict, typically a GEMM child's 30 s compile, with
the GPU idle in between; the confirmations then ran one after another at the end.

:class:`Confirmations` owns one worker thread. Contract:

- Who calls: the engine's main thread only (:meth:`start`, :meth:`take`, :meth:`close`).
- The worker runs only the ``confirm`` callable it was given, which may talk to the runtime
  (compile, GPU evaluations; both thread-safe) but never to the store: the store has one
  writer, the main thread, which stores every confirmation in task order when it takes it.
- One worker: the confirmations' paired rounds stay back to back with each other (search
  evaluations may still come between them while the run drains).
- :meth:`take` returns the confirmation of exactly the champion it is asked about; one started
  for another candidate (which cannot happen for a settled task, but costs nothing to check)
  is discarded and the confirmation runs again. A confirmation's exception is raised by
  :meth:`take`, as if it had run there.
- :meth:`close` with ``wait=False`` (interrupted, failed) cancels what has not started; a
  running one ends with its runtime call, whose result nobody stores.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Callable

from evo.core.records import Candidate
from evo.engine.champions import Confirmation

__all__ = ["Confirmations", "ConfirmFn", "settled_tasks"]

#: ``(task, champion, its search fitness, its stored profiles) -> Confirmation``, run on the
#: worker thread (the profiles are read from the store by the caller, on the main thread).
ConfirmFn = Callable[[str, Candidate, float, tuple], Confirmation]


@dataclass(frozen=True)
class _Started:
    candidate_id: str
    fitness: float
    future: cf.Future


def settled_tasks(best: dict[str, tuple[float, Candidate]], busy: set[str], *, proposing_done: bool) -> list[str]:
    """The tasks (sorted) whose best is final: none while the run may still propose
    (``proposing_done`` False); else every task with a best and no candidate in ``busy``
    (the tasks of the candidates compiling, queued or on a GPU)."""
    if not proposing_done:
        return []
    return sorted(t for t in best if t not in busy)


class Confirmations:
    """The run's champion confirmations, started early on one worker thread (module docstring)."""

    def __init__(self, confirm: ConfirmFn) -> None:
        self._confirm = confirm
        self._pool: cf.ThreadPoolExecutor | None = None
        self._started: dict[str, _Started] = {}

    def started(self, task: str) -> bool:
        """Whether a confirmation of ``task`` was started (and not yet taken)."""
        return task in self._started

    def start(self, task: str, cand: Candidate, fitness: float, profiles: tuple = ()) -> bool:
        """Start confirming ``cand`` as ``task``'s champion on the worker; False when one for
        the same candidate is already started."""
        old = self._started.get(task)
        if old is not None and old.candidate_id == cand.id and old.fitness == fitness:
            return False
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="evo-confirm")
        self._started[task] = _Started(cand.id, fitness, self._pool.submit(self._confirm, task, cand, fitness,
                                                                                 profiles))
        return True

    def take(self, task: str, cand: Candidate, fitness: float, profiles: tuple = ()) -> Confirmation:
        """``cand``'s confirmation as ``task``'s champion: the one started for it, awaited,
        else one run now on the caller's thread."""
        old = self._started.pop(task, None)
        if old is not None and old.candidate_id == cand.id and old.fitness == fitness:
            return old.future.result()
        if old is not None:
            old.future.cancel()
        return self._confirm(task, cand, fitness, profiles)

    def close(self, *, wait: bool = True) -> None:
        """Stop the worker: ``wait`` for what runs, or cancel what has not started."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
            self._pool = None
        if not wait:
            self._started.clear()
