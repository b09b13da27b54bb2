"""The optional workspace of the kernel ABI (evo_abi.h, "device scratch"), end to end on the CPU.

A host-only test double built by nvcc exports ``evo_workspace_bytes`` and an ``evo_launch``
that reports, into its float32 output, what it received: the caller must append exactly one
uint8 tensor of the asked size, filled with 0xFF on every call (so nothing survives from one
call to the next), and nothing when the kernel asks for 0 bytes or does not export the symbol.
Then the real bf16 GEMM template: it asks for a padded copy of unaligned operands and for
nothing when TMA can read them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from evaluators import abi

ROOT = Path(__file__).resolve().parents[1]
ABI_DIR = ROOT / "evaluators" / "abi"

DOUBLE = r"""
#include <cstring>
#include "evo_abi.h"
#ifdef WITH_WORKSPACE
// asks for 4 bytes per input element + 3 (an odd size on purpose); none for an empty input
EVO_EXPORT int64_t evo_workspace_bytes(const EvoTensor* in, int n_in, const EvoTensor* out, int n_out,
                                       const double*, int) {
  if (n_in != 1 || n_out != 1) return -1;
  const int64_t n = evo_numel(in[0]);
  return n ? n * 4 + 3 : 0;
}
#endif
// out[0] (float32, host memory here): n_out, then the workspace's dtype, ndim, bytes,
// whether every byte is 0xFF; it then zeroes the workspace (a later call must not see that).
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double*, int, cudaStream_t) {
  float* r = static_cast<float*>(out[0].data);
  r[0] = float(n_out);
  if (n_out == 2) {
    const EvoTensor& w = out[1];
    const unsigned char* b = static_cast<const unsigned char*>(w.data);
    bool poisoned = true;
    for (int64_t i = 0; i < w.shape[0]; ++i) poisoned = poisoned && b[i] == 0xFF;
    r[1] = float(w.dtype);
    r[2] = float(w.ndim);
    r[3] = float(w.shape[0]);
    r[4] = poisoned ? 1.f : 0.f;
    std::memset(w.data, 0, size_t(w.shape[0]));
  }
  return 0;
}
"""


def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("nvcc not found")
    return nvcc


@pytest.fixture(scope="module")
def doubles(tmp_path_factory) -> dict[str, Path]:
    nvcc = _nvcc()
    d = tmp_path_factory.mktemp("ws")
    src = d / "double.cu"
    src.write_text(DOUBLE)
    out = {}
    for name, flags in (("with", ["-DWITH_WORKSPACE"]), ("without", [])):
        so = d / f"{name}.so"
        subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", f"-I{ABI_DIR}", *flags, str(src), "-o", str(so)],
                       check=True, capture_output=True, timeout=300)
        out[name] = so
    return out


def test_workspace_is_appended_poisoned_on_every_call(doubles):
    lib = abi.load_kernel(doubles["with"])
    x = torch.zeros(10)
    assert lib.workspace_bytes([x], [torch.zeros(8)], []) == 43
    for _ in range(2):   # the double zeroes its workspace; the next call must get 0xFF again
        r = torch.zeros(8)
        assert lib.launch([x], [r], [], 0) == 0
        assert r[:5].tolist() == [2.0, 6.0, 1.0, 43.0, 1.0]


def test_given_workspace_is_used_and_checked(doubles):
    lib = abi.load_kernel(doubles["with"])
    x, r = torch.zeros(10), torch.zeros(8)
    ws = lib.make_workspace([x], [r], [])
    assert ws.dtype == torch.uint8 and ws.numel() == 43 and bool((ws == abi.WORKSPACE_POISON).all())
    assert lib.launch([x], [r], [], 0, ws) == 0 and r[0] == 2.0
    assert not bool(ws.any()), "the kernel wrote the tensor the caller gave"
    with pytest.raises(ValueError, match="asks for 43"):
        lib.launch([x], [r], [], 0, torch.zeros(42, dtype=torch.uint8))


def test_no_workspace_when_none_is_asked_or_exported(doubles):
    lib = abi.load_kernel(doubles["with"])
    r = torch.zeros(8)
    assert lib.make_workspace([torch.zeros(0)], [r], []) is None
    assert lib.launch([torch.zeros(0)], [r], [], 0) == 0 and r[0] == 1.0
    # a negative answer (inputs outside the contract) is no workspace: evo_launch then decides
    assert lib.workspace_bytes([torch.zeros(1), torch.zeros(1)], [r], []) == 0
    plain = abi.load_kernel(doubles["without"])
    r = torch.zeros(8)
    assert plain.workspace_bytes([torch.zeros(10)], [r], []) == 0
    assert plain.launch([torch.zeros(10)], [r], [], 0) == 0 and r[0] == 1.0


@pytest.mark.slow
def test_bf16_gemm_asks_for_padded_operands_only_when_unaligned(request, tmp_path):
    """The template's evo_workspace_bytes (pure host code) against the documented formula:
    A and B copied with row strides rounded up to PAD_LD (64) elements, each copy 256-byte
    rounded; 0 where TMA reads the operands directly, -1 (reported 0) for a shape mismatch.
    The seed is built with its defaults into the suite's shared build cache (tests/toolchain.py)."""
    from toolchain import compile_shared

    from evo.tasks.gemm_seeds import GEMM_SEEDS
    from evo.tasks.seedspec import render

    src = render(GEMM_SEEDS["gemm_bf16_irregular"])
    so = tmp_path / "irr.so"
    so.write_bytes(compile_shared(request, "gemm_bf16_irregular", src, {}, timeout_s=900).so_bytes)
    lib = abi.load_kernel(so)

    def bf16(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16)

    def r256(n):
        return (n + 255) // 256 * 256

    M, K, N = 8205, 2949, 5921
    assert lib.workspace_bytes([bf16(M, K), bf16(K, N)], [bf16(M, N)], []) == \
        r256(M * 3008 * 2) + r256(K * 5952 * 2)
    assert lib.workspace_bytes([bf16(256, 512), bf16(512, 384)], [bf16(256, 384)], []) == 0
    ins, n_in, outs, n_out, sc, n_sc = abi._pack([bf16(M, K), bf16(K + 1, N)], [bf16(M, N)], [])
    assert lib._workspace_bytes(ins, n_in, outs, n_out, sc, n_sc) == -1
