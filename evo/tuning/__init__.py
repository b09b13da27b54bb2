"""Optuna studies over a survivor's tunables (:mod:`evo.tuning.tuning`) and the ``[tuning]``
record (:mod:`evo.tuning.tuning_settings`).

This file imports nothing, so that ``evo.config`` can import the ``[tuning]`` record without
loading Optuna.
"""
