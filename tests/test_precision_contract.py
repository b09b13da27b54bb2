"""EVALUATION.md: fp32 tasks are strict, yet error-compensated tensor-core schemes that stay
within fp32 accuracy are legitimate. The calibrated GEMM tolerances must therefore admit
3xTF32 and bf16x6 (split operands, products of the significant terms, fp32 accumulation)
and reject plain TF32 and bf16, on every fp32 GEMM task. Simulated on the CPU with exact
operand splitting and fp32 matmuls (the GPU's tensor cores round inside the MMA, which this
does not model; the margin below, ~50x, leaves room for that)."""

from __future__ import annotations

import pytest
import torch

import evo.tasks as T
from evo.tasks.tolerance import check

FP32_GEMMS = ["kb01_square", "kb02_standard", "kb03_bmm", "kb06_large_k", "kb07_small_k", "kb08_irregular",
              "kb09_tall_skinny", "kb10_3d", "kb11_4d", "kb13_symmetric", "kb16_trans_a", "kb17_trans_b",
              "kb18_trans_both"]


def tf32(x: torch.Tensor) -> torch.Tensor:
    i = x.contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def three_tf32(a: torch.Tensor, b: torch.Tensor, op) -> torch.Tensor:
    ah, bh = tf32(a), tf32(b)
    al, bl = tf32(a - ah), tf32(b - bh)
    return op(ah, bh) + (op(ah, bl) + op(al, bh))


def six_bf16(a: torch.Tensor, b: torch.Tensor, op) -> torch.Tensor:
    a1, b1 = bf16(a), bf16(b)
    a2, b2 = bf16(a - a1), bf16(b - b1)
    a3, b3 = bf16(a - a1 - a2), bf16(b - b1 - b2)
    return op(a1, b1) + (op(a1, b2) + op(a2, b1)) + (op(a1, b3) + op(a2, b2) + op(a3, b1))


def _smallest(task):
    return min(task.shapes, key=lambda s: task.flops(s))


@pytest.mark.parametrize("name", FP32_GEMMS)
def test_compensated_schemes_pass_plain_low_precision_fails(name):
    task = T.get_task(name)
    shape = _smallest(task)
    g = torch.Generator().manual_seed(3)
    a, b = task.make_inputs(shape, g, "normal", "cpu")
    ref = task.reference(a.double(), b.double())
    op = task.reference  # applies the task's layout (transposes, batch, einsum)
    for label, out in {"3xtf32": three_tf32(a, b, op), "bf16x6": six_bf16(a, b, op)}.items():
        ok, why, m = check(out, ref, task.tolerance, dtype="float32")
        assert ok, (label, why)
        assert m["rel_l2"] * 20 < task.tolerance.rel_l2, (label, m["rel_l2"], task.tolerance.rel_l2)
    for label, out in {"tf32": op(tf32(a), tf32(b)), "bf16": op(bf16(a), bf16(b))}.items():
        ok, _, _ = check(out, ref, task.tolerance, dtype="float32")
        assert not ok, f"{label} passed the strict fp32 tolerance of {name}"


def test_three_tf32_at_a_deep_k():
    """K = 8192 (kb02's depth): the bound grows with sqrt(K); 3xTF32 stays ~50x inside it."""
    task = T.get_task("kb02_standard")
    g = torch.Generator().manual_seed(4)
    a = torch.randn(48, 8192, generator=g)
    b = torch.randn(8192, 40, generator=g)
    ref = a.double() @ b.double()
    ok, why, m = check(three_tf32(a, b, torch.matmul), ref, task.tolerance, dtype="float32")
    assert ok and m["rel_l2"] * 20 < task.tolerance.rel_l2, (why, m)
