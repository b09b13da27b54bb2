"""Build the runner (``evo_runner.cpp``) once per backend, source and compiler, into the cache.

:func:`runner_binary` returns the path of a built runner: ``<cache_dir>/runner/evo_runner-
<backend>-<key>``, where ``cache_dir`` is the compile cache's root (``compile.cache_dir``,
default ``.evo/cache``, :class:`evaluators.base.CompileSettings`) and ``key`` is the sha256 of
the source, the ABI header (``evaluators/abi/evo_abi.h``), the backend, the compiler command
and the compiler's version. A build goes to a temporary name and is renamed into place; an
``flock`` per key makes parallel callers (pytest workers, GPU actors) wait for one compiler run.

Backends (:data:`BACKENDS`): ``cuda`` (nvcc, host code only, cudart static) and ``host``
(g++ ``-DEVO_RUNNER_HOST``, no CUDA runtime: the CPU stand-in CI uses to test the runner).
A missing compiler or a failed build raises :class:`RunnerBuildError` with the fix and the
compiler's first error lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from evaluators.base import CompileSettings, InfrastructureError

__all__ = ["BACKENDS", "RUNNER_SOURCE", "RunnerBuildError", "build_command", "runner_binary"]

#: The runner's one source file (package data of ``evaluators.runner``).
RUNNER_SOURCE = Path(__file__).resolve().with_name("evo_runner.cpp")
BACKENDS = ("cuda", "host")
#: Bumped when the layout of the cache entries changes.
_SCHEMA = 1
_BUILD_TIMEOUT_S = 300.0

_memo: dict[tuple, Path] = {}
_memo_lock = threading.Lock()


class RunnerBuildError(InfrastructureError):
    """The runner could not be built: our failure (a missing compiler, a broken install)."""


def _abi_dir() -> Path:
    from evaluators.compile.toolchain import abi_include_dir

    return abi_include_dir()


def _cuda_include(nvcc: str | None = None) -> str | None:
    """A CUDA toolkit include directory holding ``cuda_runtime.h``, or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if nvcc:
        roots.insert(0, str(Path(nvcc).resolve().parent.parent))
    for root in roots:
        if root and (Path(root) / "include" / "cuda_runtime.h").is_file():
            return str(Path(root).resolve() / "include")
    return None


def _compiler(backend: str) -> str:
    if backend == "cuda":
        from evaluators.compile.toolchain import find_nvcc

        try:
            return find_nvcc(CompileSettings())
        except InfrastructureError as e:
            raise RunnerBuildError(f"cannot build the cuda runner: {e}",
                                   fix="install the CUDA toolkit or set CUDA_HOME; the runner is built with nvcc") from e
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RunnerBuildError("cannot build the host runner: no C++ compiler (g++ or c++) on PATH",
                               fix="install a C++17 compiler, e.g. `apt-get install g++`")
    return cxx


def _version(compiler: str) -> str:
    """The compiler's identity for the cache key: its version text (nvcc: plus its host g++)."""
    from evaluators.compile.toolchain import _host_compiler_version, _tool_version

    try:
        text = _tool_version(compiler, os.stat(compiler).st_mtime_ns, ("--version",))
    except (OSError, InfrastructureError) as e:
        raise RunnerBuildError(f"cannot run `{compiler} --version`: {e}",
                               fix="check that the compiler is installed and runs") from e
    if Path(compiler).name.startswith("nvcc"):
        text += "\nhost: " + _host_compiler_version(CompileSettings())
    return text


def build_command(backend: str, out: str | os.PathLike[str], compiler: str) -> list[str]:
    """The compiler's argv that builds ``backend``'s runner into ``out``."""
    if backend not in BACKENDS:
        raise ValueError(f"runner backend {backend!r}: expected one of {BACKENDS}")
    common = ["-std=c++17", "-O2", f"-I{_abi_dir()}", str(RUNNER_SOURCE), "-o", str(out)]
    if backend == "cuda":
        # a .cpp: nvcc hands it to the host compiler (no device code); cudart linked statically
        return [compiler, "-Xcompiler", "-Wall", *common, "-cudart", "static", "-ldl"]
    inc = _cuda_include()
    # the CUDA headers only for evo_abi.h's types when present; else the source's own shim
    return [compiler, "-Wall", "-DEVO_RUNNER_HOST", *([f"-I{inc}"] if inc else []), *common, "-ldl"]


def _first_errors(text: str, n: int = 12) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    errs = [l for l in lines if "error" in l.lower()]
    return "\n".join((errs or lines)[:n])


def _default_root() -> Path:
    return Path(CompileSettings().cache_dir)


def runner_binary(backend: str = "cuda", *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The built runner of ``backend`` (``"cuda"`` or ``"host"``), built now if the cache has
    none for this source and compiler. ``cache_dir``: the cache root (default: the compile
    cache's, ``.evo/cache``). Raises :class:`RunnerBuildError` (our failure) when it cannot
    be built."""
    if backend not in BACKENDS:
        raise ValueError(f"runner backend {backend!r}: expected one of {BACKENDS}")
    root = Path(cache_dir if cache_dir is not None else _default_root()).expanduser().resolve()
    compiler = _compiler(backend)
    src = RUNNER_SOURCE.read_bytes()
    abi = (_abi_dir() / "evo_abi.h").read_bytes()
    memo_key = (backend, str(root), compiler, hashlib.sha256(src + b"\0" + abi).hexdigest())
    with _memo_lock:
        hit = _memo.get(memo_key)
    if hit is not None and hit.is_file():
        return hit
    cmd = build_command(backend, "OUT", compiler)
    key = hashlib.sha256(json.dumps({
        "schema": _SCHEMA, "backend": backend, "source": hashlib.sha256(src).hexdigest(),
        "abi": hashlib.sha256(abi).hexdigest(), "cmd": cmd, "version": _version(compiler),
    }, sort_keys=True).encode()).hexdigest()[:24]
    d = root / "runner"
    final = d / f"evo_runner-{backend}-{key}"
    if not final.is_file():
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunnerBuildError(f"cannot create the runner cache {d}: {e}",
                                   fix="make the cache directory writable or set compile.cache_dir") from e
        from evaluators.compile.cache import _key_lock

        with _key_lock(d / f"evo_runner-{backend}-{key}.lock"):
            if not final.is_file():  # another process may have built it meanwhile
                _build(backend, compiler, final)
    with _memo_lock:
        _memo[memo_key] = final
    return final


def _build(backend: str, compiler: str, final: Path) -> None:
    tmpdir = Path(tempfile.mkdtemp(prefix=f".build-{backend}-", dir=final.parent))
    try:
        out = tmpdir / "evo_runner"
        cmd = build_command(backend, out, compiler)
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, cwd=str(tmpdir),
                               env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise RunnerBuildError(f"building the {backend} runner took over {_BUILD_TIMEOUT_S:.0f}s",
                                   fix="check the machine's load and the compiler", detail=" ".join(cmd)) from e
        except OSError as e:
            raise RunnerBuildError(f"cannot run {compiler}: {e}", fix="check the compiler's installation") from e
        if p.returncode != 0 or not out.is_file():
            text = (p.stderr or "") + (p.stdout or "")
            raise RunnerBuildError(
                f"building the {backend} runner failed (exit {p.returncode}):\n{_first_errors(text)}",
                fix=("check the CUDA toolkit and its host compiler (nvcc needs g++)" if backend == "cuda"
                     else "check g++ (C++17) and the Linux headers (linux/seccomp.h)"),
                detail=" ".join(cmd) + "\n" + text)
        os.chmod(out, 0o755)
        os.replace(out, final)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
