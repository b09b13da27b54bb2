"""evaluators.judge.prewarm: the judge's Triton kernels built by a process of their own at
``evo search``'s entry. What a CPU machine can check: the child and the judge build the same
steps (the child in reverse), the child's start and end, and that it exits quietly without
CUDA. Not seen here: whether Triton's cache serves the judge what the child built (GPU runs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from evaluators.judge.prewarm import begin_prewarm, end_prewarm, kernel_steps, warm_kernels


def _steps(log):
    return [(span, lambda name=name: log.append(name)) for span, name in
            [("warm:checks", "c1"), ("warm:checks", "c2"), ("warm:draws", "d1"), ("warm:draws", "d2")]]


def test_the_child_builds_the_judge_s_steps_in_reverse_each_span_once():
    spans, ran = [], []

    @contextlib.contextmanager
    def span(name):
        spans.append(name)
        yield

    warm_kernels(_steps(ran), span=span)
    assert ran == ["c1", "c2", "d1", "d2"] and spans == ["warm:checks", "warm:draws"]
    spans.clear(), ran.clear()
    warm_kernels(_steps(ran), reverse=True, span=span)
    assert ran == ["d2", "d1", "c2", "c1"] and spans == ["warm:draws", "warm:checks"]


def test_a_failing_step_raises_for_the_judge():
    def boom():
        raise RuntimeError("no compiler")

    with pytest.raises(RuntimeError, match="no compiler"):
        warm_kernels([("warm:checks", boom)])


def test_kernel_steps_are_every_warm_check_then_both_draws():
    torch = pytest.importorskip("torch")
    from evaluators.judge.prewarm import WARM_SIZES

    names = [span for span, _ in kernel_steps(torch)]
    assert names == ["warm:checks"] * (2 * len(WARM_SIZES)) + ["warm:draws"] * 2


def test_begin_starts_the_module_detached_quiet_and_without_secrets_and_a_failed_start_is_none(monkeypatch):
    seen = {}

    def popen(argv, **kw):
        seen.update(argv=argv, **kw)
        return "proc"

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("MY_MODEL_CRED", "q7Zr2mVx9LpK4wNc")
    monkeypatch.setenv("COPY_OF_IT", "q7Zr2mVx9LpK4wNc")
    assert begin_prewarm(secret_env=("MY_MODEL_CRED",), popen=popen) == "proc"
    assert seen["argv"] == [sys.executable, "-m", "evaluators.judge.prewarm"]
    env = seen["env"]
    assert "OPENAI_API_KEY" not in env and "MY_MODEL_CRED" not in env and "COPY_OF_IT" not in env
    assert env["PATH"] == os.environ["PATH"]
    assert seen["stdout"] is subprocess.DEVNULL and seen["stderr"] is subprocess.DEVNULL
    assert seen["start_new_session"] is True

    def broken(argv, **kw):
        raise OSError("no such file")

    assert begin_prewarm(popen=broken) is None


def test_end_kills_a_child_that_still_runs_and_reaps_it():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    end_prewarm(proc)
    assert proc.returncode is not None and proc.returncode != 0
    end_prewarm(None)   # nothing started: nothing to do


def test_without_cuda_the_child_exits_zero_at_once():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the child would build the kernels")
    done = subprocess.run([sys.executable, "-m", "evaluators.judge.prewarm"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
