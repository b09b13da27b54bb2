"""Tolerance calibration on the GPU, at benchmark shapes (EVALUATION.md: "calibrate the bound
from two legitimate fp32 implementations"): torch/cuBLAS fp32 passes every fp32 task, cuBLAS
with TF32 fails the fp32 GEMMs, torch's bf16 path passes the bf16 tasks, and
``evo.tasks.tolerance.check`` runs on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

import evo.tasks as T
from evo.tasks.tolerance import check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _run(task, shape, dist, seed=0, tf32=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs = task.make_inputs(shape, g, dist, "cuda")
    rd = getattr(torch, task.reference_dtype)
    with torch.no_grad():
        ref = task.reference(*[x.to(rd) for x in xs])
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            out = task.reference(*xs)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    torch.cuda.synchronize()
    return xs, out, ref


@pytest.mark.parametrize("name", ["kb01_square", "kb04_matvec", "kb06_large_k", "kb08_irregular",
                                  "kb11_4d", "kb14_upper"])
def test_fp32_gemm_cublas_passes_tf32_fails(name):
    task = T.get_task(name)
    shape = task.shapes[0]
    for dist in ("normal", "kernelbench"):
        xs, out, ref = _run(task, shape, dist)
        ok, why, m = check(out, ref, task.tolerance, dtype="float32")
        assert ok, (dist, why)
        assert m["rel_l2"] < task.tolerance.rel_l2 / 3, m  # margin for other fp32 orders
        del xs, out, ref
    if name != "kb04_matvec":  # cuBLAS runs gemv in fp32 whatever the TF32 flag
        xs, out, ref = _run(task, shape, "normal", tf32=True)
        ok, why, m = check(out, ref, task.tolerance, dtype="float32")
        assert not ok and m["rel_l2"] > task.tolerance.rel_l2, (why, m)
    torch.cuda.empty_cache()


@pytest.mark.parametrize("name", [n for n in T.task_names("kernelbench-l1")
                                  if not T.get_task(n).tags[0].startswith("gem")])
def test_fp32_torch_cuda_passes_elementwise_at_bench_shape(name):
    task = T.get_task(name)
    for dist in task.distributions[:2]:
        xs, out, ref = _run(task, task.shapes[0], dist)
        ok, why, _ = check(out, ref, task.tolerance, dtype="float32")
        assert ok, (dist, why)
        ok, _, _ = check(torch.zeros_like(out), ref, task.tolerance)
        assert not ok
        del xs, out, ref
        torch.cuda.empty_cache()


@pytest.mark.parametrize("name", T.task_names("modern"))
def test_bf16_torch_cuda_passes_at_bench_shape(name):
    task = T.get_task(name)
    for dist in task.distributions[:2]:
        xs, out, ref = _run(task, task.shapes[0], dist)
        ok, why, m = check(out, ref, task.tolerance, dtype="bfloat16")
        assert ok, (dist, why)
        assert m["rel_l2"] < 5e-3
        del xs, out, ref
        torch.cuda.empty_cache()
