"""Delayed profiling on a real GPU: compile a seed, profile it under ncu, check the numbers.

Needs a CUDA GPU, nvcc and Nsight Compute with access to the performance counters (root,
or NVreg_RestrictProfilingToAdminUsers=0); skipped otherwise.
"""

from __future__ import annotations

import pytest

from evaluators import profile as P
from evaluators.base import CompileSettings
from evo.core.records import Candidate, Status

pytestmark = pytest.mark.gpu


def _ncu_or_skip() -> str:
    try:
        return P.find_ncu()
    except P.NcuNotFoundError as e:
        pytest.skip(str(e))


def _built(task_name: str, tmp_path) -> tuple[Candidate, bytes]:
    from evaluators.compile import compile_candidate
    from evo.engine.search import seed_for as _seed_for

    src, params = _seed_for(task_name)
    cand = Candidate.create(task_name, src, params)
    out = compile_candidate(cand, CompileSettings(cache_dir=str(tmp_path / "build")))
    assert out.result.passed, out.result.reason
    return cand, out.so_bytes


@pytest.mark.parametrize("task_name, shape, bound", [
    ("kb19_relu", 0, "memory-bound"),
    ("gemm_bf16", 1, "compute-bound"),
])
def test_profile_seed(task_name, shape, bound, tmp_path):
    from evo.tasks import get_task

    _ncu_or_skip()
    cand, so = _built(task_name, tmp_path)
    settings = P.ProfileSettings(cache_dir=str(tmp_path / "profiles"), timeout_s=300)
    r = P.profile_candidate(cand, so, get_task(task_name), shape, settings=settings)
    assert r.status is Status.OK, f"{r.reason}\n{r.artifacts}"
    m = r.metrics
    assert m["missing"] == [], "every default metric exists on Hopper"
    assert m["duration_ns"] > 0 and m["kernels"] >= 1
    assert "at::" not in m["kernel"], "NVTX filtering captured a torch kernel"
    assert 0 < m["achieved_occupancy_pct"] <= m["theoretical_occupancy_pct"] + 1
    assert m["registers_per_thread"] > 0 and m["top_stalls"]
    assert m["bound"] == bound, P.format_profile(m)
    again = P.profile_candidate(cand, so, get_task(task_name), shape, settings=settings)
    assert again.metrics["cached"] is True
