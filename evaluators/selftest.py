"""Self-test of the evaluator (shared/EVALUATION.md): kernels that must FAIL every task.

For every task five generic kernels are built and judged (the judge and a runner, as any candidate):

``null``       returns cudaSuccess and writes nothing (stale memory / poison check);
``zero``       ``cudaMemsetAsync`` every output to 0 (all-zero outputs vs relative tolerance);
``copy``       copies in[0]'s bytes into out[0] (as many as fit) ("ReLU of positive inputs");
``constant``   fills every output with 1 in its dtype;
``half``       the task's own seed, called with in[0] and out[0] halved along dimension 0
               (``#define evo_launch seed_launch`` before the seed's text): half-written output.

Every one of them must come back non-``ok`` from correctness; a kernel that passes means a
hole in the evaluator. Used by ``tests/gpu/test_selftest.py`` and ``benchmarks/lab/seeds.py
--selftest``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Iterable

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.pipeline import compile_all, run_built
from evo.core.records import Candidate, Operator, StageResult, Status

__all__ = ["SELFTEST_KERNELS", "SelftestRow", "selftest_sources", "run_selftest"]

log = logging.getLogger(__name__)

SELFTEST_KERNELS = ("null", "zero", "copy", "constant", "half")

_PRELUDE = """\
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "evo_abi.h"

static inline size_t selftest_elem_bytes(int32_t dtype) {
  switch (dtype) {
    case EVO_F32: case EVO_I32: return 4;
    case EVO_F16: case EVO_BF16: return 2;
    default: return 8;
  }
}
"""

_NULL = _PRELUDE + """
// Self-test `null`: writes nothing and reports success.
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  return 0;
}
"""

_ZERO = _PRELUDE + """
// Self-test `zero`: every output byte set to 0.
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  for (int i = 0; i < n_out; ++i) {
    cudaError_t e = cudaMemsetAsync(out[i].data, 0, evo_numel(out[i]) * selftest_elem_bytes(out[i].dtype), stream);
    if (e != cudaSuccess) return e;
  }
  return 0;
}
"""

_COPY = _PRELUDE + """
// Self-test `copy`: in[0]'s bytes into out[0], as many as fit.
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  if (n_in < 1 || n_out < 1) return 0;
  size_t a = evo_numel(in[0]) * selftest_elem_bytes(in[0].dtype);
  size_t b = evo_numel(out[0]) * selftest_elem_bytes(out[0].dtype);
  return cudaMemcpyAsync(out[0].data, in[0].data, a < b ? a : b, cudaMemcpyDeviceToDevice, stream);
}
"""

_CONSTANT = _PRELUDE + """
// Self-test `constant`: every output element = 1 in its dtype.
template <typename T>
__global__ void selftest_fill(T* p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = v;
}

template <typename T>
static void fill(void* p, int64_t n, T v, cudaStream_t s) {
  if (n > 0) selftest_fill<T><<<1024, 256, 0, s>>>(static_cast<T*>(p), n, v);
}

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  for (int i = 0; i < n_out; ++i) {
    int64_t n = evo_numel(out[i]);
    switch (out[i].dtype) {
      case EVO_F32: fill<float>(out[i].data, n, 1.0f, stream); break;
      case EVO_F16: fill<__half>(out[i].data, n, __float2half(1.0f), stream); break;
      case EVO_BF16: fill<__nv_bfloat16>(out[i].data, n, __float2bfloat16(1.0f), stream); break;
      case EVO_F64: fill<double>(out[i].data, n, 1.0, stream); break;
      case EVO_I32: fill<int32_t>(out[i].data, n, 1, stream); break;
      default: fill<int64_t>(out[i].data, n, 1, stream); break;
    }
  }
  return (int)cudaGetLastError();
}
"""

_HALF_HEAD = """\
// Self-test `half`: the task's seed, called on the first half (dimension 0) of in[0] and
// out[0] only.
#define evo_launch seed_launch
"""

_HALF_TAIL = """
#undef evo_launch

EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  EvoTensor hin[16], hout[16];
  if (n_in > 16 || n_out > 16) return (int)cudaErrorInvalidValue;
  for (int i = 0; i < n_in; ++i) hin[i] = in[i];
  for (int i = 0; i < n_out; ++i) hout[i] = out[i];
  if (n_in > 0 && hin[0].ndim > 0) hin[0].shape[0] /= 2;
  if (n_out > 0 && hout[0].ndim > 0) hout[0].shape[0] /= 2;
  return seed_launch(hin, n_in, hout, n_out, scalars, n_scalars, stream);
}
"""


def selftest_sources(task: str, seed_source: str | None) -> dict[str, str]:
    """The self-test kernels for ``task`` (``half`` only when the task has a seed source)."""
    out = {"null": _NULL, "zero": _ZERO, "copy": _COPY, "constant": _CONSTANT}
    if seed_source:
        out["half"] = _HALF_HEAD + seed_source + _HALF_TAIL
    return out


@dataclass(frozen=True)
class SelftestRow:
    """One (task, kernel) verdict. ``passed_selftest`` = the evaluator rejected the kernel."""

    task: str
    kernel: str
    stage: StageResult

    @property
    def passed_selftest(self) -> bool:
        return self.stage.status is not Status.OK and self.stage.status is not Status.SKIPPED


def run_selftest(
    tasks: Iterable[str],
    compile_settings: CompileSettings,
    harness_settings: HarnessSettings,
    *,
    jobs: int | None = None,
) -> list[SelftestRow]:
    """Build every self-test kernel (in parallel) and have the judge check each (check mode).

    A kernel that does not compile is a failure of the self-test itself (raised as
    ``RuntimeError`` naming the kernel and the compiler's message): the point is to
    exercise the GPU checks, not the compiler. ``tasks`` are task names or ``"family:<name>"``;
    an unknown one raises :class:`~evo.tasks.registry.UnknownTaskError` (with the valid names)
    before anything is built.
    """
    from evo.tasks.registry import tasks_for
    from evo.tasks.seeds import UnknownSeedError, seed_params, seed_source

    tasks = [t.name for t in tasks_for(list(tasks))]   # a typo must not cost a parallel build first
    builds = []
    for t in tasks:
        try:
            src, params = seed_source(t), seed_params(t)
        except UnknownSeedError:
            log.warning("task %s has no seed kernel: self-test `half` skipped", t)
            src, params = None, {}
        for name, text in selftest_sources(t, src).items():
            builds.append((t, name, text, params if name == "half" else {}))
    hs = dataclasses.replace(harness_settings, check_only=True)
    rows: list[SelftestRow] = []
    log.info("self-test: building %d kernels for %d tasks", len(builds), len(tasks))
    t0 = time.monotonic()
    cands = [Candidate.create(t, s, p, operator=Operator.USER, notes=f"selftest:{n}") for t, n, s, p in builds]
    outcomes = compile_all(cands, compile_settings, jobs=jobs or os.cpu_count() or 4)
    log.info("self-test: built in %.0f s; checking each on the GPU", time.monotonic() - t0)
    for (task, name, _, _), cand, outcome in zip(builds, cands, outcomes):
        res = outcome.result
        if not res.passed or not outcome.so_bytes:
            raise RuntimeError(f"self-test kernel {name!r} for {task} did not compile: "
                               f"{res.reason}\n{res.artifacts.get('log', '')[:2000]}")
        rep = run_built(cand, outcome.so_bytes, hs, mode="check")
        st = rep.stage("correctness") or rep.stages[0]
        rows.append(SelftestRow(task, name, st))
        log.info("selftest %-22s %-9s -> %s: %s", task, name, st.status.value, st.reason[:160])
    return rows
