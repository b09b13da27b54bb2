"""The timed calls' input draw (evaluators.judge.fill): the task's own draw wherever the Triton
draw does not apply, and the Triton draw's contract where Triton runs (its interpreter on the
CPU when Triton is installed; the GPU tests run the compiled kernel)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from evaluators.judge import fill
from evaluators.judge.trials import draw_into
from evo.tasks import get_task

TASK = "kb19_relu"
SHAPE = {"R": 4, "C": 1031}


def _like(task, dtype=None, device="cpu"):
    return [torch.empty(s, dtype=dtype or torch.float32, device=device) for s in task.make_inputs.sizes(SHAPE)]


@pytest.mark.parametrize("fused", [None, "triton"])
def test_without_a_cuda_device_the_timed_calls_get_the_tasks_own_draw(fused):
    task = get_task(TASK)
    filler = fill.input_filler(task, _like(task), SHAPE, "normal", fused)
    a, b = _like(task), _like(task)
    filler(a, 99)
    draw_into(task, b, SHAPE, 99, "normal")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_structured_inputs_and_unknown_distributions_never_take_the_triton_draw():
    task = get_task("kb13_symmetric")     # symmetric inputs: the task's draw keeps the structure
    like = [torch.empty(s) for s in task.make_inputs.sizes(dict(task.shapes[0]))]
    assert not fill._applies(task, like, "normal")
    relu = get_task(TASK)
    assert not fill._applies(relu, _like(relu), "no-such-dist")


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dist", sorted(fill.DISTS))
def test_the_triton_draw_repeats_its_bits_for_a_seed_and_follows_the_distribution(monkeypatch, dtype, dist):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fill, "_KERNEL", [])
    fill._self_check("cpu", dtype, dist)
    a = [torch.empty(3000, dtype=dtype), torch.empty(3000, dtype=dtype)]
    fill.fast_fill(a, 7, dist)
    assert not torch.equal(a[0], a[1])   # each input its own stream


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", [TASK, "gelu_bf16"])
def test_on_the_gpu_the_timed_calls_take_the_triton_draw_and_its_bits_repeat(name):
    task = get_task(name)
    dtype = getattr(torch, task.make_inputs.dtype)
    like = [torch.empty(sz, dtype=dtype, device="cuda") for sz in task.make_inputs.sizes(SHAPE)]
    assert fill.self_check_once("cuda", dtype, "normal") and fill.self_check_once("cuda", dtype, "uniform")
    filler = fill.input_filler(task, like, SHAPE, "normal", "triton")
    a, b, own = ([torch.empty_like(x) for x in like] for _ in range(3))
    filler(a, 5)
    filler(b, 5)
    draw_into(task, own, SHAPE, 5, "normal")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, own))   # the Triton draw, not the task's
