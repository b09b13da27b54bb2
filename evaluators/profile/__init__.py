"""Delayed Nsight Compute profiling of survivors (cascade stage ``profile``).

Only correct candidates that enter their island's top-k are profiled (the rule lives in
:mod:`evo.engine.survivors`); everything else never pays for ncu. One profile is one isolated run:

    ncu --clock-control none --target-processes all --nvtx --nvtx-include evo_candidate/
        --launch-count N --csv --page raw --print-units base --metrics <list>
        --log-file <jobdir>/ncu.csv  python -m evaluators.child.profile <jobdir>

The child (:mod:`evaluators.child.profile`) builds the task's inputs for one benchmark
shape, calls the candidate once outside the range (warm-up: module load, caches), then
once inside the NVTX push/pop range ``evo_candidate``. The NVTX filter is exact: the
harness's own torch kernels (input generation, the reference that sizes the outputs) run
outside the range and are never captured, whatever their names. ``--launch-count`` caps the
captured kernels of that one call (a split-K candidate launches two); the profile then
sums their durations and takes every other number from the longest kernel.

``--clock-control none`` keeps the GPU's own clocks, as the timing stage measures them, so
the numbers describe the kernel the fitness describes (ncu's default locks base clocks).

The run has its own process group and wall-clock timeout (``ProfileSettings.timeout_s``);
on timeout the whole group, ncu and its target, is killed and the stage reports
``timeout``. Results are cached by (sha256 of the .so, shape, GPU name) in small JSON files
under ``ProfileSettings.cache_dir``; the engine also stores them (``Store.add_profile``).

Failure mapping (the cascade's rule): a candidate problem (it crashed under ncu, it launched
no kernel inside the range, it hung) is a :class:`~evo.core.records.StageResult` with a non-ok
status; a broken profiler (ncu missing, no permission to read the counters, an ``==ERROR==``
from ncu while the candidate ran fine) raises :class:`ProfileError` naming the fix. ncu
2025.3 silently leaves out metric names it does not know (seen on the H200): they show up
in the profile's ``missing`` list, not as an error. Nothing here imports torch or touches
CUDA: the child does.

Parsing (:func:`parse_ncu_csv`) follows ncu's documented ``--csv --page raw`` layout: a
header row of metric names, a row of units, then one row per profiled kernel launch;
``==PROF==`` / ``==WARNING==`` lines around it are skipped. A recording of real ncu output
on an H200 lives in ``tests/fixtures/ncu/``.

Layout: ``run.py`` (:func:`profile_candidate`: ncu around the child, failures mapped),
``settings.py`` (:class:`ProfileSettings`, the metric list, the profiler's errors),
``report.py`` (parsing, the summary, the roofline class, the readable profile), ``cache.py``
(:class:`ProfileCache`). The profiled program is :mod:`evaluators.child.profile`.
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
from evaluators.profile.run import build_ncu_command, find_ncu, gpu_name, profile_candidate
from evaluators.profile.settings import (
    DEFAULT_METRICS,
    NVTX_RANGE,
    STAGE,
    STALL_REASONS,
    NcuNotFoundError,
    ProfileError,
    ProfileSettings,
)

__all__ = [
    "STAGE",
    "NVTX_RANGE",
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
    "build_ncu_command",
    "find_ncu",
    "gpu_name",
    "profile_candidate",
]
