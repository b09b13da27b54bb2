"""The CUDA toolchain for compile tests: nvcc, the CUTLASS headers and cuobjdump, or a skip
naming what is missing; and the test suite's one nvcc build cache.

The suite's kernel builds (seeds, GEMM configs, SASS and PTX checks, host layout programs) go
through :func:`compile_shared` (a candidate ``.so`` through
``evaluators.compile.compile_candidate``) or :func:`nvcc_cached` (PTX or a host program), both into
:func:`build_cache`, one folder under pytest's cache dir (``.pytest_cache/d/evo-seed-builds``).
One nvcc run per configuration gives everything the tests read of it: every suite ``.so`` also
embeds its PTX (:func:`embed_ptx_flags`), so ptxas's report (``compile_candidate``'s metrics), the
SASS (:func:`sass`) and the PTX (:func:`ptx`) of a configuration come from one build;
:func:`nvcc_cached` ``-ptx`` is only for configurations no test builds as a ``.so``.
Tests that build the same source with the same flags share one nvcc run, a rerun on an unchanged
tree costs nothing, and the cache is safe under pytest-xdist: each key is built under an exclusive
``flock`` (a second worker wanting the same key waits for the first and then reads its result) and
published by ``os.replace`` of a finished file, so no worker ever reads half a file. Builds outside
it, on purpose: tests/test_compile.py (the compile stage's own cache, timeouts and memory limits:
what a cold cache does) and the attack fixtures of tests/test_adversarial_policy.py (their own
limits; a timeout is never cached); the runs of tests/test_search.py and tests/test_export.py (a
search / an export with the run's own ``[compile] cache_dir``: a few small kb19_relu builds);
benchmarks/lab/precompile.py in tests/test_precompile.py (the project's ``.evo/cache``, what the
script does); the two tiny plain-nvcc test doubles of tests/test_workspace_abi.py.

Device-only builds (``device_only=True`` of :func:`compile_shared` / :func:`build_sass`): a
variant configuration of a seed (tunable overrides) that no test loads is built ``nvcc -cubin``:
the device passes alone (cicc, then ptxas with its report), no host compile (cudafe++ and the
host C++ compiler: about a quarter of a CuTe GEMM build) and no link. Its SASS and ptxas report
are the ``.so``'s (the same cicc and ptxas runs). What it leaves out is the host compile of
that one configuration; the ``.so`` build of each seed still compiles its task's host code
(``evo_launch``, ``evo_workspace_bytes``), with the seed's values.

Variants (:func:`variants`): where a SASS or register-budget test checks one property on several
configurations of a template, the suite builds the representatives named per test and skips the
rest, saying so; ``EVO_GEMM_COMPILE_ALL=1`` builds every one (as every GEMM seed, see
tests/test_gemm_seeds.py). benchmarks/h200_acceptance.sh's ``compile`` step runs them all on the
GPU machine's cores.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

#: The folder (under pytest's cache dir) of the suite's one nvcc build cache.
BUILD_CACHE = "evo-seed-builds"


#: ``EVO_GEMM_COMPILE_ALL=1``: every GEMM seed and every variant of a SASS or register-budget
#: test is built (module docstring, "Variants").
COMPILE_ALL = os.environ.get("EVO_GEMM_COMPILE_ALL") == "1"


def variants(values: list, keep: tuple[int, ...] = (0,)) -> list:
    """``values`` for ``pytest.mark.parametrize``, with those whose index is not in ``keep``
    skipped unless :data:`COMPILE_ALL` (a tuple value is one test's arguments)."""
    if COMPILE_ALL:
        return list(values)
    skip = pytest.mark.skip(reason="a variant of a property the suite builds a representative of; "
                                   "EVO_GEMM_COMPILE_ALL=1 builds every one")
    return [v if i in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=skip)
            for i, v in enumerate(values)]


def toolchain():
    """``(evaluators.compile module, nvcc path, CUTLASS include dir)``; skips the test without them."""
    compile_mod = pytest.importorskip("evaluators.compile")
    from evaluators.base import CompileSettings

    try:
        nvcc = compile_mod.find_nvcc(CompileSettings())
        include = compile_mod.cutlass_include_dir()
    except (compile_mod.NvccNotFound, compile_mod.CutlassNotFound) as exc:
        pytest.skip(f"no toolchain: {exc}")
    return compile_mod, nvcc, include


def cuobjdump() -> str:
    """cuobjdump from PATH, the CUDA toolkit, or the nvidia-cuda-cuobjdump wheel (which needs
    nvdisasm beside it: nvidia-cuda-nvdisasm; both are in the project's ``test`` extra). Skips
    the test without them, so call it before any costly build the test would disassemble."""
    cands = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        import nvidia  # type: ignore

        for base in nvidia.__path__:
            cands += [str(p) for p in Path(base).glob("cu*/bin/cuobjdump")]
    except ImportError:
        pass
    for c in cands:
        if c and os.path.isfile(c) and (shutil.which("nvdisasm") or (Path(c).parent / "nvdisasm").is_file()):
            return c
    pytest.skip("no cuobjdump + nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def _cuobjdump(args: list[str]) -> str:
    """``cuobjdump *args`` (nvdisasm beside it on PATH); asserts it succeeded, returns stdout."""
    tool = cuobjdump()
    env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([tool, *args], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sass(so_path: Path) -> str:
    """The SASS of a shared object (``cuobjdump -sass``); skips the test without cuobjdump."""
    return _cuobjdump(["-sass", str(so_path)])


def ptx(so_path: Path) -> str:
    """The PTX embedded in a suite ``.so`` (``cuobjdump -ptx``; :func:`embed_ptx_flags` puts it there);
    skips the test without cuobjdump, so call :func:`cuobjdump` before the costly build."""
    text = _cuobjdump(["-ptx", str(so_path)])
    assert ".entry" in text, f"no PTX in {so_path.name} (built without embed_ptx_flags?)"
    return text


def sass_functions(so_path: Path) -> dict[str, str]:
    """:func:`sass` split per kernel: mangled function name -> its SASS listing."""
    return {chunk.split()[0]: chunk for chunk in sass(so_path).split("Function : ")[1:]}


def build_sass(request, tmp_path: Path, task: str, source: str, params: dict[str, str], timeout_s: int = 600,
               *, device_only: bool = False):
    """Builds ``source`` with ``params`` for sm_90a into the pytest cache shared by the seed
    compile tests (a rerun costs nothing), asserts the build succeeded, and returns
    ``(CompileOutcome, sass_functions of its .so or, device_only, its cubin)``. Skips without
    nvcc, CUTLASS or cuobjdump, checking cuobjdump before the costly build."""
    cuobjdump()
    outcome = compile_shared(request, task, source, params, timeout_s, device_only=device_only)
    so = tmp_path / (f"{task}.cubin" if device_only else f"{task}.so")
    so.write_bytes(outcome.so_bytes)
    return outcome, sass_functions(so)


def build_ptx(request, tmp_path: Path, task: str, source: str, params: dict[str, str], timeout_s: int = 600):
    """Like :func:`build_sass`, for the PTX: ``(CompileOutcome, ptx of its .so)`` from the one
    cached build of ``source`` with ``params`` that the configuration's other tests read too."""
    cuobjdump()
    outcome = compile_shared(request, task, source, params, timeout_s)
    so = tmp_path / f"{task}.so"
    so.write_bytes(outcome.so_bytes)
    return outcome, ptx(so)


def build_cache(request) -> Path:
    """The suite's one nvcc build cache (see the module docstring); created on first use.
    Under ``-p no:cacheprovider`` (no ``config.cache``) a directory under the system's temp
    directory serves instead."""
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(BUILD_CACHE))
    d = Path(tempfile.gettempdir()) / BUILD_CACHE
    d.mkdir(parents=True, exist_ok=True)
    return d


#: The extra nvcc flag of a device-only build: ``-cubin`` comes after ``compile_candidate``'s
#: ``-shared``, the later output kind wins, so the run stops after ptxas (its ``-v`` report
#: still parsed by ``compile_candidate``) and writes the cubin where the .so would go
#: (:func:`compile_shared` asserts that it is one).
DEVICE_ONLY_FLAGS = ("-cubin",)
#: ELF ``e_machine`` of a cubin (an x86-64 .so has 62).
EM_CUDA = 190


def embed_ptx_flags(arch: str) -> tuple[str, ...]:
    """The extra nvcc flag that also embeds ``arch``'s PTX: ``-gencode`` for the same virtual
    arch with ``code=compute_XX``. nvcc runs cicc once per virtual arch, so the build costs the
    same (no second cicc, no second ptxas), and its SASS and ptxas's report are those of the
    production build (``compile_candidate`` without extra flags); the PTX rides beside them."""
    from evaluators.compile.nvcc import gencode_flags

    (flag,) = gencode_flags(arch)
    return (flag.replace(",code=sm_", ",code=compute_"),)


def compile_shared(request, task: str, source: str, params: dict[str, str], timeout_s: float = 600,
                   *, device_only: bool = False):
    """``compile_candidate`` of ``source`` with ``params`` into :func:`build_cache` (its PTX
    embedded: :func:`embed_ptx_flags`, for :func:`ptx`); asserts the build succeeded (the message
    is nvcc's errors) and returns the ``CompileOutcome``. Skips without nvcc or CUTLASS. The
    cache key is the source, the params, the flags and the toolchain, not the task name: two
    tasks whose seeds render the same source share one build. Every suite build of a candidate
    goes through here, so that tests of one configuration share one build.

    ``device_only``: ``nvcc -cubin`` (:data:`DEVICE_ONLY_FLAGS`, the module docstring's
    "Device-only builds"): the outcome's metrics are ptxas's report as for the ``.so`` and its
    ``so_bytes`` are the sm_90a cubin (an ELF that cuobjdump reads; not loadable, no PTX)."""
    compile_mod, _, _ = toolchain()
    from evaluators.base import CompileSettings
    from evo.core.records import Candidate

    arch = CompileSettings().arch
    settings = CompileSettings(cache_dir=str(build_cache(request)), timeout_s=timeout_s,
                               extra_flags=DEVICE_ONLY_FLAGS if device_only else embed_ptx_flags(arch))
    outcome = compile_mod.compile_candidate(Candidate.create(task=task, source=source, params=params), settings)
    assert outcome.ok, outcome.result.reason + "\n" + outcome.result.artifacts.get("errors", "")
    if device_only:   # an ELF for the GPU (e_machine EM_CUDA), not a host object: no host compile ran
        assert int.from_bytes(outcome.so_bytes[18:20], "little") == EM_CUDA, "device-only build is not a cubin"
    return outcome


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    """Exclusive lock on ``path`` across processes (xdist workers); released on exit."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` so that a concurrent reader sees the old file or the whole new
    one (a temporary file beside it, then ``os.replace``)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def nvcc_cached(request, tag: str, args: list[str], source: str, suffix: str, timeout_s: float = 600) -> Path:
    """``nvcc -std=c++17 -O3 --expt-relaxed-constexpr -I<CUTLASS> -I<kernels> *args source -o OUT``
    once per content (source, args, evo_abi.h, nvcc version, include dir) in :func:`build_cache`;
    returns OUT (``suffix``: ``.ptx`` for ``-ptx``, ``""`` for a host executable). Asserts nvcc
    succeeded, with its output; failures are not cached (a fix is retried at once)."""
    compile_mod, nvcc, include = toolchain()
    kernels = compile_mod.abi_include_dir()
    version = compile_mod.nvcc_version(nvcc)
    abi = (kernels / "evo_abi.h").read_text()
    key = hashlib.sha256("\0".join([source, abi, " ".join(args), version, str(include)]).encode()).hexdigest()[:24]
    folder = build_cache(request) / "nvcc"
    folder.mkdir(exist_ok=True)
    out = folder / f"{tag}-{key}{suffix}"
    if out.exists():
        return out
    with _flock(folder / f"{tag}-{key}.lock"):
        if out.exists():  # another worker built it while this one waited
            return out
        with tempfile.TemporaryDirectory(dir=folder, prefix=f"{tag}-") as tmp:
            cu = Path(tmp) / f"{tag}.cu"
            cu.write_text(source)
            part = Path(tmp) / ("out" + suffix)
            cmd = [nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-I{include}", f"-I{kernels}",
                   *args, str(cu), "-o", str(part)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
            assert proc.returncode == 0, f"nvcc failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
            os.replace(part, out)
    return out
