"""Hopper 3xTF32 fp32 GEMM template (evo/tasks/kernels/gemm_f32_3xtf32_sm90.cu), CPU-side checks.

TMA + RS wgmma (tf32) with 3xTF32 compensation and per-k-tile promotion; NOT yet validated on a
GPU (``benchmarks/probes/f32_3xtf32_sm90.json`` checks and times it on the H200). Verified here:

* the source passes ``evaluators.policy.check_policy``; tunables parse, ``#ifndef`` defaults match
  the annotations, defaults satisfy the ``@constraint`` and the constraint rejects what the
  kernel's shared-memory static_assert would;
* it builds for sm_90a through ``evaluators.compile.compile_candidate`` (defaults and tunable
  variants) with no spills, no stack frame and no ptxas wgmma-serialisation advisory (slow,
  cached in pytest's cache dir);
* ``cuobjdump -sass`` of the .so holds ``HGMMA.64xNx8.F32.TF32`` instructions, 12 per k-tile
  (3 per k-block) (skipped when no cuobjdump is found);
* a host-only program that includes the kernel checks the hand-coded mappings against CuTe: the
  RS A-fragment coordinates of every consumer thread, the k-slot permutation, 16-byte contiguity
  and bank-conflict freedom of the A-stage loads and of the B_big/B_small stores (swizzle
  included), coverage of the B transform tasks and of the accumulator pairs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evo.tunables import check_tunable_defaults, parse_tunables, violated_constraints

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "evo" / "tasks" / "kernels"
SOURCE = KERNELS / "gemm_f32_3xtf32_sm90.cu"
TUNABLES = ["BM", "BN", "BK", "STAGES", "GROUP_M", "TF32_CVT"]

#: Builds checked for no spills (the kb01 default first); each is (params overriding defaults).
BUILD_VARIANTS = {
    "default": {},
    "bm64": {"BM": "64"},
    "bn64": {"BN": "64"},
    "bm64_bn64_s2": {"BM": "64", "BN": "64", "STAGES": "2"},
    "s5_cvt": {"STAGES": "5", "TF32_CVT": "1"},
}


def _src() -> str:
    return SOURCE.read_text()


def _defaults(src: str) -> dict[str, str]:
    return {t.name: t.default for t in parse_tunables(src)}


def test_template_shape():
    raw = _src()
    assert sum(line.strip() == "// @evo:task-config" for line in raw.splitlines()) == 1
    assert len(re.findall(r"\bevo_launch\s*\(", raw)) == 1
    assert '#include "evo_abi.h"' in raw
    assert "NOT YET VALIDATED ON A GPU" in raw
    for banned in ("cudaMalloc", "cudaFree", "cudaStreamCreate", "cudaEventCreate", "atomicAdd"):
        assert banned not in raw


def test_policy_tunables_and_constraints():
    policy = pytest.importorskip("evaluators.policy")
    src = _src()
    result = policy.check_policy(src, _defaults(src))
    assert result.status.value == "ok", result.reason
    assert [t.name for t in parse_tunables(src)] == TUNABLES
    assert check_tunable_defaults(src) == []
    assert violated_constraints(src) == []
    ok = lambda **kw: violated_constraints(src, {k: str(v) for k, v in kw.items()}) == []  # noqa: E731
    assert ok(STAGES=5) and ok(BM=64, BN=64, STAGES=5)
    for bm in (64, 128):
        for bn in (64, 128):
            for stages in (2, 3, 4, 5):
                # kSmemBytes of the kernel: stages + 2 buffers x (B_big, B_small) + barriers + align slack
                smem = stages * (bm + bn) * 32 * 4 + 2 * bn * 32 * 4 * 2 + 2 * stages * 8 + 1024
                if ok(BM=bm, BN=bn, STAGES=stages):
                    assert smem <= 232448, (bm, bn, stages)
    for variant in BUILD_VARIANTS.values():
        assert violated_constraints(src, {**_defaults(src), **variant}) == []


from toolchain import toolchain as _toolchain  # noqa: E402  (tests/ is on sys.path)


def _build(request, params: dict[str, str]):
    compile_mod, _, _ = _toolchain()
    from evaluators.base import CompileSettings
    from evo.records import Candidate

    cache = request.config.cache.mkdir("evo-seed-builds")
    settings = CompileSettings(cache_dir=str(cache), timeout_s=900)
    src = _src()
    cand = Candidate.create(task="kb01_square", source=src, params={**_defaults(src), **params})
    outcome = compile_mod.compile_candidate(cand, settings)
    assert outcome.ok, outcome.result.reason + "\n" + outcome.result.artifacts.get("errors", "")
    assert outcome.so_bytes and outcome.so_bytes[:4] == b"\x7fELF"
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILD_VARIANTS))
def test_builds_for_sm90a_without_spills_or_wgmma_serialisation(request, name):
    outcome = _build(request, BUILD_VARIANTS[name])
    m = outcome.result.metrics
    assert len(m["kernels"]) == 1, m["kernels"]
    assert m["spill_stores"] == 0 and m["spill_loads"] == 0, m
    assert m["stack_frame"] == 0, m
    assert not m.get("wgmma_serialized", False), outcome.result.artifacts.get("wgmma_serialization")
    assert "wgmma_serialization" not in outcome.result.artifacts
    assert 0 < m["registers"] <= 255


def _cuobjdump() -> str | None:
    """cuobjdump from PATH, the CUDA toolkit, or the nvidia-cuda-cuobjdump wheel (which needs
    nvdisasm beside it: nvidia-cuda-nvdisasm)."""
    cands = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        import nvidia  # type: ignore

        for base in nvidia.__path__:
            cands += [str(p) for p in Path(base).glob("cu*/bin/cuobjdump")]
    except ImportError:
        pass
    for c in cands:
        if c and os.path.isfile(c) and (shutil.which("nvdisasm") or (Path(c).parent / "nvdisasm").is_file()):
            return c
    return None


@pytest.mark.slow
def test_sass_has_hgmma_tf32(request, tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump + nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    outcome = _build(request, {})
    so = tmp_path / "k.so"
    so.write_bytes(outcome.so_bytes)
    env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([tool, "-sass", str(so)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    sass = proc.stdout
    hgmma = re.findall(r"HGMMA\.64x(\d+)x8\.F32\.TF32", sass)
    d = {k: int(v) for k, v in _defaults(_src()).items()}
    assert hgmma and all(int(n) == d["BN"] for n in hgmma), hgmma[:4]
    assert len(hgmma) == 3 * d["BK"] // 8, len(hgmma)          # one k-tile's worth, in the loop
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic in the SASS"
    assert "USETMAXREG" in sass                                # producer/consumer register split


HOST_CHECK = r"""
// Host-only layout checks for gemm_f32_3xtf32_sm90.cu (included below with the same tunables).
#include "KERNEL_FILE"
#include <cstdio>
#include <set>
#include <vector>

using namespace evo_3xtf32_sm90;
static int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 20) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)

// 16-byte accesses of 8 lanes form one wavefront: distinct 16B bank groups required.
static void check_phase_conflicts(const std::vector<long>& word_offsets, int width_words, const char* what) {
  int lanes_per_phase = 32 / width_words;   // 4B: 32 lanes, 16B: 8 lanes
  for (int p0 = 0; p0 < 32; p0 += lanes_per_phase) {
    std::set<int> banks;
    for (int l = p0; l < p0 + lanes_per_phase; ++l)
      for (int w = 0; w < width_words; ++w) banks.insert(int((word_offsets[l] + w) % 32));
    CHECK(int(banks.size()) == 32, "%s: bank conflict in lanes %d..%d", what, p0, p0 + lanes_per_phase - 1);
  }
}

int main() {
  TiledMma mma;
  auto idA = make_identity_tensor(make_shape(Int<BM>{}, Int<BK>{}));
  auto idC = make_identity_tensor(make_shape(Int<BM>{}, Int<BN>{}));
  // Swizzled layouts apply their swizzle to the smem address: evaluate through real tensors on a
  // fake 1024-byte-aligned base (host only; never dereferenced).
  float* baseA = reinterpret_cast<float*>(uintptr_t(1) << 20);
  tf32* baseB = reinterpret_cast<tf32*>(uintptr_t(1) << 21);
  auto tAs = make_tensor(make_smem_ptr(baseA), SmemLayoutA{});
  auto tBo = make_tensor(make_smem_ptr(baseB), SmemLayoutBop{});
  auto la = [&](int m, int k, int s) { return long(&tAs(m, k, s) - baseA); };
  auto lb = [&](int n, int k, int s) { return long(reinterpret_cast<tf32*>(&tBo(n, k, s)) - baseB); };
  // 1. RS A fragment: value (v, 0, j) of consumer thread ct is (r0 + 8 (v & 1), 8 j + 4 (v >> 1) + t)
  std::set<std::pair<int,int>> seenA;
  for (int ct = 0; ct < kConsumers; ++ct) {
    auto thr = mma.get_thread_slice(ct);
    auto tA = thr.partition_A(idA);
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
  // 2. slot permutation s = 8 j + 4 h + t -> k = 8 t + 4 h + j is a bijection; B chunk formula agrees
  std::set<int> ks;
  for (int s = 0; s < BK; ++s) {
    int j = s / 8, h = (s / 4) % 2, t = s % 4;
    int k = 8 * t + 4 * h + j;
    ks.insert(k);
    int c = s / 4, i = s % 4;
    CHECK(k == 8 * i + 4 * (c & 1) + (c >> 1), "B chunk formula s=%d", s);
  }
  CHECK(int(ks.size()) == BK, "permutation");
  // 3. A stage: the 4 k of a fragment row are one aligned float4; LDS.128 phases conflict-free
  for (int st = 0; st < STAGES; ++st)
    for (int v = 0; v < 4; ++v)
      for (int w = 0; w < kConsumers / 32; ++w) {
        std::vector<long> off(32);
        for (int lane = 0; lane < 32; ++lane) {
          int ct = 32 * w + lane, t = lane % 4;
          int r0 = 64 * (ct / 128) + 16 * ((ct % 128) / 32) + lane / 4;
          int m = r0 + 8 * (v & 1), k0 = 8 * t + 4 * (v >> 1);
          long o = la(m, k0, st);
          CHECK(o % 4 == 0, "A float4 alignment");
          for (int i = 1; i < 4; ++i) CHECK(la(m, k0 + i, st) == o + i, "A float4 contiguity");
          off[lane] = o;
        }
        check_phase_conflicts(off, 4, "A lds128");
      }
  // 4. B transform: tasks cover (n, c) once; loads and stores conflict-free; chunks contiguous
  std::set<std::pair<int,int>> seenB;
  constexpr int kNB = BN / 32, kTasks = kNB * (BK / 4), kWarps = kConsumers / 32;
  for (int w = 0; w < kWarps; ++w)
    for (int r = 0; r < kTasks / kWarps; ++r) {
      int q = w + kWarps * r, c = q / kNB;
      std::vector<long> offS(32), offL(32);
      for (int lane = 0; lane < 32; ++lane) {
        int n = 32 * (q % kNB) + lane;
        seenB.insert({n, c});
        for (int buf = 0; buf < 2; ++buf) {
          long o = lb(n, 4 * c, buf);
          CHECK(o % 4 == 0, "B chunk alignment");
          for (int i = 1; i < 4; ++i) CHECK(lb(n, 4 * c + i, buf) == o + i, "B chunk contiguity");
        }
        offS[lane] = lb(n, 4 * c, 1);
        offL[lane] = SmemLayoutBst{}(n, 8 * 1 + 4 * (c & 1) + (c >> 1), 1);
      }
      check_phase_conflicts(offS, 4, "B sts128");
      check_phase_conflicts(offL, 1, "B lds32");
    }
  CHECK(int(seenB.size()) == BN * (BK / 4), "B tasks cover the tile once");
  // 5. accumulators: pairs (i, i+1) are (m, n), (m, n+1), n even; cover C once
  std::set<std::pair<int,int>> seenC;
  for (int ct = 0; ct < kConsumers; ++ct) {
    auto tC = mma.get_thread_slice(ct).partition_C(idC);
    for (int i = 0; i < size(tC); i += 2) {
      auto a = tC(i), b = tC(i + 1);
      CHECK(get<0>(a) == get<0>(b) && get<1>(b) == get<1>(a) + 1 && get<1>(a) % 2 == 0, "C pair");
      seenC.insert({int(get<0>(a)), int(get<1>(a))});
      seenC.insert({int(get<0>(b)), int(get<1>(b))});
    }
  }
  CHECK(int(seenC.size()) == BM * BN, "C covered once");
  printf("%s BM=%d BN=%d STAGES=%d smem=%d\n", fails ? "FAILED" : "OK", BM, BN, STAGES, kSmemBytes);
  return fails ? 1 : 0;
}
"""


@pytest.mark.slow
@pytest.mark.parametrize("cfg", ["BM=128 BN=128", "BM=64 BN=128", "BM=128 BN=64", "BM=64 BN=64 STAGES=2"])
def test_host_layout_check(request, cfg):
    _, nvcc, include = _toolchain()
    defines = [f"-D{kv}" for kv in cfg.split()]
    source = HOST_CHECK.replace("KERNEL_FILE", str(SOURCE))
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([source, _src(), (KERNELS / "evo_abi.h").read_text(), cfg, version,
                                    str(include)]).encode()).hexdigest()[:24]
    cache = Path(request.config.cache.mkdir("evo-3xtf32-sm90"))
    exe = cache / f"layout-{key}"
    if not exe.exists():
        cu = cache / f"layout-{key}.cu"
        cu.write_text(source)
        tmp = exe.with_name(exe.name + ".part")
        cmd = [nvcc, "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
               f"-I{include}", f"-I{KERNELS}", *defines, str(cu), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"nvcc failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
        tmp.rename(exe)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("OK"), run.stdout + run.stderr
