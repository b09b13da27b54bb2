"""Champion confirmation's paired timing in the judge (mode ``paired``): the champion and the
baseline (the task's seed), each in a runner of its own, timed call by call on the same fresh
inputs, the order alternating; the baseline's failures are reported as the pairing's, never
as the champion's. CPU stand-in runners on a fake clock (tests/fakes/fake_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluators.harness_job import HarnessJob
from evaluators.judge.judge import Judge
from tests.fakes.fake_runner import FakeClock, FakeRunner, relu_kernel
from tests.test_judge import REF_MS, TASK_FILE, FakeOps, _settings

REPS = 10


def _paired_judge(tmp_path: Path, first: dict, second: dict) -> tuple[Judge, list, FakeClock]:
    """A judge whose first runner (the champion's) behaves as ``first`` and whose second (the
    baseline's) as ``second``."""
    clock = FakeClock()
    made: list = []

    def start(*, jobdir, timeout_s, seccomp):
        r = FakeRunner(relu_kernel, clock, Path(jobdir), **(first if not made else second))
        made.append(r)
        return r

    return Judge(backend="host", ops=FakeOps(clock), workdir=tmp_path, start_runner=start), made, clock


def _paired_job(**kw) -> HarnessJob:
    base = dict(task="judge_relu", candidate_id="c0ffee", so_bytes=b"\x7fELF champion", mode="paired",
                task_files=(TASK_FILE,), seed=99, baseline_id="5eed", baseline_so=b"\x7fELF seed")
    base.update(kw)
    return HarnessJob(**base)


def test_the_champion_and_the_baseline_are_timed_call_by_call_on_the_same_inputs(tmp_path):
    judge, made, _ = _paired_judge(tmp_path, {"cost_ms": 1.0}, {"cost_ms": 1.25})
    rep = judge.evaluate(_paired_job(), _settings(reps=REPS))
    assert [(s.stage, s.status.value) for s in rep.stages] == [("correctness", "ok"), ("timing", "ok")]
    assert rep.fitness == pytest.approx(REF_MS / 1.0)
    paired = rep.stage("timing").metrics["paired"]
    assert paired["baseline_ms"] == [[1.25] * REPS] and paired["candidate_ms"] == [[1.0] * REPS]
    assert paired["baseline_fitness"] == pytest.approx(REF_MS / 1.25)
    assert paired["shapes"] == [dict(rep.stage("timing").metrics["shapes"][0]["shape"])]
    champion, baseline = made
    # the champion: correctness (2 shapes x 5 trials x 2 calls), one warm-up call, REPS timed calls;
    # the baseline: loaded only for the timing, one warm-up call and REPS timed calls, never checked for correctness
    assert champion.calls == 2 * 5 * 2 + 1 + REPS and baseline.calls == 1 + REPS
    assert champion.log.count("LOAD") == 1 and baseline.log.count("LOAD") == 1
    assert rep.env["paired_with"] == "5eed"
    judge.close()
    assert champion.closed and baseline.closed


def test_a_baseline_that_dies_leaves_the_champion_timed_and_names_the_pairing_failure(tmp_path):
    judge, made, _ = _paired_judge(tmp_path, {}, {"die_at": 3})
    rep = judge.evaluate(_paired_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "ok" and rep.fitness == pytest.approx(REF_MS)
    err = rep.stage("timing").metrics["paired"]["error"]
    assert err.startswith("the baseline's") and "baseline_ms" not in rep.stage("timing").metrics["paired"]
    assert made[0].calls == 2 * 5 * 2 + 1 + REPS   # the champion's loop went on alone
    judge.close()


def test_a_baseline_that_skips_work_fails_the_pairing_not_the_champion(tmp_path):
    judge, _made, _ = _paired_judge(tmp_path, {}, {"skip_from": 1})   # its warm-up runs, its timed calls do not
    rep = judge.evaluate(_paired_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "ok"
    assert "poison" in rep.stage("timing").metrics["paired"]["error"]
    judge.close()


def test_a_baseline_that_lies_about_its_times_fails_the_pairing(tmp_path):
    judge, _made, _ = _paired_judge(tmp_path, {}, {"lie_factor": 4.0})
    rep = judge.evaluate(_paired_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "ok"
    assert "the reported time is not what the call took" in rep.stage("timing").metrics["paired"]["error"]
    judge.close()


def test_a_champion_that_fails_is_the_champions_verdict_whatever_the_baseline_does(tmp_path):
    judge, _made, _ = _paired_judge(tmp_path, {"skip_from": 2 * 5 * 2 + 1}, {})
    rep = judge.evaluate(_paired_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "incorrect" and "paired" not in rep.stage("timing").metrics
    judge.close()


def test_a_paired_job_needs_its_baseline_and_only_a_paired_job_has_one():
    with pytest.raises(ValueError, match="baseline_so and baseline_id"):
        _paired_job(baseline_so=b"")
    with pytest.raises(ValueError, match="baseline_so and baseline_id"):
        _paired_job(mode="check+time")
