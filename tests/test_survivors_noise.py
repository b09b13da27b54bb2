"""Noise-aware promotion (evo.engine.champions): the speedup interval and champion confirmation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.engine.champions import (NO_SIGNIFICANT_GAIN, PairedTimings, SpeedupInterval, confirm_champion,
                           paired_from_evaluations, speedup_interval)


def _paired(base, cand):
    return PairedTimings(("s0",), (tuple(base),), (tuple(cand),))


def test_interval_is_the_t_interval_of_log_ratios():
    base, cand = [1.0, 1.1, 0.9, 1.05], [0.8, 0.9, 0.75, 0.85]
    iv = speedup_interval(_paired(base, cand), 0.95)
    xs = [math.log(b / c) for b, c in zip(base, cand)]
    m = sum(xs) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / 3)
    half = 3.182446305284263 * sd / 2  # t_{0.975, 3}
    assert iv.ratio == pytest.approx(math.exp(m))
    assert (iv.low, iv.high) == (pytest.approx(math.exp(m - half)), pytest.approx(math.exp(m + half)))
    assert iv.rounds == 4 and iv.significant and iv.verdict == "faster"


def test_pairing_cancels_drift_common_to_both_members():
    # the GPU gets 30% slower over the rounds; the candidate is always 2% faster in its round
    base = [1.0, 1.1, 1.2, 1.3]
    cand = [b / 1.02 for b in base]
    iv = speedup_interval(_paired(base, cand))
    assert iv.low == pytest.approx(1.02) and iv.high == pytest.approx(1.02) and iv.significant


def test_a_gain_inside_the_noise_is_no_significant_gain():
    base = [1.00, 1.03, 0.97, 1.01]
    cand = [0.99, 1.02, 0.99, 0.98]  # 0.6% faster on average, rounds disagree
    iv = speedup_interval(_paired(base, cand))
    assert iv.ratio > 1.0 and iv.low < 1.0 < iv.high
    assert not iv.significant and iv.verdict == NO_SIGNIFICANT_GAIN


def test_slower_when_the_whole_interval_is_below_one():
    iv = speedup_interval(_paired([1.0, 1.0, 1.0], [1.2, 1.21, 1.19]))
    assert iv.verdict == "slower" and not iv.significant


def test_shapes_are_averaged_geometrically_per_round():
    t = PairedTimings(("a", "b"), ((1.0, 1.0), (2.0, 2.0)), ((0.5, 0.5), (2.0, 2.0)))
    assert speedup_interval(t).ratio == pytest.approx(math.sqrt(2.0))


def test_higher_confidence_gives_a_wider_interval():
    t = _paired([1.0, 1.1, 0.9, 1.05, 1.0], [0.9, 1.0, 0.85, 0.95, 0.97])
    lo, hi = speedup_interval(t, 0.8), speedup_interval(t, 0.99)
    assert hi.low < lo.low and hi.high > lo.high


@pytest.mark.parametrize("bad", [
    lambda: PairedTimings(("a",), ((1.0,),), ((1.0,),)),               # one round
    lambda: PairedTimings(("a",), ((1.0, 1.0),), ((1.0,),)),           # unequal rounds
    lambda: PairedTimings(("a",), ((1.0, 0.0),), ((1.0, 1.0),)),       # zero time
    lambda: PairedTimings(("a", "b"), ((1.0, 1.0),), ((1.0, 1.0),)),   # a row missing
])
def test_malformed_timings_are_refused(bad):
    with pytest.raises(ValueError, match="PairedTimings"):
        bad()


def test_confidence_must_be_a_probability():
    with pytest.raises(ValueError, match="confidence"):
        speedup_interval(_paired([1, 1], [1, 1]), 1.0)


def _ev(cid, ms, fitness):
    rows = [{"shape": "s0", "median_ms": ms}]
    return Evaluation(cid, (StageResult("timing", Status.OK, metrics={"shapes": rows}),), fitness=fitness, gpu="H200")


def test_paired_from_evaluations_uses_per_shape_medians_or_fitness():
    a, b = _ev("a", 2.0, 1.0), _ev("b", 1.0, 2.0)
    t = paired_from_evaluations([(a, b), (a, b)])
    assert t.shapes == ("s0",) and t.baseline_ms == ((2.0, 2.0),) and t.candidate_ms == ((1.0, 1.0),)
    bare = [(Evaluation("a", (), fitness=1.0), Evaluation("b", (), fitness=1.25))] * 2
    assert speedup_interval(paired_from_evaluations(bare)).ratio == pytest.approx(1.25)


class _Rt:
    """A runtime whose GPU returns the next scripted median time of each candidate."""

    def __init__(self, times):
        self.times = {k: list(v) for k, v in times.items()}
        self.order = []
        self.modes = []

    def submit_compile(self, c):
        return ("c", c)

    def submit_gpu(self, gpu, c, so, mode=None):
        self.order.append(c.id)
        self.modes.append(mode)
        ms = self.times[c.id].pop(0)
        return ("g", _ev(c.id, ms, 1.0 / ms))

    def get(self, ref):
        kind, x = ref
        if kind == "c":
            return SimpleNamespace(result=SimpleNamespace(passed=True, reason=""), so_bytes=b"so")
        return SimpleNamespace(evaluation=x)

    def remote_errors(self):
        return ()


SEED = Candidate.create("kb19_relu", "// seed\n", {})
CHILD = Candidate.create("kb19_relu", "// child\n", {})


def test_a_champion_inside_the_noise_leaves_the_seed_crowned():
    rt = _Rt({SEED.id: [1.00, 1.01, 0.99], CHILD.id: [0.995, 1.005, 1.0]})
    c = confirm_champion(rt, "kb19_relu", CHILD, 1.005, baseline=SEED)
    assert c.record["verdict"] == NO_SIGNIFICANT_GAIN and c.crown == SEED
    assert c.record["baseline_id"] == SEED.id and c.record["gain"]["rounds"] == 3
    assert c.record["confirmed"]  # the re-timing itself agrees with the search's number
    cid, fit = c.champion(CHILD, 1.005)
    assert cid == SEED.id and fit == pytest.approx((1 / 1.00 * 1 / 1.01 * 1 / 0.99) ** (1 / 3))
    # rounds alternate: (child, seed), (seed, child), (child, seed)
    assert rt.order == [CHILD.id, SEED.id, SEED.id, CHILD.id, CHILD.id, SEED.id]
    # the first re-evaluation checks the champion again; the rounds after it re-time only
    assert rt.modes == [None] + ["time-only"] * 5


def test_a_champion_faster_than_the_noise_is_crowned():
    rt = _Rt({SEED.id: [1.0, 1.02, 0.98], CHILD.id: [0.80, 0.81, 0.79]})
    c = confirm_champion(rt, "kb19_relu", CHILD, 1.25, baseline=SEED)
    assert c.record["verdict"] == "faster" and c.crown == CHILD and c.champion(CHILD, 1.25) == (CHILD.id, 1.25)
    assert c.record["gain"]["low"] > 1.0


def test_the_seed_as_champion_is_retimed_once_without_a_gain():
    rt = _Rt({SEED.id: [1.0]})
    c = confirm_champion(rt, "kb19_relu", SEED, 1.0, baseline=SEED)
    assert rt.order == [SEED.id] and "gain" not in c.record and c.crown == SEED


def test_an_interval_serialises_with_its_verdict():
    d = SpeedupInterval(1.01, 0.99, 1.03, 0.95, 3).as_dict()
    assert d["verdict"] == NO_SIGNIFICANT_GAIN and d["method"] == "paired-t-log"


def test_a_task_without_a_seed_is_confirmed_without_a_gain():
    rt = _Rt({CHILD.id: [1.0]})
    c = confirm_champion(rt, "no_such_task", CHILD, 1.0, baseline=None)
    assert c.record["confirmed"] and "gain" not in c.record and "no baseline" in c.record["gain_error"]
    assert c.crown == CHILD and rt.order == [CHILD.id]


def test_a_baseline_that_fails_its_retiming_leaves_the_gain_unmeasured():
    rt = _Rt({SEED.id: [1.0, 1.0, 1.0], CHILD.id: [0.5, 0.5, 0.5]})
    real = rt.submit_gpu

    def flaky(gpu, c, so, mode=None):
        kind, ev = real(gpu, c, so, mode)
        return (kind, Evaluation(c.id, (StageResult("correctness", Status.INCORRECT),)) if c == SEED else ev)

    rt.submit_gpu = flaky
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED)
    assert "gain" not in c.record and "not correct" in c.record["gain_error"] and c.crown == CHILD


def _profile(shape, ncu_ms):
    return {"shape": str(shape), "gpu": "H200", "metrics": {"shape": shape, "ncu_kernel_ms": ncu_ms}}


def test_ncu_corroborates_a_timing_that_holds_its_kernels():
    from evo.engine.champions import NCU_TOLERANCE, ncu_corroboration

    shape = {"N": 4096, "M": 2}
    ev = Evaluation("c", (StageResult("timing", Status.OK, metrics={"shapes": [
        {"shape": {"M": 2, "N": 4096}, "median_ms": 1.0}]}),), fitness=1.0)
    ok = ncu_corroboration(ev, [_profile(shape, 0.9)])
    assert ok["agrees"] and ok["shapes"][0]["ratio"] == pytest.approx(1 / 0.9) and ok["tolerance"] == NCU_TOLERANCE
    assert ncu_corroboration(ev, [_profile(shape, 5.0)])["agrees"] is False      # claims 1 ms, kernels took 5
    # the newest profile of a shape counts; far above ncu (launch overhead) is no disagreement
    assert ncu_corroboration(ev, [_profile(shape, 5.0), _profile(shape, 0.01)])["agrees"]
    assert ncu_corroboration(ev, [_profile({"N": 1}, 5.0)]) is None            # no shape in common
    assert ncu_corroboration(ev, [{"shape": "x", "metrics": {"ncu_kernels": 0}}]) is None


def test_a_champion_whose_retiming_ncu_contradicts_is_invalid_and_the_seed_stays():
    rt = _Rt({SEED.id: [1.0, 1.02, 0.98], CHILD.id: [0.50, 0.51, 0.49]})
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED, profiles=[_profile("s0", 1.0)])
    assert c.record["confirmed"] is False and "below ncu's kernel time" in c.record["timing_invalid"]
    assert c.record["ncu"]["shapes"][0]["ncu_ms"] == 1.0 and c.record["ncu"]["shapes"][0]["timed_ms"] == 0.5
    assert c.crown == SEED and c.champion(CHILD, 2.0)[0] == SEED.id
    # the same champion whose kernels ncu timed at 0.45 ms: corroborated and crowned
    rt = _Rt({SEED.id: [1.0, 1.02, 0.98], CHILD.id: [0.50, 0.51, 0.49]})
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED, profiles=[_profile("s0", 0.45)])
    assert c.record["confirmed"] and c.record["ncu"]["agrees"] and c.crown == CHILD


def test_the_gpu_actor_hands_the_retiming_mode_to_the_evaluation_and_not_to_a_stand_in(monkeypatch):
    """``submit_gpu(..., mode="time-only")`` reaches evaluators.pipeline.evaluate_built as its
    ``mode``; an actor built on a stand-in evaluate function without modes evaluates fully."""
    import evaluators.pipeline as pipeline
    from evaluators.actor import GpuEvaluator
    from evaluators.base import HarnessSettings

    seen = []

    def built(candidate, so_bytes, settings, *, mode=None, **kw):
        seen.append(mode)
        return _ev(candidate.id, 1.0, 1.0)

    monkeypatch.setattr(pipeline, "evaluate_built", built)
    actor = GpuEvaluator(None, HarnessSettings(), concurrent=False)
    try:
        actor.evaluate(CHILD, b"so", "time-only")
        actor.evaluate(CHILD, b"so")
    finally:
        actor.close()
    assert seen == ["time-only", None]

    def stand_in(candidate, so_bytes, settings):
        return _ev(candidate.id, 1.0, 1.0)

    other = GpuEvaluator(stand_in, HarnessSettings(), concurrent=False)
    try:
        assert other.evaluate(CHILD, b"so", "time-only").evaluation.candidate_id == CHILD.id
    finally:
        other.close()
