"""The CUDA toolchain for compile tests: nvcc and the CUTLASS headers, or a skip naming what is missing."""

from __future__ import annotations

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
