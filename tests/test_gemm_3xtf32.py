"""3xTF32 fp32 GEMM template (evo/tasks/kernels/gemm_f32_3xtf32.cu), CPU-side checks only.

Its seeds are :data:`evo.tasks.gemm_seeds.F32_3XTF32_SEEDS`, one per strict-fp32 GEMM task
(same task-config defines as ``gemm_f32``: ``TRANS_A``, ``TRANS_B``, ``EPILOGUE``), and they are
the registry's strict-fp32 seeds (validated on an H200 by benchmarks/lab/probes/f32_3xtf32.json;
GPU checks run in every search and ``evo bench``). What this module verifies on the CPU:

* every seed's rendered source passes ``evaluators.policy.check_policy``, its tunables parse,
  each ``#ifndef`` default matches its annotation and the defaults satisfy every
  ``@constraint``; the constraints reject what the static_asserts or the register budget would;
* every distinct seed builds for sm_90a through ``evaluators.compile.compile_candidate`` (both
  cp.async instantiations) with ptxas reporting no spills and no stack frame (slow, cached in
  pytest's cache dir), and so do the worst-case tunable combinations of each register class
  (:data:`EXTREME_CONFIGS`: largest warp tile at the tightest register cap, with the options
  that cost registers: transposed operands, split-K, triangular epilogue, PTX cvt);
* the PTX holds ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` 3 times per atom per
  k-block and, with ``TF32_CVT=1``, ``cvt.rna.tf32.f32`` twice per operand value (the default
  integer rounding is checked bit-for-bit against a cvt.rna model in Python);
* a host-only C++ program built from the template checks the CuTe layouts of both smem kinds
  of each operand (TRANS_A = TRANS_B = 0 and = 1; a mixed pair repeats their checks) for the
  default, the smallest and a wide tile config: the accumulator partition covers the
  C tile once in even column pairs (float2 epilogue), the copy partitions cover each smem stage
  once with 16-byte chunks, and every fragment load of every warp hits 32 distinct banks.

Not verified: numerical correctness, determinism and speed on a GPU; that is
``benchmarks/lab/probes/f32_3xtf32.json`` (see docs/kernels.md, "3xTF32 fp32 GEMM template").

``WGMMA = 1`` (the Hopper TMA + RS-wgmma kernel; validated on an H200, the default of the
seeds it serves): the template keeps all of it in ``#if WGMMA`` blocks; the constraint admits
BM, BN in {64, 128} and the stages that fit (an M-major A also keeps a transposed copy); two
builds (kb01, and kb18 with BM = 64, 3 stages, PTX cvt) have no spills and no wgmma
serialisation; the SASS holds 12 HGMMA per k-tile (skipped without cuobjdump); a host-only
program checks the hand-coded fragment, producer-transform and accumulator mappings (coverage,
k-slot permutation, 16-byte contiguity, the XOR chunk addressing of SW128 rows, bank
conflicts) for both A kinds and both B stage kinds. GPU check:
``benchmarks/lab/probes/f32_3xtf32_producer_split.json``.

``PAD = 1`` (default; WGMMA = 1 only): operands TMA cannot read in place are copied into a
row-padded workspace first (a fourth kernel, ``pad_rows_kernel``, in every WGMMA = 1 build);
its host side (``evo_workspace_bytes``, the workspace checks) is tested in
tests/test_workspace_f32.py. Not yet run on a GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
import subprocess

import pytest

from evo.tasks.gemm_seeds import F32_3XTF32_SEEDS, F32_FFMA_SEEDS, FP32_GEMM_TASKS, GEMM_F32_3XTF32_TEMPLATE
from evo.tasks.seedspec import TASK_CONFIG_MARKER, SeedSpec, render, template_source
from evo.core.tunables import check_tunable_defaults, parse_constraints, parse_tunables, violated_constraints

TEMPLATE = GEMM_F32_3XTF32_TEMPLATE

#: The kb01_square seed (kept under this name for the validation recipe in docs/kernels.md).
KB01_3XTF32 = F32_3XTF32_SEEDS["kb01_square"]

MMA_PTX = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
CVT_PTX = "cvt.rna.tf32.f32"

TUNABLES = ["BM", "BN", "BK", "STAGES", "WARPS_M", "WARPS_N", "GROUP_M", "SPLIT_K", "EPI_SMEM", "MIN_BLOCKS",
            "TF32_CVT", "PROMOTE", "WGMMA", "PERSIST", "PAD", "PAD_LD", "TMA_STORE", "SPLIT_WS"]


def _src(task: str | None = None) -> str:
    """A seed's rendered source; without a task, kb01 on the mma.sync kernel (WGMMA = 0), the
    configuration the generic template checks below are about (kb01's seed itself uses WGMMA = 1)."""
    if task is None:
        spec = F32_3XTF32_SEEDS["kb01_square"]
        tun = tuple((k, "0" if k == "WGMMA" else v) for k, v in spec.tunable_defaults)
        return render(dataclasses.replace(spec, tunable_defaults=tun))
    return render(F32_3XTF32_SEEDS[task])


def _defaults(src: str) -> dict[str, str]:
    return {t.name: t.default for t in parse_tunables(src)}


def _config_src(trans_a: int = 0, trans_b: int = 0, epilogue: int = 0) -> str:
    defines = (("TRANS_A", str(trans_a)), ("TRANS_B", str(trans_b)), ("EPILOGUE", str(epilogue)))
    return render(SeedSpec(TEMPLATE, defines, "test config"))


# ------------------------------------------------------------------------------------------
# static checks
# ------------------------------------------------------------------------------------------


def test_template_shape():
    raw = template_source(TEMPLATE)
    assert sum(line.strip() == TASK_CONFIG_MARKER for line in raw.splitlines()) == 1
    assert len(re.findall(r"\bevo_launch\s*\(", raw)) == 1
    assert '#include "evo_abi.h"' in raw
    assert "History:" in raw     # the first Hopper design's race stays documented where it was
    # everything of the Hopper path is compiled only with WGMMA = 1: without the #if WGMMA
    # blocks no code line mentions it (WGMMA = 0 builds exactly the validated mma.sync kernel).
    # Blocks: includes, the kernel, the host plan's Hopper/PAD part, the Hopper launch.
    blocks = re.findall(r"^#if WGMMA\n.*?^#endif", raw, re.S | re.M)
    assert len(blocks) == 4 and not any(re.search(r"^#if", b[3:], re.M) for b in blocks)
    rest = re.sub(r"^#if WGMMA\n.*?^#endif", "", raw, flags=re.S | re.M)
    code = "\n".join(line.split("//")[0] for line in rest.splitlines())
    guards = ("#ifndef WGMMA\n#define WGMMA 0", "#ifndef TMA_STORE\n#define TMA_STORE 0")
    for g in guards:
        code = code.replace(g, "")
    assert not re.search(r"wgmma|wg::|tma|WGMMA", code, re.I)
    assert "atomic" not in raw.replace("no atomics", "")
    for banned in ("cudaMalloc", "cudaFree", "cudaStreamCreate", "cudaEventCreate"):
        assert banned not in raw


def test_seed_table_mirrors_the_fp32_gemm_seeds():
    assert set(F32_3XTF32_SEEDS) == set(FP32_GEMM_TASKS)
    for task, spec in F32_3XTF32_SEEDS.items():
        assert spec.template == TEMPLATE
        # same task config as the FFMA seed: same tensors, same layouts, same epilogue
        assert dict(spec.defines) == dict(F32_FFMA_SEEDS[task].defines), task
    assert dict(F32_3XTF32_SEEDS["kb06_large_k"].tunable_defaults)["SPLIT_WS"] == "1"   # one wave of slices
    assert dict(F32_3XTF32_SEEDS["kb09_tall_skinny"].tunable_defaults)["EPI_SMEM"] == "1"


@pytest.mark.parametrize("task", sorted(F32_3XTF32_SEEDS))
def test_rendered_seed_passes_policy_and_constraints(task):
    policy = pytest.importorskip("evaluators.policy")
    src = _src(task)
    result = policy.check_policy(src, _defaults(src))
    assert result.status.value == "ok", result.reason
    assert [t.name for t in parse_tunables(src)] == TUNABLES
    assert check_tunable_defaults(src) == []
    assert violated_constraints(src) == []
    for name, value in F32_3XTF32_SEEDS[task].tunable_defaults:
        assert _defaults(src)[name] == value


def test_constraints():
    src = _src()
    assert parse_constraints(src)
    ok = lambda **kw: violated_constraints(src, {k: str(v) for k, v in kw.items()}) == []  # noqa: E731
    assert ok(BM=64, BN=64, WARPS_M=2, WARPS_N=2, SPLIT_K=8)
    assert ok(BM=64, BN=128, WARPS_M=2, WARPS_N=4, MIN_BLOCKS=2)          # 32 x 32 warp tiles, 128 regs
    assert not ok(MIN_BLOCKS=2)                                              # 64 x 32 warp tiles at 128 regs
    assert not ok(BM=128, BN=128, WARPS_M=2, WARPS_N=2)                      # 64 x 64 warp tile: 128 acc
    assert not ok(BM=256, BN=128, WARPS_M=4, WARPS_N=4)                      # 64 x 32 at 512 threads
    assert not ok(BM=256, BN=256, WARPS_M=4, WARPS_N=4)
    assert not ok(BM=128, BN=64, BK=16, WARPS_M=4, WARPS_N=4)                # a stage < one chunk/thread
    # two CTAs per SM must fit the SM's 228 KB: 5 stages of 64x128x32 do not, 3 do
    assert not ok(BM=64, BN=128, WARPS_M=2, WARPS_N=4, MIN_BLOCKS=2, STAGES=5)
    assert ok(BM=64, BN=128, WARPS_M=2, WARPS_N=4, MIN_BLOCKS=2, STAGES=3)
    assert not ok(SPLIT_K=8, EPI_SMEM=1)                                     # split-K is always staged
    # tunable overrides render into both the annotation and the guard
    moved = render(SeedSpec(TEMPLATE, (), "x", (("STAGES", "4"), ("BK", "16"))))
    assert check_tunable_defaults(moved) == [] and violated_constraints(moved) == []
    # the shared-memory formula follows the transposes: an accepted config always fits 227 KB
    for ta in (0, 1):
        for tb in (0, 1):
            s_cfg = _config_src(ta, tb)
            for bm, bn, wm, wn in ((256, 128, 4, 4), (128, 256, 2, 4), (128, 128, 2, 4)):
                for stages in (2, 3, 4, 5):
                    bk = 32
                    sa = bk * (bm + 8) if ta else bm * (bk + 4)
                    sb = bn * (bk + 4) if tb else bk * (bn + 8)
                    params = {"BM": str(bm), "BN": str(bn), "WARPS_M": str(wm), "WARPS_N": str(wn),
                              "STAGES": str(stages), "BK": str(bk)}
                    if stages * (sa + sb) * 4 + 1024 > 233472:
                        assert violated_constraints(s_cfg, params), (ta, tb, params)


def _tf32_rna_model(x: float) -> int:
    """What PTX cvt.rna.tf32.f32 returns: round the fp32 bits to 10 mantissa bits, ties away."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    sign, mag = bits & 0x80000000, bits & 0x7FFFFFFF
    if mag >= 0x7F800000:                           # Inf / NaN pass through
        return bits
    keep, rest = mag >> 13, mag & 0x1FFF
    if rest >= 0x1000:                              # ties away from zero (magnitude rounds up)
        keep += 1
    return sign | (keep << 13)                      # a carry into the exponent is correct (up to Inf)


def test_integer_tf32_rounding_matches_cvt_rna():
    """TF32_CVT = 0 rounds with `(bits + 0x1000) & 0xffffe000`; check it against cvt.rna semantics."""
    import random

    rng = random.Random(8)
    samples = [0.0, -0.0, 1.0, -1.0, 3.4028234663852886e38, -3.4028234663852886e38, float("inf"),
               float("-inf"), 1e-45, -1e-45, 1.1754943508222875e-38]
    samples += [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32) & 0x7F7FFFFF | (rng.getrandbits(1) << 31)))[0]
                for _ in range(20000)]
    samples += [struct.unpack("<f", struct.pack("<I", (rng.getrandbits(19) << 13) | 0x1000))[0]
                for _ in range(2000)]                                         # exact ties
    for x in samples:
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
        if bits & 0x7FFFFFFF > 0x7F800000:
            continue                                  # NaN: may differ (documented in the template)
        assert ((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF == _tf32_rna_model(x), hex(bits)


# ------------------------------------------------------------------------------------------
# real builds (cached)
# ------------------------------------------------------------------------------------------


from toolchain import build_cache, build_ptx, compile_shared, nvcc_cached, variants, write_atomic  # noqa: E402  (tests/ is on sys.path)


def _build(request, task: str, src: str, params: dict[str, str], n_kernels: int = 2):
    """``src`` with ``params`` built and its ptxas report checked: a seed (``params`` its
    defaults) as the full .so, a variant configuration device-only (tests/toolchain.py)."""
    outcome = compile_shared(request, task, src, params, device_only=params != _defaults(src))
    assert outcome.so_bytes and outcome.so_bytes[:4] == b"\x7fELF"
    m = outcome.result.metrics
    # 16-byte and 4-byte cp.async instantiations (+ the TMA/wgmma kernel, the PAD row copy and the
    # SPLIT_WS reduction with WGMMA = 1; those two are built whatever PAD / SPLIT_WS, launched only
    # when a call needs them)
    assert len(m["kernels"]) == n_kernels, m["kernels"]
    assert any("pad_rows_kernel" in k for k in m["kernels"]) == (n_kernels == 5), m["kernels"]
    assert any("splitk_reduce_kernel" in k for k in m["kernels"]) == (n_kernels == 5), m["kernels"]
    assert not m.get("wgmma_serialized", False), outcome.result.artifacts.get("wgmma_serialization")
    assert m["spill_stores"] == 0 and m["spill_loads"] == 0, m
    assert m["stack_frame"] == 0, m
    assert 0 < m["registers"] <= 255
    return outcome


def _distinct_seeds() -> list[str]:
    """One task per distinct rendered source (kb01/kb02/kb08/... render identically)."""
    seen: dict[str, str] = {}
    for task in sorted(F32_3XTF32_SEEDS):
        seen.setdefault(_src(task), task)
    return sorted(seen.values())


#: kb06's seed build is also the one whose PTX test_workspace_split_k_ptx_has_no_cluster_and_no_atomics
#: reads: one worker runs both, so the second reads the first's build instead of waiting for it.
_KB06_SEED_BUILD = pytest.mark.xdist_group("kb06_seed_build")


@pytest.mark.slow
@pytest.mark.parametrize("task", [pytest.param(t, marks=_KB06_SEED_BUILD) if t == "kb06_large_k" else t
                                  for t in _distinct_seeds()])
def test_seed_compiles_for_sm90a_without_spills(request, task):
    src = _src(task)
    params = _defaults(src)
    m = _build(request, task, src, params, n_kernels=5 if params["WGMMA"] == "1" else 2).result.metrics
    print(task, {k: (v["registers"], v["spill_stores"]) for k, v in m["kernels"].items()})


#: Worst case of each register class the constraints admit: (warp tile, threads x MIN_BLOCKS)
#: at its tightest cap (255 regs up to 256 threads per SM share, 128 at 512), with the options
#: that cost registers switched on (transposed operands, split-K, triangular epilogue, PTX cvt).
_FAT = {"SPLIT_K": "8", "TF32_CVT": "1", "BK": "32"}
EXTREME_CONFIGS = {
    "w64x32_t256": ((0, 1, 1), {"BM": "128", "BN": "128", "WARPS_M": "2", "WARPS_N": "4", **_FAT}),
    "w64x32_t256_ta": ((1, 0, 2), {"BM": "128", "BN": "128", "WARPS_M": "2", "WARPS_N": "4", **_FAT}),
    "w32x64_t256": ((1, 1, 1), {"BM": "64", "BN": "256", "WARPS_M": "2", "WARPS_N": "4", **_FAT}),
    "w64x32_t128_mb2": ((0, 1, 0), {"BM": "128", "BN": "64", "WARPS_M": "2", "WARPS_N": "2",
                                     "MIN_BLOCKS": "2", "STAGES": "2", "TF32_CVT": "1", "EPI_SMEM": "1"}),
    "w32x32_t512": ((0, 1, 1), {"BM": "128", "BN": "128", "WARPS_M": "4", "WARPS_N": "4", **_FAT}),
    "w32x32_t256_mb2": ((1, 1, 2), {"BM": "64", "BN": "128", "WARPS_M": "2", "WARPS_N": "4",
                                     "MIN_BLOCKS": "2", **_FAT}),
    "w64x16_t512": ((1, 1, 1), {"BM": "256", "BN": "64", "WARPS_M": "4", "WARPS_N": "4", **_FAT,
                                "BK": "32", "SPLIT_K": "8"}),
    "w32x16_t512": ((0, 1, 2), {"BM": "128", "BN": "64", "WARPS_M": "4", "WARPS_N": "4", **_FAT}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", variants(sorted(EXTREME_CONFIGS), keep=tuple(
    i for i, n in enumerate(sorted(EXTREME_CONFIGS)) if n in ("w64x32_t256", "w64x32_t128_mb2", "w32x32_t512"))))
def test_extreme_configs_compile_without_spills(request, name):
    (ta, tb, ep), params = EXTREME_CONFIGS[name]
    src = _config_src(ta, tb, ep)
    assert violated_constraints(src, params) == [], violated_constraints(src, params)
    full = {**_defaults(src), **params}
    _build(request, "kb01_square", src, full)


def _nvcc_cached(request, tag: str, args: list[str], source: str, suffix: str) -> str:
    """nvcc once per content in the suite's shared build cache (tests/toolchain.py); returns
    the PTX text (``suffix`` ``.ptx``) or the executable's path."""
    out = nvcc_cached(request, tag, args, source, suffix)
    return out.read_text(errors="replace") if suffix == ".ptx" else str(out)


#: kb01's seed on the mma.sync kernel (WGMMA = 0) with its default TF32_CVT = 0 is the build
#: tests/test_workspace_f32.py::test_without_pad_or_wgmma_no_workspace[WGMMA=0] loads (kb08 renders
#: as kb01): one worker runs both tests, the second reads the first's build.
_KB01_MMA_SYNC_BUILD = pytest.mark.xdist_group("kb01_mma_sync_build")


@pytest.mark.slow
@pytest.mark.parametrize("cvt", [pytest.param("0", marks=_KB01_MMA_SYNC_BUILD), "1"])
def test_ptx_uses_tf32_tensor_core_mma(request, tmp_path, cvt):
    src = _src()
    if cvt == "0":
        # the PTX of the .so build of this configuration (kb01's seed with -DWGMMA=0 is _src()
        # with its defaults: the same defines), not a second nvcc run
        seed = _src("kb01_square")
        params = {**_defaults(seed), "WGMMA": "0"}
        assert params == {**_defaults(src), "TF32_CVT": cvt}
        ptx = build_ptx(request, tmp_path, "kb01_square", seed, params)[1]
    else:   # no test builds this configuration as a .so: PTX only (cicc; no ptxas, no host compile)
        ptx = _nvcc_cached(request, f"ptx-cvt{cvt}", ["-arch=sm_90a", "-ptx", f"-DTF32_CVT={cvt}"], src, ".ptx")
    d = {k: int(v) for k, v in _defaults(src).items()}
    threads = 32 * d["WARPS_M"] * d["WARPS_N"]
    atoms = (d["BM"] * d["BN"]) // (16 * 8) // (threads // 32)      # atoms per warp per k-block
    kblocks = d["BK"] // 8
    a_vals = 4 * d["BM"] // (16 * d["WARPS_M"])                       # A fragment values / thread
    b_vals = 2 * d["BN"] // (8 * d["WARPS_N"])
    n_inst = 2                                                         # vector + scalar copy paths
    assert ptx.count(MMA_PTX) == n_inst * 3 * atoms * kblocks
    assert ptx.count(CVT_PTX) == (n_inst * 2 * (a_vals + b_vals) * kblocks if cvt == "1" else 0)
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M), "atomics in the PTX"


@pytest.mark.slow
def test_split_k_ptx_reads_peers_through_dsmem(request):
    spec = F32_3XTF32_SEEDS["kb06_large_k"]
    tun = dict(spec.tunable_defaults) | {"SPLIT_K": "16", "SPLIT_WS": "0"}   # the cluster split
    src = render(dataclasses.replace(spec, tunable_defaults=tuple(tun.items())))
    assert violated_constraints(src) == []
    ptx = _nvcc_cached(request, "ptx-kb06-cluster", ["-arch=sm_90a", "-ptx"], src, ".ptx")
    assert "mapa.shared::cluster" in ptx and "ld.shared::cluster.v4.f32" in ptx
    assert "barrier.cluster.arrive" in ptx and "barrier.cluster.wait" in ptx
    assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M), "atomics in the PTX"


@pytest.mark.slow
@_KB06_SEED_BUILD
def test_workspace_split_k_ptx_has_no_cluster_and_no_atomics(request, tmp_path):
    """kb06's seed (SPLIT_WS = 1): independent CTAs per K slice (no cluster launch, no
    distributed shared memory) whose partial tiles a second kernel sums in a fixed order, so
    the result stays bitwise deterministic: no atomics anywhere. The PTX of the seed's .so
    build (test_seed_compiles_for_sm90a_without_spills[kb06_large_k] checks its ptxas report)."""
    src = _src("kb06_large_k")
    _, ptx = build_ptx(request, tmp_path, "kb06_large_k", src, _defaults(src))
    assert "splitk_reduce_kernel" in ptx
    assert "ld.shared::cluster" not in ptx and "barrier.cluster" not in ptx
    assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M), "atomics in the PTX"


def _run_host_program(request, src: str, program: str, key: str, args: list[str], *,
                      device_pass: bool = False, argv: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Builds `program` (a host-only C++ program whose ``#include "KERNEL_FILE"`` pulls in the
    rendered kernel `src`) with nvcc, cached under `key`, and runs it with `argv` (no GPU needed).

    Without ``device_pass`` the whole program is inside ``#ifndef __CUDA_ARCH__``: nvcc's device
    passes (cicc for compute_90 and compute_90a, ptxas) see an empty file, which takes a build
    from about 52 s to 24 s on the 2-core CI machine, and the host pass, which builds all the
    program runs, is unchanged. That needs a kernel whose ``__global__`` functions are all
    templates (their host stubs come from the host pass); a WGMMA = 1 build has non-template
    kernels (pad_rows_kernel, splitk_reduce_kernel) whose stubs the device pass emits, so those
    programs pass ``device_pass=True`` and a single virtual arch (one cicc run, no ptxas). What
    a device compile of the kernel would catch is the business of the .so builds above (seeds,
    extreme configs), not of these layout checks."""
    folder = build_cache(request) / "nvcc"
    folder.mkdir(exist_ok=True)
    kernel = folder / ("kernel-" + hashlib.sha256(src.encode()).hexdigest()[:16] + ".cu")
    if not kernel.exists():
        write_atomic(kernel, src)   # another worker may be reading it: never half written
    text = program.replace("KERNEL_FILE", str(kernel))
    if not device_pass:
        text = "#ifndef __CUDA_ARCH__\n" + text + "\n#endif\n"
    exe = _nvcc_cached(request, key, args, text, "")
    return subprocess.run([exe, *argv], capture_output=True, text=True, timeout=60)


#: Device-pass flags of the host programs that need one: PTX for one virtual arch, no cubin.
HOST_PROGRAM_ARCH = "-gencode=arch=compute_90a,code=compute_90a"


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

# Three tile configs (the default; the smallest, two warps, BK = 16, 64 x 64: other paddings,
# copy layouts and copy repetition counts; a wide 256 x 64 one), each with both transpose
# pairs (TRANS_A, TRANS_B) = (0, 0) and (1, 1): every operand in both of its smem kinds
# (K-major and X-major). The mixed pairs (0, 1) and (1, 0) were dropped (half the host builds):
# in the template A's side is ``smem_layout<kAKMajor, BM>`` / ``copy_a`` (TRANS_A only) and B's
# ``smem_layout<kBKMajor, BN>`` / ``copy_b`` (TRANS_B only), and HOST_CHECK checks A's copies and
# fragment loads, B's, and the C partition (neither) separately, so a mixed pair only repeats
# checks the two same-kind pairs already make.
LAYOUT_CONFIGS = {
    f"{name}-ta{t}tb{t}": {"TRANS_A": str(t), "TRANS_B": str(t), **params}
    for t in (0, 1)
    for name, params in (
        ("default", {}),
        ("small", {"BM": "64", "BN": "64", "BK": "16", "STAGES": "2", "WARPS_M": "2", "WARPS_N": "1"}),
        ("wide", {"BM": "256", "BN": "64", "BK": "32", "STAGES": "2", "WARPS_M": "4", "WARPS_N": "4"}),
    )
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LAYOUT_CONFIGS))
def test_host_layout_check(request, name):
    params = LAYOUT_CONFIGS[name]
    ta, tb = int(params["TRANS_A"]), int(params["TRANS_B"])
    tunables = {k: v for k, v in params.items() if not k.startswith("TRANS_")}
    assert violated_constraints(_config_src(ta, tb), tunables) == [], violated_constraints(_config_src(ta, tb), tunables)
    # the bare template (no task-config block): TRANS_A / TRANS_B come in as -D flags
    src = render(SeedSpec(TEMPLATE, (), "layout check"))
    args = ["-arch=sm_90a", *[f"-D{k}={v}" for k, v in params.items()]]
    proc = _run_host_program(request, src, HOST_CHECK, f"host-{name}", args)
    assert proc.returncode == 0 and proc.stdout.strip().startswith("OK"), (name, proc.stdout, proc.stderr)


# ------------------------------------------------------------------------------------------
# WGMMA = 1: the Hopper kernel (TMA + RS tf32 wgmma). These are its CPU-side checks
# (benchmarks/lab/probes/f32_3xtf32_sm90.json checks and times it on an H200).
# ------------------------------------------------------------------------------------------

#: WGMMA = 1 builds checked for no spills / no wgmma serialisation: the kb01 seed and the other
#: admitted extreme: both operands transposed (M-major A transposed by the producer, K-major B),
#: one consumer warpgroup (BM = 64), 3 stages, PTX cvt.
WGMMA_BUILDS = {
    "kb01": ("kb01_square", {}),
    "kb18_bm64_s3_cvt": ("kb18_trans_both", {"BM": "64", "STAGES": "3", "TF32_CVT": "1"}),
    "kb09": ("kb09_tall_skinny", {}),   # the seed: PERSIST + TMA_STORE
}


def _wgmma_build(request, name: str):
    task, params = WGMMA_BUILDS[name]
    src = _src(task)
    full = {**_defaults(src), "WGMMA": "1", **params}
    assert violated_constraints(src, full) == [], violated_constraints(src, full)
    return _build(request, task, src, full, n_kernels=5)


def test_wgmma_constraint():
    src = _src()
    ok = lambda **kw: violated_constraints(src, {k: str(v) for k, v in kw.items()}) == []  # noqa: E731
    assert ok(WGMMA=1) and ok(WGMMA=1, STAGES=3) and ok(WGMMA=1, BM=64, WARPS_M=2)
    assert not ok(WGMMA=1, BK=16) and not ok(WGMMA=1, BM=256, WARPS_M=4)
    assert not ok(WGMMA=1, BN=256, BM=64, WARPS_M=2, WARPS_N=4)
    # 5 stages and BN = 64 (deterministic on an H200 since the producer splits B) fit with a
    # K-major A; an M-major A also keeps a transposed copy per operand buffer (2 x BM x BK x 4 B)
    assert ok(WGMMA=1, STAGES=5) and ok(WGMMA=1, BM=64, BN=64, WARPS_N=2)
    s16 = _src("kb16_trans_a")
    ok16 = lambda **kw: violated_constraints(s16, {**_defaults(s16), **{k: str(v) for k, v in kw.items()}}) == []  # noqa: E731
    assert ok16(WGMMA=1, STAGES=4) and not ok16(WGMMA=1, STAGES=5)
    assert ok(BK=16) and ok(STAGES=5)                                         # WGMMA = 0: unchanged
    wg_seeds = [t for t, spec in F32_3XTF32_SEEDS.items() if ("WGMMA", "1") in spec.tunable_defaults]
    assert sorted(set(F32_3XTF32_SEEDS) - set(wg_seeds)) == []   # kb08 (K = 2949): padded copies (PAD)
    assert _defaults(_src("kb08_irregular"))["PAD"] == "1"
    # PAD only matters with WGMMA = 1; without it PAD stays at its default (no duplicate configs)
    assert ok(WGMMA=1, PAD=0) and ok(PAD=1) and not ok(PAD=0)
    for task in F32_3XTF32_SEEDS:
        s = _src(task)
        assert violated_constraints(s, _defaults(s)) == [], task
    # SPLIT_K = 16 (a non-portable cluster) only for the Hopper kernel
    assert ok(WGMMA=1, SPLIT_K=16) and not ok(SPLIT_K=16) and ok(SPLIT_K=8)
    # PERSIST (one CTA per SM looping over tiles): Hopper kernel, one CTA per tile's K
    assert ok(WGMMA=1, PERSIST=1) and not ok(PERSIST=1) and not ok(WGMMA=1, PERSIST=1, SPLIT_K=2)
    # TMA_STORE: Hopper kernel, SPLIT_K = 1, and its 64 KB tile buffer counts: 3 stages fit, 4 not
    assert ok(WGMMA=1, TMA_STORE=1, STAGES=3) and not ok(WGMMA=1, TMA_STORE=1, STAGES=4)
    assert not ok(TMA_STORE=1, STAGES=3) and not ok(WGMMA=1, TMA_STORE=1, STAGES=3, SPLIT_K=2)
    # SPLIT_WS (K slices through the workspace, a second reduce kernel): Hopper kernel, one CTA
    # per slice, so neither with a cluster split nor with the persistent loop
    assert ok(WGMMA=1, SPLIT_WS=1) and not ok(SPLIT_WS=1)
    assert not ok(WGMMA=1, SPLIT_WS=1, SPLIT_K=2) and not ok(WGMMA=1, SPLIT_WS=1, PERSIST=1)
    policy = pytest.importorskip("evaluators.policy")
    for task in ("kb01_square", "kb16_trans_a", "kb17_trans_b", "kb18_trans_both", "kb14_upper"):
        s = _src(task)
        result = policy.check_policy(s, {**_defaults(s), "WGMMA": "1"})
        assert result.status.value == "ok", (task, result.reason)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WGMMA_BUILDS))
def test_wgmma_builds_without_spills_or_serialisation(request, name):
    outcome = _wgmma_build(request, name)
    m = outcome.result.metrics
    assert "wgmma_serialization" not in outcome.result.artifacts
    wg = [k for k in m["kernels"] if "wgmma_kernel" in k]
    assert len(wg) == 1, m["kernels"]
    print(name, {k: (v["registers"], v["spill_stores"]) for k, v in m["kernels"].items()})


@pytest.mark.slow
def test_wgmma_sass_has_hgmma_tf32(request, tmp_path):
    from toolchain import cuobjdump
    from toolchain import sass as _sass

    cuobjdump()                                   # skips before the build when it is missing
    outcome = _wgmma_build(request, "kb01")
    so = tmp_path / "k.so"
    so.write_bytes(outcome.so_bytes)
    sass = _sass(so)
    hgmma = re.findall(r"HGMMA\.64x(\d+)x8\.F32\.TF32", sass)
    d = {k: int(v) for k, v in _defaults(_src()).items()}
    assert hgmma and all(int(n) == d["BN"] for n in hgmma), hgmma[:4]
    assert len(hgmma) == 3 * d["BK"] // 8, len(hgmma)          # one k-tile's worth, in the loop
    assert "USETMAXREG" in sass                                # producer/consumer register split
    # Race guard (docs/kernels.md, "The A-stage release fence"): in the wgmma kernel no mbarrier
    # arrive follows a shared-memory load without a FENCE.VIEW.ASYNC (fence.proxy.async) in
    # between, in program order; without the consumers' fence the A-stage releases break this.
    kernel = sass[sass.index("gemm_3xtf32_wgmma_kernel"):]
    kernel = kernel[:kernel.find("Function :") if "Function :" in kernel else len(kernel)]
    pending, arrives, unfenced = False, 0, []
    for line in kernel.splitlines():
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m:
            continue
        op = m.group(1)
        if op.startswith("LDS"):
            pending = True
        elif op.startswith("FENCE.VIEW.ASYNC"):
            pending = False
        elif op.startswith("SYNCS.ARRIVE"):
            arrives += 1
            if pending:
                unfenced.append(line.strip()[:100])
    assert arrives >= 3 and not unfenced, unfenced


@pytest.mark.slow
def test_tma_store_sass(request, tmp_path):
    """kb09's seed (TMA_STORE = 1): the tile leaves by bulk tensor stores (four 32 x 128 boxes
    of the swizzled buffer), its issuer waits for their reads (DEPBAR on the bulk-group
    scoreboard), and the shared-memory writes before them are fenced for the async proxy."""
    from toolchain import cuobjdump
    from toolchain import sass as _sass

    cuobjdump()
    so = tmp_path / "k.so"
    so.write_bytes(_wgmma_build(request, "kb09").so_bytes)
    kernel = _sass(so)
    kernel = kernel[kernel.index("gemm_3xtf32_wgmma_kernel"):]
    kernel = kernel[:kernel.find("Function :") if "Function :" in kernel else len(kernel)]
    assert len(re.findall(r"UTMASTG\.3D", kernel)) == 4
    first_store = kernel.index("UTMASTG")
    assert "FENCE.VIEW.ASYNC.S" in kernel[:first_store]
    assert not re.search(r"\b(LDL|STL)\b", kernel), "local memory (spills) in the TMA-store kernel"


HOST_CHECK_WGMMA = r"""
// Host-only checks of the hand-coded WGMMA = 1 mappings (kernel included with the same defines);
// with the argument `split-count`, the SPLIT_WS slice counts of split_count instead.
#include "KERNEL_FILE"
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

using namespace cute;
namespace W = evo_3xtf32::wg;
static int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 20) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)

// Accesses of one warp: each shared-memory wavefront serves 128 bytes; returns the number of
// wavefronts of a 4-byte (width 1) or 16-byte (width 4, 8 lanes per phase) access.
static int wavefronts(const std::vector<long>& word_offsets, int width_words) {
  int lanes_per_phase = 32 / width_words, total = 0;
  for (int p0 = 0; p0 < 32; p0 += lanes_per_phase) {
    std::vector<std::set<long>> bank(32);
    for (int l = p0; l < p0 + lanes_per_phase; ++l)
      for (int w = 0; w < width_words; ++w) bank[(word_offsets[l] + w) % 32].insert(word_offsets[l] + w);
    int worst = 1;
    for (auto& b : bank) worst = b.size() > size_t(worst) ? int(b.size()) : worst;
    total += worst;
  }
  return total;
}

// The slice counts of the SPLIT_WS plan (no GPU, no device query): "work k_tiles sms count" lines.
static int split_counts() {
  const long long cases[][3] = {{4, 16384, 132}, {4, 16384, 64}, {66, 16384, 132}, {67, 16384, 132},
                                {256, 128, 132}, {1, 8, 132}, {1, 7, 132}, {2, 1000, 132}, {0, 100, 132}};
  for (auto& c : cases) std::printf("%lld %lld %lld %d\n", c[0], c[1], c[2], W::split_count(c[0], c[1], c[2]));
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "split-count") == 0) return split_counts();
  constexpr bool kAK = evo_3xtf32::kAKMajor, kBK = evo_3xtf32::kBKMajor;
  W::TiledMma mma;
  auto idA = make_identity_tensor(make_shape(Int<BM>{}, Int<BK>{}));
  auto idC = make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{}));
  // Swizzled layouts apply their swizzle to the smem address: evaluate through real tensors on
  // fake 1024-byte-aligned bases (host only; never dereferenced).
  float* baseA = reinterpret_cast<float*>(uintptr_t(1) << 20);
  float* baseS = reinterpret_cast<float*>(uintptr_t(1) << 22);
  W::tf32* baseB = reinterpret_cast<W::tf32*>(uintptr_t(1) << 21);
  auto tAs = make_tensor(make_smem_ptr(baseA), W::SmemLayoutA{});
  auto tBs = make_tensor(make_smem_ptr(baseS), W::SmemLayoutBst{});
  auto tBo = make_tensor(make_smem_ptr(baseB), W::SmemLayoutBop{});
  auto la = [&](int m, int k, int s) { return long(&tAs(m, k, s) - baseA); };
  auto ls = [&](int n, int k, int s) { return long(&tBs(n, k, s) - baseS); };
  auto lb = [&](int n, int k, int s) { return long(reinterpret_cast<W::tf32*>(&tBo(n, k, s)) - baseB); };
  // every stage element has its own word (the layouts are bijective onto their cosize)
  { std::set<long> a, b; for (int s = 0; s < STAGES; ++s) for (int k = 0; k < BK; ++k) {
      for (int m = 0; m < BM; ++m) a.insert(la(m, k, s));
      for (int n = 0; n < BN; ++n) b.insert(ls(n, k, s)); }
    CHECK(int(a.size()) == BM * BK * STAGES && int(b.size()) == BN * BK * STAGES, "stage layouts"); }
  // 1. RS A fragment: value (v, 0, j) of consumer ct is (r0 + 8 (v & 1), slot 8 j + 4 (v >> 1) + t)
  std::set<std::pair<int,int>> seenA;
  for (int ct = 0; ct < W::kConsumers; ++ct) {
    auto tA = mma.get_thread_slice(ct).partition_A(idA);
    CHECK(size<0>(tA) == 4 && size<1>(tA) == 1 && size<2>(tA) == BK / 8, "A partition shape");
    const int lane = ct % 32, t = lane % 4;
    const int r0 = 64 * (ct / 128) + 16 * ((ct % 128) / 32) + lane / 4;
    for (int v = 0; v < 4; ++v)
      for (int j = 0; j < BK / 8; ++j) {
        auto c = tA(v, 0, j);
        CHECK(int(get<0>(c)) == r0 + 8 * (v & 1) && int(get<1>(c)) == 8 * j + 4 * (v >> 1) + t,
              "A frag ct=%d v=%d j=%d -> (%d,%d)", ct, v, j, int(get<0>(c)), int(get<1>(c)));
        seenA.insert({int(get<0>(c)), int(get<1>(c))});
      }
  }
  CHECK(int(seenA.size()) == BM * BK, "A fragments cover the tile once");
  // 2. the slot -> k permutation is a bijection; K-major A: a fragment row's 4 k are consecutive
  std::set<int> ks;
  for (int s = 0; s < BK; ++s) ks.insert(W::phys_k(s));
  CHECK(int(ks.size()) == BK && *ks.begin() == 0 && *ks.rbegin() == BK - 1, "permutation");
  for (int v = 0; v < 4; ++v) for (int t = 0; t < 4; ++t) for (int j = 0; j < 4; ++j) {
    CHECK(W::a_frag_k(v, t, j) == W::phys_k(8 * j + 4 * (v >> 1) + t), "a_frag_k");
    CHECK(W::a_frag_k(v, t, j) == W::a_frag_k(v, t, 0) + j && W::a_frag_k(v, t, 0) % 4 == 0, "A float4");
  }
  // 3. A fragment loads: one aligned float4 per v, conflict-free, from the K-major A stage or,
  //    for an M-major A (kATrans), from the producer's transposed K-major copy (physical k)
  float* baseK = reinterpret_cast<float*>(uintptr_t(1) << 23);
  auto tAk = make_tensor(make_smem_ptr(baseK), W::SmemLayoutAkm{});
  auto lk = [&](int m, int k, int b) { return long(&tAk(m, k, b) - baseK); };
  auto lread = [&](int m, int k, int s) { return W::kATrans ? lk(m, k, s % W::kNBop) : la(m, k, s); };
  CHECK(W::kATrans == !kAK, "an M-major A is transposed by the producer");
  int waveA = 0;
  for (int st = 0; st < STAGES; ++st)
    for (int v = 0; v < 4; ++v)
      for (int w = 0; w < W::kConsumers / 32; ++w) {
        std::vector<long> off(32);
        for (int lane = 0; lane < 32; ++lane) {
          int ct = 32 * w + lane, t = lane % 4;
          int m = 64 * (ct / 128) + 16 * ((ct % 128) / 32) + lane / 4 + 8 * (v & 1);
          long o = lread(m, W::a_frag_k(v, t, 0), st);
          CHECK(W::a_frag_k(v, t, 0) % 4 == 0 && o % 4 == 0, "A float4 alignment");
          for (int i = 1; i < 4; ++i) CHECK(lread(m, W::a_frag_k(v, t, i), st) == o + i, "A float4 contiguity");
          off[lane] = o;
        }
        int wf = wavefronts(off, 4);
        waveA = wf > waveA ? wf : waveA;
        CHECK(wf == 4, "A load wavefronts %d", wf);
      }
  // 4. the 128 producer threads' transforms (mirrors transform_rows / transform_b): every
  //    (row, slot chunk) written once with the right physical k; loads and stores of each warp
  //    conflict-free; chunk c of a K-major SW128 row is chunk 0's address XOR 16 c (sw128_chunk)
  auto xor_ok = [&](auto addr, int rows, int bufs, const char* what) {
    for (int x = 0; x < rows; ++x) for (int b = 0; b < bufs; ++b) for (int c = 0; c < BK / 4; ++c)
      CHECK((addr(x, 0, b) * 4 ^ (16 * c)) == addr(x, 4 * c, b) * 4, "%s: sw128_chunk x=%d c=%d", what, x, c);
  };
  xor_ok(lb, BN, W::kNBop, "B operand");
  if (W::kATrans) xor_ok(lk, BM, W::kNBop, "A transposed");
  if (kBK) xor_ok(ls, BN, STAGES, "K-major B stage");
  if (kAK) xor_ok(la, BM, STAGES, "K-major A stage");
  std::set<std::pair<int,int>> seenB;
  int waveB = 0;
  auto note = [&](int wf, int best, const char* what) { waveB = wf > waveB ? wf : waveB; CHECK(wf == best, "%s: %d wavefronts", what, wf); };
  // rows-contiguous stage (x, k) of kRows rows: warp w takes x-block w % kNB, chunks c0 kPer + r
  auto rows_check = [&](int kRows, bool permute, auto lsrc, auto ldst, std::set<std::pair<int,int>>& seen, const char* what) {
    const int kNB = kRows / 32, kWarps = 4, kStep = kWarps / kNB, kPer = (BK / 4) / kStep;
    CHECK(kWarps % kNB == 0 && (BK / 4) % kStep == 0, "%s: task split", what);
    for (int w = 0; w < kWarps; ++w)
      for (int r = 0; r < kPer; ++r) {
        const int c = (kStep == 1 ? 0 : w / kNB) * kPer + r;
        std::vector<long> offS(32);
        for (int i = 0; i < 4; ++i) {
          std::vector<long> offL(32);
          for (int lane = 0; lane < 32; ++lane)
            offL[lane] = lsrc(32 * (w % kNB) + lane, permute ? W::phys_k(4 * c + i) : 4 * c + i, 1);
          note(wavefronts(offL, 1), 1, what);
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int x = 32 * (w % kNB) + lane;
          seen.insert({x, c});
          offS[lane] = ldst(x, 4 * c, 1);
        }
        note(wavefronts(offS, 4), 4, what);
      }
  };
  if (!kBK) {
    rows_check(BN, true, ls, lb, seenB, "B rows");
  } else {
    constexpr int kTasks = 2 * BN;
    for (int h = 0; h < 2; ++h) for (int e = 0; e < 4; ++e) for (int i = 0; i < 4; ++i)
      CHECK(4 * W::bk_src_chunk(h, W::bk_src_reg(e, i)) + W::bk_src_elem(e, i) == W::phys_k(4 * W::bk_dst_chunk(h, e) + i),
            "TRANS_B source of slot chunk h=%d e=%d i=%d", h, e, i);
    for (int r = 0; r < (kTasks + 127) / 128; ++r)
      for (int w = 0; w < 4; ++w)
        for (int i = 0; i < 4; ++i) {
          std::vector<long> offL(32), offS(32);
          for (int lane = 0; lane < 32; ++lane) {
            const int tid = 32 * w + lane, q = tid + 128 * r;
            if (q >= kTasks) { offL[lane] = offL[0]; offS[lane] = offS[0]; continue; }
            const int n = 128 % BN == 0 ? tid % BN : q % BN;
            const int h = 128 % BN == 0 ? tid / BN + (128 / BN) * r : q / BN;
            CHECK(n == q % BN && h == q / BN, "K-major B task mapping");
            offL[lane] = ls(n, 4 * W::bk_src_chunk(h, i), 1);
            CHECK(offL[lane] % 4 == 0, "B float4 alignment");
            for (int x = 1; x < 4; ++x) CHECK(ls(n, 4 * W::bk_src_chunk(h, i) + x, 1) == offL[lane] + x, "B float4");
            offS[lane] = lb(n, 4 * W::bk_dst_chunk(h, i), 1);
            seenB.insert({n, W::bk_dst_chunk(h, i)});
          }
          note(wavefronts(offL, 4), 4, "B lds128");
          note(wavefronts(offS, 4), 4, "B sts128");
        }
  }
  CHECK(int(seenB.size()) == BN * (BK / 4), "B tasks cover the tile once (%d)", int(seenB.size()));
  if (W::kATrans) {
    std::set<std::pair<int,int>> seenAt;
    rows_check(BM, false, la, lk, seenAt, "A transpose");
    CHECK(int(seenAt.size()) == BM * (BK / 4), "A transpose tasks cover the tile once (%d)", int(seenAt.size()));
  }
  for (int n = 0; n < BN; ++n) for (int c = 0; c < BK / 4; ++c) for (int buf = 0; buf < W::kNBop; ++buf) {
    long o = lb(n, 4 * c, buf);
    CHECK(o % 4 == 0, "B_big chunk alignment");
    for (int i = 1; i < 4; ++i) CHECK(lb(n, 4 * c + i, buf) == o + i, "B_big chunk contiguity");
  }
  // 5. accumulators: pairs (i, i+1) are (m, n), (m, n+1), n even; cover C once
  std::set<std::pair<int,int>> seenC;
  for (int ct = 0; ct < W::kConsumers; ++ct) {
    auto tC = mma.get_thread_slice(ct).partition_C(idC);
    for (int i = 0; i < size(tC); i += 2) {
      auto a = tC(i), b = tC(i + 1);
      CHECK(get<0>(a) == get<0>(b) && get<1>(b) == get<1>(a) + 1 && get<1>(a) % 2 == 0, "C pair");
      seenC.insert({int(get<0>(a)), int(get<1>(a))});
      seenC.insert({int(get<0>(b)), int(get<1>(b))});
    }
  }
  CHECK(int(seenC.size()) == BM * BN, "C covered once");
  printf("%s TRANS_A=%d TRANS_B=%d BM=%d BN=%d STAGES=%d smem=%d A-wavefronts=%d B-wavefronts=%d\n",
         fails ? "FAILED" : "OK", TRANS_A, TRANS_B, BM, BN, STAGES, W::kSmemBytes, waveA, waveB);
  return fails ? 1 : 0;
}
"""

#: Two builds cover both A kinds (K-major stage; M-major stage transposed by the producer),
#: both B stage kinds (N-contiguous: transpose; K-major: register transpose) and 1 or 2 consumer
#: warpgroups. The first also has kb06's SPLIT_WS = 1, which no layout or mapping reads (it picks
#: the epilogue's partial-tile store and the host plan's split), so test_split_ws_slice_count
#: runs the same program: one build for both.
WGMMA_LAYOUT_CONFIGS = {
    "ta0tb1-128x128": {"TRANS_A": "0", "TRANS_B": "1", "BM": "128", "BN": "128", "STAGES": "4", "SPLIT_WS": "1"},
    "ta1tb0-64x128": {"TRANS_A": "1", "TRANS_B": "0", "BM": "64", "BN": "128", "STAGES": "2", "WARPS_M": "2"},
}
#: The WGMMA layout program test_split_ws_slice_count runs (with the argument ``split-count``).
SPLIT_COUNT_PROGRAM = "ta0tb1-128x128"
#: The defines split_count reads (test_split_ws_slice_count checks this on the template's text).
SPLIT_COUNT_DEFINES = ("SPLIT_WS", "SPLIT_K", "PERSIST")
#: One worker runs the layout check and the slice count of SPLIT_COUNT_PROGRAM (one build).
_SPLIT_COUNT_BUILD = pytest.mark.xdist_group("wgmma_host_split_count_build")


def _wgmma_host_program(request, name: str, *argv: str) -> subprocess.CompletedProcess:
    """HOST_CHECK_WGMMA built with WGMMA_LAYOUT_CONFIGS[name] (and WGMMA = 1), run with ``argv``."""
    params = {**WGMMA_LAYOUT_CONFIGS[name], "WGMMA": "1"}
    ta, tb = int(params["TRANS_A"]), int(params["TRANS_B"])
    tunables = {k: v for k, v in params.items() if not k.startswith("TRANS_")}
    assert violated_constraints(_config_src(ta, tb), tunables) == []
    src = render(SeedSpec(TEMPLATE, (), "wgmma layout check"))
    args = [HOST_PROGRAM_ARCH, "-O1", *[f"-D{k}={v}" for k, v in params.items()]]
    return _run_host_program(request, src, HOST_CHECK_WGMMA, f"wgmma-host-{name}", args, device_pass=True, argv=argv)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_SPLIT_COUNT_BUILD) if n == SPLIT_COUNT_PROGRAM else n
                                  for n in sorted(WGMMA_LAYOUT_CONFIGS)])
def test_wgmma_host_layout_check(request, name):
    proc = _wgmma_host_program(request, name)
    print(proc.stdout)
    assert proc.returncode == 0 and proc.stdout.strip().startswith("OK"), (name, proc.stdout, proc.stderr)


@pytest.mark.slow
@_SPLIT_COUNT_BUILD
def test_split_ws_slice_count(request):
    """kb06's plan: 4 tiles on 132 SMs split 33 ways (one wave); splitting stops when the tiles
    fill more than half of the SMs, and no slice is shorter than 4 k-tiles (K = 128).

    split_count reads only SPLIT_WS, SPLIT_K and PERSIST (checked below on the template's
    text), so the WGMMA layout program SPLIT_COUNT_PROGRAM, built with kb06's values of those
    three, computes kb06's counts: test_wgmma_host_layout_check's build, not one of its own."""
    kb06 = _defaults(_src("kb06_large_k"))
    built = {**_defaults(render(SeedSpec(TEMPLATE, (), "x"))), **WGMMA_LAYOUT_CONFIGS[SPLIT_COUNT_PROGRAM]}
    assert {k: built[k] for k in SPLIT_COUNT_DEFINES} == {k: kb06[k] for k in SPLIT_COUNT_DEFINES}, built
    body = re.search(r"constexpr int64_t kMinSliceKTiles.*?constexpr int split_count\(.*?\n\}\n",
                     template_source(TEMPLATE), re.S)
    assert body, "split_count not found in the template"
    defines = set(TUNABLES) | {name for name, _ in F32_3XTF32_SEEDS["kb06_large_k"].defines}
    assert set(re.findall(r"\b[A-Z][A-Z0-9_]*\b", body.group(0))) & defines == set(SPLIT_COUNT_DEFINES), body.group(0)
    proc = _wgmma_host_program(request, SPLIT_COUNT_PROGRAM, "split-count")
    assert proc.returncode == 0, proc.stderr
    got = {tuple(map(int, line.split()[:3])): int(line.split()[3]) for line in proc.stdout.splitlines()}
    assert got == {
        (4, 16384, 132): 33,    # kb06: 4 x 33 = 132 CTAs
        (4, 16384, 64): 16,
        (66, 16384, 132): 2,    # exactly half the SMs: still split
        (67, 16384, 132): 1,    # more than half: no split
        (256, 128, 132): 1,     # kb01-sized grids never split
        (1, 8, 132): 2,         # 8 k-tiles: two slices of 4
        (1, 7, 132): 1,         # a second slice would be shorter than 4 k-tiles
        (2, 1000, 132): 66,
        (0, 100, 132): 1,
    }

