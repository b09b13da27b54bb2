"""Delayed Nsight Compute profiling of survivors (cascade stage ``profile``).

Only correct candidates that enter their island's top-k are profiled (the rule lives in
:mod:`evo.engine.survivors`); everything else never pays for ncu. The judge takes the profile
(:mod:`evaluators.judge.profile`): ncu in front of a sandboxed runner, confined like any
runner, that calls the candidate once on the judge's buffers; the judge checks that call's
output as it checks a timed call, so ncu's numbers describe a correct call, and ncu's kernel
duration corroborates a champion's time (it never grants fitness).

``--clock-control none`` keeps the GPU's own clocks, as the timing stage measures them, so
the numbers describe the kernel the fitness describes (ncu's default locks base clocks).

The whole profile is bounded by ``ProfileSettings.timeout_s``; on timeout the process group,
ncu and its target, is killed and the stage reports ``timeout``. Results are cached by
(sha256 of the .so, shape, GPU name, metrics) in small JSON files under
``ProfileSettings.cache_dir``; the engine also stores them (``Store.add_profile``).

Failure mapping (the cascade's rule): a candidate problem (it crashed under ncu, its call was
wrong, it launched no kernel, it hung) is a :class:`~evo.core.records.StageResult` with a
non-ok status; a broken profiler (ncu missing, no permission to read the counters, an
``==ERROR==`` from ncu while the candidate's call was fine) raises :class:`ProfileError` naming
the fix. ncu 2025.3 silently leaves out metric names it does not know (seen on the H200): they
show up in the profile's ``missing`` list, not as an error.

Parsing (:func:`parse_ncu_csv`) follows ncu's documented ``--csv --page raw`` layout: a
header row of metric names, a row of units, then one row per profiled kernel launch;
``==PROF==`` / ``==WARNING==`` lines around it are skipped. A recording of real ncu output
on an H200 lives in ``tests/fixtures/ncu/``.

Layout: ``run.py`` (:func:`profile_candidate`: the cache, then the judge), ``settings.py``
(:class:`ProfileSettings`, the metric list, the profiler's errors), ``report.py`` (parsing,
the summary, the roofline class, the readable profile), ``cache.py`` (:class:`ProfileCache`).
"""

from __future__ import annotations

from evaluators.profile.cache import ProfileCache, profile_key
from evaluators.profile.report import (
    KernelRow,
    classify_roofline,
    format_profile,
    parse_ncu_csv,
    profile_descriptor,
    summarize,
)
from evaluators.profile.run import find_ncu, gpu_name, profile_candidate
from evaluators.profile.settings import (
    DEFAULT_METRICS,
    STAGE,
    STALL_REASONS,
    NcuNotFoundError,
    ProfileError,
    ProfileSettings,
)

__all__ = [
    "STAGE",
    "STALL_REASONS",
    "DEFAULT_METRICS",
    "ProfileSettings",
    "ProfileError",
    "NcuNotFoundError",
    "KernelRow",
    "parse_ncu_csv",
    "summarize",
    "classify_roofline",
    "profile_descriptor",
    "format_profile",
    "profile_key",
    "ProfileCache",
    "find_ncu",
    "gpu_name",
    "profile_candidate",
]
