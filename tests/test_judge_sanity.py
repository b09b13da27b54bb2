"""The judge's check of every timed call (evaluators.judge.timing._sanity): unwritten poison
is found whether or not the output's sum is finite (the fast path: a finite sum proves no
NaN), a NaN the reference also has is not poison, an infinity is not poison, and values far
from the reference's fail on the sampled elements."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from evaluators.judge.timing import _sanity

TASK = SimpleNamespace(index_rule=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_fully_written_output_passes(dtype):
    ref = torch.randn(10_000, dtype=torch.float64).to(dtype)
    assert _sanity(TASK, [ref.clone()], [ref]) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unwritten_poison_is_counted(dtype):
    ref = torch.randn(10_000).to(dtype)
    out = ref.clone()
    out[[3, 9_999]] = float("nan")
    assert "2 of 10000 elements still hold the poison" in _sanity(TASK, [out], [ref])


def test_a_nan_the_reference_has_is_not_poison_and_an_infinity_is_not_either():
    ref = torch.randn(10_000)
    ref[5] = float("nan")
    ref[7] = float("inf")
    out = ref.clone()
    assert _sanity(TASK, [out], [ref]) is None        # sum not finite: the scan runs, finds nothing unwritten
    out[8] = float("nan")
    assert "1 of 10000 elements still hold the poison" in _sanity(TASK, [out], [ref])


def test_wrong_values_fail_on_the_sampled_elements():
    ref = torch.randn(10_000)
    assert "relative L2 distance" in _sanity(TASK, [ref + 1.0], [ref])
    assert "has shape" in _sanity(TASK, [ref[:10]], [ref])
