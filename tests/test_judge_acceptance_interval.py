"""benchmarks/judge_acceptance.py's reading of "the seeds' speedups are within noise of the
old path's": the judge's fitness over the harness's, paired by round, with the engine's t-interval."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("scipy")

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "judge_acceptance.py"


def _mod():
    spec = importlib.util.spec_from_file_location("judge_acceptance", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_agreeing_paths_are_within_noise_and_a_steady_offset_is_not():
    ja = _mod()
    q, lo, hi = ja.fitness_interval([1.00, 1.01, 0.99, 1.00], [1.01, 1.00, 1.00, 1.02])
    assert lo <= 1.0 <= hi and q == pytest.approx(math.exp(sum(math.log(j / h) for h, j in
                                                               zip([1.00, 1.01, 0.99, 1.00], [1.01, 1.00, 1.00, 1.02])) / 4))
    q, lo, hi = ja.fitness_interval([1.000, 1.001, 0.999, 1.000], [1.010, 1.011, 1.009, 1.010])
    assert lo > 1.0 and q == pytest.approx(1.01, rel=1e-3), "a steady 1% offset is outside a tight interval"
