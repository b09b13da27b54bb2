"""CPU tests of the judge's logic: the correctness trials with Python fake kernels in place of
a runner, the output checks, timing statistics and verdicts, ABI struct layout. The CUDA paths
are covered in tests/gpu/."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
import torch

from evaluators import abi
from evaluators.judge.checks import (
    poison_,
    same_bits,
    shape_order,
    trial_seed,
    worst_element,
)
from evaluators.judge.summary import ShapeSamples, geomean, iqr, median, summarize
from fakes.judge_trials import judge_correctness  # noqa: E402  (tests/ is on sys.path)
from evo.core.records import Status
from evo.tasks.base import Task
from evo.tasks.tolerance import FP32_ELEMENTWISE

ROOT = Path(__file__).resolve().parents[1]


def _relu(x):
    return torch.relu(x)


def _inputs(shape, gen, dist, device):
    scale = 10.0 if dist == "wide" else 1.0
    return (torch.randn(shape["M"], shape["N"], generator=gen, device=device) * scale,)


def _count(shape):
    return float(shape["M"] * shape["N"])


TASK = Task(
    name="fake_relu", family="user", dtype="float32", description="relu", reference=_relu,
    make_inputs=_inputs, shapes=({"M": 64, "N": 96}, {"M": 8, "N": 16}, {"M": 33, "N": 7}),
    tolerance=FP32_ELEMENTWISE, flops=_count, bytes=_count, distributions=("normal", "wide"),
)


def _run(launch, **kw):
    return judge_correctness(TASK, launch, trials=kw.pop("trials", 3), seed=7, **kw)


def test_correct_kernel_passes_every_shape():
    seen = []

    def good(ins, outs):
        seen.append(tuple(ins[0].shape))
        outs[0].copy_(torch.relu(ins[0]))

    r = _run(good)
    assert r.status is Status.OK, r.reason
    assert {s for s in seen} == {(64, 96), (8, 16), (33, 7)}
    # 3 shapes x 3 trials x 2 calls (determinism)
    assert r.metrics["calls"] == 18 and len(seen) == 18
    # smallest first
    assert seen[0] == (8, 16)


def test_null_kernel_fails_on_poison_with_a_located_reason():
    r = _run(lambda ins, outs: None)
    assert r.status is Status.INCORRECT
    assert "shape {'M': 8, 'N': 16}" in r.reason and "trial 0 (normal inputs)" in r.reason
    assert "non-finite" in r.reason and "(0, 0)" in r.reason


def test_copy_kernel_fails_on_negative_inputs():
    r = _run(lambda ins, outs: outs[0].copy_(ins[0]))
    assert r.status is Status.INCORRECT and "worst |out - ref|" in r.reason


def test_input_mutation_is_caught():
    def mutate(ins, outs):
        outs[0].copy_(torch.relu(ins[0]))
        ins[0].zero_()

    r = _run(mutate)
    assert r.status is Status.INCORRECT and "modified input 0" in r.reason


def test_stateful_kernel_fails_determinism():
    calls = {"n": 0}

    def once(ins, outs):  # computes on the first call only (a result cache)
        calls["n"] += 1
        if calls["n"] == 1:
            outs[0].copy_(torch.relu(ins[0]))

    r = _run(once)
    assert r.status is Status.INCORRECT
    assert "determinism" in r.artifacts["failing_check"]


def test_pointer_keyed_cache_fails():
    cache = {}

    def cached(ins, outs):  # recomputes only for unseen input addresses
        key = ins[0].data_ptr()
        if key not in cache:
            cache[key] = torch.relu(ins[0])
        outs[0].copy_(cache[key])

    r = _run(cached)
    assert r.status is Status.INCORRECT and "trial 1" in r.reason


def test_nondeterministic_kernel_fails():
    def noisy(ins, outs):
        outs[0].copy_(torch.relu(ins[0]) * (1 + 1e-7 * torch.rand(()).item()))

    r = _run(noisy)
    assert r.status is Status.INCORRECT and "determinism" in r.artifacts["failing_check"]


def test_hard_coded_shape_fails_on_other_shapes():
    def only_64x96(ins, outs):
        if ins[0].shape == (64, 96):
            outs[0].copy_(torch.relu(ins[0]))
        else:  # what a kernel with baked-in sizes would do elsewhere: wrong extent
            outs[0].zero_()

    r = _run(only_64x96)
    assert r.status is Status.INCORRECT and "'M': 8" in r.reason


def test_half_written_output_fails():
    def half(ins, outs):
        m = ins[0].shape[0] // 2
        outs[0][:m].copy_(torch.relu(ins[0][:m]))

    r = _run(half)
    assert r.status is Status.INCORRECT and "non-finite" in r.reason


def test_trials_cover_every_distribution_and_seeds_differ():
    dists = []

    def good(ins, outs):
        dists.append(float(ins[0].abs().max()))
        outs[0].copy_(torch.relu(ins[0]))

    r = _run(good, trials=1, shape_indices=[0])
    assert r.status is Status.OK and r.metrics["trials"] == 2
    assert dists[2] > 3 * dists[0]  # the wide trial is wide
    assert trial_seed(1, 0, 0) != trial_seed(1, 0, 1) != trial_seed(2, 0, 1)


def test_helpers():
    assert shape_order(TASK.shapes) == [1, 2, 0]
    with pytest.raises(ValueError, match="out of range"):
        shape_order(TASK.shapes, [5])
    t = poison_(torch.empty(3))
    assert torch.isnan(t).all()
    assert poison_(torch.empty(2, dtype=torch.int32)).ne(0).all()
    a = torch.tensor([1.0, float("nan")])
    assert same_bits(a, a.clone()) and not same_bits(a, torch.tensor([1.0, 2.0]))
    assert "at (1, 0)" in worst_element(torch.tensor([[1.0], [5.0]]), torch.tensor([[1.0], [2.0]]))
    # in chunks (outputs of several GB): the same answer as in one piece
    o, r = torch.zeros(3, 7), torch.zeros(3, 7)
    o[2, 5], o[1, 1] = 4.0, 1.0
    assert all("= 4 at (2, 5)" in worst_element(o, r, chunk=c) for c in (1, 3, 8, 1 << 24))
    o[0, 6] = o[2, 0] = float("nan")
    assert all("2 of 21 elements non-finite" in w and "first at (0, 6)" in w
               for w in (worst_element(o, r, chunk=c) for c in (1, 3, 8, 1 << 24)))


def test_stats():
    assert median([3, 1, 2]) == 2 and median([1, 2, 3, 4]) == 2.5
    assert iqr([1, 2, 3, 4, 5]) == pytest.approx(2.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        geomean([0.0])


def _samples(cand, ref, left=0.01, sol=None, sync=0.0):
    return ShapeSamples({"N": 1}, tuple([cand] * 5), tuple([ref] * 5), tuple([left] * 5), 1, sol,
                        tuple([sync] * 5))


def test_summarize_verdicts():
    ok = summarize([_samples(1.0, 2.0, sol=0.5), _samples(2.0, 4.0)])
    assert ok.status is Status.OK and ok.metrics["fitness"] == pytest.approx(2.0)
    assert not ok.metrics["needs_reconfirm"]
    assert ok.metrics["shapes"][0]["pct_sol"] == pytest.approx(50.0)
    fast = summarize([_samples(0.1, 2.0)])
    assert fast.status is Status.OK and fast.metrics["needs_reconfirm"]
    sol = summarize([_samples(0.4, 2.0, sol=0.5)])
    assert sol.status is Status.INVALID and "speed-of-light" in sol.reason
    side = summarize([_samples(0.005, 2.0, left=1.9)])
    assert side.status is Status.INVALID and "another stream" in side.reason
    # a slow bare synchronize (VM) is not mistaken for leftover work
    assert summarize([_samples(0.005, 0.01, left=0.09, sync=0.08)]).status is Status.OK


def test_abi_struct_matches_header():
    hdr = (ROOT / "evaluators" / "abi" / "evo_abi.h").read_text()
    assert int(re.search(r"#define EVO_MAX_DIMS (\d+)", hdr).group(1)) == abi.MAX_DIMS
    assert int(re.search(r"#define EVO_ABI_VERSION (\d+)", hdr).group(1)) == abi.ABI_VERSION
    enum = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"EVO_(\w+) = (\d+)", hdr))
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
             "I32": "int32", "I64": "int64", "U8": "uint8", "BOOL": "bool"}
    assert {names[k]: v for k, v in enum.items()} == abi.EVO_DTYPES
    assert ctypes.sizeof(abi.EvoTensor) == 8 + 4 + 4 + 8 * 8 * 2
    assert abi.EvoTensor.shape.offset == 16 and abi.EvoTensor.strides.offset == 80
    t = torch.zeros(4, 6).t()
    e = abi.describe(t)
    assert e.ndim == 2 and list(e.shape)[:2] == [6, 4] and list(e.strides)[:2] == [1, 6]
    assert e.dtype == 0 and e.data == t.data_ptr()
    with pytest.raises(ValueError, match="ABI supports"):
        abi.dtype_code(torch.complex64)


def test_load_kernel_rejects_non_libraries(tmp_path):
    p = tmp_path / "k.so"
    p.write_bytes(b"not an elf")
    with pytest.raises(abi.KernelLoadError, match="could not load"):
        abi.load_kernel(p)


def test_selftest_rejects_an_unknown_task_before_building_anything(tmp_path):
    """A typo in the self-test's task list (e.g. ``EVO_SELFTEST_TASKS``) is our error, named
    with the valid names before any of the (slow, parallel) builds starts."""
    from evaluators.base import CompileSettings, HarnessSettings
    from evaluators.selftest import run_selftest
    from evo.tasks.registry import UnknownTaskError

    cache = tmp_path / "cc"
    with pytest.raises(UnknownTaskError, match="kb01_square"):
        run_selftest(["kb19_relu", "kb01_square_matmul"], CompileSettings(cache_dir=str(cache)),
                     HarnessSettings())
    assert not cache.exists() or not any(cache.iterdir())
