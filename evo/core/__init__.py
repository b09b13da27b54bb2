"""The shared vocabulary at the bottom of ``evo``: records (:mod:`evo.core.records`), how a
settings record declares its config keys (:mod:`evo.core.settings`), ``@tunable`` and
``@constraint`` declarations (:mod:`evo.core.tunables`) and checks of user-given file locations
(:mod:`evo.core.paths`).

Every other package imports these (evaluators, mutators, populations and the judge among
them); they import nothing of the engine, CLI, store, config, results or tuning,
nor Ray (``tests/test_layers.py``). This file imports nothing: ``import evo.core.records``
stays as light as the records themselves (``tests/test_lazy_imports.py``).
"""
