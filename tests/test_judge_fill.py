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
def test_on_the_gpu_the_timed_calls_take_the_faster_draw_and_its_bits_repeat(name):
    task = get_task(name)
    dtype = getattr(torch, task.make_inputs.dtype)
    like = [torch.empty(sz, dtype=dtype, device="cuda") for sz in task.make_inputs.sizes(SHAPE)]
    assert fill.self_check_once("cuda", dtype, "normal") and fill.self_check_once("cuda", dtype, "uniform")
    filler = fill.input_filler(task, like, SHAPE, "normal", "triton")
    chosen = fill._CHOSEN[(task.name, tuple(sorted(SHAPE.items())), "normal", tuple(str(x.dtype) for x in like))]
    a, b, own = ([torch.empty_like(x) for x in like] for _ in range(3))
    filler(a, 5)
    filler(b, 5)
    draw_into(task, own, SHAPE, 5, "normal")
    print(f"[{name}] chosen: {chosen}")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(a, own)) == (chosen == "task")   # the draw it chose


def test_the_faster_draw_is_chosen_by_its_least_time_and_a_tie_goes_to_the_first():
    times = {"triton": iter([5.0, 4.3, 4.4]), "task": iter([3.7, 3.6, 3.9])}
    calls: list = []
    draws = {name: (lambda name=name: calls.append(name)) for name in times}
    chosen = fill.faster(draws, lambda fn: (fn(), next(times[calls[-1]]))[1])
    assert chosen == "task" and calls.count("triton") == calls.count("task") == 3
    assert fill.faster({"a": lambda: None, "b": lambda: None}, lambda fn: 1.0) == "a"


def test_where_the_triton_draw_applies_the_filler_is_the_faster_one_measured_once_per_shape(monkeypatch):
    """On the CPU with both draws' gates opened and a fake device clock: the filler is the draw
    the clock says is faster, measured once per (task, shape, distribution, dtypes)."""
    task = get_task(TASK)
    ran: list = []
    monkeypatch.setattr(fill, "_applies", lambda *a: True)
    monkeypatch.setattr(fill, "self_check_once", lambda *a: True)
    monkeypatch.setattr(fill, "fast_fill", lambda bufs, seed, dist: ran.append("triton"))
    monkeypatch.setattr(fill, "_CHOSEN", {})
    measured: list = []

    def clock(fn):   # the Triton draw takes 2 ms, the task's 1 ms
        ran.clear()
        fn()
        measured.append("triton" if ran else "task")
        return 1.0 if measured[-1] == "task" else 2.0

    monkeypatch.setattr(fill, "_device_ms", clock)
    like = _like(task)
    filler = fill.input_filler(task, like, SHAPE, "normal", "triton")
    assert len(measured) == 6 and fill._CHOSEN == {(TASK, tuple(sorted(SHAPE.items())), "normal",
                                                     ("torch.float32",)): "task"}
    a, b = _like(task), _like(task)
    ran.clear()
    filler(a, 99)
    draw_into(task, b, SHAPE, 99, "normal")
    assert not ran and all(torch.equal(x, y) for x, y in zip(a, b))   # the task's own draw
    fill.input_filler(task, like, SHAPE, "normal", "triton")
    assert len(measured) == 6   # chosen once
    def faster_triton(fn):
        ran.clear()
        fn()
        return 0.5 if ran else 1.0

    monkeypatch.setattr(fill, "_device_ms", faster_triton)
    ran.clear()
    other = {"R": 8, "C": 1031}
    bigger = [torch.empty(sz) for sz in task.make_inputs.sizes(other)]
    fill.input_filler(task, bigger, other, "normal", "triton")(bigger, 3)
    assert ran == ["triton"] and len(fill._CHOSEN) == 2   # measured for this shape: the Triton draw
