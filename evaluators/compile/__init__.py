"""Compile stage: a candidate's CUDA source -> shared object bytes, cached by content.

Contract:
  ``compile_candidate(candidate, settings) -> CompileOutcome``. ``outcome.result`` is a
  ``StageResult(stage="compile")`` whose status is ``ok``, ``compile_error`` (nvcc failed,
  including running out of the memory limit), ``timeout`` (nvcc ran past
  ``settings.timeout_s`` and its whole process group was killed) or ``rejected`` (tunable
  values that are not numbers/identifiers; they would be spliced into -D flags).
  ``outcome.so_bytes`` holds the .so when ok (bytes travel to GPU workers, so no shared disk is
  needed). A failure of the *candidate* is data; a failure of the *system* (nvcc or the
  nvidia-cutlass wheel missing, an unusable arch string) raises a clear exception.

Build (ARCHITECTURE.md): ``nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a
--expt-relaxed-constexpr -shared -Xcompiler -fPIC -Xptxas -v -lineinfo -I<evo_abi.h dir>
-I<cutlass include> -DNAME=VALUE...`` plus ``settings.extra_flags``. No ``--use_fast_math``:
it changes fp32 results, so a candidate that wants fast intrinsics writes them itself.

Isolation: nvcc runs in a private temporary directory (also its TMPDIR), in its own process
group, under ``RLIMIT_AS = settings.memory_mb`` (per process: nvcc, cicc, ptxas, the host
compiler each get the limit), with core dumps off. The limit is set by a tiny Python
``exec`` wrapper rather than ``preexec_fn``, which is unsafe in threaded processes such as
Ray workers. A template bomb therefore ends as ``compile_error`` or ``timeout``.

Cache: ``<cache_dir>/compile/<key[:2]>/<key>.{so,json}``, key = sha256 of the source,
canonical params, flags, the ABI header, nvcc version, host compiler version, CUTLASS
version and arch. Writes go to a temporary file then ``os.replace`` (the JSON last, as the
commit marker), and an ``flock`` per key makes concurrent compiles of the same key from
several processes wait for one nvcc run instead of repeating it. Successful builds and
deterministic compile errors are cached; timeouts and builds a limit stopped (memory, disk)
are not (``metrics["resource_failure"]``), and a cached failure written under older
verdict rules (:data:`~evaluators.compile.cache.VERDICT_RULES`) is rebuilt.

Our failures are raised, never returned as the candidate's verdict (and never cached):
settings out of range (:func:`check_settings`: ``memory_mb`` 0 or 256..1048576 MB,
``timeout_s`` in (0, 86400]), a temp directory without room (:data:`~evaluators.compile.infrastructure.DISK_MIN_FREE_MB`,
checked before and after a failed build), the limit wrapper failing to set its limits or
to start nvcc (its own tagged line and exit code), and a failure that a limit or the
toolchain could have caused (out of memory, killed, a loader error, no output) when a
trivial canary kernel fails to build under the same limits too
(:class:`CompileInfrastructureError`, :class:`NvccNotFound`).

Layout:

=====================  ======================================================================
``stage.py``           :func:`compile_candidate`, :func:`compile_to_file`, :class:`CompileStage`,
                       the ``[compile]`` settings check
``toolchain.py``       nvcc, the host compiler, CUTLASS, the ABI header: where, which version
``nvcc.py``            one nvcc run: its argv, the limit wrapper, process group and timeout
``landlock.py``        what nvcc may read and write; diagnostics from other files withheld
``cache.py``           the build cache: the key, atomic writes, the per-key lock
``diagnostics.py``     what the log says: ptxas resources and advisories, errors, trimming
``infrastructure.py``  whose failure a failed build is: ours (raised) or the candidate's
=====================  ======================================================================
"""

from __future__ import annotations

from evaluators.compile.cache import cache_key
from evaluators.compile.diagnostics import KernelResources, PtxasReport, extract_errors, parse_ptxas, trim_log
from evaluators.compile.infrastructure import CompileInfrastructureError
from evaluators.compile.landlock import nvcc_landlock, nvcc_readable, withhold_foreign
from evaluators.compile.nvcc import build_command, build_flags, gencode_flags
from evaluators.compile.stage import (
    CompileOutcome,
    CompileSettingsError,
    CompileStage,
    check_settings,
    compile_candidate,
    compile_to_file,
)
from evaluators.compile.toolchain import (
    CutlassNotFound,
    NvccNotFound,
    abi_include_dir,
    cutlass_include_dir,
    cutlass_version,
    find_nvcc,
    nvcc_version,
)

__all__ = [
    "CompileInfrastructureError",
    "CompileOutcome",
    "CompileSettingsError",
    "CompileStage",
    "CutlassNotFound",
    "NvccNotFound",
    "KernelResources",
    "PtxasReport",
    "abi_include_dir",
    "build_command",
    "build_flags",
    "cache_key",
    "check_settings",
    "compile_candidate",
    "compile_to_file",
    "cutlass_include_dir",
    "cutlass_version",
    "extract_errors",
    "find_nvcc",
    "gencode_flags",
    "nvcc_landlock",
    "nvcc_readable",
    "nvcc_version",
    "parse_ptxas",
    "trim_log",
    "withhold_foreign",
]
