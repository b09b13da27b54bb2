"""The padded-operand workspace of the 3xTF32 template (``PAD = 1`` with ``WGMMA = 1``), CPU only.

``evo_workspace_bytes`` and the workspace checks of ``evo_launch`` are pure host code (one
shared planning function, ``make_plan``), so a real sm_90a build of a seed can be loaded with
:func:`evaluators.abi.load_kernel` and asked on a machine without a GPU: CPU torch tensors
stand in for the device tensors (only their pointers' alignment is read, nothing is
dereferenced). The calls below never reach a kernel launch.

Workspace bytes: for each operand TMA cannot read in place (contiguous extent not a multiple of
4 floats, or base not 16-byte aligned), ``round_up(rows * round_up(cols, PAD_LD) * 4, 256)`` with
``cols`` its contiguous extent and ``rows`` its stored rows over all batches; A's copy first.
Not verified here: that the padded path computes the right C on a GPU, and its speed (the GPU
checks of the seeds do that: benchmarks/lab/probes/f32_3xtf32_pad.json, tests/gpu/).
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import pytest

from evo.tasks.gemm_seeds import F32_3XTF32_SEEDS
from evo.tasks.seedspec import render
from evo.core.tunables import parse_tunables, violated_constraints

torch = pytest.importorskip("torch")
abi = pytest.importorskip("evaluators.abi")

INVALID = 1   # cudaErrorInvalidValue

#: kb08_irregular's benchmark shape (evo/tasks/kernelbench.py).
M8, N8, K8 = 8205, 5921, 2949


def _ru(x: int, m: int) -> int:
    return (x + m - 1) // m * m


PAD_LD = 32   # the template's default: 128-byte padded rows


def _copy_bytes(rows: int, cols: int) -> int:
    return _ru(rows * _ru(cols, PAD_LD) * 4, 256)


def _build(request, task: str, **overrides: str):
    """A seed's .so (its tunable defaults plus ``overrides``), built once per pytest cache."""
    from toolchain import build_cache, compile_shared

    src = render(F32_3XTF32_SEEDS[task])
    params = {t.name: t.default for t in parse_tunables(src)} | overrides
    assert violated_constraints(src, params) == []
    cache = build_cache(request)
    outcome = compile_shared(request, task, src, params)
    m = outcome.result.metrics
    assert m["spill_stores"] == 0 and m["spill_loads"] == 0 and m["stack_frame"] == 0, m
    key = hashlib.sha256(outcome.so_bytes).hexdigest()[:16]   # a new build never reuses a dlopened path
    so = Path(cache) / f"ws-{task}-{key}.so"
    so.write_bytes(outcome.so_bytes)
    return abi.load_kernel(so), params


@pytest.fixture(scope="module")
def kb08(request):
    lib, params = _build(request, "kb08_irregular")
    assert params["WGMMA"] == "1" and params["PAD"] == "1"
    return lib


def _raw(lib, inputs, outputs) -> int:
    """evo_workspace_bytes itself (KernelLibrary.workspace_bytes reports a negative as 0)."""
    return int(lib._workspace_bytes(*abi._pack(inputs, outputs, [])))


def _launch(lib, inputs, outputs) -> int:
    """evo_launch with exactly these outputs (only for calls it must reject on the host)."""
    return int(lib._launch(*abi._pack(inputs, outputs, []), ctypes.c_void_p(0)))


def _shifted(*shape: int) -> torch.Tensor:
    """A contiguous fp32 tensor whose data pointer is 4 bytes past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    base = torch.empty(n + 4)
    off = next(i for i in range(4) if (base.data_ptr() + 4 * i) % 16 == 4)
    t = base[off:off + n].view(*shape)
    assert t.data_ptr() % 16 == 4 and t.is_contiguous()
    return t


@pytest.mark.slow
def test_kb08_shape_asks_for_both_padded_copies(kb08):
    a, b, c = torch.empty(M8, K8), torch.empty(K8, N8), torch.empty(M8, N8)
    assert a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    # A [M, K]: K = 2949 -> 2976 floats a row (PAD_LD 32), 97_672_320 bytes -> 97_672_448 (256-byte
    # multiple); B [K, N]: N = 5921 -> 5952 floats a row, 70_209_792 bytes; B's copy at 97_672_448
    want = _copy_bytes(M8, K8) + _copy_bytes(K8, N8)
    assert 8205 * 2976 * 4 == 97_672_320 and 2949 * 5952 * 4 == 70_209_792
    assert want == 97_672_448 + 70_209_792 == 167_882_240
    assert kb08.workspace_bytes([a, b], [c], []) == want
    assert _raw(kb08, [a, b], [c]) == want
    # evo_launch rejects the call without the workspace, or with a wrong one (host checks only)
    assert _launch(kb08, [a, b], [c]) == INVALID
    assert _launch(kb08, [a, b], [c, torch.empty(want - 16, dtype=torch.uint8)]) == INVALID
    assert _launch(kb08, [a, b], [c, torch.empty(want // 4, dtype=torch.float32)]) == INVALID
    assert _launch(kb08, [a, b], [c, torch.empty(2, want // 2, dtype=torch.uint8)]) == INVALID
    ws = torch.empty(want + 16, dtype=torch.uint8)
    assert _launch(kb08, [a, b], [c, ws[4:4 + want]]) == INVALID          # 4-byte aligned
    assert _launch(kb08, [a, b], [c, ws, ws]) == INVALID


@pytest.mark.slow
def test_only_the_operand_that_needs_it_is_copied(kb08):
    # N = 5921 unaligned only: B's copy alone
    a, b, c = torch.empty(256, 512), torch.empty(512, N8), torch.empty(256, N8)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(512, N8)
    # K = 2949 unaligned, N = 384 aligned: A [M, K] needs a copy, B [K, N] does not
    a, b, c = torch.empty(300, K8), torch.empty(K8, 384), torch.empty(300, 384)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(300, K8)
    # aligned extents, A's base 4 bytes off a 16-byte boundary: A copied with its own row stride
    a, b, c = _shifted(256, 256), torch.empty(256, 256), torch.empty(256, 256)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(256, 256) == 256 * 256 * 4
    # a copy's size is rounded up to 256 bytes: 3 x 5 -> 3 rows of 32 floats = 384 -> 512 bytes
    a, b, c = torch.empty(3, 5), torch.empty(5, 8), torch.empty(3, 8)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(3, 5) == 512


@pytest.mark.slow
def test_tma_legal_and_degenerate_shapes_need_no_workspace(kb08):
    a, b, c = torch.empty(256, 256), torch.empty(256, 256), torch.empty(256, 256)
    assert _raw(kb08, [a, b], [c]) == 0
    assert _launch(kb08, [a, b], [c, torch.empty(256, dtype=torch.uint8)]) == INVALID   # none asked
    # K = 0 runs the mma.sync kernel (it writes the zeros); M = 0 launches nothing. (Strides
    # given explicitly: torch reports (1, 1) for an empty (3, 0) tensor, which
    # evo_is_contiguous does not accept.)
    a0, b0 = torch.empty_strided((3, 0), (0, 1)), torch.empty_strided((0, 5), (5, 1))
    assert _raw(kb08, [a0, b0], [torch.empty(3, 5)]) == 0
    assert _raw(kb08, [torch.empty_strided((0, 7), (7, 1)), torch.empty(7, 5)],
                [torch.empty_strided((0, 5), (5, 1))]) == 0


@pytest.mark.slow
def test_batched_and_folded_operands(kb08):
    # bmm (kb03's layout): A [L, M, K], B [L, K, N]; rows cover every batch
    L, M, N, K = 3, 129, 383, 97
    a, b, c = torch.empty(L, M, K), torch.empty(L, K, N), torch.empty(L, M, N)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(L * M, K) + _copy_bytes(L * K, N)
    # leading dims of A folded into M (kb10's layout): A [B, M, K] @ B [K, N]
    a, b, c = torch.empty(2, 65, 1031), torch.empty(1031, 257), torch.empty(2, 65, 257)
    assert kb08.workspace_bytes([a, b], [c], []) == _copy_bytes(130, 1031) + _copy_bytes(1031, 257)


@pytest.mark.slow
def test_mismatched_inputs_give_a_negative_answer(kb08):
    a, b = torch.empty(M8, K8), torch.empty(K8, N8)
    bad_c = torch.empty(M8, N8 + 1)
    assert _raw(kb08, [a, b], [bad_c]) < 0
    assert kb08.workspace_bytes([a, b], [bad_c], []) == 0          # reported as 0 ...
    assert _launch(kb08, [a, b], [bad_c]) == INVALID                # ... evo_launch says why
    assert _raw(kb08, [a, torch.empty(K8 + 1, N8)], [torch.empty(M8, N8)]) < 0
    assert _raw(kb08, [a.double(), b.double()], [torch.empty(M8, N8, dtype=torch.float64)]) < 0
    assert _raw(kb08, [a.t(), b], [torch.empty(K8, N8)]) < 0        # not contiguous
    assert _raw(kb08, [a], [torch.empty(M8, N8)]) < 0


@pytest.mark.slow
def test_transposed_operands_pad_their_contiguous_dim(request):
    # kb18: A stored [K, M] (M contiguous), B stored [N, K] (K contiguous)
    lib, _ = _build(request, "kb18_trans_both")
    a, b, c = torch.empty(K8, M8), torch.empty(N8, K8), torch.empty(M8, N8)
    assert lib.workspace_bytes([a, b], [c], []) == _copy_bytes(K8, M8) + _copy_bytes(N8, K8)
    # M = 8208 is aligned, so only B needs a copy
    a, c = torch.empty(K8, 8208), torch.empty(8208, N8)
    assert lib.workspace_bytes([a, b], [c], []) == _copy_bytes(N8, K8)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    {"PAD": "0"},
    # kb08 renders as kb01: tests/test_gemm_3xtf32.py::test_ptx_uses_tf32_tensor_core_mma[0] reads
    # this build's PTX, on the same worker (the group), so neither waits for the other's build
    pytest.param({"WGMMA": "0"}, marks=pytest.mark.xdist_group("kb01_mma_sync_build")),
])
def test_without_pad_or_wgmma_no_workspace(request, overrides):
    lib, _ = _build(request, "kb08_irregular", **overrides)
    a, b, c = torch.empty(M8, K8), torch.empty(K8, N8), torch.empty(M8, N8)
    assert _raw(lib, [a, b], [c]) == 0
    assert _raw(lib, [a, b], [torch.empty(M8, N8 + 1)]) < 0        # same validation either way


@pytest.mark.slow
def test_split_ws_without_a_device_does_not_split(request):
    """kb06's seed (SPLIT_WS = 1) sizes its partial tiles by the device's SM count. Where no
    device can be queried (this machine), evo_workspace_bytes and evo_launch's plan agree on no
    split: the kb06 shape asks for no workspace and a workspace is rejected. On an H200 the same
    call asks for 4 tiles x 33 slices x 64 KB (docs/kernels.md; the slice count itself is pinned
    by tests/test_gemm_3xtf32.py::test_split_ws_slice_count)."""
    from evaluators.pipeline import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present: the split follows its SM count (checked by evo bench on the GPU)")
    lib, params = _build(request, "kb06_large_k")
    assert params["SPLIT_WS"] == "1" and params["WGMMA"] == "1"
    a, b, c = torch.empty(256, 524288), torch.empty(524288, 256), torch.empty(256, 256)
    assert _raw(lib, [a, b], [c]) == 0
    assert _launch(lib, [a, b], [c, torch.empty(4 * 33 * 128 * 128 * 4, dtype=torch.uint8)]) == INVALID
