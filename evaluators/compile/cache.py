"""The build cache: ``<cache_dir>/compile/<key[:2]>/<key>.{so,json}``, keyed by content.

The key (:func:`cache_key`) is the sha256 of everything that determines the .so. Writes go
to a temporary file then ``os.replace`` (the JSON last, as the commit marker), and an
``flock`` per key makes concurrent compiles of the same key from several processes wait for
one nvcc run instead of repeating it. A cached failure written under older verdict rules
(:data:`VERDICT_RULES`) is not loaded, so it is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from evaluators.base import CompileSettings
from evaluators.compile.nvcc import build_flags
from evaluators.compile.toolchain import abi_include_dir
from evo.core.records import Status, StageResult, canonical_params

logger = logging.getLogger(__name__)


#: Bumped when the cache layout or the meaning of cached results changes.
CACHE_SCHEMA = 1
#: Version of the rules that decide which failures are the candidate's (and so cacheable).
#: A cached non-ok entry written under older rules is ignored and rebuilt: before version 2 a
#: full disk or a too-small memory limit could be cached as a candidate's compile error.
VERDICT_RULES = 2
#: Environment variables nvcc or the host compiler read that change what gets built: part of
#: the cache key when set (they reach nvcc through the scrubbed environment).
BUILD_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
             "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")


def _abi_header_sha() -> str:
    return hashlib.sha256((abi_include_dir() / "evo_abi.h").read_bytes()).hexdigest()


def _reads_key() -> dict[str, Any]:
    """What nvcc may read, when it differs from the default (Landlock reads on, no extra
    paths): whether an #include outside the include path builds depends on it."""
    from evaluators.sandbox import SandboxSettings
    from evaluators.sandbox.landlock import _landlock_abi

    s = SandboxSettings.from_env()
    restricted = s.enabled and s.landlock and s.landlock_reads and _landlock_abi() > 0
    if restricted and not s.extra_readable:
        return {}
    return {"restricted": restricted, "extra": list(s.extra_readable)}


def _build_env() -> dict[str, str]:
    return {k: os.environ[k] for k in BUILD_ENV if os.environ.get(k)}


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
