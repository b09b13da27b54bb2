"""TensorInputs.fill_ (evo.tasks.inputs): inputs drawn into the judge's buffers are, bit for
bit, what ``make_inputs`` returns for the same generator state, for every distribution, dtype
and structure (dense float32 drawn in place, the rest copied in), and the generator ends in
the same state; mismatched buffers are refused. The judge's fill_inputs takes this path."""

from __future__ import annotations

import itertools

import pytest
import torch

from evo.tasks.inputs import DISTRIBUTIONS, STRUCTURES, InputSpec, TensorInputs

SHAPE = {"M": 17, "N": 33}


def _both(ti: TensorInputs, dist: str, device: str = "cpu"):
    g = torch.Generator(device=device).manual_seed(11)
    made = ti(SHAPE, g, dist, device)
    after_made = torch.rand(4, generator=g, device=device)
    g = torch.Generator(device=device).manual_seed(11)
    bufs = [torch.full_like(x, float("nan")) for x in made]
    ti.fill_(bufs, SHAPE, g, dist)
    after_fill = torch.rand(4, generator=g, device=device)
    return made, bufs, after_made, after_fill


@pytest.mark.parametrize("dtype,structure,dist", list(itertools.product(
    ["float32", "bfloat16", "float16"], STRUCTURES, DISTRIBUTIONS)))
def test_fill_is_bit_identical_to_make_inputs(dtype, structure, dist):
    ti = TensorInputs((InputSpec(("N", "N"), structure), InputSpec(("M", "N")), InputSpec(("N",))), dtype)
    made, bufs, a, b = _both(ti, dist)
    for x, y in zip(made, bufs):
        assert x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))
    assert torch.equal(a, b), "the generator must end where make_inputs leaves it"


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bits (-0.0 and NaN payloads compared too)."""
    return x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def test_dense_float32_is_drawn_in_place():
    ti = TensorInputs((InputSpec(("M", "N")),), "float32")
    buf = torch.empty(17, 33)
    ptr = buf.data_ptr()
    ti.fill_([buf], SHAPE, torch.Generator().manual_seed(0), "normal")
    assert buf.data_ptr() == ptr and torch.isfinite(buf).all() and buf.std() > 0.5


def test_mismatched_buffers_are_refused():
    ti = TensorInputs((InputSpec(("M", "N")),), "float32")
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="spec wants"):
        ti.fill_([torch.empty(33, 17)], SHAPE, g, "normal")
    with pytest.raises(ValueError, match="spec wants"):
        ti.fill_([torch.empty(17, 33, dtype=torch.bfloat16)], SHAPE, g, "normal")
    with pytest.raises(ValueError, match="contiguous"):
        ti.fill_([torch.empty(33, 17).t()], SHAPE, g, "normal")
    with pytest.raises(ValueError, match="2 buffers for 1 inputs"):
        ti.fill_([torch.empty(17, 33)] * 2, SHAPE, g, "normal")
    with pytest.raises(ValueError, match="unknown distribution"):
        ti.fill_([torch.empty(17, 33)], SHAPE, g, "gaussian")


def test_the_judges_fill_inputs_draws_into_the_slots():
    from types import SimpleNamespace

    from evaluators.judge.trials import fill_inputs

    ti = TensorInputs((InputSpec(("M", "N")), InputSpec(("N",))), "float32")
    task = SimpleNamespace(name="t", make_inputs=ti)
    slots = SimpleNamespace(ins=[torch.empty(17, 33), torch.empty(33)])
    ptrs = [b.data_ptr() for b in slots.ins]
    kept = fill_inputs(task, slots, SHAPE, 7, "wide", keep=True)
    expect = ti(SHAPE, torch.Generator().manual_seed(7), "wide")
    assert [b.data_ptr() for b in slots.ins] == ptrs
    assert all(torch.equal(a, b) for a, b in zip(slots.ins, expect))
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(kept, slots.ins))
