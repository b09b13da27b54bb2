"""Task suite: registry, inputs, counts, speed-of-light, tolerance rules, user task files.

CPU only, small shapes only (the checking shapes every task carries).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import textwrap
from pathlib import Path

import pytest
import torch

import evo.tasks as T
from evo.tasks import gpus
from evo.tasks.base import Task, Tolerance
from evo.tasks.inputs import sample
from evo.tasks.tolerance import check, check_deterministic, fp32_gemm

REPO = Path(__file__).resolve().parents[1]

KB_NAMES = (
    "kb01_square kb02_standard kb03_bmm kb04_matvec kb05_scalar kb06_large_k kb07_small_k "
    "kb08_irregular kb09_tall_skinny kb10_3d kb11_4d kb12_diag kb13_symmetric kb14_upper "
    "kb15_lower kb16_trans_a kb17_trans_b kb18_trans_both kb19_relu kb20_leaky_relu "
    "kb21_sigmoid kb22_tanh kb23_softmax kb24_log_softmax kb25_swish kb26_gelu kb27_selu "
    "kb28_hardsigmoid kb29_softplus kb30_softsign kb31_elu kb32_hardtanh"
).split()
MODERN_NAMES = (
    "gemm_bf16 gemm_bf16_irregular bmm_bf16 gemm_bias_gelu_bf16 gemm_silu_mul_bf16 "
    "gelu_bf16 silu_bf16 softmax_bf16 rmsnorm_bf16"
).split()
ALL = KB_NAMES + MODERN_NAMES
FP32_GEMMS = [n for n in KB_NAMES if T.get_task(n).tags[:1] in (("gemm",), ("gemv",))]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def smallest(task: Task) -> dict:
    return min(task.shapes, key=lambda s: math.prod(s.values()))


def inputs_and_ref(task: Task, shape: dict, dist: str, seed: int = 0):
    xs = task.make_inputs(shape, gen(seed), dist, "cpu")
    rd = getattr(torch, task.reference_dtype)
    ref = task.reference(*[x.to(rd) for x in xs])
    return xs, ref


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round an fp32 tensor's mantissa to tf32's 10 bits (round half away from zero)."""
    i = x.contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


# ------------------------------------------------------------------------------- registry
def test_exact_task_names_and_families():
    assert T.task_names("kernelbench-l1") == KB_NAMES
    assert T.task_names("modern") == MODERN_NAMES
    assert T.task_names()[: len(ALL)] == ALL
    assert T.families()[:2] == ["kernelbench-l1", "modern"]
    for n in ALL:
        t = T.get_task(n)
        assert t.seed == n and t.name == n
        assert t.dtype == ("float32" if n.startswith("kb") else "bfloat16")
        assert t.reference_dtype == ("float64" if n.startswith("kb") else "float32")
    assert T.get_task("gemm_bf16").bench_shapes == 2
    assert [s["M"] for s in T.get_task("gemm_bf16").benchmark_shapes] == [8192, 4096]


def test_unknown_task_lists_names_and_close_matches():
    with pytest.raises(T.UnknownTaskError) as ei:
        T.get_task("kb23_sofmax")
    assert isinstance(ei.value, KeyError)
    msg = str(ei.value)
    assert "'kb23_softmax'" in msg and "kb01_square" in msg and "rmsnorm_bf16" in msg
    with pytest.raises(T.UnknownFamilyError, match="kernelbench-l1"):
        T.task_names("kernelbench")
    with pytest.raises(KeyError):
        T.tasks_for(["family:nope"])


def test_tasks_for_names_and_families_in_order_without_duplicates():
    got = [t.name for t in T.tasks_for(["kb19_relu", "family:modern", "gemm_bf16"])]
    assert got == ["kb19_relu"] + MODERN_NAMES
    assert T.tasks_for([]) == []


def test_registry_duplicate_and_validation():
    t = T.get_task("kb19_relu")
    assert T.BUILTIN_TASKS.with_tasks([t]).names() == T.task_names()  # the same task again: no-op
    from dataclasses import replace

    with pytest.raises(T.DuplicateTaskError, match="already registered"):
        T.BUILTIN_TASKS.with_tasks([replace(t, description="another")])
    with pytest.raises(T.InvalidTaskError, match="dtype"):
        T.TaskRegistry([replace(t, name="x_bad", dtype="int8")])
    with pytest.raises(T.InvalidTaskError, match="dtype"):
        T.validate_task(replace(t, name="x_bad", dtype="int8"))
    with pytest.raises(T.InvalidTaskError, match="bench_shapes"):
        T.validate_task(replace(t, name="x_bad", bench_shapes=9))
    with pytest.raises(T.InvalidTaskError, match="distribution"):
        T.validate_task(replace(t, name="x_bad", distributions=("gaussian",)))
    with pytest.raises(T.InvalidTaskError, match="shapes"):
        T.validate_task(replace(t, name="x_bad", shapes=({"R": 0, "C": 3},)))


def test_task_table_rows():
    rows = T.task_table(gpus.H200)
    by = {r["name"]: r for r in rows}
    assert set(ALL) <= set(by)
    r = by["gemm_bf16"]
    assert r["n_shapes"] == 4 and r["n_bench"] == 2 and "M=8192" in r["bench_shape"]
    assert r["sol_ms"] == pytest.approx(2 * 8192**3 / 989.4e12 * 1e3)
    assert all(x["sol_ms"] is None for x in T.task_table(None))


def test_tasks_pickle_by_reference():
    for n in ALL:
        t = T.get_task(n)
        assert pickle.loads(pickle.dumps(t)) == t


# ------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("name", ALL)
def test_reference_runs_on_smallest_shape_and_counts_match(name):
    task = T.get_task(name)
    shape = smallest(task)
    xs, ref = inputs_and_ref(task, shape, task.distributions[0])
    assert all(x.is_contiguous() and x.dtype == getattr(torch, task.dtype) for x in xs)
    assert torch.isfinite(ref).all()
    # flops / bytes positive on every shape
    for s in task.shapes:
        assert task.flops(s) > 0 and task.bytes(s) > 0
    # bytes = inputs + output at the task dtype (triangular inputs: the stored half only)
    item = getattr(torch, task.dtype).itemsize
    specs = task.make_inputs.specs
    elems = sum(sp.stored_numel(shape) for sp in specs) + ref.numel()
    assert task.bytes(shape) == elems * item
    if not any(sp.structure in ("upper", "lower") for sp in specs):
        assert elems == sum(x.numel() for x in xs) + ref.numel()
    # baseline call on the task-dtype inputs gives the output dtype
    base = task.reference(*xs)
    assert base.dtype == getattr(torch, task.dtype) and base.shape == ref.shape


def test_inputs_deterministic_per_seed_and_device_checked():
    task = T.get_task("kb01_square")
    shape = task.shapes[1]
    a = task.make_inputs(shape, gen(7), "normal", "cpu")
    b = task.make_inputs(shape, gen(7), "normal", "cpu")
    c = task.make_inputs(shape, gen(8), "normal", "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    with pytest.raises(ValueError, match="same device"):
        task.make_inputs(shape, gen(0), "normal", "cuda")
    with pytest.raises(ValueError, match="unknown distribution"):
        task.make_inputs(shape, gen(0), "gaussian", "cpu")


def test_distributions_differ():
    size = (200_000,)
    s = {d: sample(size, gen(0), d) for d in T.DISTRIBUTIONS}
    assert abs(s["normal"].mean()) < 0.02 and s["normal"].std() == pytest.approx(1, rel=0.02)
    assert s["wide"].std() == pytest.approx(10, rel=0.02)
    assert s["logits"].std() == pytest.approx(30, rel=0.02)
    assert s["uniform"].min() >= -1 and s["uniform"].max() < 1 and s["uniform"].min() < -0.99
    assert s["kernelbench"].min() >= 0 and s["kernelbench"].max() < 1
    # wide crosses every activation threshold: |x| > 20 (Softplus) both ways
    assert (s["wide"] > 20).any() and (s["wide"] < -20).any()


def test_structured_inputs():
    for name, check_fn in [
        ("kb13_symmetric", lambda A: torch.equal(A, A.T)),
        ("kb14_upper", lambda A: torch.equal(A, torch.triu(A))),
        ("kb15_lower", lambda A: torch.equal(A, torch.tril(A))),
    ]:
        task = T.get_task(name)
        for d in task.distributions:
            A, B = task.make_inputs(smallest(task), gen(1), d, "cpu")
            assert check_fn(A) and check_fn(B) and A.abs().sum() > 0


def test_bf16_inputs_are_rounded_float32_samples():
    task = T.get_task("gelu_bf16")
    (x,) = task.make_inputs({"R": 3, "C": 5}, gen(3), "normal", "cpu")
    ref = sample((3, 5), gen(3), "normal").to(torch.bfloat16)
    assert x.dtype == torch.bfloat16 and torch.equal(x, ref)


# ------------------------------------------------------------------------------- counts / GPUs
def test_counts_and_speed_of_light_match_tasks_md():
    h200 = T.get_gpu("h200")
    # memory-bound speed-of-light values from TASKS.md (compulsory bytes / 4274 GB/s)
    expect = {"kb19_relu": 3.0147, "kb05_scalar": 2.0098, "kb12_diag": 0.0314,
              "softmax_bf16": 0.1256, "rmsnorm_bf16": 0.1256, "gelu_bf16": 1.5074}
    for n, ms in expect.items():
        t = T.get_task(n)
        assert t.bytes(t.shapes[0]) / (h200.bandwidth_gbs * 1e9) * 1e3 == pytest.approx(ms, rel=2e-3)
        assert T.speed_of_light_ms(t, t.shapes[0], h200) == pytest.approx(ms, rel=2e-3)
    # fp32 GEMM roof is the tf32 tensor peak
    kb1 = T.get_task("kb01_square")
    assert T.speed_of_light_ms(kb1, kb1.shapes[0], h200) == pytest.approx(
        2 * 4096**3 / 494.7e12 * 1e3)
    # triangular product: only the band of MACs counts
    kb14 = T.get_task("kb14_upper")
    n = 5
    assert kb14.flops({"N": n}) == 2 * sum(j - i + 1 for i in range(n) for j in range(i, n))
    assert kb14.bytes({"N": n}) == (2 * n * (n + 1) // 2 + n * n) * 4


def test_gpu_lookup():
    assert T.gpu_names() == ["H100", "H200"]
    assert T.get_gpu("H100") is gpus.H100 and T.get_gpu("NVIDIA H200") is gpus.H200
    assert gpus.match_gpu("NVIDIA H100 80GB HBM3") is gpus.H100
    assert gpus.match_gpu("NVIDIA A100-SXM4-80GB") is None
    with pytest.raises(T.UnknownGpuError, match="known GPUs: H100, H200") as ei:
        T.get_gpu("A100")
    assert isinstance(ei.value, KeyError)
    if not torch.cuda.is_available():
        assert T.detect_gpu() is None


# ------------------------------------------------------------------------------- tolerance
def seq_matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """fp32, one rounding per multiply and per add, k in increasing order."""
    acc = torch.zeros(A.shape[0], B.shape[1])
    for k in range(A.shape[1]):
        acc = acc + A[:, k : k + 1] * B[k : k + 1, :]
    return acc


def test_kb01_fp32_orders_pass_tf32_and_bf16_fail():
    task = T.get_task("kb01_square")
    shape = task.shapes[1]  # M=129, N=383, K=97
    for dist in task.distributions:
        (A, B), ref = inputs_and_ref(task, shape, dist)
        legit = {
            "torch": A @ B,
            "sequential": seq_matmul(A, B),
            "split-k": sum(A[:, k : k + 8] @ B[k : k + 8] for k in range(0, A.shape[1], 8)),
            "reversed-k": torch.flip(A, [1]) @ torch.flip(B, [0]),
        }
        for label, out in legit.items():
            ok, why, _ = check(out, ref, task.tolerance, dtype="float32")
            assert ok, (dist, label, why)
        if dist == "normal":
            for label, out in {"tf32": tf32(A) @ tf32(B),
                               "bf16": (A.bfloat16() @ B.bfloat16()).float()}.items():
                ok, why, m = check(out, ref, task.tolerance, dtype="float32")
                assert not ok and m["rel_l2"] > 2e-4, (label, m)


@pytest.mark.parametrize("name", FP32_GEMMS)
def test_fp32_gemms_pass_fp32_fail_tf32(name):
    task = T.get_task(name)
    shape = smallest(task)
    xs, ref = inputs_and_ref(task, shape, "normal")
    ok, why, _ = check(task.reference(*xs), ref, task.tolerance, dtype="float32")
    assert ok, why
    out = task.reference(*[tf32(x) for x in xs])
    ok, why, _ = check(out, ref, task.tolerance, dtype="float32")
    assert not ok and "relative L2" in why


def test_fp32_gemm_rule():
    assert fp32_gemm(64).rel_l2 == 1e-5
    assert fp32_gemm(4096).rel_l2 == pytest.approx(4 * 2**-24 * 64)
    assert fp32_gemm(1 << 20).rel_l2 == 1e-4
    assert all(fp32_gemm(k).rel_l2 < 2e-4 for k in (1, 97, 4096, 1 << 20))  # below tf32


_E = torch.exp
#: fp32 formulas a fast kernel might use (cancellation included), all legitimate.
FORMULAS = {
    "kb21_sigmoid": lambda x: 1 / (1 + _E(-x)),
    "kb22_tanh": lambda x: 1 - 2 / (_E(2 * x) + 1),
    "kb25_swish": lambda x: x / (1 + _E(-x)),
    "kb26_gelu": lambda x: 0.5 * x * (1 + torch.erf(x * 0.70710678)),
    "kb27_selu": lambda x: 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * (_E(x) - 1)),
    "kb28_hardsigmoid": lambda x: torch.clamp(x * (1 / 6) + 0.5, 0, 1),
    "kb29_softplus": lambda x: torch.where(x > 20, x, torch.log(1 + _E(x))),
    "kb30_softsign": lambda x: x / (1 + x.abs()),
    "kb31_elu": lambda x: torch.where(x > 0, x, _E(x) - 1),
    "kb23_softmax": lambda x: (lambda e: e / e.sum(1, keepdim=True))(_E(x - x.max(1, keepdim=True).values)),
    "kb24_log_softmax": lambda x: (lambda s: s - torch.log(_E(s).sum(1, keepdim=True)))(
        x - x.max(1, keepdim=True).values),
}


def ulp_jitter(y: torch.Tensor, k: int = 2, seed: int = 0) -> torch.Tensor:
    """Move every non-zero element by up to k ulps (a fast-math function's error)."""
    g = torch.Generator().manual_seed(seed)
    j = torch.randint(-k, k + 1, y.shape, generator=g, dtype=torch.int32)
    moved = (y.view(torch.int32) + j).view(torch.float32)
    return torch.where((y == 0) | ~torch.isfinite(moved) | (moved.sign() != y.sign()), y, moved)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_fp32_activation_formulas_and_fast_math_pass_bf16_fails(name):
    task = T.get_task(name)
    f = FORMULAS[name]
    for i, dist in enumerate(task.distributions):
        # every distribution on the first checking shape; the long-row shape once
        for shape in task.shapes[1:] if i == 0 else task.shapes[1:2]:
            (x,), ref = inputs_and_ref(task, shape, dist)
            for label, out in {"formula": f(x), "jitter": ulp_jitter(f(x)),
                               "torch fp32": task.reference(x)}.items():
                ok, why, _ = check(out, ref, task.tolerance, dtype="float32")
                assert ok, (dist, shape, label, why)
            ok, _, _ = check(task.reference(x.bfloat16()).float(), ref, task.tolerance)
            assert not ok


@pytest.mark.parametrize("name", MODERN_NAMES)
def test_bf16_tasks_accept_torch_bf16_and_rounded_ref(name):
    task = T.get_task(name)
    for dist in task.distributions:
        shape = task.shapes[task.bench_shapes]
        xs, ref = inputs_and_ref(task, shape, dist)
        for label, out in {"eager bf16": task.reference(*xs), "rounded": ref.bfloat16()}.items():
            ok, why, m = check(out, ref, task.tolerance, dtype="bfloat16")
            assert ok, (dist, label, why)
            assert m["rel_l2"] < 5e-3


@pytest.mark.parametrize("name", ALL)
def test_zero_copy_constant_outputs_fail(name):
    task = T.get_task(name)
    shape = smallest(task)
    failed_copy = failed_const = False
    for dist in task.distributions:
        xs, ref = inputs_and_ref(task, shape, dist)
        dt = getattr(torch, task.dtype)
        ok, why, _ = check(torch.zeros(ref.shape, dtype=dt), ref, task.tolerance, dtype=dt)
        assert not ok, (dist, "zero")
        flat = xs[0].reshape(-1)[: ref.numel()]
        copy = torch.cat([flat, torch.zeros(ref.numel() - flat.numel(), dtype=dt)]).reshape(ref.shape)
        failed_copy |= not check(copy, ref, task.tolerance, dtype=dt)[0]
        const = torch.full(ref.shape, float(ref.mean()), dtype=dt)
        failed_const |= not check(const, ref, task.tolerance, dtype=dt)[0]
        if dist == "normal":
            assert failed_copy and failed_const, "copy/constant must fail on zero-mean inputs"
    assert failed_copy and failed_const


def test_check_reports_nonfinite_shape_dtype_and_worst_element():
    ref = torch.linspace(-1, 1, 60, dtype=torch.float64).reshape(6, 10)
    tol = Tolerance(atol=1e-6, rtol=1e-5, rel_l2=1e-5, atol_relative=True)
    out = ref.float().clone()
    ok, why, m = check(out, ref, tol, dtype="float32")
    assert ok and why == "ok" and m["n_violations"] == 0
    bad = out.clone()
    bad[2, 3] = float("nan")
    ok, why, m = check(bad, ref, tol, dtype=torch.float32)
    assert not ok and "non-finite" in why and "(2, 3)" in why and m["n_nonfinite"] == 1
    bad = out.clone()
    bad[4, 7] += 0.5
    ok, why, m = check(bad, ref, tol, chunk=7)  # chunks smaller than a row
    assert not ok and m["worst_index"] == [4, 7] and "elementwise" in why and "relative L2" in why
    assert m["max_abs_err"] == pytest.approx(0.5, rel=1e-6)
    assert m["worst_ref"] == pytest.approx(float(ref[4, 7]))
    ok, why, _ = check(out.reshape(10, 6), ref, tol)
    assert not ok and "shape mismatch" in why
    ok, why, _ = check(out.double(), ref, tol, dtype="float32")
    assert not ok and "dtype mismatch" in why
    ok, why, _ = check(out.int(), ref, tol)
    assert not ok and "dtype" in why
    ok, why, _ = check(None, ref, tol)
    assert not ok
    # NaN in the reference must be matched, infinities too
    r2 = ref.clone()
    r2[0, 0] = float("nan")
    r2[0, 1] = float("inf")
    o2 = r2.float().clone()
    assert check(o2, r2, tol)[0]
    o2[0, 1] = 0.0
    assert not check(o2, r2, tol)[0]
    # chunked == unchunked
    noisy = ref.float() * (1 + 1e-6)
    a, b = check(noisy, ref, tol), check(noisy, ref, tol, chunk=3)
    assert a[0] == b[0] and a[2]["rel_l2"] == pytest.approx(b[2]["rel_l2"])


def test_check_absolute_atol_and_empty():
    ref = torch.zeros(4, dtype=torch.float64)
    assert check(torch.zeros(4), ref, Tolerance(atol=0.0, rtol=0.0, rel_l2=1e-5))[0]
    ok, why, m = check(torch.full((4,), 1e-3), ref, Tolerance(atol=1e-2, rtol=0.0, rel_l2=1.0))
    assert not ok and math.isinf(m["rel_l2"])  # zero reference: any error is infinite rel_l2
    assert check(torch.zeros(0), torch.zeros(0, dtype=torch.float64),
                 Tolerance(atol=0, rtol=0, rel_l2=1e-5))[0]


def test_check_deterministic():
    tol = Tolerance(atol=0, rtol=0, rel_l2=1e-5)
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert check_deterministic(a, a.clone(), tol)[0]
    ok, why, d = check_deterministic(a, a + 1e-3, tol)
    assert not ok and "nondeterministic" in why
    loose = Tolerance(atol=0, rtol=0, rel_l2=1e-5, nondeterminism=1e-2)
    b = a.clone()
    b[0] += 1e-3
    assert check_deterministic(a, b, loose)[0]


def test_check_deterministic_in_chunks_finds_the_worst_difference_in_any_chunk():
    """Outputs of several GB are compared a chunk at a time (float64 temporaries of one
    chunk): the verdict, the largest difference and its position are those of the whole."""
    tol = Tolerance(atol=0, rtol=0, rel_l2=1e-5)
    a = torch.arange(23, dtype=torch.float32).reshape(1, 23)
    b = a.clone()
    b[0, 9] += 0.25
    b[0, 17] += 0.5
    b[0, 2] = float("nan")
    a[0, 2] = float("nan")            # NaN in both: the same
    for chunk in (1, 4, 5, 1 << 23):
        ok, why, mx = check_deterministic(a, b, tol, chunk=chunk)
        assert not ok and mx == 0.5 and "(0, 17)" in why, (chunk, why)
        assert check_deterministic(a, b, Tolerance(atol=0, rtol=0, rel_l2=1e-5, nondeterminism=0.5), chunk=chunk)[0]
    z = torch.tensor([0.0, -0.0])
    assert check_deterministic(z, torch.tensor([-0.0, 0.0]), tol, chunk=1) == (True, "ok", 0.0)


def test_the_fused_tolerance_check_decides_and_reports_exactly_as_the_eager_one(monkeypatch):
    """The judge fuses each pass with torch.compile on a GPU (inductor there; ``aot_eager``
    here traces the same graph, whole and with dynamic sizes, without a device compiler):
    verdict, reasons and every metric equal the eager passes', on passing outputs and on
    each kind of failure, with chunks that split the tensor unevenly."""
    from evo.tasks import tolerance as T

    monkeypatch.setattr(T, "_FUSED_BROKEN", False)
    monkeypatch.setattr(T, "_FUSED_CHUNK", 7)        # several fused chunks, the last one short
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 41, generator=g, dtype=torch.float64)
    r[0, 0] = float("inf")
    good = r.float()
    outs = {"ok": good}
    for name, (i, j, v) in {"violation": (1, 7, 0.5), "nan": (2, 3, float("nan")),
                            "inf": (0, 5, float("inf"))}.items():
        o = good.clone()
        o[i, j] = v if name != "violation" else o[i, j] + v
        outs[name] = o
    for name, o in outs.items():
        eager = T.check(o, r, T.FP32_ELEMENTWISE, dtype=torch.float32, chunk=7)
        fused = T.check(o, r, T.FP32_ELEMENTWISE, dtype=torch.float32, chunk=7, fused="aot_eager")
        assert fused == eager, name
        assert eager[0] is (name == "ok"), name
    assert not T._FUSED_BROKEN


def test_a_fused_backend_that_fails_falls_back_to_the_same_eager_rule(monkeypatch, caplog):
    from evo.tasks import tolerance as T

    monkeypatch.setattr(T, "_FUSED_BROKEN", False)
    r = torch.randn(5, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    o = r.float()
    o[2, 2] += 1.0
    eager = T.check(o, r, T.FP32_ELEMENTWISE, dtype=torch.float32, chunk=7)   # same chunks, same sums
    sizes: list[int] = []
    real = T._lean_out_stats   # finite tensors: the eager check's lean chunk pass
    monkeypatch.setattr(T, "_lean_out_stats", lambda oc, *a: sizes.append(oc.numel()) or real(oc, *a))
    assert T.check(o, r, T.FP32_ELEMENTWISE, dtype=torch.float32, chunk=7, fused="no_such_backend") == eager
    assert T._FUSED_BROKEN and "checking eagerly" in caplog.text
    # started over eagerly in the caller's chunks, not the fused path's large ones
    assert sizes and max(sizes) <= 7 and sum(sizes) == o.numel()


# ------------------------------------------------------------------------------- user tasks
USER_TASK_SRC = '''
import torch
from evo.tasks import InputSpec, Task, TensorInputs, Tolerance

def ref(x):
    return x * torch.sigmoid(x) + 1

def flops(shape):
    return 5.0 * shape["N"]

def nbytes(shape):
    return 8.0 * shape["N"]

{name_list} = [
    Task(name="{name}", family="mine", dtype="float32", description="fused swish + 1",
         reference=ref, make_inputs=TensorInputs((InputSpec(("N",)),), "float32"),
         shapes=[{{"N": 1031}}], tolerance=Tolerance(atol=2e-6, rtol=1e-5, rel_l2=1e-5,
         atol_relative=True), flops=flops, bytes=nbytes, seed="{seed}"),
]
'''


@pytest.fixture
def user_file(tmp_path, request):
    created: list[str] = []

    def make(body: str | None = None, *, name: str | None = None, seed: str = "",
             fn: bool = False, filename: str = "tasks_mine.py") -> Path:
        name = name or f"user_{request.node.name[:30]}_{len(created)}".replace("[", "_").replace("]", "_")
        created.append(name)
        if body is None:
            body = USER_TASK_SRC.format(name=name, seed=seed, name_list="_ALL" if fn else "TASKS")
            if fn:
                body += "\ndef tasks():\n    return list(_ALL)\n"
        p = tmp_path / filename
        p.write_text(textwrap.dedent(body))
        return p

    yield make


def test_load_user_task_file(user_file, tmp_path):
    (tmp_path / "k.cu").write_text("// seed\n")
    p = user_file(seed="k.cu")
    tasks = T.load_task_file(p)
    assert len(tasks) == 1
    t = tasks[0]
    reg = T.BUILTIN_TASKS.with_files([p])
    assert t.family == "user" and reg.get(t.name) == t and reg.files == (str(p.resolve()),)
    assert t.seed == str((tmp_path / "k.cu").resolve()) and T.seed_path(t) == tmp_path / "k.cu"
    assert isinstance(t.shapes, tuple) and "user" in reg.families()
    assert t.name in reg.names("user")
    assert T.load_task_file(p) == tasks  # idempotent
    assert reg.with_files([p]) is reg  # a file already loaded into it is skipped
    x = t.make_inputs(t.shapes[0], gen(0), "normal", "cpu")[0]
    assert check(t.reference(x), t.reference(x.double()), t.tolerance)[0]
    assert pickle.loads(pickle.dumps(t)) == t


def test_load_user_task_file_with_tasks_function(user_file):
    p = user_file(fn=True)
    (t,) = T.load_task_file(p)
    assert T.BUILTIN_TASKS.with_files([p]).get(t.name).family == "user"


def test_loading_user_tasks_changes_no_global_registry(user_file):
    """A user file's tasks go into a new registry; the built-in one (and the module
    functions over it) never see them, so nothing needs resetting between searches."""
    before = T.task_names()
    p = user_file()
    (t,) = T.load_task_file(p)
    reg = T.BUILTIN_TASKS.with_files([p])
    assert reg.get(t.name) == t and len(reg) == len(before) + 1
    assert T.task_names() == before and t.name not in T.BUILTIN_TASKS and "user" not in T.families()
    with pytest.raises(T.UnknownTaskError):
        T.get_task(t.name)
    assert not hasattr(T, "register_task")


@pytest.mark.parametrize(
    "body, match",
    [
        ("TASKS = [\n", "syntax error"),
        ("import nonexistent_module_xyz\n", "ModuleNotFoundError"),
        ("x = 1\n", "defines no tasks"),
        ("TASKS = 3\n", "must be a list"),
        ("TASKS = []\n", "empty"),
        ("TASKS = ['kb19_relu']\n", r"TASKS\[0\] is a str"),
        ("TASKS = []\ndef tasks():\n    return []\n", "both TASKS and tasks"),
        ("def tasks():\n    raise RuntimeError('boom')\n", "boom"),
    ],
)
def test_bad_task_files(user_file, body, match):
    p = user_file(body)
    with pytest.raises(T.TaskFileError, match=match) as ei:
        T.load_task_file(p)
    assert isinstance(ei.value, ValueError) and str(p.resolve()) in str(ei.value)


def test_syntax_error_names_line(user_file):
    p = user_file("x = 1\ny = (\n")
    with pytest.raises(T.TaskFileError, match=r":2: syntax error"):
        T.load_task_file(p)


def test_missing_file_and_seed(user_file, tmp_path):
    with pytest.raises(T.TaskFileError, match="not found"):
        T.load_task_file(tmp_path / "nope.py")
    with pytest.raises(T.TaskFileError, match="not a file"):
        T.load_task_file(tmp_path)
    p = user_file(seed="missing.cu")
    with pytest.raises(T.TaskFileError, match="seed kernel 'missing.cu' not found"):
        T.load_task_file(p)


def test_user_task_lambda_invalid_and_duplicate(user_file):
    src = USER_TASK_SRC.format(name="user_lambda_t", seed="", name_list="TASKS")
    p = user_file(src.replace("reference=ref", "reference=lambda x: x"), name="user_lambda_t",
                  filename="lam.py")
    with pytest.raises(T.TaskFileError, match="cannot be pickled"):
        T.load_task_file(p)
    p = user_file(src.replace('dtype="float32", description', 'dtype="int8", description'),
                  name="user_lambda_t", filename="bad_dtype.py")
    with pytest.raises(T.TaskFileError, match="dtype 'int8'"):
        T.load_task_file(p)
    dup = USER_TASK_SRC.format(name="kb19_relu", seed="", name_list="TASKS")
    p = user_file(dup, name="user_dup_unused", filename="dup.py")
    with pytest.raises(T.TaskFileError, match="already registered") as ei:
        T.BUILTIN_TASKS.with_files([p])
    assert str(p.resolve()) in str(ei.value)
    assert T.get_task("kb19_relu").family == "kernelbench-l1"


def _unpickle_and_run(blob: bytes) -> float:
    task = pickle.loads(blob)
    x = task.make_inputs(task.shapes[0], torch.Generator().manual_seed(0), "normal", "cpu")[0]
    return float(task.reference(x).sum())


def test_user_task_unpickles_in_a_fresh_process(user_file):
    p = user_file()
    (t,) = T.load_task_file(p)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.apply(_unpickle_and_run, (pickle.dumps(t),))
    x = t.make_inputs(t.shapes[0], gen(0), "normal", "cpu")[0]
    assert got == pytest.approx(float(t.reference(x).sum()))


def test_example_task_file():
    path = REPO / "configs" / "examples" / "my_task.py"
    (t,) = T.load_task_file(path)
    assert t.name == "rownorm_l2" and t.family == "user"
    assert Path(t.seed).is_file() and Path(t.seed).name == "my_task_seed.cu"
    for dist in t.distributions:
        for shape in t.shapes[1:2]:
            (x,), ref = inputs_and_ref(t, shape, dist)
            ok, why, _ = check(t.reference(x), ref, t.tolerance, dtype="float32")
            assert ok, why
            assert not check(x, ref, t.tolerance)[0]
