"""The record of config section ``[search]``: :class:`EngineSettings`.

It lives apart from :mod:`evo.engine.engine` (which exports it with the Engine that takes it)
because :mod:`evo.config` composes it into the config and must not import the engine to do
so. Its config keys are the ``config_key`` fields (default and bounds declared once, see
:mod:`evo.core.settings`); ``search.migration_count <= search.population_size`` is the one
cross-key rule, checked by :mod:`evo.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evo.core.settings import config_key

__all__ = ["EngineSettings"]


@dataclass(frozen=True)
class EngineSettings:
    """The scheduling knobs the engine reads (config section ``[search]``).

    Config keys: ``islands_per_task``: independent populations per task.
    ``population_size``: elites kept per island. ``max_evaluations``: the evaluation
    budget. ``max_wall_seconds``: the wall-clock limit (the config key is
    ``max_wall_minutes``). ``in_flight``: proposals between proposal and result (0 = auto).
    ``migration_every`` / ``migration_count``: ring migration period (in evaluations) and
    size. ``selection_lambda``: the selector's pressure. ``archive``: a MAP-Elites archive
    per island. ``ordered``: take finished work in the order it started, so that a replay of
    the run makes the same children (:mod:`evo.engine.engine`; costs throughput).

    Set by code: ``confirm_champions`` (re-time a task's new best before it is reported),
    ``progress_every`` (evaluations between progress events), ``profile`` / ``tuning`` (the
    run's :class:`evaluators.profile.ProfileSettings` / :class:`evo.tuning.tuning_settings.TuningSettings`,
    None or ``enabled=False``: off), ``tuning_storage`` (the Optuna storage of the studies,
    ``evo.tuning.tuning.journal_path``; required with tuning).
    """

    islands_per_task: int = config_key(2, ge=1, le=64)
    population_size: int = config_key(16, ge=2, le=1024)
    max_evaluations: int = config_key(200, ge=1)
    max_wall_seconds: float = config_key(600.0, gt=0, name="max_wall_minutes", scale=60.0)
    in_flight: int = config_key(0, ge=0)
    migration_every: int = config_key(40, ge=1)
    migration_count: int = config_key(2, ge=0)
    selection_lambda: float = config_key(1.0, gt=0)
    archive: bool = config_key(True)
    ordered: bool = config_key(False)
    confirm_champions: bool = True
    progress_every: int = 10
    profile: Any = None
    tuning: Any = None
    tuning_storage: str = ""
