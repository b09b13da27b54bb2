"""Self-test of the evaluator on the GPU: for every task, the null, zero, copy, constant and
half-written kernels must all FAIL correctness (shared/EVALUATION.md).

``EVO_SELFTEST_TASKS=kb19_relu,kb23_softmax`` restricts the tasks (default: all 41, five
kernels each: give that its own device call). Progress (builds, then one line per kernel):
``-o log_cli=true --log-cli-level=INFO``.
"""

from __future__ import annotations

import os

import pytest

from evaluators.base import CompileSettings, HarnessSettings

pytestmark = pytest.mark.gpu


def _tasks() -> list[str]:
    env = os.environ.get("EVO_SELFTEST_TASKS", "").strip()
    if env:
        return [t.strip() for t in env.split(",") if t.strip()]
    from evo.tasks.registry import task_names

    return task_names()


def test_every_selftest_kernel_fails(tmp_path):
    from evaluators.selftest import run_selftest

    rows = run_selftest(_tasks(), CompileSettings(cache_dir=str(tmp_path / "cc")),
                        HarnessSettings(trials=5, timeout_s=300))
    for r in rows:
        print(f"[selftest] {r.task:22s} {r.kernel:9s} {r.stage.status.value:10s} {r.stage.reason[:160]}")
    holes = [(r.task, r.kernel, r.stage.reason) for r in rows if not r.passed_selftest]
    assert not holes, f"the evaluator accepted kernels that must fail: {holes}"
    assert {r.kernel for r in rows} >= {"null", "zero", "copy", "constant"}
