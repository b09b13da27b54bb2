"""The search: its entry points (:mod:`evo.engine.search`), the steady-state loop
(:mod:`evo.engine.engine`) and the helpers beside it (proposals, dispatch, islands, recovery,
survivors, resume, ordering, bookkeeping), the seams' Protocols (:mod:`evo.engine.seams`), the
Ray runtime (:mod:`evo.engine.runtime`) and the early start of its local instance
(:mod:`evo.engine.early_ray`, :mod:`evo.engine.local_ray`), the LLM mutator's view of the store
(:mod:`evo.engine.llm_context`) and the dry run's LLM checks (:mod:`evo.engine.llm_check`).

This file imports nothing, so that ``evo.config`` can import the ``[search]`` record
(:mod:`evo.engine.engine_settings`) without loading the engine.
"""
