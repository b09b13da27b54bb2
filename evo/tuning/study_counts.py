"""What one tuning study did, counted once: :class:`StudyCounts`, and the rule for a finished study.

A study (:class:`evo.tuning.tuning.TuningStudy`) has a trial budget, ``n_trials`` (the engine
sizes it when the study opens, :func:`evo.engine.survivors.sized_trials`). Its trials are of
three kinds, and only two of them spend that budget:

- **evaluated** (``issued``): an asked point sent to compile and the GPU;
- **told**: a point the sampler chose that is answered at once with an earlier evaluation of
  the same point (a repeat of an earlier trial, a candidate the run already evaluated): it
  costs no evaluation, yet it is one of the study's trials;
- free: **pruned** asks (a violated constraint, a point still in flight) and **known** points
  (the run's evaluations of the same source, added as finished trials without an ask, and
  the parent's own values told its known fitness).

:attr:`StudyCounts.finished` is the one rule for "the study finished"; the study's own
``done``/``finished``, the engine's ``tuning_done`` event and benchmarks/search_power.py's
count all follow it. This module imports nothing heavy (no Optuna), so readers of a run's
events can use it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

__all__ = ["StudyCounts"]


@dataclass(frozen=True)
class StudyCounts:
    """Counts of one study (module docstring). ``n_trials``: its trial budget; ``asked``: points
    the sampler chose (``issued + told + pruned``; known points are not asked); ``issued``: asked
    points sent for evaluation (``in_flight`` of them not told back yet); ``told``: asked points
    answered with an earlier evaluation; ``pruned``: asked points pruned; ``known``: points the
    run evaluated outside the study, added as finished trials; ``out_of_points``: the study
    can ask nothing new (every feasible point tried, or its cap on asks reached)."""

    n_trials: int
    asked: int = 0
    issued: int = 0
    told: int = 0
    pruned: int = 0
    known: int = 0
    in_flight: int = 0
    out_of_points: bool = False

    @property
    def evaluated(self) -> int:
        """Trials evaluated and told back (compile + GPU)."""
        return self.issued - self.in_flight

    @property
    def spent(self) -> int:
        """Trials that count against ``n_trials``: evaluated (in flight included) or told."""
        return self.issued + self.told

    @property
    def done(self) -> bool:
        """The study asks nothing more: its budget is spent or it is out of points."""
        return self.spent >= self.n_trials or self.out_of_points

    @property
    def finished(self) -> bool:
        """**The rule**: done, and none of its trials is in flight."""
        return self.done and self.in_flight == 0

    @property
    def owed(self) -> int:
        """Trials the study may still ask for that would need an evaluation budget (0 once done)."""
        return 0 if self.done else self.n_trials - self.spent

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StudyCounts":
        """The record :meth:`to_json` wrote; unknown keys are ignored, ``n_trials`` is required."""
        names = {f.name for f in fields(cls)}
        if "n_trials" not in data:
            raise ValueError(f"study counts {dict(data)!r}: field 'n_trials' is missing")
        return cls(**{k: v for k, v in data.items() if k in names})
