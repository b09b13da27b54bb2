"""The ground truth's host fallback: a float64 reference that runs the device out of memory
is computed again on host copies of the inputs (the judge's correctness and timing checks ask
for it), and the tolerance check compares a truth held elsewhere chunk by chunk. This CPU
machine has one device, so the cross-device move itself is a no-op here; the GPU run
(benchmarks/judge_gpu/steps.py and `evo bench` over kb25_swish) is what exercises it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from evaluators.judge.checks import ground_truth, worst_element
from evo.tasks.tolerance import FP32_ELEMENTWISE, check


class _OOMOnce:
    """A reference that raises torch.OutOfMemoryError on its first call, as a device would."""

    def __init__(self) -> None:
        self.calls: list[torch.dtype] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.dtype)
        if len(self.calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB.")
        return x * torch.sigmoid(x)


def _task(ref) -> SimpleNamespace:
    return SimpleNamespace(reference=ref, reference_dtype="float64", dtype="float32",
                           tolerance=FP32_ELEMENTWISE)


def test_out_of_memory_without_fallback_propagates():
    ref = _OOMOnce()
    with pytest.raises(torch.OutOfMemoryError):
        ground_truth(_task(ref), [torch.randn(8)])
    assert len(ref.calls) == 1


def test_out_of_memory_with_fallback_computes_on_host_copies_in_float64():
    ref = _OOMOnce()
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    (truth,) = ground_truth(_task(ref), [x], host_fallback=True)
    assert ref.calls == [torch.float64, torch.float64]
    assert truth.device.type == "cpu" and truth.dtype == torch.float64
    torch.testing.assert_close(truth, x.double() * torch.sigmoid(x.double()))
    out = (x * torch.sigmoid(x)).float()
    ok, why, m = check(out, truth, FP32_ELEMENTWISE, dtype=torch.float32, chunk=64)
    assert ok, why
    assert m["numel"] == 1000


def test_other_errors_are_not_caught_by_the_fallback():
    def bad(x):
        raise RuntimeError("shape mismatch in the reference")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        ground_truth(_task(bad), [torch.randn(4)], host_fallback=True)


def test_chunked_check_and_worst_element_name_the_same_wrong_element():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    truth = x.double() * 2
    out = (x * 2).float()
    out[4321] += 1.0
    ok, why, m = check(out, truth, FP32_ELEMENTWISE, dtype=torch.float32, chunk=100)
    assert not ok and m["worst_index"] == [4321]
    assert "at (4321)" in worst_element(out, truth, chunk=100)
