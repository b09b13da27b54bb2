"""The CUDA toolchain for compile tests: nvcc, the CUTLASS headers and cuobjdump, or a skip naming what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


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


def sass(so_path: Path) -> str:
    """The SASS of a shared object (``cuobjdump -sass``); skips the test without cuobjdump."""
    tool = cuobjdump()
    env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([tool, "-sass", str(so_path)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sass_functions(so_path: Path) -> dict[str, str]:
    """:func:`sass` split per kernel: mangled function name -> its SASS listing."""
    return {chunk.split()[0]: chunk for chunk in sass(so_path).split("Function : ")[1:]}


def build_sass(request, tmp_path: Path, task: str, source: str, params: dict[str, str], timeout_s: int = 600):
    """Builds ``source`` with ``params`` for sm_90a into the pytest cache shared by the seed
    compile tests (a rerun costs nothing), asserts the build succeeded, and returns
    ``(CompileOutcome, sass_functions of its .so)``. Skips without nvcc, CUTLASS or cuobjdump,
    checking cuobjdump before the costly build."""
    cuobjdump()
    compile_mod, _, _ = toolchain()
    from evaluators.base import CompileSettings
    from evo.records import Candidate

    settings = CompileSettings(cache_dir=str(request.config.cache.mkdir("evo-seed-builds")), timeout_s=timeout_s)
    outcome = compile_mod.compile_candidate(Candidate.create(task=task, source=source, params=params), settings)
    assert outcome.ok, outcome.result.reason + "\n" + outcome.result.artifacts.get("errors", "")
    so = tmp_path / f"{task}.so"
    so.write_bytes(outcome.so_bytes)
    return outcome, sass_functions(so)
