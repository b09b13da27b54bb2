"""Timeouts that scale with the task: a hang costs seconds, not the configured five minutes.

A candidate that never finishes (a pipelined kernel with a wrong barrier spins forever) is
only caught by the wall-clock limit of its isolated process. ``[evaluator] timeout_s`` is a
safe upper bound for any task, far too long for most: at 300 s one hang cost five GPU-minutes.
So each GPU actor learns, per task, how long its *passing* isolated processes take (process
start included: the harness reports each child's wall clock as ``env["wall_check_s"]`` and
``env["wall_time_s"]``) and gives the next candidate of that task

    timeout = margin_s + factor x (the slowest of the last ``window`` passing walls)

for each process (correctness, timing), never above ``timeout_s``. Until a task has a
passing evaluation on this GPU (its seed is evaluated first) the upper bound applies.
Only passing evaluations teach: a candidate that fails fast must not shrink the limit for
a correct but slower one. A correct candidate slower than ``factor`` x the slowest seen
(plus the margin) is cut off and recorded as ``timeout`` with the rule in its reason: such a
kernel is many times slower than everything that passed before, not a champion.

Used by :class:`evaluators.actor.GpuEvaluator` (one budget per actor: it sees its own GPU's
results); plain data, no CUDA, no Ray.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Mapping

from evaluators.base import HarnessSettings

__all__ = ["TimeoutBudget"]

log = logging.getLogger(__name__)

#: (env key of the measured wall, HarnessSettings field it sets)
_CHILDREN = (("wall_check_s", "timeout_check_s"), ("wall_time_s", "timeout_time_s"))


@dataclass
class TimeoutBudget:
    """Per-task, per-process timeouts learned from this GPU's passing evaluations.

    ``margin_s`` covers jitter in process start-up (imports, CUDA context, sandbox set-up);
    ``factor`` x the slowest recent passing wall leaves room for correct candidates slower
    than those seen so far. Not thread-safe (an actor evaluates one candidate at a time).
    """

    margin_s: float = 10.0
    factor: float = 2.0
    window: int = 8
    _walls: dict[tuple[str, str], deque] = field(default_factory=dict)

    def settings_for(self, task: str, settings: HarnessSettings) -> HarnessSettings:
        """``settings`` with this task's per-child timeouts (unchanged while none is known)."""
        values: dict[str, float] = {}
        notes = []
        for key, attr in _CHILDREN:
            walls = self._walls.get((task, key))
            if not walls:
                continue
            t = min(settings.timeout_s, self.margin_s + self.factor * max(walls))
            values[attr] = t
            notes.append(f"{attr.split('_')[1]} {t:.3g}s")
        if not values:
            return settings
        note = (f"adaptive timeout: {self.margin_s:g}s + {self.factor:g} x the slowest of this task's last "
                f"{self.window} passing processes on this GPU ({', '.join(notes)}; upper bound timeout_s = "
                f"{settings.timeout_s:g}s)")
        return replace(settings, timeout_note=note, **values)

    def record(self, task: str, env: Mapping[str, str], passed: bool) -> None:
        """Learn from one evaluation's per-child walls (``env`` of its report); only passing
        evaluations count."""
        if not passed:
            return
        for key, _attr in _CHILDREN:
            raw = env.get(key)
            try:
                wall = float(raw) if raw is not None else None
            except ValueError:
                wall = None
            if wall is None or wall <= 0:
                continue
            self._walls.setdefault((task, key), deque(maxlen=self.window)).append(wall)
