"""GEMM seed templates: rendering, tunable declarations, and a real sm_90a compile of two seeds.

The compile tests run nvcc for real (one fp32 and one bf16 seed, and a representative of each
SASS property's configurations; set EVO_GEMM_COMPILE_ALL=1 to build every distinct seed and
every configuration) into the suite's shared build cache (tests/toolchain.py), so a rerun
on an unchanged tree costs nothing. They skip when nvcc or the CUTLASS wheel is
missing. Correctness and speed need a GPU: benchmarks/lab/probe.py and `evo bench`.
"""

from __future__ import annotations

import re

import pytest

from evo.tasks.gemm_seeds import (
    BF16_GEMM_TASKS,
    FP32_GEMM_TASKS,
    GEMM_BF16_TEMPLATE,
    GEMM_F32_TEMPLATE,
    GEMM_SEEDS,
    F32_FFMA_SEEDS,
    gemm_seed,
)

#: Every seed table of this module: the registry's seeds plus the FFMA alternatives.
ALL_SPECS = {**{f"{k}@ffma": v for k, v in F32_FFMA_SEEDS.items()}, **GEMM_SEEDS}
from evo.tasks.seedspec import TASK_CONFIG_MARKER, SeedSpec, render, template_source

FP32_TASKS = {
    "kb01_square", "kb02_standard", "kb03_bmm", "kb06_large_k", "kb07_small_k", "kb08_irregular",
    "kb09_tall_skinny", "kb10_3d", "kb11_4d", "kb13_symmetric", "kb14_upper", "kb15_lower",
    "kb16_trans_a", "kb17_trans_b", "kb18_trans_both",
}
BF16_TASKS = {"gemm_bf16", "gemm_bf16_irregular", "bmm_bf16", "gemm_bias_gelu_bf16", "gemm_silu_mul_bf16"}


def test_seed_table_covers_exactly_the_gemm_tasks():
    assert set(GEMM_SEEDS) == FP32_TASKS | BF16_TASKS
    assert set(FP32_GEMM_TASKS) == FP32_TASKS
    assert set(BF16_GEMM_TASKS) == BF16_TASKS
    assert all(isinstance(s, SeedSpec) for s in GEMM_SEEDS.values())
    assert set(F32_FFMA_SEEDS) == FP32_TASKS
    assert {GEMM_SEEDS[t].template for t in FP32_TASKS} == {"gemm_f32_3xtf32"}


def test_unknown_task_lists_valid_names():
    with pytest.raises(KeyError, match="kb01_square"):
        gemm_seed("kb99_nope")


@pytest.mark.parametrize("template", [GEMM_F32_TEMPLATE, GEMM_BF16_TEMPLATE])
def test_template_has_one_marker_and_one_entry_point(template):
    src = template_source(template)
    assert sum(line.strip() == TASK_CONFIG_MARKER for line in src.splitlines()) == 1
    assert len(re.findall(r"\bevo_launch\s*\(", src)) == 1
    assert '#include "evo_abi.h"' in src


@pytest.mark.parametrize("task", sorted(ALL_SPECS))
def test_seed_renders_with_its_defines_and_consistent_tunables(task):
    tunables = pytest.importorskip("evo.core.tunables")
    spec = ALL_SPECS[task]
    src = render(spec)
    lines = src.splitlines()
    marker = next(i for i, line in enumerate(lines) if line.strip() == TASK_CONFIG_MARKER)
    for offset, (name, value) in enumerate(spec.defines, 1):
        assert lines[marker + offset] == f"#define {name} {value}"
    assert len(re.findall(r"\bevo_launch\s*\(", src)) == 1
    declared = {t.name: t for t in tunables.parse_tunables(src)}
    assert declared, "template declares no tunables"
    assert tunables.check_tunable_defaults(src) == []
    for name, value in spec.tunable_defaults:
        assert declared[name].default == value
    assert tunables.violated_constraints(src) == [], "the seed's own defaults violate a constraint"


def test_task_config_matches_the_task():
    d = {k: dict(v.defines) for k, v in GEMM_SEEDS.items()}
    assert all(dict(F32_FFMA_SEEDS[k].defines) == d[k] for k in F32_FFMA_SEEDS)
    assert d["kb16_trans_a"] == {"TRANS_A": "1", "TRANS_B": "0", "EPILOGUE": "0"}
    assert d["kb17_trans_b"] == {"TRANS_A": "0", "TRANS_B": "1", "EPILOGUE": "0"}
    assert d["kb18_trans_both"] == {"TRANS_A": "1", "TRANS_B": "1", "EPILOGUE": "0"}
    assert d["kb14_upper"]["EPILOGUE"] == "1" and d["kb15_lower"]["EPILOGUE"] == "2"
    assert d["gemm_bias_gelu_bf16"]["EPILOGUE"] == "1" and d["gemm_silu_mul_bf16"]["EPILOGUE"] == "2"
    assert dict(GEMM_SEEDS["kb06_large_k"].tunable_defaults)["SPLIT_WS"] == "1"   # workspace split-K, Hopper kernel


def test_constraints_reject_oversized_configs():
    tunables = pytest.importorskip("evo.core.tunables")
    f32 = render(F32_FFMA_SEEDS["kb01_square"])
    assert tunables.violated_constraints(f32, {"BM": "256", "BN": "256", "THR_M": "4", "THR_N": "16"})
    assert tunables.violated_constraints(f32, {"BK": "32", "STAGES": "6", "BM": "256", "BN": "256"})
    bf16 = render(GEMM_SEEDS["gemm_silu_mul_bf16"])
    assert tunables.violated_constraints(bf16, {"TILE_N": "256"})      # two 128x256 fp32 accumulators
    assert tunables.violated_constraints(render(GEMM_SEEDS["gemm_bf16"]), {"STAGES": "7"})  # > 227 KB smem


def test_bf16_pingpong_constraints():
    """PINGPONG: one warpgroup holds a whole tile's accumulators (<= 128 x 128 fp32 values, 128
    registers a thread), and it needs the persistent loop and no cluster (and the immediate
    epilogue: the seeds' EPI_DEFER is switched off here)."""
    tunables = pytest.importorskip("evo.core.tunables")
    gemm = render(GEMM_SEEDS["gemm_bf16"])            # PERSIST = 1
    dual = render(GEMM_SEEDS["gemm_silu_mul_bf16"])   # PERSIST = 1, two accumulators
    ok = lambda src, **kv: not tunables.violated_constraints(
        src, {"EPI_DEFER": "0"} | {k: str(v) for k, v in kv.items()})
    assert ok(gemm, PINGPONG=1, TILE_N=128, STAGES=6) and ok(gemm, PINGPONG=1, TILE_M=64, STAGES=5)
    assert not ok(gemm, PINGPONG=1)                                   # 128 x 256: 256 registers
    assert not ok(gemm, PINGPONG=1, TILE_N=128, PERSIST=0)
    assert not ok(gemm, PINGPONG=1, TILE_N=128, CLUSTER_M=2)
    assert not ok(dual, PINGPONG=1, TILE_M=64)                        # the SwiGLU seed runs clusters
    assert ok(dual, PINGPONG=1, TILE_M=64, CLUSTER_M=1) and not ok(dual, PINGPONG=1, CLUSTER_M=1)


# ------------------------------------------------------------------------------------------
# real compiles (cached)
# ------------------------------------------------------------------------------------------

def _check_build(request, task: str) -> dict[str, dict]:
    """A seed (an fp32 task's FFMA alternative, a bf16 task's registry seed) built for sm_90a with
    its tunable defaults through ``compile_candidate`` into the suite's shared build cache
    (tests/toolchain.py; the gemm_bf16 build is the one test_bf16_gemm_sass_uses_hgmma_and_tma
    disassembles): it builds, ptxas reports every kernel, none spills, no wgmma is serialised.
    Returns ptxas's per-kernel report (mangled name -> registers, spills, ...)."""
    from toolchain import compile_shared
    from evo.core.tunables import parse_tunables

    src = render(F32_FFMA_SEEDS[task] if task in F32_FFMA_SEEDS else GEMM_SEEDS[task])
    params = {t.name: t.default for t in parse_tunables(src)}
    outcome = compile_shared(request, task, src, params, timeout_s=900)
    m = outcome.result.metrics
    assert m["kernels"], "no ptxas resource report"
    spilled = {k: v for k, v in m["kernels"].items() if v["spill_stores"] or v["spill_loads"]}
    assert not spilled, f"{task} spills registers: {spilled}"
    assert not m["wgmma_serialized"], f"{task}: wgmma serialization\n{outcome.result.artifacts.get('wgmma_serialization')}"
    return m["kernels"]


from toolchain import COMPILE_ALL as _ALL, variants  # noqa: E402  (tests/ is on sys.path)
_F32_BUILDS = sorted(FP32_TASKS) if _ALL else ["kb01_square"]
_BF16_BUILDS = sorted(BF16_TASKS) if _ALL else ["gemm_bf16"]


@pytest.mark.slow
@pytest.mark.parametrize("task", _F32_BUILDS)
def test_fp32_ffma_seed_compiles_for_sm90a(request, task):
    kernels = _check_build(request, task)
    assert any("gemm_f32_kernel" in k for k in kernels), list(kernels)


#: The gemm_bf16 seed's build (its tunable defaults) is checked by the two tests below; one
#: worker runs both, so the second reads the first's build instead of waiting for it.
_GEMM_BF16_BUILD = pytest.mark.xdist_group("gemm_bf16_seed_build")


@pytest.mark.slow
@_GEMM_BF16_BUILD
@pytest.mark.parametrize("task", _BF16_BUILDS)
def test_bf16_seed_compiles_for_sm90a_with_both_producer_paths(request, task):
    kernels = [k for k in _check_build(request, task) if k.startswith("_ZN8evo_bf16")]
    # one TMA instantiation (template flag true: "Lb1E") and one fallback ("Lb0E")
    assert any("Lb1E" in k for k in kernels) and any("Lb0E" in k for k in kernels), kernels


@pytest.mark.slow
@_GEMM_BF16_BUILD
def test_bf16_gemm_sass_uses_hgmma_and_tma(request, tmp_path):
    """Issue 8's SASS check for the bf16 seed: both instantiations (TMA producer and the
    predicated ld.global fallback) run their maths on HGMMA bf16 -> fp32, the TMA one loads with
    UTMALDG, and neither touches local memory (no spills, no stack arrays)."""
    kernels = _bf16_sass(request, tmp_path, "gemm_bf16")
    for name, body in kernels.items():
        assert re.search(r"HGMMA\.64x\d+x16\.F32\.BF16", body), name
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
        if "Lb1E" in name:
            assert "UTMALDG" in body, name


def _bf16_sass(request, tmp_path, task: str, **overrides: str) -> dict[str, str]:
    """SASS of the bf16 template's two GEMM instantiations (TMA: "Lb1E", fallback: "Lb0E") of a
    seed built with its tunable defaults plus ``overrides``, by function name. The seed itself
    is its full .so build (the one test_bf16_seed_compiles_for_sm90a_with_both_producer_paths
    checks for gemm_bf16; host code included); a variant (overrides that change a default) is a
    device-only build (tests/toolchain.py)."""
    from toolchain import build_sass
    from evo.core.tunables import parse_tunables, violated_constraints

    src = render(GEMM_SEEDS[task])
    defaults = {t.name: t.default for t in parse_tunables(src)}
    params = defaults | overrides
    assert violated_constraints(src, params) == []
    outcome, functions = build_sass(request, tmp_path, task, src, params, timeout_s=900,
                                    device_only=params != defaults)
    assert not outcome.result.metrics.get("wgmma_serialized", False)
    kernels = {name: body for name, body in functions.items()
               if name.startswith("_ZN8evo_bf16") and "pad_rows" not in name}
    assert any("Lb1E" in k for k in kernels) and any("Lb0E" in k for k in kernels), list(functions)
    return kernels


@pytest.mark.slow
@pytest.mark.parametrize(("task", "tiles"), variants([
    ("gemm_bias_gelu_bf16", {"TILE_N": "128", "STAGES": "6", "CLUSTER_M": "1", "EPI_BF16X2": "0"}),
    ("gemm_silu_mul_bf16", {"TILE_M": "64", "STAGES": "5", "CLUSTER_M": "1"})]))
def test_bf16_pingpong_sass(request, tmp_path, task, tiles):
    """PINGPONG = 1: the TMA kernel's consumer warpgroups take turns through an order barrier
    (named barriers 1 and 2 of 256 threads: BAR.SYNC and BAR.ARV), still run HGMMA, and stay free of local
    memory with a whole tile's accumulators in one warpgroup; the fallback kernel has no order
    barrier."""
    kernels = _bf16_sass(request, tmp_path, task, PINGPONG="1", EPI_DEFER="0", **tiles)
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
        assert re.search(r"HGMMA\.64x\d+x16\.F32\.BF16", body), name
        if "Lb1E" in name:
            # 256 threads (0x100) on a barrier id in a register: not __syncthreads' BAR.SYNC 0x0
            assert re.search(r"BAR\.SYNC(\.DEFER_BLOCKING)? R\d+, 0x100", body), name
            assert re.search(r"\bBAR\.ARV R\d+, 0x100", body), name
        else:
            assert not re.search(r"\bBAR\.ARV\b", body), name


@pytest.mark.slow
@pytest.mark.parametrize(("task", "cm", "cn"), variants([
    ("gemm_bf16", "2", "1"),
    ("gemm_silu_mul_bf16", "2", "1"),
    ("gemm_bf16", "1", "2"),
    ("gemm_bias_gelu_bf16", "2", "2"),
    ("gemm_silu_mul_bf16", "2", "2"),
], keep=(1, 3)))
def test_bf16_cluster_multicast_sass(request, tmp_path, task, cm, cn):
    """CLUSTER_M = 2 (clusters along M sharing B) / CLUSTER_N = 2 (along N sharing A): the TMA
    kernel loads the shared operand by multicast TMA (both operands with 2 x 2 clusters: no
    plain tensor load left), releases stages to its peers by remote mbarrier arrives, meets
    them at cluster barriers (start and exit), and stays free of local memory; the fallback
    kernel is unchanged (no cluster). The CLUSTER_M = 2 representative is the SwiGLU seed
    itself (its defaults), whose build test_bf16_epi_defer_sass reads too."""
    kernels = _bf16_sass(request, tmp_path, task, CLUSTER_M=cm, CLUSTER_N=cn)
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
        if "Lb1E" in name:
            loads = re.findall(r"UTMALDG\.3D(\.MULTICAST)?", body)
            assert any(loads), f"{name}: no multicast TMA load"
            # one operand multicast, the other loaded plainly; both multicast with 2 x 2 clusters
            assert all(loads) == (cm == cn == "2"), (name, loads)
            assert re.search(r"SYNCS\.ARRIVE\.TRANS64\.RED", body), name   # mbarrier arrive on a peer
            assert "UCGABAR_ARV" in body and "UCGABAR_WAIT" in body, name
        else:
            assert "MULTICAST" not in body and "UCGABAR" not in body, name


def test_bf16_cluster_constraints():
    """PINGPONG and STREAMK need single-CTA clusters along N as along M; 2 x 2 clusters are
    legal with the cooperative persistent kernel."""
    from evo.core.tunables import parse_tunables, violated_constraints

    src = render(GEMM_SEEDS["gemm_bias_gelu_bf16"])
    base = {t.name: t.default for t in parse_tunables(src)}
    assert violated_constraints(src, base | {"CLUSTER_M": "2", "CLUSTER_N": "2", "PERSIST": "1"}) == []
    assert violated_constraints(src, base | {"CLUSTER_N": "2", "PINGPONG": "1", "PERSIST": "1", "TILE_N": "128"})
    assert violated_constraints(src, base | {"CLUSTER_N": "2", "STREAMK": "1", "PERSIST": "1"})


def _longest_branch_free_run(body: str, opcode: str) -> int:
    """Most ``opcode`` instructions between two branches (``BRA``) in one SASS listing."""
    best = run = 0
    for line in body.splitlines():
        if re.search(r"\bBRA\b", line):
            run = 0
        elif re.search(rf"\b{re.escape(opcode)}\b", line):
            run += 1
            best = max(best, run)
    return best


@pytest.mark.slow
@pytest.mark.parametrize(("task", "overrides", "values"), variants([
    ("gemm_bias_gelu_bf16", {"EPI_DEFER": "0", "EPI_BF16X2": "0"}, 128 * 256 // 256),     # 128 x 256 tile, 256 consumer threads
    ("gemm_silu_mul_bf16", {"EPI_DEFER": "0"}, 128 * 128 // 256),
]))
def test_bf16_straight_line_epilogue_sass(request, tmp_path, task, overrides, values):
    """EPI_FAST (the default), immediate epilogue (EPI_DEFER = 0; the seeds defer theirs, see
    test_bf16_epi_defer_sass): the TMA kernel stores a tile that lies wholly inside C with no
    branch between its bf16x2 stores (one 32-bit STG per value pair), and the bias of bias+GELU
    comes in one batch of 32-bit read-only loads (one per 8-column group, 256 / 8 = 32) issued
    before the last wgmma wait, not one 16-bit load per value behind the previous store."""
    kernels = _bf16_sass(request, tmp_path, task, **overrides)
    tma = next(body for name, body in kernels.items() if "Lb1E" in name)
    pairs = values // 2
    run = _longest_branch_free_run(tma, "STG.E")
    assert run >= pairs, f"longest branch-free run of STG.E is {run}, want {pairs}"
    if task == "gemm_bias_gelu_bf16":
        head = tma.split("WARPGROUP.DEPBAR.LE gsb0, 0x0")[0]
        batch = _longest_branch_free_run(head, "LDG.E.CONSTANT")
        assert batch >= 32, f"bias loads before the last wgmma wait: {batch} in a row, want 32"


def test_bf16_streamk_constraints():
    """STREAMK needs the persistent cooperative TMA kernel with one accumulator: no clusters, no
    ping-pong, not the dual (SwiGLU) GEMM (and the immediate epilogue, EPI_DEFER = 0)."""
    tunables = pytest.importorskip("evo.core.tunables")
    gemm = render(GEMM_SEEDS["gemm_bf16"])            # PERSIST = 1
    dual = render(GEMM_SEEDS["gemm_silu_mul_bf16"])
    ok = lambda src, **kv: not tunables.violated_constraints(
        src, {"EPI_DEFER": "0"} | {k: str(v) for k, v in kv.items()})
    assert ok(gemm, STREAMK=1)
    assert not ok(gemm, STREAMK=1, EPI_DEFER=1)
    assert not ok(gemm, STREAMK=1, PERSIST=0)
    assert not ok(gemm, STREAMK=1, CLUSTER_M=2)
    assert not ok(gemm, STREAMK=1, PINGPONG=1, TILE_N=128)
    assert not ok(dual, STREAMK=1, CLUSTER_M=1)


@pytest.mark.slow
@pytest.mark.parametrize("task", variants(["gemm_bf16", "gemm_bias_gelu_bf16"]))
def test_bf16_streamk_sass(request, tmp_path, task):
    """STREAMK = 1: the TMA kernel publishes partial tiles with a release store and waits for
    them with acquire loads (gpu scope), syncs the 256 consumer threads on named barrier 1,
    still runs HGMMA, and stays free of local memory; the fallback kernel (never persistent)
    has none of it."""
    kernels = _bf16_sass(request, tmp_path, task, STREAMK="1", CLUSTER_M="1", EPI_DEFER="0", EPI_BF16X2="0")
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
        assert re.search(r"HGMMA\.64x\d+x16\.F32\.BF16", body), name
        if "Lb1E" in name:
            assert re.search(r"STG\.E\.STRONG\.GPU", body), name      # st.release.gpu
            assert re.search(r"LDG\.E\.STRONG\.GPU", body), name      # ld.acquire.gpu
            assert re.search(r"BAR\.SYNC(\.DEFER_BLOCKING)? 0x1, 0x100", body), name
        else:
            assert not re.search(r"STRONG\.GPU", body), name


def test_bf16_dual_mma_constraints():
    """DUAL_MMA is the dual (SwiGLU) GEMM's single 2 TILE_N-wide wgmma: only for that task,
    and only while 2 TILE_N fits one wgmma (<= 256 columns)."""
    tunables = pytest.importorskip("evo.core.tunables")
    ok = lambda task, **kv: not tunables.violated_constraints(render(GEMM_SEEDS[task]),
                                                              {k: str(v) for k, v in kv.items()})
    assert ok("gemm_silu_mul_bf16", DUAL_MMA=1, TILE_N=128)
    assert ok("gemm_silu_mul_bf16", DUAL_MMA=1, TILE_N=128, TILE_M=64)
    assert not ok("gemm_silu_mul_bf16", DUAL_MMA=1, TILE_N=256, TILE_M=64)
    assert not ok("gemm_bf16", DUAL_MMA=1, TILE_N=128)
    assert not ok("gemm_bias_gelu_bf16", DUAL_MMA=1, TILE_N=128)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", variants([{}, {"CLUSTER_M": "1"}, {"TILE_M": "64", "CLUSTER_M": "1"}]))
def test_bf16_dual_mma_sass(request, tmp_path, overrides):
    """DUAL_MMA = 1: the SwiGLU TMA kernel's main loop issues one 64 x 2 TILE_N HGMMA per
    k-step (no 64 x TILE_N ones: the two B tiles are one operand), stays free of local memory,
    and keeps the straight-line epilogue (one bf16x2 store per output pair, no branch between;
    the immediate one: EPI_DEFER = 0)."""
    kernels = _bf16_sass(request, tmp_path, "gemm_silu_mul_bf16", DUAL_MMA="1", EPI_DEFER="0", **overrides)
    tn = int(overrides.get("TILE_N", "128"))
    tm = int(overrides.get("TILE_M", "128"))
    tma = next(body for name, body in kernels.items() if "Lb1E" in name)
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
    widths = set(re.findall(r"HGMMA\.64x(\d+)x16\.F32\.BF16", tma))
    assert widths == {str(2 * tn)}, widths
    pairs = (tm // 2) * tn // 128 // 2          # output values per consumer thread / 2
    run = _longest_branch_free_run(tma, "STG.E")
    assert run >= pairs, f"longest branch-free run of STG.E is {run}, want {pairs}"


@pytest.mark.slow
def test_bf16_b_kfirst_loads_b_in_64x64_boxes(request, tmp_path):
    """B_KFIRST = 1 orders B's swizzle atoms k-block first, so CuTe loads each 64 x 64 block of
    the 256 x 64 B stage with one TMA box (4 per stage, plus A's one) instead of 32 boxes of
    64 x 8 (B_KFIRST = 0, the default): the count docs/kernels.md quotes."""
    counts = {}
    for kf in ("0", "1"):
        kernels = _bf16_sass(request, tmp_path, "gemm_bf16", B_KFIRST=kf)
        tma = next(body for name, body in kernels.items() if "Lb1E" in name)
        counts[kf] = len(re.findall(r"\bUTMALDG\.3D\b", tma))
    # 33 and 5 with nvcc 13.0; a different unrolling would scale both, not the ratio
    assert counts["1"] <= 8 and counts["0"] >= 4 * counts["1"], counts


def test_bf16_epi_defer_and_wide_tile_constraints():
    """EPI_DEFER needs the persistent cooperative kernel (no PINGPONG / STREAMK) and at most 128
    accumulators a thread (not TILE_N = 320); TILE_N = 320 (a 64 x 256 and a 64 x 64 wgmma per
    k-step, 160 accumulators) needs TILE_M = 128 and one B operand, so not SwiGLU."""
    tunables = pytest.importorskip("evo.core.tunables")
    ok = lambda task, **kv: not tunables.violated_constraints(render(GEMM_SEEDS[task]),
                                                              {k: str(v) for k, v in kv.items()})
    for task in ("gemm_bf16", "gemm_bias_gelu_bf16", "gemm_silu_mul_bf16"):
        assert ok(task)                                           # the seeds defer
        assert not ok(task, PERSIST=0)
    assert not ok("gemm_bf16", PINGPONG=1, TILE_N=128)
    assert not ok("gemm_bf16", TILE_N=320)
    assert ok("gemm_bf16", TILE_N=320, EPI_DEFER=0) and ok("gemm_bias_gelu_bf16", TILE_N=320, EPI_DEFER=0, EPI_BF16X2=0)
    assert not ok("gemm_bf16", TILE_N=320, EPI_DEFER=0, TILE_M=64)
    assert not ok("gemm_silu_mul_bf16", TILE_N=320, EPI_DEFER=0, DUAL_MMA=0)
    assert not ok("gemm_bf16", TILE_N=320, EPI_DEFER=0, STAGES=5)            # 5 x 56 KB stages
    # EPI_BF16X2 (the bias+GELU seed's packed bias add) lives in the deferred bias+GELU slices
    assert not ok("gemm_bias_gelu_bf16", EPI_DEFER=0)
    assert ok("gemm_bias_gelu_bf16", EPI_DEFER=0, EPI_BF16X2=0)
    assert not ok("gemm_bf16", EPI_BF16X2=1) and not ok("gemm_silu_mul_bf16", EPI_BF16X2=1)


def _under_wgmma(body: str, pattern: str) -> int:
    """Instructions matching ``pattern`` between a HGMMA and the next wait for all wgmmas
    (WARPGROUP.DEPBAR ... 0x0; a wait down to one batch, 0x1, leaves the last one running): what
    the consumers issue while a wgmma batch of theirs runs."""
    count, inside = 0, False
    for line in body.splitlines():
        if "HGMMA." in line:
            inside = True
        elif re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0\b", line):
            inside = False
        elif inside and re.search(pattern, line):
            count += 1
    return count


@pytest.mark.slow
@pytest.mark.parametrize(("task", "pairs"), [
    ("gemm_bf16", 128 * 256 // 256 // 2),        # 128 x 256 tile, 256 consumer threads
    ("gemm_bias_gelu_bf16", 128 * 256 // 256 // 2),
    ("gemm_silu_mul_bf16", 128 * 128 // 256 // 2),
])
def test_bf16_epi_defer_sass(request, tmp_path, task, pairs):
    """EPI_DEFER = 1 (the three persistent seeds): every bf16x2 store of a tile wholly inside C
    is issued between a wgmma of the next tile and the wait for it (the epilogue runs under
    the maths), bias+GELU's bias words are read there too, and the kernels stay free of local
    memory (the packed tile is 64 registers more next to the 128 accumulators; bias+GELU's
    EPI_BF16X2 build with 224 / 56 registers, whose 40-register producer spilled)."""
    kernels = _bf16_sass(request, tmp_path, task)
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
    tma = next(body for name, body in kernels.items() if "Lb1E" in name)
    under = _under_wgmma(tma, r"\bSTG\.E\b")
    assert under >= pairs, f"{under} stores under a wgmma, want the tile's {pairs} pairs"
    if task == "gemm_bias_gelu_bf16":
        loads = _under_wgmma(tma, r"\bLDG\.E\.CONSTANT\b")
        assert loads >= 256 // 8, f"bias loads under a wgmma: {loads}, want one per 8-column group"
        # EPI_BF16X2: one packed bf16x2 FMA (A @ B pair + bias, halved) per output pair
        fmas = _under_wgmma(tma, r"\bHFMA2\.BF16")
        assert fmas >= pairs, f"packed bias FMAs under a wgmma: {fmas}, want the tile's {pairs} pairs"


@pytest.mark.slow
def test_bf16_wide_tile_sass(request, tmp_path):
    """TILE_N = 320: each k-step issues a 64 x 256 and a 64 x 64 HGMMA (no wgmma is wider than
    256), B comes in 64 x 64 TMA boxes, and 160 accumulators a thread fit without local memory."""
    kernels = _bf16_sass(request, tmp_path, "gemm_bias_gelu_bf16", TILE_N="320", EPI_DEFER="0", EPI_BF16X2="0",
                         CLUSTER_M="2")
    tma = next(body for name, body in kernels.items() if "Lb1E" in name)
    for name, body in kernels.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{name} uses local memory"
    assert set(re.findall(r"HGMMA\.64x(\d+)x16\.F32\.BF16", tma)) == {"256", "64"}
    assert "UTMALDG.3D.MULTICAST" in tma                    # 2-CTA clusters share B, box by box
