"""Parent side of the isolated GPU harness: spawn one fresh process per candidate, kill, collect.

Contract (shared/EVALUATION.md, Isolation):

- One new process per candidate (``subprocess``: fork+exec of a fresh interpreter, never a
  fork of a CUDA process), in its own process group (``start_new_session=True``), pinned to
  one GPU with ``CUDA_VISIBLE_DEVICES``, with an environment scrubbed of secrets and a
  private working and temp directory, confined by :mod:`evaluators.sandbox` (network
  namespace, rlimits, Landlock; docs/SECURITY.md).
- A wall-clock timeout kills the *whole group* (SIGKILL) and reports ``timeout``; a death
  without a result file reports ``crash`` with the trimmed tail of stderr and the last
  progress marker (which shape / trial was running) so a repair prompt can use it.
- This module never imports torch, CUDA or the candidate: it can run in the engine's GPU
  actor, a CPU test, or ``evo check``.

The child (``evaluators/child/harness.py``, or any ``entry`` for tests) gets one argument, the job
directory, containing ``job.json`` and ``kernel.so``; it writes ``result.json`` atomically
(``result.json.tmp`` + rename) and ``progress.json`` before each risky step. Exit code 0 =
the result file says what happened (a candidate failure is data); exit code
:data:`HARNESS_BUG_EXIT` with ``error.json`` = the harness itself failed, which raises
:class:`HarnessError` here.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

from evaluators.base import HarnessSettings
from evaluators.child_process import ChildProcess
from evaluators.harness_job import HarnessError, HarnessJob, HarnessReport, ShapeTiming, child_env
from evo.core.records import StageResult, Status

__all__ = [
    "HarnessJob",
    "HarnessReport",
    "ShapeTiming",
    "HarnessError",
    "run_isolated",
    "child_env",
]

log = logging.getLogger(__name__)


def run_isolated(
    job: HarnessJob,
    settings: HarnessSettings,
    *,
    entry: str = "evaluators.child.harness",
    python: str | None = None,
    keep_dir: bool = False,
    workdir: str | Path | None = None,
    sandbox: Any = None,
    pool: Any = None,
) -> HarnessReport:
    """Run one candidate's GPU stages in a fresh, killable process; never raises for candidates.

    With ``settings.isolation == "judge"`` the judge of this process evaluates it instead
    (:mod:`evaluators.judge`: a trusted judge, a sandboxed runner per candidate); ``entry``,
    ``python``, ``keep_dir``, ``workdir`` and ``pool`` then do not apply.

    ``entry``: the child's module (run as ``python -m entry JOBDIR``) or a ``.py`` path (run
    as ``python path JOBDIR``); tests point it at small fake children. ``settings.check_only``
    downgrades ``check+time`` to ``check``. Raises :class:`HarnessError` only when the child
    reports a harness bug (exit :data:`HARNESS_BUG_EXIT` with ``error.json``).
    ``sandbox``: :class:`evaluators.sandbox.SandboxSettings` (``None``: from the environment,
    see docs/SECURITY.md); the layers applied are recorded in ``report.env["sandbox"]``.

    ``check+time`` with ``settings.fresh_timing_process`` (the default) runs two children
    with the same seed: ``check``, then, only if correctness passed, ``time-only``; the report
    joins the first's correctness stage with the second's timing stage, fitness and
    environment (``env["timing_process"] = "fresh"``), and ``seconds`` is their sum.

    ``pool``: an :class:`evaluators.warm.WarmPool` (the GPU actor's): the children come
    from it (warm ones, prepared before this candidate existed, given their job now; its
    ``entry``, ``python``, ``workdir`` and ``sandbox`` apply, not these), and each runs
    inside the pool's :class:`~evaluators.gpu_schedule.GpuSchedule` slot: correctness
    shares the GPU, anything that times has it alone. Without a pool the timing process is
    started gated next to the correctness process (its start-up overlaps the trials; killed
    unread when correctness fails; its timeout counts from the gate).
    """
    mode = job.mode
    if settings.check_only and mode == "check+time":
        mode = "check"
    if settings.isolation == "judge":
        # The judge decides (evaluators.judge); the candidate runs in its runner, never here.
        import dataclasses

        from evaluators.judge import judge_for

        return judge_for("cuda").evaluate(dataclasses.replace(job, mode=mode), settings, sandbox=sandbox)
    seed = job.seed if job.seed is not None else secrets.randbits(62)
    src = pool if pool is not None else _Cold(dict(entry=entry, python=python, keep_dir=keep_dir,
                                                    workdir=workdir, sandbox=sandbox))
    if mode != "check+time" or not settings.fresh_timing_process:
        rep = src.run(job, settings, mode, seed)
        # one process doing both stages counts as the correctness process (its timeout too)
        wall = "wall_time_s" if mode == "time-only" else "wall_check_s"
        return replace(rep, env={**rep.env, wall: f"{rep.seconds:.3f}"})
    # Correctness and timing in two fresh processes (same seed). Timed in the process that
    # had just run the correctness trials, memory-bound kernels measured up to 11% slower
    # (gelu_bf16 1.686 ms against 1.511 ms in a fresh process; torch's own silu 7% slower)
    # and the slowdown lasted exactly as long as the first buffers allocated after the
    # trials lived: benchmarks/lab/timing_state.py, docs/evaluator.md. The timing process
    # does no GPU work until the correctness process has exited with correctness ok.
    timer = src.reserve(job, settings, "time-only", seed)
    try:
        first = src.run(job, settings, "check", seed)
    except BaseException:
        timer.abort()
        raise
    c = first.stage("correctness")
    if c is None or c.status is not Status.OK:
        timer.abort()
        why = c.status.value if c is not None else "missing from the child's result"
        skipped = StageResult("timing", Status.SKIPPED, f"not run: correctness {why}")
        return replace(first, stages=tuple(x for x in (c, skipped) if x is not None),
                       env={**first.env, "mode": "check+time", "wall_check_s": f"{first.seconds:.3f}"})
    second = timer.run()
    t = second.stage("timing") or StageResult("timing", Status.CRASH, "the timing process reported no timing stage")
    return HarnessReport(
        stages=(c, t),
        fitness=second.fitness,
        timings=second.timings,
        env={**second.env, "mode": "check+time", "timing_process": "fresh",
             "wall_check_s": f"{first.seconds:.3f}", "wall_time_s": f"{second.seconds:.3f}"},
        seconds=first.seconds + second.seconds,
        returncode=second.returncode,
    )


class _Cold:
    """Children started for their job, no GPU schedule (``evo check``, ``evo bench``, tests):
    the source :func:`run_isolated` uses without a pool."""

    def __init__(self, kw: dict[str, Any]) -> None:
        self.kw = kw

    def run(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> HarnessReport:
        return ChildProcess(job, settings, mode, seed, **self.kw).finish()

    def reserve(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> "_Gated":
        return _Gated(ChildProcess(job, settings, mode, seed, gate=True, **self.kw))


class _Gated:
    """A gated child started now; :meth:`run` opens its gate and waits for its report."""

    def __init__(self, child: "ChildProcess") -> None:
        self.child = child

    def run(self) -> HarnessReport:
        self.child.open_gate()
        return self.child.finish()

    def abort(self) -> None:
        self.child.abort()


