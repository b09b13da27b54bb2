"""Timeouts that scale with the task (issue 30, item 4): a GPU actor learns each task's
passing process walls and cuts a hang off after margin + factor x the slowest of them,
never above the configured upper bound. Real isolated processes (fixture children)."""

from __future__ import annotations

import time

import pytest

from evaluators.actor import GpuEvaluator
from evaluators.base import HarnessSettings
from evaluators.timeouts import TimeoutBudget
from evo.core.records import Candidate, Operator, Status
from fakes.harness_stages import fixture_evaluate


def test_no_history_keeps_the_upper_bound_and_failures_teach_nothing():
    b = TimeoutBudget(margin_s=10, factor=2)
    hs = HarnessSettings(timeout_s=300)
    assert b.settings_for("t", hs) == hs
    b.record("t", {"wall_check_s": "0.5", "wall_time_s": "0.5"}, passed=False)
    assert b.settings_for("t", hs) == hs


def test_passing_walls_set_per_process_timeouts_capped_by_the_upper_bound():
    b = TimeoutBudget(margin_s=10, factor=2, window=2)
    hs = HarnessSettings(timeout_s=300)
    b.record("t", {"wall_check_s": "7.5", "wall_time_s": "3.0"}, passed=True)
    b.record("t", {"wall_check_s": "6.0", "wall_time_s": "4.0"}, passed=True)
    s = b.settings_for("t", hs)
    assert (s.timeout_check_s, s.timeout_time_s) == (25.0, 18.0)  # 10 + 2 x the slowest
    assert "adaptive timeout" in s.timeout_note and "upper bound timeout_s = 300s" in s.timeout_note
    assert b.settings_for("other", hs) == hs  # per task
    b.record("t", {"wall_check_s": "1.0", "wall_time_s": "1.0"}, passed=True)
    b.record("t", {"wall_check_s": "1.0", "wall_time_s": "1.0"}, passed=True)
    assert b.settings_for("t", hs).timeout_check_s == 12.0  # the window forgets old walls
    b.record("t", {"wall_check_s": "500"}, passed=True)
    assert b.settings_for("t", hs).timeout_check_s == 300.0  # never above timeout_s


@pytest.mark.slow
def test_a_hang_after_a_passing_candidate_is_killed_in_seconds(tmp_path):
    """With timeout_s = 300 (the default), the actor's first passing evaluation of the task
    sets the limit: the hanging candidate after it costs seconds, with the rule in its reason."""
    gpu = GpuEvaluator(fixture_evaluate, HarnessSettings(timeout_s=300, fresh_timing_process=False), pooled=False)
    ok = Candidate.create("kb19_relu", "// ok\n", {}, operator=Operator.USER, notes="ok")
    first = gpu.evaluate(ok, b"\x7fELF").evaluation
    assert first.correct, first.stages
    hang = Candidate.create("kb19_relu", "// hang\n", {}, operator=Operator.USER, notes="hang")
    t0 = time.monotonic()
    res = gpu.evaluate(hang, b"\x7fELF").evaluation
    took = time.monotonic() - t0
    (c, *_rest) = res.stages
    assert c.status is Status.TIMEOUT and "adaptive timeout" in c.reason, c.reason
    assert took < 30, took
