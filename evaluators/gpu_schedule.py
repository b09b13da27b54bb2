"""Who may use one GPU at a time: a readers-writer discipline with timing exclusive.

The GPU actor runs several candidates' processes on its GPU at once (docs/evaluator.md,
"One GPU, several candidates"), under two rules:

- *shared* work (a correctness process from its job's arrival to its exit; a warm child's
  CUDA start-up, :mod:`evaluators.warm`): any number at once, correctness bounded by
  ``check_concurrency`` (:class:`GpuSchedule` counts them apart);
- *exclusive* work (a timing process from its job's arrival to its exit; an ncu profile):
  nothing else on the GPU, shared or exclusive.

A waiting exclusive request blocks new shared work (writer preference), so timing is
never starved by a stream of correctness processes; the shared work already running
finishes first. Waiting processes (a warm child blocked on its gate, a timing child not
yet given its job) do no GPU work and hold nothing here.

Plain threads and a condition variable: the actor's method calls run on Ray's threads.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["GpuSchedule", "Interval"]


@dataclass(frozen=True)
class Interval:
    """One piece of work that held the GPU: ``kind`` (``check``, ``warm``, ``time``,
    ``profile``) from ``start`` to ``end`` (``time.time()`` seconds)."""

    kind: str
    start: float
    end: float


@dataclass
class GpuSchedule:
    """The readers-writer lock of one GPU; ``check_concurrency`` bounds correctness processes.

    ``shared(kind)`` / ``exclusive(kind)`` are context managers that block until allowed;
    ``try_shared`` / ``release_shared`` serve holders that are not a thread (a warm child's
    start-up, released when the child says it is ready). ``intervals`` keeps what held the
    GPU, for tests and the benchmark (bounded: the last ``keep`` entries).
    """

    check_concurrency: int = 1
    keep: int = 10000
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _checks: int = 0
    _others: int = 0
    _exclusive: bool = False
    _waiting_exclusive: int = 0
    intervals: list[Interval] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.check_concurrency < 1:
            raise ValueError(f"check_concurrency must be >= 1, got {self.check_concurrency}")

    # ------------------------------------------------------------ shared
    def _shared_free(self, kind: str) -> bool:
        if self._exclusive or self._waiting_exclusive:
            return False
        return kind != "check" or self._checks < self.check_concurrency

    def _take_shared(self, kind: str) -> None:
        if kind == "check":
            self._checks += 1
        else:
            self._others += 1

    def try_shared(self, kind: str) -> bool:
        """Take a shared slot now if allowed (no waiting); True when taken."""
        with self._cond:
            if not self._shared_free(kind):
                return False
            self._take_shared(kind)
            return True

    def release_shared(self, kind: str, start: float | None = None) -> None:
        with self._cond:
            if kind == "check":
                self._checks -= 1
            else:
                self._others -= 1
            if start is not None:
                self._note(kind, start)
            self._cond.notify_all()

    @contextmanager
    def shared(self, kind: str = "check") -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._shared_free(kind))
            self._take_shared(kind)
        t0 = time.time()
        try:
            yield
        finally:
            self.release_shared(kind, t0)

    # ------------------------------------------------------------ exclusive
    @contextmanager
    def exclusive(self, kind: str = "time") -> Iterator[None]:
        with self._cond:
            self._waiting_exclusive += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and self._checks == 0 and self._others == 0)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        t0 = time.time()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._note(kind, t0)
                self._cond.notify_all()

    def _note(self, kind: str, start: float) -> None:
        self.intervals.append(Interval(kind, start, time.time()))
        if len(self.intervals) > self.keep:
            del self.intervals[: len(self.intervals) - self.keep]

    @property
    def idle(self) -> bool:
        """Nothing holds the GPU and no exclusive request waits."""
        with self._cond:
            return not (self._exclusive or self._waiting_exclusive or self._checks or self._others)
