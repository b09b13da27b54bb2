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
verdict rules (:data:`VERDICT_RULES`) is rebuilt.

Our failures are raised, never returned as the candidate's verdict (and never cached):
settings out of range (:func:`check_settings`: ``memory_mb`` 0 or 256..1048576 MB,
``timeout_s`` in (0, 86400]), a temp directory without room (:data:`DISK_MIN_FREE_MB`,
checked before and after a failed build), the limit wrapper failing to set its limits or
to start nvcc (its own tagged line and exit code), and a failure that a limit or the
toolchain could have caused (out of memory, killed, a loader error, no output) when a
trivial canary kernel fails to build under the same limits too
(:class:`CompileInfrastructureError`, :class:`NvccNotFound`).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from evaluators.base import CompileSettings, InfrastructureError
from evo.records import Candidate, Status, StageResult, canonical_params

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
    "nvcc_version",
    "parse_ptxas",
    "trim_log",
]

logger = logging.getLogger(__name__)

#: Bumped when the cache layout or the meaning of cached results changes.
CACHE_SCHEMA = 1
#: Version of the rules that decide which failures are the candidate's (and so cacheable).
#: A cached non-ok entry written under older rules is ignored and rebuilt: before version 2 a
#: full disk or a too-small memory limit could be cached as a candidate's compile error.
VERDICT_RULES = 2
#: ``compile.memory_mb``: 0 (no limit) or within this range (MB). Below ~256 MB nvcc cannot
#: start at all; far above it the byte count overflows the limit wrapper's C long.
MEMORY_MB_RANGE = (256, 1 << 20)
#: ``compile.timeout_s`` upper bound (s).
TIMEOUT_S_MAX = 24 * 3600.0
#: Below this much free space in the temp directory a build is not attempted (and a failed
#: build is our failure, not the candidate's).
DISK_MIN_FREE_MB = 64
#: Environment variables nvcc or the host compiler read that change what gets built: part of
#: the cache key when set (they reach nvcc through the scrubbed environment).
BUILD_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
             "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")
ERRORS_MAX_LINES = 40
ERRORS_MAX_BYTES = 4 * 1024
LOG_MAX_BYTES = 16 * 1024
_LOG_READ_MAX = 4 * 1024 * 1024  # never read more of a runaway log than this
_SOURCE_NAME = "candidate.cu"
_OUTPUT_NAME = "candidate.so"


class NvccNotFound(InfrastructureError):
    """nvcc could not be located or run. The message lists where we looked and the fix."""


class CutlassNotFound(InfrastructureError):
    """The nvidia-cutlass wheel (CuTe/CUTLASS headers) is not installed or is incomplete."""


class CompileInfrastructureError(InfrastructureError):
    """The build failed for a reason that is ours, not the candidate's: the temp directory's
    disk is full, ``compile.memory_mb`` is too small for nvcc to build even a trivial kernel,
    the limit wrapper could not set its limits or start nvcc. Never cached, never charged to
    the candidate: the run stops with the message and ``fix``."""


class CompileSettingsError(InfrastructureError, ValueError):
    """A ``[compile]`` setting is out of its allowed range (the message names field, value
    and range)."""


# ---------------------------------------------------------------------------------------------
# Toolchain discovery


@functools.lru_cache(maxsize=None)
def cutlass_include_dir() -> Path:
    """The CuTe/CUTLASS header directory shipped by the ``nvidia-cutlass`` wheel.

    The wheel installs a ``cutlass_library`` package whose ``source/include`` holds ``cute/``
    and ``cutlass/``. Raises :class:`CutlassNotFound` naming ``pip install nvidia-cutlass``.
    """
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):  # ValueError: a broken or blocked sys.modules entry
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise CutlassNotFound(
            "the CuTe/CUTLASS headers were not found: the `cutlass_library` package is missing. "
            "Install them with `pip install nvidia-cutlass`."
        )
    for loc in spec.submodule_search_locations:
        inc = Path(loc) / "source" / "include"
        if (inc / "cute" / "tensor.hpp").is_file() and (inc / "cutlass" / "cutlass.h").is_file():
            return inc
    raise CutlassNotFound(
        f"`cutlass_library` is installed at {list(spec.submodule_search_locations)} but has no "
        "source/include/cute/tensor.hpp; reinstall with `pip install --force-reinstall nvidia-cutlass`."
    )


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """CUTLASS version of the headers actually used (``cutlass/version.h``), e.g. ``"4.2.0"``."""
    header = cutlass_include_dir() / "cutlass" / "version.h"
    try:
        text = header.read_text(errors="replace")
        parts = [re.search(rf"#define\s+CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)  # type: ignore[union-attr]
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-cutlass")
    except PackageNotFoundError as exc:  # pragma: no cover - headers without the wheel metadata
        raise CutlassNotFound("cannot determine the CUTLASS version; `pip install nvidia-cutlass`") from exc


def abi_include_dir() -> Path:
    """Directory holding ``evo_abi.h``: ``evaluators/child/``, beside its Python loader
    (:mod:`evaluators.child.abi`; package data of ``evaluators.child``)."""
    path = Path(__file__).resolve().parent / "child"
    if not (path / "evo_abi.h").is_file():
        raise FileNotFoundError(f"evo_abi.h is missing from {path}; the cute-evo install is broken")
    return path


def _is_exe(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nvcc(settings: CompileSettings | None = None) -> str:
    """Locate nvcc: ``settings.nvcc`` if set to anything but the default ``"nvcc"``, then
    ``$CUDA_HOME/bin/nvcc``, ``/usr/local/cuda/bin/nvcc``, then ``nvcc`` on ``PATH``.

    An explicitly configured ``compile.nvcc`` that does not exist is an error (never silently
    replaced by another toolkit). Raises :class:`NvccNotFound` listing what was tried.
    """
    requested = settings.nvcc if settings is not None else "nvcc"
    if requested and requested != "nvcc":
        found = requested if os.sep in requested else shutil.which(requested)
        if found and _is_exe(found):
            return str(found)
        raise NvccNotFound(
            f"compile.nvcc = {requested!r} is not an executable file; fix the setting or remove it "
            "to search $CUDA_HOME, /usr/local/cuda and PATH"
        )
    tried = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root:
            cand = os.path.join(root, "bin", "nvcc")
            tried.append(cand)
            if _is_exe(cand):
                return cand
    cand = "/usr/local/cuda/bin/nvcc"
    tried.append(cand)
    if _is_exe(cand):
        return cand
    found = shutil.which("nvcc")
    tried.append("nvcc on PATH")
    if found:
        return found
    raise NvccNotFound(
        f"nvcc not found (tried {', '.join(tried)}). Install the CUDA toolkit (12.x or newer), set "
        "CUDA_HOME, or set compile.nvcc to its path."
    )


@functools.lru_cache(maxsize=32)
def _tool_version(path: str, mtime_ns: int, args: tuple[str, ...]) -> str:
    del mtime_ns  # part of the cache key only: a replaced binary is asked again
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvccNotFound(f"could not run `{path} {' '.join(args)}`: {exc}") from exc
    return (out.stdout + out.stderr).strip()


def nvcc_version(nvcc: str) -> str:
    """nvcc's full version, e.g. ``"13.0.88"`` (from ``nvcc --version``)."""
    try:
        mtime = os.stat(nvcc).st_mtime_ns
    except OSError as exc:
        raise NvccNotFound(f"nvcc {nvcc!r} does not exist") from exc
    text = _tool_version(nvcc, mtime, ("--version",))
    m = re.search(r"release\s+[\d.]+,\s*V([\w.\-]+)", text)
    if not m:
        raise NvccNotFound(f"`{nvcc} --version` printed no release line; is it really nvcc?\n{text[:400]}")
    return m.group(1)


def _host_compiler_version(settings: CompileSettings) -> str:
    """Version of the host C++ compiler nvcc will call (part of the cache key)."""
    flags = list(settings.extra_flags)
    cc = "g++"
    for i, f in enumerate(flags):
        if f in ("-ccbin", "--compiler-bindir") and i + 1 < len(flags):
            cc = flags[i + 1]
        elif f.startswith(("-ccbin=", "--compiler-bindir=")):
            cc = f.split("=", 1)[1]
    path = cc if os.sep in cc else shutil.which(cc)
    if not path or not os.path.exists(path):
        return f"{cc}:unknown"
    if os.path.isdir(path):
        path = os.path.join(path, "g++")
        if not os.path.exists(path):
            return f"{cc}:unknown"
    try:
        text = _tool_version(path, os.stat(path).st_mtime_ns, ("--version",))
    except NvccNotFound:
        return f"{cc}:unknown"
    return text.splitlines()[0] if text else f"{cc}:unknown"


# ---------------------------------------------------------------------------------------------
# Flags and keys


def gencode_flags(arch: str) -> list[str]:
    """``"sm_90a"`` -> ``["-gencode=arch=compute_90a,code=sm_90a"]`` (also ``sm_100a``, ``sm_80``)."""
    m = re.fullmatch(r"sm_(\d{2,3}[a-z]?)", arch.strip())
    if not m:
        raise ValueError(f"compile.arch = {arch!r} is not an SM architecture like 'sm_90a' or 'sm_100a'")
    v = m.group(1)
    return [f"-gencode=arch=compute_{v},code=sm_{v}"]


def build_flags(settings: CompileSettings) -> list[str]:
    """The path-free nvcc flags (they are part of the cache key)."""
    return [
        "-std=c++17",
        "-O3",
        *gencode_flags(settings.arch),
        "--expt-relaxed-constexpr",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Xptxas",
        "-v",
        "-lineinfo",
        *settings.extra_flags,
    ]


def _define_flags(params: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"-D{k}={v}" for k, v in params]


def _bad_param(params: tuple[tuple[str, str], ...]) -> str | None:
    """Tunable values become -D flags: re-check them here (the engine runs policy on the
    source alone and dedupes by source), with the policy's ``param-syntax`` rule."""
    from evaluators.policy import param_violations

    bad = param_violations(params)
    return f"policy rule param-syntax: {bad[0].message}" if bad else None


def build_command(
    nvcc: str, source_path: str, out_path: str, settings: CompileSettings,
    params: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """The full nvcc argv for one build."""
    return [
        nvcc,
        *build_flags(settings),
        f"-I{abi_include_dir()}",
        f"-I{cutlass_include_dir()}",
        *_define_flags(params),
        source_path,
        "-o",
        out_path,
    ]


def _abi_header_sha() -> str:
    return hashlib.sha256((abi_include_dir() / "evo_abi.h").read_bytes()).hexdigest()


def _reads_key() -> dict[str, Any]:
    """What nvcc may read, when it differs from the default (Landlock reads on, no extra
    paths): whether an #include outside the include path builds depends on it."""
    from evaluators.sandbox import SandboxSettings, _landlock_abi

    s = SandboxSettings.from_env()
    restricted = s.enabled and s.landlock and s.landlock_reads and _landlock_abi() > 0
    if restricted and not s.extra_readable:
        return {}
    return {"restricted": restricted, "extra": list(s.extra_readable)}


def _build_env() -> dict[str, str]:
    return {k: os.environ[k] for k in BUILD_ENV if os.environ.get(k)}


def check_settings(settings: CompileSettings) -> None:
    """Raise :class:`CompileSettingsError` naming every numeric setting out of range
    (``memory_mb``, ``timeout_s``) and any flag that is not a plain string."""
    problems = []
    m = settings.memory_mb
    lo, hi = MEMORY_MB_RANGE
    if isinstance(m, bool) or not isinstance(m, int) or not (m == 0 or lo <= m <= hi):
        problems.append(f"compile.memory_mb = {m!r}: allowed 0 (no limit) or an integer from {lo} to {hi} (MB)")
    t = settings.timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 < t <= TIMEOUT_S_MAX):
        problems.append(f"compile.timeout_s = {t!r}: allowed a number of seconds > 0 and <= {TIMEOUT_S_MAX:g}")
    bad_flags = [f for f in settings.extra_flags if not isinstance(f, str) or "\0" in f or "\n" in f]
    if bad_flags:
        problems.append(f"compile.extra_flags: {bad_flags!r} are not single-line strings")
    if problems:
        raise CompileSettingsError("; ".join(problems), fix="fix the [compile] section of the config")


def cache_key(
    source: str, params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None, settings: CompileSettings,
    nvcc_ver: str, cutlass_ver: str, host_cc: str = "",
) -> str:
    """sha256 over everything that determines the .so: source, canonical params, flags, the
    ABI header, nvcc / host compiler / CUTLASS versions, arch, the :data:`BUILD_ENV`
    variables that are set, and nvcc's read restriction when it is not the default. Not ``memory_mb`` or ``timeout_s``: they do not change a build
    that succeeds, and a build they stop is never cached."""
    pairs = params if isinstance(params, tuple) else canonical_params(params)
    blob = json.dumps(
        {
            "schema": CACHE_SCHEMA,
            "source": source,
            "params": [list(p) for p in pairs],
            "flags": build_flags(settings),
            "abi": _abi_header_sha(),
            "nvcc": nvcc_ver,
            "host_cc": host_cc,
            "cutlass": cutlass_ver,
            "arch": settings.arch,
            # only when set, so keys of the common case did not change when this was added
            **({"env": env} if (env := _build_env()) else {}),
            **({"reads": reads} if (reads := _reads_key()) else {}),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# ptxas report and error text


@dataclass(frozen=True)
class KernelResources:
    """ptxas resource usage of one entry function (kernel)."""

    name: str
    registers: int = 0
    barriers: int = 0
    smem_bytes: int = 0
    cmem_bytes: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    def as_dict(self) -> dict[str, int]:
        d = dataclasses.asdict(self)
        d.pop("name")
        return d


@dataclass(frozen=True)
class PtxasReport:
    """What ``-Xptxas -v`` said: per-kernel resources and performance advisories.

    ``wgmma_serialized``: ``(function, cause)`` for every "wgmma.mma_async instructions are
    serialized due to <cause>" advisory, a strong signal that a Hopper GEMM lost its tensor
    core pipelining. ``advisories``: every ``(Cxxxx)`` advisory line, verbatim.
    """

    kernels: tuple[KernelResources, ...] = ()
    wgmma_serialized: tuple[tuple[str, str], ...] = ()
    advisories: tuple[str, ...] = ()

    def metrics(self) -> dict[str, Any]:
        ks = self.kernels
        return {
            "kernels": {k.name: k.as_dict() for k in ks},
            "registers": max((k.registers for k in ks), default=0),
            "smem_bytes": max((k.smem_bytes for k in ks), default=0),
            "stack_frame": max((k.stack_frame for k in ks), default=0),
            "spill_stores": sum(k.spill_stores for k in ks),
            "spill_loads": sum(k.spill_loads for k in ks),
            "wgmma_serialized": bool(self.wgmma_serialized),
        }


_RE_ENTRY = re.compile(r"ptxas\s+info\s*:\s*Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"ptxas\s+info\s*:\s*Function properties for (\S+)")
_RE_FRAME = re.compile(
    r"(\d+) bytes stack frame,\s*(\d+) bytes spill stores,\s*(\d+) bytes spill loads"
)
_RE_USED = re.compile(r"ptxas\s+info\s*:\s*Used (\d+) registers(.*)")
_RE_WGMMA = re.compile(
    r"wgmma\.mma_async instructions are serialized(?: due to (.*?))?(?: in the function '([^']+)')?\s*\.?\s*$"
)
_RE_ADVISORY = re.compile(r"ptxas\s+(?:info|warning)\s*:\s*\(C\d+\).*")


def parse_ptxas(log: str) -> PtxasReport:
    """Parse the ``ptxas info`` lines of an nvcc ``-Xptxas -v`` log.

    Resource lines ("Used N registers, used M barriers, S bytes smem, C bytes cmem[0]") follow
    "Compiling entry function 'X'"; the stack/spill line follows "Function properties for X".
    Non-entry (device) functions' properties are ignored. Unknown lines are skipped, so the
    parser tolerates format drift between CUDA versions (missing fields read as 0).
    """
    kernels: dict[str, dict[str, int]] = {}
    order: list[str] = []
    current: str | None = None
    props_for: str | None = None
    wgmma: list[tuple[str, str]] = []
    advisories: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()
        m = _RE_ENTRY.search(line)
        if m:
            current = m.group(1)
            if current not in kernels:
                kernels[current] = {}
                order.append(current)
            props_for = None
            continue
        m = _RE_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _RE_FRAME.search(line)
        if m and props_for is not None:
            if props_for in kernels:
                kernels[props_for].update(
                    stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
                )
            props_for = None
            continue
        m = _RE_USED.search(line)
        if m and current is not None:
            rest = m.group(2)
            k = kernels[current]
            k["registers"] = int(m.group(1))
            for key, pat in (("barriers", r"(\d+) barriers"), ("smem_bytes", r"(\d+) bytes smem")):
                mm = re.search(pat, rest)
                if mm:
                    k[key] = int(mm.group(1))
            k["cmem_bytes"] = sum(int(x) for x in re.findall(r"(\d+) bytes cmem\[\d+\]", rest))
            continue
        if _RE_ADVISORY.search(line) or "Potential Performance Loss" in line:
            advisories.append(line)
        m = _RE_WGMMA.search(line)
        if m:
            wgmma.append(((m.group(2) or "").strip(), (m.group(1) or "").strip()))
    return PtxasReport(
        kernels=tuple(KernelResources(name=n, **kernels[n]) for n in order),
        wgmma_serialized=tuple(wgmma),
        advisories=tuple(advisories),
    )


_DIAG_START = re.compile(r"^(?:\S.*?(?:\(\d+\)|:\d+:\d+):\s|ptxas|nvcc|nvlink|/usr/bin/ld|collect2|\S+\.(?:cu|h|hpp|cuh)\b)")


def extract_errors(log: str, max_lines: int = ERRORS_MAX_LINES, max_bytes: int = ERRORS_MAX_BYTES) -> str:
    """The part of a compile log worth showing a repair prompt.

    Keeps the first ``max_lines`` lines that contain "error" (case-insensitive), each with
    the context lines nvcc prints under it (the offending source line and caret, "detected
    during instantiation ..." notes), up to the next diagnostic; trimmed to ``max_bytes``.
    """
    lines = log.splitlines()
    out: list[str] = []
    n_err = 0
    i = 0
    while i < len(lines) and n_err < max_lines:
        line = lines[i]
        if "error" in line.lower():
            n_err += 1
            out.append(line.rstrip())
            j = i + 1
            ctx = 0
            while j < len(lines) and ctx < 8:
                nxt = lines[j]
                if not nxt.strip() or (_DIAG_START.match(nxt) and not nxt.startswith((" ", "\t"))):
                    break
                out.append(nxt.rstrip())
                ctx += 1
                j += 1
            i = j
        else:
            i += 1
    text = "\n".join(out)
    if not text:  # e.g. killed by a signal without a message: fall back to the log's tail
        text = "\n".join(lines[-20:])
    if len(text.encode()) > max_bytes:
        text = text.encode()[: max_bytes - 20].decode("utf-8", "ignore").rstrip() + "\n... [truncated]"
    return text


def trim_log(log: str, max_bytes: int = LOG_MAX_BYTES) -> str:
    """Head and tail of a log within ``max_bytes`` (errors come first, summaries last)."""
    raw = log.encode()
    if len(raw) <= max_bytes:
        return log
    head = raw[: max_bytes * 3 // 4].decode("utf-8", "ignore")
    tail = raw[-(max_bytes // 4 - 64) :].decode("utf-8", "ignore")
    return f"{head}\n... [{len(raw) - len(head.encode()) - len(tail.encode())} bytes omitted] ...\n{tail}"


def _sanitize(log: str, workdir: str) -> str:
    """Replace the private temp dir and the CUTLASS path so logs are stable and short."""
    log = log.replace(workdir + os.sep, "").replace(workdir, ".")
    try:
        log = log.replace(str(cutlass_include_dir()), "<cutlass>")
    except CutlassNotFound:  # pragma: no cover
        pass
    return log


# ---------------------------------------------------------------------------------------------
# Running nvcc

#: First words of every line the limit wrapper itself prints (its own failures, before nvcc).
_WRAPPER_TAG = "evo-compile-wrapper:"
#: Exit codes of the limit wrapper's own failures: it could not set its limits / start nvcc.
_WRAPPER_SETUP_EXIT, _WRAPPER_EXEC_EXIT = 71, 72

# ``python -I -S -c _LIMIT_WRAPPER CONFIG_JSON cmd...``: limits, then exec cmd. Its own
# failures are tagged and get exit codes of their own, so they are never read as nvcc's.
_LIMIT_WRAPPER = r'''
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
def die(code, what, e):
    sys.stdout.write("%s %s: %s\n" % (cfg["tag"], what, e))
    sys.stdout.flush()
    os._exit(code)
try:
    lim = int(cfg.get("as_bytes", 0))
    if lim > 0:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            lim = min(lim, hard)
        resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
except BaseException as e:
    die(cfg["setup_exit"], "setting the limits failed", repr(e))
if cfg.get("landlock"):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def check(r, what):
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))
        return r
    try:
        landlock_apply(libc, cfg["landlock"], check)
    except BaseException as e:
        die(cfg["setup_exit"], "Landlock failed", repr(e))
try:
    os.execv(sys.argv[2], sys.argv[2:])
except BaseException as e:
    die(cfg["exec_exit"], "cannot start %s" % sys.argv[2], repr(e))
'''

_OOM_MARKERS = ("out of memory", "bad_alloc", "cannot allocate memory", "memory exhausted",
                "virtual memory exhausted", "insufficient memory", "memoryerror", "died due to signal",
                "failed to map segment")
_DISK_MARKERS = ("no space left on device", "disk quota exceeded", "file too large")


@dataclass(frozen=True)
class _Run:
    returncode: int | None  # None: timed out
    log: str
    seconds: float


def _run_limited(cmd: list[str], cwd: str, timeout_s: float, memory_mb: int,
                 landlock: dict[str, Any] | None = None) -> _Run:
    """Run ``cmd`` in its own process group under an address-space limit (and, given
    ``landlock``, :data:`evaluators.sandbox.LANDLOCK_CODE`'s file rules); kill the group on
    timeout."""
    log_path = os.path.join(cwd, "nvcc.log")
    from evaluators.sandbox import LANDLOCK_CODE, scrub_env

    # nvcc reads machine-written source: it gets no secrets (the LLM key stays in the driver).
    env = dict(scrub_env(os.environ), TMPDIR=cwd, TMP=cwd, TEMP=cwd)
    cfg = {"as_bytes": max(0, int(memory_mb)) * 1024 * 1024, "tag": _WRAPPER_TAG,
           "setup_exit": _WRAPPER_SETUP_EXIT, "exec_exit": _WRAPPER_EXEC_EXIT, "landlock": landlock}
    argv = [sys.executable, "-I", "-S", "-c", LANDLOCK_CODE + _LIMIT_WRAPPER, json.dumps(cfg), *cmd]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log_f:
        proc = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_f, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )
        rc: int | None
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None or rc is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            else:
                # nvcc is done; make sure no straggler of its group keeps running
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    seconds = time.perf_counter() - t0
    with open(log_path, "rb") as f:
        data = f.read(_LOG_READ_MAX)
    return _Run(rc, data.decode("utf-8", "replace"), seconds)


# ---------------------------------------------------------------------------------------------
# What nvcc may read and write


def _host_compiler(settings: CompileSettings) -> str:
    flags = list(settings.extra_flags)
    cc = "g++"
    for i, f in enumerate(flags):
        if f in ("-ccbin", "--compiler-bindir") and i + 1 < len(flags):
            cc = flags[i + 1]
        elif f.startswith(("-ccbin=", "--compiler-bindir=")):
            cc = f.split("=", 1)[1]
    if os.path.isdir(cc):
        cc = os.path.join(cc, "g++")
    return cc


@functools.lru_cache(maxsize=8)
def _toolchain_dirs(nvcc: str, host_cc: str) -> tuple[str, ...]:
    """Directories the toolchain reads: the CUDA toolkit of ``nvcc`` (``<root>/bin/nvcc``:
    the whole root), the host compiler's programs, libraries and system include directories
    (asked from the compiler: ``-print-search-dirs`` and ``-E -v``), the programs nvcc and
    gcc start (sh, as, ld), and the dynamic loader's library directories."""
    out: list[str] = []
    real = Path(os.path.realpath(nvcc))
    root = real.parent.parent if real.parent.name == "bin" and (real.parent.parent / "include").is_dir() else real.parent
    out.append(str(root))
    for prog in (host_cc, "g++", "gcc", "cc", "c++", "sh", "as", "ld"):
        found = prog if os.sep in prog else shutil.which(prog)
        if found and os.path.exists(found):
            out += [os.path.dirname(found), os.path.dirname(os.path.realpath(found))]
    cc = host_cc if os.sep in host_cc else shutil.which(host_cc)
    if cc:
        try:
            dirs = subprocess.run([cc, "-print-search-dirs"], capture_output=True, text=True, timeout=60).stdout
            for line in dirs.splitlines():
                key, _, val = line.partition(": ")
                if key in ("install", "programs", "libraries"):
                    out += [p for p in val.lstrip("=").split(os.pathsep) if p.startswith("/")]
            inc = subprocess.run([cc, "-xc++", "-E", "-v", "/dev/null"], capture_output=True, text=True,
                                 timeout=60, stdin=subprocess.DEVNULL).stderr
            inside = False
            for line in inc.splitlines():
                if line.startswith("#include <...> search starts here"):
                    inside = True
                elif line.startswith("End of search list"):
                    inside = False
                elif inside and line.strip().startswith("/"):
                    out.append(line.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    from evaluators.sandbox import _ld_conf_dirs

    out += ["/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local/lib"]
    out += _ld_conf_dirs()
    existing = []
    for p in out:
        try:
            rp = os.path.realpath(os.path.normpath(p))
        except OSError:
            continue
        if os.path.exists(rp) and rp not in existing:
            existing.append(rp)
    return tuple(existing)


#: Files nvcc, cicc, ptxas and gcc read outside the directories above (seen with strace on
#: nvcc 13.0 / gcc 12): the loader cache, the time zone, random bytes, the overcommit mode.
_TOOLCHAIN_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/null", "/dev/zero", "/dev/urandom",
                    "/dev/random", "/proc/self", "/proc/sys/vm/overcommit_memory", "/proc/cpuinfo",
                    "/proc/meminfo", "/sys/devices/system/cpu")


def nvcc_landlock(nvcc: str, settings: CompileSettings, workdir: str) -> dict[str, Any] | None:
    """The Landlock rules nvcc runs under, or None where Landlock is off or missing.

    Reads only beneath the include path (the ABI header's and CUTLASS's directories, the
    host compiler's system include directories), the toolchain (:func:`_toolchain_dirs`,
    :data:`_TOOLCHAIN_FILES`), ``$LD_LIBRARY_PATH`` and the private work directory, so
    ``#include "/etc/passwd"`` (or the lineage DB, a key file) fails to open and its content
    cannot reach the compile log, the DB or a repair prompt. Writes only in the work
    directory (and /dev/null). Extra paths: ``EVO_SANDBOX_READABLE`` / ``EVO_SANDBOX_WRITABLE``;
    off with ``EVO_SANDBOX_READS=0`` (reads) / ``EVO_SANDBOX_LANDLOCK_FS=0`` (writes) /
    ``EVO_SANDBOX_LANDLOCK=0`` (both).
    """
    from evaluators.sandbox import SandboxSettings, _landlock_abi

    s = SandboxSettings.from_env()
    if not (s.enabled and s.landlock) or not (s.landlock_reads or s.landlock_fs):
        return None
    if _landlock_abi() < 1:
        _warn_no_landlock()
        return None
    return {"fs_read": bool(s.landlock_reads), "fs_write": bool(s.landlock_fs), "read": nvcc_readable(nvcc, settings),
            "list": [], "write": [workdir, "/dev/null", *s.extra_writable]}


def nvcc_readable(nvcc: str, settings: CompileSettings) -> list[str]:
    """What nvcc may read besides its work directory (see :func:`nvcc_landlock`)."""
    from evaluators.sandbox import SandboxSettings

    return [str(abi_include_dir()), str(cutlass_include_dir()), *_toolchain_dirs(nvcc, _host_compiler(settings)),
            *_TOOLCHAIN_FILES, *[p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p.startswith("/")],
            *SandboxSettings.from_env().extra_readable]


_DIAG_PATH = re.compile(r"^(/[^\s:(]+)(?:\(\d+\)|:\d+)")


def withhold_foreign(log: str, readable: list[str]) -> str:
    """``log`` with every diagnostic located in a file outside ``readable`` (the include path
    and the toolchain) replaced by one line naming the file, and the source lines the
    compiler quoted under it dropped: a second layer behind nvcc's Landlock rules (a kernel
    without Landlock), so that no content of such a file reaches an artifact."""
    roots = [r.rstrip("/") for r in readable if r]
    out: list[str] = []
    skipping = False
    for line in log.splitlines():
        m = _DIAG_PATH.match(line)
        if m:
            path = os.path.normpath(m.group(1))
            skipping = not any(path == r or path.startswith(r + "/") for r in roots)
            if skipping:
                out.append(f"{path}: [diagnostic withheld: the file is outside the include path]")
                continue
        elif skipping and (line.startswith((" ", "\t")) or not line.strip()):
            if not line.strip():
                skipping = False
                out.append(line)
            continue
        else:
            skipping = False
        out.append(line)
    return "\n".join(out) + ("\n" if log.endswith("\n") else "")


@functools.lru_cache(maxsize=1)
def _warn_no_landlock() -> None:
    logger.warning("SANDBOX: Landlock is not available in this kernel: nvcc can read any file this user can "
                   "(an #include of a host file would reach the compile log)")


# ---------------------------------------------------------------------------------------------
# Cache


@contextmanager
def _key_lock(path: Path) -> Iterator[None]:
    """Exclusive per-key lock across processes (flock); a no-op where flock is unavailable."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _cache_paths(cache_dir: str, key: str) -> tuple[Path, Path, Path]:
    shard = Path(cache_dir).expanduser() / "compile" / key[:2]
    return shard / f"{key}.so", shard / f"{key}.json", shard / f"{key}.lock"


def _cache_load(cache_dir: str, key: str) -> tuple[StageResult, bytes | None] | None:
    so_path, json_path, _ = _cache_paths(cache_dir, key)
    try:
        meta = json.loads(json_path.read_text())
        if meta.get("schema") != CACHE_SCHEMA or meta.get("key") != key:
            return None
        status = Status(meta["status"])
        if status is not Status.OK and int(meta.get("verdict_rules", 1)) < VERDICT_RULES:
            return None  # a failure cached under older rules may have been ours: rebuild
        so = None
        if status is Status.OK:
            so = so_path.read_bytes()
            if hashlib.sha256(so).hexdigest() != meta.get("so_sha256"):
                logger.warning("compile cache entry %s is corrupt (sha mismatch); rebuilding", key[:12])
                return None
    except (OSError, ValueError, KeyError):
        return None
    res = StageResult(
        stage="compile", status=status, reason=meta.get("reason", ""), metrics=dict(meta.get("metrics", {})),
        artifacts=dict(meta.get("artifacts", {})), seconds=0.0,
    )
    return res, so


def _cache_store(cache_dir: str, key: str, result: StageResult, so: bytes | None) -> None:
    so_path, json_path, _ = _cache_paths(cache_dir, key)
    so_path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "schema": CACHE_SCHEMA,
        "key": key,
        "status": result.status.value,
        "reason": result.reason,
        "metrics": result.metrics,
        "artifacts": result.artifacts,
        "so_sha256": hashlib.sha256(so).hexdigest() if so is not None else None,
        "verdict_rules": VERDICT_RULES,
        "created": time.time(),
    }
    if so is not None:
        _atomic_write(so_path, so)
    _atomic_write(json_path, json.dumps(meta, sort_keys=True).encode())  # commit marker, last


# ---------------------------------------------------------------------------------------------
# The stage


@dataclass(frozen=True)
class CompileOutcome:
    """Result of one compile: the stage result, the .so bytes (when ok), the cache key, and
    whether it came from the cache without running nvcc."""

    result: StageResult
    so_bytes: bytes | None
    key: str
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.result.passed


def _fail(status: Status, reason: str, key: str, seconds: float, **artifacts: str) -> CompileOutcome:
    return CompileOutcome(StageResult("compile", status, reason, artifacts=dict(artifacts), seconds=seconds),
                          None, key, False)


def compile_candidate(candidate: Candidate, settings: CompileSettings) -> CompileOutcome:
    """Build ``candidate`` into a shared object (see the module docstring for the contract)."""
    t0 = time.perf_counter()
    check_settings(settings)
    params = candidate.params if isinstance(candidate.params, tuple) else canonical_params(candidate.params)
    nvcc = find_nvcc(settings)
    nv_ver = nvcc_version(nvcc)
    cu_ver = cutlass_version()
    host_cc = _host_compiler_version(settings)
    key = cache_key(candidate.source, params, settings, nv_ver, cu_ver, host_cc)
    bad = _bad_param(params)
    if bad:
        return _fail(Status.REJECTED, bad, key, time.perf_counter() - t0)

    hit = _cache_load(settings.cache_dir, key)
    if hit is not None:
        logger.debug("compile cache hit %s for candidate %s", key[:12], candidate.short_id)
        res, so = hit
        return CompileOutcome(dataclasses.replace(res, seconds=time.perf_counter() - t0), so, key, True)

    so_path, json_path, lock_path = _cache_paths(settings.cache_dir, key)
    so_path.parent.mkdir(parents=True, exist_ok=True)
    with _key_lock(lock_path):
        hit = _cache_load(settings.cache_dir, key)  # another process may have built it meanwhile
        if hit is not None:
            logger.debug("compile cache hit %s (built concurrently) for %s", key[:12], candidate.short_id)
            res, so = hit
            return CompileOutcome(dataclasses.replace(res, seconds=time.perf_counter() - t0), so, key, True)
        _check_disk(tempfile.gettempdir())
        outcome = _build(candidate, params, settings, nvcc, key, t0)
        if _cacheable(outcome):
            try:
                _cache_store(settings.cache_dir, key, outcome.result, outcome.so_bytes)
            except OSError as exc:
                logger.warning("could not write compile cache entry %s: %s", key[:12], exc)
        return outcome


def _cacheable(outcome: CompileOutcome) -> bool:
    r = outcome.result
    if r.status is Status.OK:
        return True
    return r.status is Status.COMPILE_ERROR and not r.metrics.get("resource_failure", False)


def _build(candidate: Candidate, params: tuple[tuple[str, str], ...], settings: CompileSettings, nvcc: str,
           key: str, t0: float) -> CompileOutcome:
    with tempfile.TemporaryDirectory(prefix="evo-nvcc-") as work:
        with open(os.path.join(work, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(candidate.source)
        cmd = build_command(nvcc, _SOURCE_NAME, _OUTPUT_NAME, settings, params)
        logger.debug("nvcc for %s in %s: %s", candidate.short_id, work, " ".join(cmd))
        run = _run_limited(cmd, work, settings.timeout_s, settings.memory_mb, nvcc_landlock(nvcc, settings, work))
        log = withhold_foreign(_sanitize(run.log, work), nvcc_readable(nvcc, settings))
        so_file = os.path.join(work, _OUTPUT_NAME)
        so = None
        if run.returncode == 0 and os.path.isfile(so_file):
            with open(so_file, "rb") as f:
                so = f.read()
    seconds = time.perf_counter() - t0
    metrics: dict[str, Any] = {"nvcc_seconds": round(run.seconds, 3)}
    artifacts: dict[str, str] = {"log": trim_log(log)}
    if run.returncode is None:
        return CompileOutcome(StageResult(
            "compile", Status.TIMEOUT, f"nvcc timed out after {settings.timeout_s:g}s (compile.timeout_s)",
            metrics=metrics, artifacts={**artifacts, "errors": extract_errors(log)}, seconds=seconds), None, key)
    if so is None:
        _raise_if_ours(run, log, settings, nvcc)
        low = log.lower()
        out_of_memory = any(mk in low for mk in _OOM_MARKERS)
        out_of_disk = any(mk in low for mk in _DISK_MARKERS)
        killed = run.returncode < 0 or run.returncode in (134, 137, 139)
        errors = extract_errors(log)
        first = next((ln.strip() for ln in errors.splitlines() if "error" in ln.lower()), "")
        limit = f"compile.memory_mb = {settings.memory_mb} MB"
        if out_of_memory:
            reason = f"nvcc ran out of memory under {limit}" + (f": {first[:200]}" if first else "")
        elif out_of_disk:
            reason = ("nvcc ran out of disk space for its temporary files while the disk itself has room: "
                      "the candidate's build output is too large" + (f": {first[:200]}" if first else ""))
        elif killed:
            reason = f"nvcc was killed (exit {run.returncode}); the memory limit ({limit}) is the likely cause"
        elif run.returncode == 0:
            reason = "nvcc exited 0 but produced no shared object"
        else:
            reason = f"nvcc failed (exit {run.returncode}): {first[:300] or 'no error text; see the log'}"
        # a limit stopped it: the verdict depends on the limit, not only on the source: not cached
        metrics["resource_failure"] = bool(out_of_memory or out_of_disk or killed)
        return CompileOutcome(StageResult("compile", Status.COMPILE_ERROR, reason, metrics=metrics,
                                          artifacts={**artifacts, "errors": errors}, seconds=seconds), None, key)
    report = parse_ptxas(log)
    metrics.update(report.metrics())
    metrics["so_size"] = len(so)
    ptxas_lines = "\n".join(ln for ln in log.splitlines() if "ptxas" in ln or "bytes stack frame" in ln)
    artifacts["ptxas"] = trim_log(ptxas_lines, 8 * 1024)
    if report.wgmma_serialized:
        artifacts["wgmma_serialization"] = "\n".join(
            ln for ln in report.advisories if "wgmma.mma_async instructions are serialized" in ln)
    if report.advisories:
        artifacts["ptxas_advisories"] = trim_log("\n".join(report.advisories), 4 * 1024)
    return CompileOutcome(StageResult("compile", Status.OK, "", metrics=metrics, artifacts=artifacts,
                                      seconds=seconds), so, key)


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


def compile_to_file(
    source: str, params: Mapping[str, Any] | None, settings: CompileSettings, out_path: str | os.PathLike[str],
) -> CompileOutcome:
    """Compile a source (e.g. from a script) and, when it builds, write the .so to ``out_path``.

    Returns the outcome either way; nothing is written on failure.
    """
    cand = Candidate.create(task="", source=source, params=params, operator="user")
    outcome = compile_candidate(cand, settings)
    if outcome.ok and outcome.so_bytes is not None:
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(out, outcome.so_bytes)
    return outcome


@dataclass(frozen=True)
class CompileStage:
    """The compile step as an object with ``name`` and ``run(candidate)`` (picklable; its only state
    is the on-disk cache). ``build`` returns the full outcome including the .so bytes."""

    settings: CompileSettings = CompileSettings()
    name: str = "compile"

    def build(self, candidate: Candidate) -> CompileOutcome:
        return compile_candidate(candidate, self.settings)

    def run(self, candidate: Candidate) -> StageResult:
        return self.build(candidate).result
