"""A search's start-up, measured: how old the process was at each step before the engine ran.

``evo search`` makes a :class:`StartupClock` as its command starts and marks each step
(config loaded, tasks loaded, GPU probed; :func:`evo.engine.search.run_search` marks the
rest); the run's ``start`` event carries the :class:`StartupRecord` it gives
(``payload["startup"]``), so the start-up of any run can be read from its own record and its
slow step named. Ages are seconds since the process started (what the interpreter, the
imports and every step took), read from ``/proc`` once and advanced by a monotonic clock, so
the ages of later steps never go back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["process_age_s", "StartupClock", "StartupRecord", "STEPS"]

#: The steps marked, by name, in the order a local search reaches them: the CLI's command
#: entered; the config validated; its tasks loaded; the GPU probe answered (only when probed);
#: run_search entered (only without the CLI); the seeds found and the keys and database checked;
#: the store open and the run created or resumed; the cluster runtime's start begun (the seed
#: compiles started just before); the driver's own preparation done while the runtime starts
#: (the sandbox probed); the runtime ready. Where the start is not overlapped (a named cluster)
#: "ray_start" comes after "prepared"; where it began early (StartupRecord.ray_early), right
#: after "cli".
STEPS = ("cli", "config", "tasks", "gpu", "search", "seeds", "store", "ray_start", "prepared", "ray_ready")


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc``), or None where it cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class StartupRecord:
    """The start-up of one search, as its ``start`` event records it.

    ``age_at``: (step, process age in seconds) in the order the steps happened (names from
    :data:`STEPS`; ages None where the process age cannot be read). ``runtime_s``: seconds
    the cluster runtime's start took (``Runtime.start``: a local Ray instance and its actors,
    or joining a cluster). ``ray_overlapped``: the runtime started on a thread of its own
    while the search prepared the rest (a local instance), rather than after it.
    ``ray_early``: the local instance's start began at the command's entry, before the config
    was loaded, and the runtime took it over (:mod:`evo.engine.early_ray`); "ray_start" is
    then marked right after "cli".
    """

    age_at: tuple[tuple[str, float | None], ...]
    runtime_s: float | None = None
    ray_overlapped: bool = False
    ray_early: bool = False

    def age(self, step: str) -> float | None:
        """The process age at ``step``, or None when it was not marked."""
        return dict(self.age_at).get(step)

    def to_json(self) -> dict[str, Any]:
        """``process_age_s`` (the age when the runtime's start began), ``age_at`` (step ->
        age, in order), ``runtime_s``, ``ray_overlapped`` and ``ray_early``."""
        return {"process_age_s": self.age("ray_start"), "age_at": dict(self.age_at),
                "runtime_s": self.runtime_s, "ray_overlapped": self.ray_overlapped, "ray_early": self.ray_early}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StartupRecord":
        return cls(age_at=tuple((str(k), v) for k, v in (d.get("age_at") or {}).items()),
                   runtime_s=d.get("runtime_s"), ray_overlapped=bool(d.get("ray_overlapped", False)),
                   ray_early=bool(d.get("ray_early", False)))


class StartupClock:
    """Marks steps of a start-up with the process's age (see :class:`StartupRecord`).

    ``first``: the step marked at construction. The process age is read from ``/proc`` once,
    here; later marks add the monotonic time since, so they are never out of order. Used by
    the driver's main thread only.
    """

    def __init__(self, first: str) -> None:
        self._age0 = process_age_s()
        self._t0 = time.monotonic()
        self._marks: list[tuple[str, float | None]] = []
        self.mark(first)

    def mark(self, step: str) -> None:
        """Record ``step`` (a name of :data:`STEPS`) as reached now; a step marked again moves
        to now (Ray started again after an early start that could not serve)."""
        if step not in STEPS:
            raise ValueError(f"start-up step {step!r}: unknown; known: {', '.join(STEPS)}")
        age = None if self._age0 is None else round(self._age0 + time.monotonic() - self._t0, 3)
        self._marks = [m for m in self._marks if m[0] != step] + [(step, age)]

    def record(self, runtime_s: float | None, ray_overlapped: bool, ray_early: bool = False) -> StartupRecord:
        return StartupRecord(tuple(self._marks), runtime_s, ray_overlapped, ray_early)
