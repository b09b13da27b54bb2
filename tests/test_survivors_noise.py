"""Noise-aware promotion (evo.engine.champions): the speedup interval and champion confirmation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.engine.champions import (NO_SIGNIFICANT_GAIN, PairedTimings, SpeedupInterval, confirm_champion,
                                  paired_from_metrics, speedup_interval)


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


def _ev(cid, ms, fitness, paired=None):
    rows = [{"shape": {"n": 4}, "median_ms": ms}]
    metrics = {"shapes": rows, **({"paired": paired} if paired is not None else {})}
    return Evaluation(cid, (StageResult("timing", Status.OK, metrics=metrics),), fitness=fitness, gpu="H200")


class _Rt:
    """A runtime whose GPU answers as the judge does: a plain evaluation at the candidate's
    scripted first time, or (mode ``paired``) the scripted per-rep times of both members."""

    def __init__(self, times, base_times=(), paired_error=None):
        self.times, self.base_times, self.paired_error = times, list(base_times), paired_error
        self.calls = []

    def submit_compile(self, c):
        return ("c", c)

    def submit_gpu(self, gpu, c, so, mode=None, baseline=None, baseline_so=None):
        self.calls.append((c.id, mode, baseline.id if baseline is not None else None, baseline_so))
        reps = self.times[c.id]
        if mode != "paired":
            return ("g", _ev(c.id, reps[0], 1.0 / reps[0]))
        paired = ({"error": self.paired_error} if self.paired_error else
                  {"shapes": [{"n": 4}], "baseline_ms": [list(self.base_times)], "candidate_ms": [list(reps)],
                   "baseline_fitness": 1.0 / (sum(self.base_times) / len(self.base_times))})
        return ("g", _ev(c.id, sorted(reps)[len(reps) // 2], 1.0 / sorted(reps)[len(reps) // 2], paired))

    def get(self, ref):
        kind, x = ref
        if kind == "c":
            return SimpleNamespace(result=SimpleNamespace(passed=True, reason=""), so_bytes=b"so-" + x.id.encode())
        return SimpleNamespace(evaluation=x)

    def remote_errors(self):
        return ()


SEED = Candidate.create("kb19_relu", "// seed\n", {})
CHILD = Candidate.create("kb19_relu", "// child\n", {})


def test_a_champion_inside_the_noise_leaves_the_seed_crowned():
    rt = _Rt({CHILD.id: [0.995, 1.005, 1.0, 0.99]}, base_times=[1.00, 1.01, 0.99, 1.0])
    c = confirm_champion(rt, "kb19_relu", CHILD, 1.0, baseline=SEED)
    assert c.record["verdict"] == NO_SIGNIFICANT_GAIN and c.crown == SEED
    assert c.record["baseline_id"] == SEED.id and c.record["gain"]["rounds"] == 4   # the reps are the rounds
    assert c.record["confirmed"]  # the re-timing itself agrees with the search's number
    cid, fit = c.champion(CHILD, 1.0)
    assert cid == SEED.id and fit == pytest.approx(1.0)
    # one evaluation, the champion checked again and timed call by call with the seed's binary
    assert rt.calls[-1] == (CHILD.id, "paired", SEED.id, b"so-" + SEED.id.encode())


def test_a_champion_faster_than_the_noise_is_crowned():
    rt = _Rt({CHILD.id: [0.80, 0.81, 0.79]}, base_times=[1.0, 1.02, 0.98])
    c = confirm_champion(rt, "kb19_relu", CHILD, 1.25, baseline=SEED)
    assert c.record["verdict"] == "faster" and c.crown == CHILD and c.champion(CHILD, 1.25) == (CHILD.id, 1.25)
    assert c.record["gain"]["low"] > 1.0 and len(rt.calls) == 1


def test_the_seed_as_champion_is_retimed_once_without_a_gain():
    rt = _Rt({SEED.id: [1.0]})
    c = confirm_champion(rt, "kb19_relu", SEED, 1.0, baseline=SEED)
    assert rt.calls == [(SEED.id, None, None, None)] and "gain" not in c.record and c.crown == SEED


def test_an_interval_serialises_with_its_verdict():
    d = SpeedupInterval(1.01, 0.99, 1.03, 0.95, 3).as_dict()
    assert d["verdict"] == NO_SIGNIFICANT_GAIN and d["method"] == "paired-t-log"


def test_a_task_without_a_seed_is_confirmed_without_a_gain():
    rt = _Rt({CHILD.id: [1.0]})
    c = confirm_champion(rt, "no_such_task", CHILD, 1.0, baseline=None)
    assert c.record["confirmed"] and "gain" not in c.record and "no baseline" in c.record["gain_error"]
    assert c.crown == CHILD and [x[:2] for x in rt.calls] == [(CHILD.id, None)]


def test_a_baseline_that_fails_its_part_leaves_the_gain_unmeasured():
    rt = _Rt({CHILD.id: [0.5, 0.5, 0.5]}, paired_error="the baseline's shape {'n': 4}, timed call 3: the runner died")
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED)
    assert "gain" not in c.record and "the runner died" in c.record["gain_error"] and c.crown == CHILD
    assert c.record["confirmed"]


def test_an_evaluator_without_the_paired_mode_leaves_the_gain_unmeasured():
    rt = _Rt({CHILD.id: [0.5, 0.5]}, base_times=[1.0, 1.0])
    real = rt.submit_gpu
    rt.submit_gpu = lambda gpu, c, so, mode=None, baseline=None, baseline_so=None: real(gpu, c, so)
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED)
    assert "no paired times" in c.record["gain_error"] and c.crown == CHILD


def test_paired_metrics_become_timings_with_the_reps_as_rounds():
    t = paired_from_metrics({"shapes": [{"n": 4, "m": 2}], "baseline_ms": [[2.0, 2.0]], "candidate_ms": [[1.0, 1.0]]})
    assert t.shapes == ("m=2,n=4",) and t.rounds == 2 and speedup_interval(t).ratio == pytest.approx(2.0)
    with pytest.raises(ValueError, match="runner died"):
        paired_from_metrics({"error": "the runner died"})
    with pytest.raises(ValueError, match="without"):
        paired_from_metrics({"shapes": [{"n": 4}]})
    with pytest.raises(ValueError, match="PairedTimings"):
        paired_from_metrics({"shapes": [{"n": 4}], "baseline_ms": [[2.0]], "candidate_ms": [[1.0]]})


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
    rt = _Rt({CHILD.id: [0.50, 0.51, 0.49]}, base_times=[1.0, 1.02, 0.98])
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED, profiles=[_profile({"n": 4}, 1.0)])
    assert c.record["confirmed"] is False and "below ncu's kernel time" in c.record["timing_invalid"]
    assert c.record["ncu"]["shapes"][0]["ncu_ms"] == 1.0 and c.record["ncu"]["shapes"][0]["timed_ms"] == 0.5
    assert c.crown == SEED and c.champion(CHILD, 2.0)[0] == SEED.id
    # the same champion whose kernels ncu timed at 0.45 ms: corroborated and crowned
    rt = _Rt({CHILD.id: [0.50, 0.51, 0.49]}, base_times=[1.0, 1.02, 0.98])
    c = confirm_champion(rt, "kb19_relu", CHILD, 2.0, baseline=SEED, profiles=[_profile({"n": 4}, 0.45)])
    assert c.record["confirmed"] and c.record["ncu"]["agrees"] and c.crown == CHILD


def test_the_gpu_actor_hands_the_retiming_mode_to_the_evaluation_and_not_to_a_stand_in(monkeypatch):
    """``submit_gpu(..., mode, baseline, baseline_so)`` reaches evaluators.pipeline.evaluate_built
    as its ``mode`` and ``baseline``; a stand-in evaluate function that takes both gets them,
    one without modes evaluates fully."""
    import evaluators.pipeline as pipeline
    from evaluators.actor import GpuEvaluator
    from evaluators.base import HarnessSettings

    seen = []

    def built(candidate, so_bytes, settings, *, mode=None, baseline=None, **kw):
        seen.append((mode, baseline))
        return _ev(candidate.id, 1.0, 1.0)

    monkeypatch.setattr(pipeline, "evaluate_built", built)
    actor = GpuEvaluator(None, HarnessSettings(), concurrent=False)
    try:
        actor.evaluate(CHILD, b"so", "time-only")
        actor.evaluate(CHILD, b"so")
        actor.evaluate(CHILD, b"so", "paired", SEED, b"seed-so")
    finally:
        actor.close()
    assert seen == [("time-only", None), (None, None), ("paired", (SEED, b"seed-so"))]

    def with_modes(candidate, so_bytes, settings, *, mode=None, baseline=None):
        seen.append((mode, baseline))
        return _ev(candidate.id, 1.0, 1.0)

    mine = GpuEvaluator(with_modes, HarnessSettings(), concurrent=False)
    try:
        mine.evaluate(CHILD, b"so", "paired", SEED, b"seed-so")
    finally:
        mine.close()
    assert seen[-1] == ("paired", (SEED, b"seed-so"))

    def stand_in(candidate, so_bytes, settings):
        return _ev(candidate.id, 1.0, 1.0)

    other = GpuEvaluator(stand_in, HarnessSettings(), concurrent=False)
    try:
        assert other.evaluate(CHILD, b"so", "time-only").evaluation.candidate_id == CHILD.id
    finally:
        other.close()
