"""Where the judge's time goes during one evaluation: wall seconds per step, summed.

The judge's own work (writing inputs, the references, the output checks, starting and
calibrating the runner) is what separates an evaluation's wall time from the candidate's
calls; :class:`Phases` sums it per named step so a run's records say which step limits the
rate (``env["judge_phases"]`` of every evaluation the judge decides). Device work is
asynchronous: a step's seconds include the device work queued before it that it waits for,
so steps are grouped where a synchronise ends them (see the callers).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["Phases", "parse_phases"]


class Phases:
    """Seconds per step name, summed over the evaluation (``clock`` may be a fake)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._s: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = self._clock()
        try:
            yield
        finally:
            self.add(name, self._clock() - t0)

    def add(self, name: str, seconds: float) -> None:
        self._s[name] = self._s.get(name, 0.0) + float(seconds)

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self._s.items()}

    def dumps(self) -> str:
        """``name=seconds`` pairs, space-separated, in the order the steps first ran (an
        evaluation's ``env`` holds strings)."""
        return " ".join(f"{k}={v:.4f}" for k, v in self._s.items())


def parse_phases(text: str) -> dict[str, float]:
    """What :meth:`Phases.dumps` wrote, back as seconds per step name (in its order)."""
    out: dict[str, float] = {}
    for kv in text.split():
        k, _, v = kv.partition("=")
        out[k] = float(v)
    return out
