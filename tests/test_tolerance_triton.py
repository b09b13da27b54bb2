"""The Triton tolerance kernels against the eager passes, on the CPU through Triton's
interpreter (TRITON_INTERPRET=1) where Triton is installed, on a GPU in tests/gpu. CI has no
Triton (the CPU torch build does not bring it), so these are skipped there; the GPU session
runs them natively."""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from evo.tasks import tolerance as tl  # noqa: E402
from evo.tasks import tolerance_triton as tt  # noqa: E402
from evo.tasks.tolerance import BF16_ELEMENTWISE, FP32_ELEMENTWISE, Tolerance, check  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu] if DEV == "cuda" else []   # selected by the GPU runs' `-m gpu`


def test_self_check_passes():
    tt.self_check(DEV)


@pytest.mark.parametrize("case", range(12))
def test_verdicts_and_exact_metrics_match_the_eager_check(case):
    g = torch.Generator().manual_seed(case)
    n = int(torch.randint(1, 3 * tt.BLOCK, (1,), generator=g))
    ref = torch.randn(n, generator=g, dtype=torch.float64) * (10.0 ** (case % 5 - 2))
    out = ref.to(torch.float32 if case % 3 else torch.bfloat16)
    if case % 4 == 1:
        out[int(torch.randint(0, n, (1,), generator=g))] += 1.0
    if case % 6 == 2:
        out[n // 2] = float("nan")
    if case % 6 == 3 and n > 2:
        ref[1], out[1] = float("inf"), float("inf")
    tol = BF16_ELEMENTWISE if out.dtype == torch.bfloat16 else FP32_ELEMENTWISE
    ref, out = ref.to(DEV), out.to(DEV)
    want = check(out, ref, tol, lean=False, chunk=1000)
    got = check(out, ref, tol, fused="triton", chunk=1000)
    assert got[0] == want[0]
    for k in ("numel", "n_nonfinite", "n_violations", "worst_index", "max_abs_err"):
        assert got[2][k] == want[2][k], k
    for k in ("rel_l2", "ref_rms", "worst_ratio"):
        a, b = got[2][k], want[2][k]
        assert (a == b) or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9), k


def test_a_degenerate_bound_is_checked_eagerly():
    ref = torch.randn(100, dtype=torch.float64).to(DEV)
    out = ref.to(torch.float32)
    tol = Tolerance(atol=float("nan"), rtol=0.0, rel_l2=1.0)
    got, want = check(out, ref, tol, fused="triton"), check(out, ref, tol, lean=False)
    assert got[:2] == want[:2] and math.isnan(got[2]["worst_ratio"]) and math.isnan(want[2]["worst_ratio"])
    assert got[2]["worst_index"] == want[2]["worst_index"] and not tl._FUSED_BROKEN
