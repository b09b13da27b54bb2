"""GPU tests: skipped unless a CUDA GPU (and nvcc) is usable here.

Detection goes through :func:`evaluators.pipeline.gpu_available`, which asks ``nvidia-smi``
and a throwaway subprocess and never initialises CUDA in the test process (the harness
children must be the only CUDA users).
"""

from __future__ import annotations

import shutil

import pytest


def _reason() -> str | None:
    from evaluators.pipeline import gpu_available

    if not gpu_available():
        return "needs a CUDA GPU (none usable on this machine)"
    try:
        from evaluators.base import CompileSettings
        from evaluators.compile import find_nvcc

        find_nvcc(CompileSettings())
    except Exception as e:  # noqa: BLE001 - any failure to find nvcc means skip
        if shutil.which("nvcc") is None:
            return f"needs nvcc: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    why = _reason()
    if why is None:
        return
    skip = pytest.mark.skip(reason=why)
    for item in gpu_items:
        item.add_marker(skip)
