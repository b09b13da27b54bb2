"""TensorInputs.fill_ on CUDA buffers (the judge's): bit for bit what make_inputs makes with a
CUDA generator, for every distribution and the float32 and bfloat16 dtypes."""

from __future__ import annotations

import pytest
import torch

from evo.tasks.inputs import DISTRIBUTIONS, InputSpec, TensorInputs
from tests.test_inputs_fill import _both, _bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_fill_is_bit_identical_to_make_inputs_on_cuda(dtype, dist):
    ti = TensorInputs((InputSpec(("M", "N")), InputSpec(("N", "N"), "symmetric")), dtype)
    made, bufs, a, b = _both(ti, dist, device="cuda")
    assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(made, bufs))
    assert torch.equal(a, b)
