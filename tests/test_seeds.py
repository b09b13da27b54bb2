"""Seed registry and the memory-bound seed templates (elementwise, rowreduce, matvec).

The compile test builds ONE rendered seed of each template with the real nvcc for sm_90a
through evaluators.compile (cached under pytest's cache dir, so a rerun costs nothing);
it skips when nvcc or the CUTLASS wheel is missing. Correctness and speed need a GPU:
benchmarks/lab/probe.py and `evo bench`.
"""

from __future__ import annotations

import re

import pytest

from evo.tasks import seeds
from evo.tasks.seedspec import TASK_CONFIG_MARKER, SeedSpec, render, template_source
from evo.core.tunables import check_tunable_defaults, parse_constraints, parse_tunables, violated_constraints

MINE = {
    "elementwise": {
        "kb05_scalar", "kb19_relu", "kb20_leaky_relu", "kb21_sigmoid", "kb22_tanh", "kb25_swish", "kb26_gelu",
        "kb27_selu", "kb28_hardsigmoid", "kb29_softplus", "kb30_softsign", "kb31_elu", "kb32_hardtanh",
        "gelu_bf16", "silu_bf16", "kb12_diag",
    },
    "rowreduce": {"kb23_softmax", "kb24_log_softmax", "softmax_bf16", "rmsnorm_bf16"},
    "matvec": {"kb04_matvec"},
}
MY_SEEDS = sorted(set().union(*MINE.values()))
ALLOWED_INCLUDE = re.compile(r'#include\s+(<(cute|cutlass)/[\w/.]+>|<cuda[\w/.]*\.h>|<cooperative_groups\.h>|"evo_abi\.h")')


def test_my_tables_match_templates():
    assert set(seeds.ELEMENTWISE_SEEDS) | set(seeds.ROWREDUCE_SEEDS) | set(seeds.MATVEC_SEEDS) == set(MY_SEEDS)
    for template, names in MINE.items():
        assert {n for n in names if seeds.seed_spec(n).template == template} == names
    assert {"elementwise", "rowreduce", "matvec"} <= set(seeds.template_names())


@pytest.mark.parametrize("name", MY_SEEDS)
def test_seed_renders_self_contained(name):
    src = seeds.seed_source(name)
    spec = seeds.seed_spec(name)
    assert isinstance(spec, SeedSpec)
    assert len(re.findall(r"\bevo_launch\s*\(", src)) == 1
    assert 'EVO_EXPORT int evo_launch(' in src
    for line in src.splitlines():
        if line.lstrip().startswith("#include"):
            assert ALLOWED_INCLUDE.match(line.strip()), line
    # the task config sits right after the marker, in order
    lines = src.splitlines()
    at = lines.index(TASK_CONFIG_MARKER)
    for i, (k, v) in enumerate(spec.defines):
        assert lines[at + 1 + i] == f"#define {k} {v}"


@pytest.mark.parametrize("name", MY_SEEDS)
def test_seed_tunables_consistent(name):
    src = seeds.seed_source(name)
    tunables = parse_tunables(src)
    assert tunables, "every memory-bound seed exposes tunables"
    assert check_tunable_defaults(src) == []
    assert violated_constraints(src) == []
    assert parse_constraints(src)
    params = seeds.seed_params(name)
    assert params == {t.name: t.default for t in tunables}
    for k, v in dict(seeds.seed_spec(name).tunable_defaults).items():
        assert params[k] == v


def test_constraints_use_task_config_constants():
    bf16 = seeds.seed_source("gelu_bf16")
    f32 = seeds.seed_source("kb26_gelu")
    assert violated_constraints(bf16, {"VEC": 8}) == []
    assert any("VEC * EVO_ELEM_BYTES <= 16" in v for v in violated_constraints(f32, {"VEC": 8}))


def test_unknown_seed_lists_valid_names():
    with pytest.raises(KeyError) as exc:
        seeds.seed_spec("kb99_nope")
    assert isinstance(exc.value, seeds.UnknownSeedError)
    assert "kb19_relu" in str(exc.value) and "kb99_nope" in str(exc.value)


def test_render_rejects_bad_specs():
    with pytest.raises(FileNotFoundError, match="elementwise"):
        render(SeedSpec("no_such_template", (), "x"))
    with pytest.raises(ValueError, match="not one of"):
        render(SeedSpec("elementwise", (), "x", (("BLOCK", "96"),)))
    with pytest.raises(ValueError, match="no tunable"):
        render(SeedSpec("elementwise", (), "x", (("NOPE", "1"),)))
    with pytest.raises(ValueError, match="macro name"):
        SeedSpec("elementwise", (("1BAD", "1"),), "x")


def test_tunable_default_override_rewrites_annotation_and_guard():
    src = render(SeedSpec("elementwise", (), "x", (("BLOCK", "512"),)))
    assert "// @tunable BLOCK = 512 in {128, 256, 512, 1024}" in src
    assert "#ifndef BLOCK\n#define BLOCK 512\n" in src
    assert check_tunable_defaults(src) == []


@pytest.mark.parametrize("template", sorted(MINE))
def test_template_has_one_marker(template):
    src = template_source(template)
    assert sum(line.strip() == TASK_CONFIG_MARKER for line in src.splitlines()) == 1


def test_seeds_pass_static_policy():
    policy = pytest.importorskip("evaluators.policy")
    for name in MY_SEEDS:
        r = policy.check_policy(seeds.seed_source(name), seeds.seed_params(name))
        assert r.status.value == "ok", (name, r.reason)


def test_every_task_has_a_seed():
    pytest.importorskip("evo.tasks.gemm_seeds")
    from evo.tasks import get_task, task_names

    missing = [n for n in task_names() if (get_task(n).seed or n) not in seeds.SEEDS]
    assert missing == []


# One rendered seed per template, with the harness's scalar-path instantiation exercised too.
COMPILE_ONE = ["kb25_swish", "kb23_softmax", "kb04_matvec"]


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILE_ONE)
def test_seed_compiles_for_sm90a(name, request):
    from toolchain import compile_shared

    outcome = compile_shared(request, name, seeds.seed_source(name), seeds.seed_params(name))
    assert outcome.so_bytes and outcome.so_bytes[:4] == b"\x7fELF"
    # no spills in the seeds: they are the baseline the search starts from
    log = outcome.result.artifacts.get("ptxas", "")
    assert "bytes spill stores" in log or outcome.cached
    assert re.findall(r"([1-9]\d*) bytes spill stores", log) == []


def test_softmax_seeds_stream_rows():
    """kb23 / kb24 are seeded with rowreduce.cu's STREAM = 1 (H200: 1.42x -> 1.78x torch)."""
    assert seeds.seed_params("kb23_softmax")["STREAM"] == "1" == seeds.seed_params("kb24_log_softmax")["STREAM"]


def test_keep_exp_constraint_only_for_softmax():
    """KEEP_EXP = 1 is allowed where it changes the kernel (softmax) and rejected elsewhere,
    so the tuner spends no compile on a duplicate of the KEEP_EXP = 0 build."""
    for name in ("softmax_bf16", "kb23_softmax"):
        assert violated_constraints(seeds.seed_source(name), {**seeds.seed_params(name), "KEEP_EXP": "1"}) == []
    for name in ("rmsnorm_bf16", "kb24_log_softmax"):
        src, params = seeds.seed_source(name), seeds.seed_params(name)
        assert violated_constraints(src, params) == []
        assert any("KEEP_EXP" in v for v in violated_constraints(src, {**params, "KEEP_EXP": "1"}))


@pytest.mark.slow
def test_keep_exp_sass(request, tmp_path):
    """KEEP_EXP = 1 halves the MUFU exps of softmax's register-resident kernel (pass 2 reuses
    pass 1's exps and adds one per thread), with no local memory for the kept fp32 values (32
    per thread in the softmax_bf16 seed)."""
    from toolchain import build_sass

    name = "softmax_bf16"
    src, params = seeds.seed_source(name), seeds.seed_params(name)
    counts = {}
    for keep in ("0", "1"):
        # the seed (KEEP_EXP = 1) as its .so, the other value device-only (tests/toolchain.py)
        _, functions = build_sass(request, tmp_path, name, src, {**params, "KEEP_EXP": keep},
                                  device_only=keep != params["KEEP_EXP"])
        regs = {fn: body for fn, body in functions.items() if re.search(r"row_kernelILi\d+ELi0E", fn)}
        assert len(regs) == 2, list(functions)  # kRegs for V = VEC (8) and V = 1
        for fn, body in functions.items():
            assert not re.search(r"\b(LDL|STL)\b", body), f"KEEP_EXP={keep}: {fn} uses local memory"
        counts[keep] = {re.search(r"row_kernelILi(\d+)", fn).group(1): len(re.findall(r"MUFU\.EX2", body))
                        for fn, body in regs.items()}
    assert counts["1"]["1"] < counts["0"]["1"], counts
    # the seed's own kernel (V = VEC = 8): VEC x REG_VECS values per thread, whose pass-2 exps
    # become one (the thread's scale)
    values = int(params["VEC"]) * int(params["REG_VECS"])
    assert counts["0"]["8"] - counts["1"]["8"] == values - 1, counts


# STREAM = 1: the kb23 seed as is (it shares test_seed_compiles_for_sm90a's cached build), and
# the bf16 RMSNorm path (16-byte vectors of 8 elements, a weight vector) the search may draw.
STREAM_BUILDS = [("kb23_softmax", {}), ("rmsnorm_bf16", {"STREAM": "1", "BLOCK": "512"})]


@pytest.mark.slow
@pytest.mark.parametrize("name,override", STREAM_BUILDS, ids=[n for n, _ in STREAM_BUILDS])
def test_row_stream_sass(name, override, request, tmp_path):
    """rowreduce.cu at STREAM = 1 builds for sm_90a with no local memory, passes the static
    policy, and its streaming kernel really moves rows by bulk copies completed on mbarriers
    (UBLKCP + SYNCS) while the other instantiations do not."""
    from toolchain import build_sass

    src = seeds.seed_source(name)
    params = {**seeds.seed_params(name), **override}
    policy = pytest.importorskip("evaluators.policy")
    verdict = policy.check_policy(src, params)
    assert verdict.status.value == "ok", verdict.reason
    # a variant (the override) device-only, the seed as its .so (tests/toolchain.py)
    _, functions = build_sass(request, tmp_path, name, src, params, device_only=bool(override))
    stream = [body for fn, body in functions.items() if "row_stream_kernel" in fn]
    assert len(stream) == 1, list(functions)
    assert "UBLKCP" in stream[0] and "SYNCS.ARRIVE.TRANS64" in stream[0]
    for fn, body in functions.items():
        assert not re.search(r"\b(LDL|STL)\b", body), f"{fn} uses local memory"
        if "row_stream_kernel" not in fn:
            assert "UBLKCP" not in body, fn
