"""The toolchain a build uses: nvcc, the host compiler, the CuTe/CUTLASS headers, the ABI header.

Where each is found (:func:`find_nvcc`, :func:`cutlass_include_dir`, :func:`abi_include_dir`)
and its version (:func:`nvcc_version`, :func:`cutlass_version`, the host compiler's), which
are part of the build cache key. A missing piece raises :class:`NvccNotFound` or
:class:`CutlassNotFound` naming the fix.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from evaluators.base import CompileSettings, InfrastructureError


class NvccNotFound(InfrastructureError):
    """nvcc could not be located or run. The message lists where we looked and the fix."""


class CutlassNotFound(InfrastructureError):
    """The nvidia-cutlass wheel (CuTe/CUTLASS headers) is not installed or is incomplete."""


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
    """Directory holding ``evo_abi.h``: ``evaluators/abi/``, beside its Python statement
    (:mod:`evaluators.abi`; package data of ``evaluators.abi``)."""
    path = Path(__file__).resolve().parents[1] / "abi"
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


def _ccbin(settings: CompileSettings) -> str:
    """The host compiler named by ``-ccbin`` / ``--compiler-bindir`` in the extra flags (a
    command, a path or a directory), else ``g++``."""
    flags = list(settings.extra_flags)
    cc = "g++"
    for i, f in enumerate(flags):
        if f in ("-ccbin", "--compiler-bindir") and i + 1 < len(flags):
            cc = flags[i + 1]
        elif f.startswith(("-ccbin=", "--compiler-bindir=")):
            cc = f.split("=", 1)[1]
    return cc


def _host_compiler_version(settings: CompileSettings) -> str:
    """Version of the host C++ compiler nvcc will call (part of the cache key)."""
    cc = _ccbin(settings)
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


def _host_compiler(settings: CompileSettings) -> str:
    cc = _ccbin(settings)
    if os.path.isdir(cc):
        cc = os.path.join(cc, "g++")
    return cc
