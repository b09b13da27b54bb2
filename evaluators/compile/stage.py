"""The compile stage's entry points: :func:`compile_candidate` (the contract is in
:mod:`evaluators.compile`), :func:`compile_to_file` for scripts, :class:`CompileStage`, and
the check of the ``[compile]`` settings.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from evaluators.base import CompileSettings, InfrastructureError
from evaluators.compile.cache import _atomic_write, _cache_load, _cache_paths, _cache_store, _key_lock, cache_key
from evaluators.compile.diagnostics import _sanitize, extract_errors, parse_ptxas, trim_log
from evaluators.compile.infrastructure import _DISK_MARKERS, _OOM_MARKERS, _check_disk, _raise_if_ours
from evaluators.compile.landlock import nvcc_landlock, nvcc_readable, withhold_foreign
from evaluators.compile.nvcc import _OUTPUT_NAME, _SOURCE_NAME, _run_limited, build_command
from evaluators.compile.toolchain import _host_compiler_version, cutlass_version, find_nvcc, nvcc_version
from evo.core.records import Candidate, Status, StageResult, canonical_params

logger = logging.getLogger(__name__)


#: ``compile.memory_mb``: 0 (no limit) or within this range (MB). Below ~256 MB nvcc cannot
#: start at all; far above it the byte count overflows the limit wrapper's C long.
MEMORY_MB_RANGE = (256, 1 << 20)
#: ``compile.timeout_s`` upper bound (s).
TIMEOUT_S_MAX = 24 * 3600.0


class CompileSettingsError(InfrastructureError, ValueError):
    """A ``[compile]`` setting is out of its allowed range (the message names field, value
    and range)."""


def _bad_param(params: tuple[tuple[str, str], ...]) -> str | None:
    """Tunable values become -D flags: re-check them here (the engine runs policy on the
    source alone and dedupes by source), with the policy's ``param-syntax`` rule."""
    from evaluators.policy import param_violations

    bad = param_violations(params)
    return f"policy rule param-syntax: {bad[0].message}" if bad else None


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
    """Build ``candidate`` into a shared object (:mod:`evaluators.compile` states the contract)."""
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
