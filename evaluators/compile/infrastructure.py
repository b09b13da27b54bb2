"""Whose failure a failed build is: the candidate's (data, cached) or ours (raised, never
cached, never charged to the candidate).

Ours: a temp directory without room (:func:`_check_disk`, before and after a failed build),
the limit wrapper failing to set its limits or to start nvcc, and a failure that a limit or
the toolchain could have caused (out of memory, killed, a loader error, no output) when a
trivial canary kernel fails to build under the same limits too (:func:`_raise_if_ours`).
"""

from __future__ import annotations

import errno
import os
import tempfile

from evaluators.base import CompileSettings, InfrastructureError
from evaluators.compile.diagnostics import _sanitize
from evaluators.compile.landlock import nvcc_landlock
from evaluators.compile.nvcc import (
    _OUTPUT_NAME,
    _SOURCE_NAME,
    _WRAPPER_EXEC_EXIT,
    _WRAPPER_SETUP_EXIT,
    _WRAPPER_TAG,
    _Run,
    _run_limited,
    build_command,
    build_flags,
)
from evaluators.compile.toolchain import NvccNotFound


#: Below this much free space in the temp directory a build is not attempted (and a failed
#: build is our failure, not the candidate's).
DISK_MIN_FREE_MB = 64


class CompileInfrastructureError(InfrastructureError):
    """The build failed for a reason that is ours, not the candidate's: the temp directory's
    disk is full, ``compile.memory_mb`` is too small for nvcc to build even a trivial kernel,
    the limit wrapper could not set its limits or start nvcc. Never cached, never charged to
    the candidate: the run stops with the message and ``fix``."""


_OOM_MARKERS = ("out of memory", "bad_alloc", "cannot allocate memory", "memory exhausted",
                "virtual memory exhausted", "insufficient memory", "memoryerror", "died due to signal",
                "failed to map segment")
_DISK_MARKERS = ("no space left on device", "disk quota exceeded", "file too large")


def _check_disk(directory: str, min_free_mb: int | None = None) -> None:
    """Raise :class:`CompileInfrastructureError` when ``directory``'s file system has less
    than ``min_free_mb`` free (or cannot take a file of that size): nvcc's temporary files
    go there, and a build that fails for lack of space says nothing about the candidate."""
    min_free_mb = DISK_MIN_FREE_MB if min_free_mb is None else min_free_mb
    need = min_free_mb * 1024 * 1024
    try:
        st = os.statvfs(directory)
        free = st.f_bavail * st.f_frsize
    except OSError as exc:
        raise CompileInfrastructureError(
            f"the compile temp directory {directory} is not usable: {exc}",
            fix="point TMPDIR at a writable directory") from exc
    ok = free >= need
    if ok:
        # free blocks are not always this user's (quotas): reserve a little for real
        try:
            with tempfile.TemporaryFile(dir=directory) as f:
                os.posix_fallocate(f.fileno(), 0, min(need, 1 << 20))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                ok = False
            # EOPNOTSUPP / EINVAL: a file system without fallocate; statvfs has to do
    if not ok:
        raise CompileInfrastructureError(
            f"the compile temp directory {directory} has {free / 2**20:.0f} MB free, less than the "
            f"{min_free_mb} MB nvcc needs: a build there fails whatever the candidate",
            fix="free space there, or point TMPDIR at a disk with room")


#: A kernel any working toolchain builds under any sane limit (the canary of _raise_if_ours).
_CANARY_SOURCE = (
    "// evo canary: a build that fails on this says the toolchain or its limits are broken\n"
    '#include "evo_abi.h"\n'
    "__global__ void evo_canary_kernel(float* p) { if (p) p[threadIdx.x] = 0.f; }\n"
    "EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,\n"
    "                          const double* scalars, int n_scalars, cudaStream_t stream) {\n"
    "  evo_canary_kernel<<<1, 32, 0, stream>>>(nullptr);\n"
    "  return 0;\n"
    "}\n"
)
#: (nvcc, flags, memory_mb) whose canary built in this process: asked once.
_canary_ok: set[tuple[str, tuple[str, ...], int]] = set()


def _canary_failure(settings: CompileSettings, nvcc: str) -> str | None:
    """Build the canary under ``settings``'s limits; None when it builds, else why not."""
    key = (nvcc, tuple(build_flags(settings)), int(settings.memory_mb))
    if key in _canary_ok:
        return None
    with tempfile.TemporaryDirectory(prefix="evo-nvcc-canary-") as work:
        with open(os.path.join(work, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(_CANARY_SOURCE)
        cmd = build_command(nvcc, _SOURCE_NAME, _OUTPUT_NAME, settings)
        run = _run_limited(cmd, work, min(float(settings.timeout_s), 300.0), settings.memory_mb,
                           nvcc_landlock(nvcc, settings, work))
        built = run.returncode == 0 and os.path.isfile(os.path.join(work, _OUTPUT_NAME))
        log = _sanitize(run.log, work)
    if built:
        _canary_ok.add(key)
        return None
    if run.returncode is None:
        return f"it timed out after {min(float(settings.timeout_s), 300.0):g} s"
    first = next((ln.strip() for ln in log.splitlines() if ln.strip()), "no output")
    return f"exit {run.returncode}: {first[:300]}"


def _raise_if_ours(run: _Run, log: str, settings: CompileSettings, nvcc: str) -> None:
    """Raise :class:`CompileInfrastructureError` when a failed build is our failure.

    In order: the limit wrapper's own failure (its tagged line and exit code: no candidate
    output can produce both); a temp disk without room now; then, for a failure that a limit
    or the toolchain could have caused (out of memory, killed, the loader failing, no output
    at all), a trivial kernel built under the same limits: if that fails too, the limits or
    the toolchain are broken (e.g. ``compile.memory_mb`` below what nvcc needs to start) and
    no candidate could have built. Otherwise the failure is the candidate's.
    """
    rc = run.returncode
    first = log.lstrip().splitlines()[0] if log.strip() else ""
    if rc in (_WRAPPER_SETUP_EXIT, _WRAPPER_EXEC_EXIT) and first.startswith(_WRAPPER_TAG):
        what = first[len(_WRAPPER_TAG):].strip()
        if rc == _WRAPPER_EXEC_EXIT:
            raise NvccNotFound(f"the compile limit wrapper could not run nvcc: {what}",
                               fix="check compile.nvcc / CUDA_HOME (is nvcc still installed?)")
        raise CompileInfrastructureError(f"the compile limit wrapper failed before nvcc ran: {what}",
                                         fix=f"check compile.memory_mb (now {settings.memory_mb})")
    _check_disk(tempfile.gettempdir())
    low = log.lower()
    suspect = (any(mk in low for mk in _OOM_MARKERS) or rc is None or rc < 0 or rc in (127, 134, 137, 139)
               or "error while loading shared libraries" in low or not log.strip())
    if not suspect:
        return
    why = _canary_failure(settings, nvcc)
    if why is not None:
        raise CompileInfrastructureError(
            f"nvcc cannot build even a trivial kernel under compile.memory_mb = {settings.memory_mb} MB "
            f"({why}): the failure of this candidate's build is not its own",
            fix="raise compile.memory_mb (nvcc with CuTe needs several GB of address space) or check the "
                "CUDA toolkit with `nvcc --version`")
