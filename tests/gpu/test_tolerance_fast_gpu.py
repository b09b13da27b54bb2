"""The lean tolerance check against the full passes on CUDA tensors (the judge's device):
the same verdict, reason and every metric, bit for bit, on the CPU suite's random corpus with
outputs on the GPU and the reference on the GPU or, as in the judge's host fallback, on the
host; and at a size with several default chunks and one NaN.
"""

from __future__ import annotations

import pytest
import torch

from evo.tasks import tolerance as T
from tests.test_tolerance_fast import TOLS, _case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _same(out, ref, tol, chunk, label):
    lean = T.check(out, ref, tol, chunk=chunk)
    full = T.check(out, ref, tol, chunk=chunk, lean=False)
    assert repr(lean) == repr(full), f"{label}\nlean: {lean}\nfull: {full}"
    return full


def test_lean_equals_full_on_cuda():
    g = torch.Generator().manual_seed(4321)
    for i in range(300):
        out, ref, name, chunk, label = _case(g, i)
        ref = ref if i % 2 else ref.cuda()
        _same(out.cuda(), ref, TOLS[name], chunk, f"{label} ref on {ref.device}")


def test_lean_equals_full_on_cuda_at_several_default_chunks():
    g = torch.Generator(device="cuda").manual_seed(1)
    n = (1 << 24) + 12345
    ref = torch.randn(n, dtype=torch.float64, device="cuda", generator=g)
    out = ref.float()
    assert _same(out, ref, T.FP32_ELEMENTWISE, 1 << 23, "finite")[0]
    out[n - 7] = float("nan")
    out[3] += 1.0
    assert not _same(out, ref, T.FP32_ELEMENTWISE, 1 << 23, "one NaN, one violation")[0]
