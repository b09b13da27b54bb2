"""3xTF32 fp32 GEMM template (evo/tasks/kernels/gemm_f32_3xtf32.cu), CPU-side checks only.

The template is NOT yet validated on a GPU (written in a session without device time); it is
not in ``GEMM_SEEDS``. :data:`KB01_3XTF32` is its seed spec for kb01_square-style inputs
(plain ``A[M, K] @ B[K, N]``, row-major, any M/N/K). What this module verifies:

* the rendered source passes ``evaluators.policy.check_policy``;
* tunables parse, each ``#ifndef`` default matches its annotation, the defaults satisfy every
  ``@constraint`` and the constraints reject configurations the static_asserts would;
* ONE real nvcc build for sm_90a through ``evaluators.compile.compile_candidate`` succeeds and
  ptxas reports no spills (cached under pytest's cache dir);
* the PTX of the default build holds ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``
  and ``cvt.rna.tf32.f32`` in the expected counts (3 MMAs per atom per k-block, 2 cvt per
  operand value) -- no ``cuobjdump`` here, so SASS is not inspected;
* a host-only C++ program built from the same source checks the kernel's CuTe layouts (default and smallest config): the
  accumulator partition covers the C tile exactly once and pairs adjacent columns (the
  float2 epilogue relies on it), the copy partitions cover the smem tiles exactly once, and
  the fragment loads of every warp hit 32 distinct shared-memory banks.

Not verified: numerical correctness, determinism and speed on a GPU. Validate with
``evo check`` as docs/kernels.md ("3xTF32 fp32 GEMM template") describes.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from evo.tasks.seedspec import TASK_CONFIG_MARKER, SeedSpec, render, template_source
from evo.tunables import check_tunable_defaults, parse_constraints, parse_tunables, violated_constraints

TEMPLATE = "gemm_f32_3xtf32"
KERNELS = Path(__file__).resolve().parents[1] / "evo" / "tasks" / "kernels"

#: Seed spec for kb01_square-style inputs (the template has no task-config defines: it
#: handles exactly the 2-D row-major ``A @ B`` contract). Not registered in GEMM_SEEDS until
#: it has passed ``evo check`` and been timed on a GPU.
KB01_3XTF32 = SeedSpec(TEMPLATE, (), "C = A @ B by 3xTF32 tensor-core MMA (m16n8k8), cp.async pipeline")

MMA_PTX = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
CVT_PTX = "cvt.rna.tf32.f32"


def _src() -> str:
    return render(KB01_3XTF32)


def _defaults() -> dict[str, str]:
    return {t.name: t.default for t in parse_tunables(_src())}


# ------------------------------------------------------------------------------------------
# static checks
# ------------------------------------------------------------------------------------------


def test_template_shape():
    raw = template_source(TEMPLATE)
    assert sum(line.strip() == TASK_CONFIG_MARKER for line in raw.splitlines()) == 1
    assert len(re.findall(r"\bevo_launch\s*\(", raw)) == 1
    assert '#include "evo_abi.h"' in raw
    assert "NOT YET VALIDATED ON A GPU" in raw
    assert "atomic" not in raw.replace("no atomics", "")
    assert "cudaMalloc" not in raw


def test_rendered_source_passes_policy():
    policy = pytest.importorskip("evaluators.policy")
    result = policy.check_policy(_src(), _defaults())
    assert result.status.value == "ok", result.reason


def test_tunables_and_constraints():
    src = _src()
    names = [t.name for t in parse_tunables(src)]
    assert names == ["BM", "BN", "BK", "STAGES", "WARPS_M", "WARPS_N", "GROUP_M", "MIN_BLOCKS"]
    assert check_tunable_defaults(src) == []
    assert parse_constraints(src)
    assert violated_constraints(src) == []
    # warp tile not a whole number of atoms
    assert violated_constraints(src, {"BM": "64", "WARPS_M": "4", "BN": "64", "WARPS_N": "4"}) == []
    assert violated_constraints(src, {"BN": "64", "WARPS_N": "4", "BM": "64", "WARPS_M": "4", "BK": "16"})
    # more than 128 accumulators per thread
    assert violated_constraints(src, {"WARPS_M": "1", "WARPS_N": "2"})
    # 4 stages of 128x128x32 at two CTAs per SM exceed the SM's shared memory
    assert violated_constraints(src, {"STAGES": "4", "MIN_BLOCKS": "2"})
    # tunable overrides render into both the annotation and the guard
    moved = render(SeedSpec(TEMPLATE, (), "x", (("STAGES", "4"), ("BK", "16"))))
    assert check_tunable_defaults(moved) == [] and violated_constraints(moved) == []


# ------------------------------------------------------------------------------------------
# real builds (cached)
# ------------------------------------------------------------------------------------------


def _toolchain():
    compile_mod = pytest.importorskip("evaluators.compile")
    from evaluators.base import CompileSettings

    try:
        nvcc = compile_mod.find_nvcc(CompileSettings())
        include = compile_mod.cutlass_include_dir()
    except (compile_mod.NvccNotFound, compile_mod.CutlassNotFound) as exc:
        pytest.skip(f"no toolchain: {exc}")
    return compile_mod, nvcc, include


def test_compiles_for_sm90a_without_spills(request):
    compile_mod, _, _ = _toolchain()
    from evaluators.base import CompileSettings
    from evo.records import Candidate

    cache = request.config.cache.mkdir("evo-seed-builds")
    settings = CompileSettings(cache_dir=str(cache), timeout_s=600)
    cand = Candidate.create(task="kb01_square", source=_src(), params=_defaults())
    outcome = compile_mod.compile_candidate(cand, settings)
    assert outcome.ok, outcome.result.reason + "\n" + outcome.result.artifacts.get("errors", "")
    assert outcome.so_bytes and outcome.so_bytes[:4] == b"\x7fELF"
    m = outcome.result.metrics
    assert len(m["kernels"]) == 2, m["kernels"]   # 16-byte and 4-byte cp.async instantiations
    assert m["spill_stores"] == 0 and m["spill_loads"] == 0, m
    assert m["stack_frame"] == 0, m
    assert 0 < m["registers"] <= 255


def _nvcc_cached(request, tag: str, args: list[str], source: str, suffix: str) -> str:
    """Run nvcc once per content hash; returns the output file's text (cached on success)."""
    _, nvcc, include = _toolchain()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    abi = (KERNELS / "evo_abi.h").read_text()
    key = hashlib.sha256("\0".join([source, abi, " ".join(args), version, str(include)]).encode()).hexdigest()[:24]
    cache = Path(request.config.cache.mkdir("evo-3xtf32"))
    out = cache / f"{tag}-{key}{suffix}"
    if not out.exists():
        cu = cache / f"{tag}-{key}.cu"
        cu.write_text(source)
        tmp = out.with_name(out.name + ".part")
        cmd = [nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-I{include}", f"-I{KERNELS}",
               *args, str(cu), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"nvcc failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
        tmp.rename(out)
    return out.read_text(errors="replace") if suffix == ".ptx" else str(out)


def test_ptx_uses_tf32_tensor_core_mma(request):
    ptx = _nvcc_cached(request, "ptx", ["-arch=sm_90a", "-ptx"], _src(), ".ptx")
    d = {k: int(v) for k, v in _defaults().items()}
    threads = 32 * d["WARPS_M"] * d["WARPS_N"]
    atoms = (d["BM"] * d["BN"]) // (16 * 8) // (threads // 32)      # atoms per warp per k-block
    kblocks = d["BK"] // 8
    a_vals = 4 * d["BM"] // (16 * d["WARPS_M"])                       # A fragment values / thread
    b_vals = 2 * d["BN"] // (8 * d["WARPS_N"])
    n_inst = 2                                                         # vector + scalar copy paths
    assert ptx.count(MMA_PTX) == n_inst * 3 * atoms * kblocks
    assert ptx.count(CVT_PTX) == n_inst * 2 * (a_vals + b_vals) * kblocks
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M), "atomics in the PTX"


HOST_CHECK = r"""
// Host-only check of the kernel's CuTe layouts (no GPU): includes the rendered kernel.
#include "KERNEL_FILE"
#include <cstdio>
#include <vector>
using namespace cute;
using namespace evo_3xtf32;

static int fails = 0;
#define EXPECT(c, ...) do { if (!(c)) { if (fails++ < 10) std::printf(__VA_ARGS__); } } while (0)

template <bool kVec> void check_copies() {
  auto sA = make_tensor(make_gmem_ptr((float*)nullptr), smem_layout_a());
  auto sB = make_tensor(make_gmem_ptr((float*)nullptr), smem_layout_b());
  std::vector<int> hitA(cosize(smem_layout_a()), 0), hitB(cosize(smem_layout_b()), 0);
  for (int t = 0; t < kThreads; ++t) {
    auto a = Copies<kVec>::copy_a().get_slice(t).partition_D(sA(_, _, 0));
    auto b = Copies<kVec>::copy_b().get_slice(t).partition_D(sB(_, _, 0));
    for (int i = 0; i < size(a); ++i) hitA[&a(i) - (float*)nullptr]++;
    for (int i = 0; i < size(b); ++i) hitB[&b(i) - (float*)nullptr]++;
    EXPECT(size<0>(a) == (kVec ? 4 : 1), "copy A vector width\n");
    for (int j = 0; j < size<1>(a) * size<2>(a) && kVec; ++j) {
      auto chunk = a(_, j % size<1>(a), j / size<1>(a));
      long off = &chunk(0) - (float*)nullptr;
      EXPECT(off % 4 == 0 && &chunk(3) - &chunk(0) == 3, "A chunk not 16B contiguous (thread %d)\n", t);
    }
    for (int j = 0; j < size<1>(b) * size<2>(b) && kVec; ++j) {
      auto chunk = b(_, j % size<1>(b), j / size<1>(b));
      long off = &chunk(0) - (float*)nullptr;
      EXPECT(off % 4 == 0 && &chunk(3) - &chunk(0) == 3, "B chunk not 16B contiguous (thread %d)\n", t);
    }
  }
  for (int m = 0; m < BM; ++m) for (int k = 0; k < BK; ++k)
    EXPECT(hitA[smem_layout_a()(m, k, 0)] == 1, "A copy covers (%d,%d) %d times\n", m, k, hitA[smem_layout_a()(m, k, 0)]);
  for (int n = 0; n < BN; ++n) for (int k = 0; k < BK; ++k)
    EXPECT(hitB[smem_layout_b()(n, k, 0)] == 1, "B copy covers (%d,%d) %d times\n", n, k, hitB[smem_layout_b()(n, k, 0)]);
}

int main() {
  auto mma = make_mma();
  auto cC = make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{}));
  auto sA = make_tensor(make_gmem_ptr((float*)nullptr), smem_layout_a());
  auto sB = make_tensor(make_gmem_ptr((float*)nullptr), smem_layout_b());
  std::vector<int> hitC(BM * BN, 0);
  for (int t = 0; t < kThreads; ++t) {
    auto thr = mma.get_slice(t);
    auto tc = thr.partition_C(cC);
    for (int i = 0; i < size(tc); ++i) hitC[get<0>(tc(i)) * BN + get<1>(tc(i))]++;
    for (int mi = 0; mi < size<1>(tc); ++mi) for (int ni = 0; ni < size<2>(tc); ++ni) {
      for (int v = 0; v < 4; v += 2) {
        auto c0 = tc(v, mi, ni); auto c1 = tc(v + 1, mi, ni);
        EXPECT(get<0>(c1) == get<0>(c0) && get<1>(c1) == get<1>(c0) + 1 && get<1>(c0) % 2 == 0,
               "accumulator values %d,%d are not an even column pair (thread %d)\n", v, v + 1, t);
      }
    }
  }
  for (int i = 0; i < BM * BN; ++i) EXPECT(hitC[i] == 1, "C element %d owned %d times\n", i, hitC[i]);
  // Bank conflicts of the fragment loads: per warp, value, tile and k-block, 32 distinct banks.
  for (int w = 0; w < kThreads / 32; ++w) {
    auto a0 = mma.get_slice(32 * w).partition_A(sA);
    auto b0 = mma.get_slice(32 * w).partition_B(sB);
    for (int i = 0; i < size<0>(a0) * size<1>(a0) * size<2>(a0); ++i) {
      unsigned mask = 0;
      for (int l = 0; l < 32; ++l) {
        auto a = mma.get_slice(32 * w + l).partition_A(sA);
        long off = &a(i % size<0>(a0), (i / size<0>(a0)) % size<1>(a0), i / (size<0>(a0) * size<1>(a0)), 0) - (float*)nullptr;
        mask |= 1u << (off % 32);
      }
      EXPECT(mask == 0xffffffffu, "A fragment load %d of warp %d has bank conflicts (mask %08x)\n", i, w, mask);
    }
    for (int i = 0; i < size<0>(b0) * size<1>(b0) * size<2>(b0); ++i) {
      unsigned mask = 0;
      for (int l = 0; l < 32; ++l) {
        auto b = mma.get_slice(32 * w + l).partition_B(sB);
        long off = &b(i % size<0>(b0), (i / size<0>(b0)) % size<1>(b0), i / (size<0>(b0) * size<1>(b0)), 0) - (float*)nullptr;
        mask |= 1u << (off % 32);
      }
      EXPECT(mask == 0xffffffffu, "B fragment load %d of warp %d has bank conflicts (mask %08x)\n", i, w, mask);
    }
  }
  check_copies<true>();
  check_copies<false>();
  std::printf("%s %d\n", fails ? "FAIL" : "OK", fails);
  return fails ? 1 : 0;
}
"""

# The default config plus the smallest one (one warp, BK = 16, BN = 64: other paddings and
# copy layouts), so the layout claims hold beyond the defaults.
LAYOUT_CONFIGS = {
    "default": {},
    "small": {"BM": "64", "BN": "64", "BK": "16", "STAGES": "2", "WARPS_M": "1", "WARPS_N": "1"},
}


def test_host_layout_check(request):
    src = _src()
    for name, params in LAYOUT_CONFIGS.items():
        assert violated_constraints(src, params) == [], (name, violated_constraints(src, params))
    cache = Path(request.config.cache.mkdir("evo-3xtf32"))
    kernel = cache / ("kernel-" + hashlib.sha256(src.encode()).hexdigest()[:16] + ".cu")
    kernel.write_text(src)
    program = HOST_CHECK.replace("KERNEL_FILE", str(kernel))
    exes = []
    for name, params in LAYOUT_CONFIGS.items():
        args = ["-arch=sm_90a", *[f"-D{k}={v}" for k, v in params.items()]]
        exes.append((name, _nvcc_cached(request, f"host-{name}", args, program, "")))
    for name, exe in exes:
        proc = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip().startswith("OK"), (name, proc.stdout, proc.stderr)
