"""The record of config section ``[tuning]``: :class:`TuningSettings`.

It lives apart from :mod:`evo.tuning.tuning` because :mod:`evo.config` composes it into the
config and must not import Optuna to do so. Its config keys are the ``config_key`` fields
(default and bounds declared once, see :mod:`evo.core.settings`).
"""

from __future__ import annotations

from dataclasses import dataclass

from evo.core.settings import config_key

__all__ = ["TuningSettings"]


@dataclass(frozen=True)
class TuningSettings:
    """Automatic tuning of survivors (config section ``[tuning]``; read by the engine's
    survivor work, :mod:`evo.engine.survivors`, and :class:`evo.tuning.tuning.TuningStudy`).

    Config keys: ``enabled``: master switch, off by default (each study costs compiles and
    GPU time). ``trials_per_survivor``: trials per study, each evaluated (compile + GPU run)
    or told an earlier evaluation of its point; pruned and known points are free (a record
    built by code with 0 tunes nothing). The engine sizes a study down to what the run's
    evaluation budget left pays for (:func:`evo.engine.survivors.sized_trials`).
    ``top_k``: a correct member is tuned when it enters the best ``top_k`` of its island.
    ``max_concurrent``: trials of one study in flight at once (TPE learns from finished
    trials, so a few at a time is the sweet spot).

    Set by code: ``seed``: TPE seed (``Config.tuning_settings`` passes ``run.seed``; the
    engine derives one per study from the run's random stream).
    """

    enabled: bool = config_key(False)
    trials_per_survivor: int = config_key(16, ge=1)
    top_k: int = config_key(2, ge=1)
    seed: int = 0
    max_concurrent: int = config_key(2, ge=1)
