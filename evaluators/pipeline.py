"""Compile then run isolated: the one place that builds a candidate and runs its GPU stages
in a fresh isolated process, for every caller (the engine's GPU actor, ``evo check``, ``evo
bench``, the self-test, local tuning, the kernel lab's probe).

- :func:`build_and_run` — policy (optional) -> compile -> the isolated child, for one
  candidate in this process; a failing stage ends the evaluation.
- :func:`check_kernel` — ``evo check``: a source file in, every stage's result out. Without
  a CUDA GPU the GPU stages come back ``skipped`` with :data:`NO_GPU_REASON`.
- :func:`compile_all` — many candidates built in parallel (nvcc runs in its own process, so
  threads suffice), for callers that build everything before measuring anything.
- :func:`run_built` — a built candidate's ``.so`` through the isolated child: the one place a
  :class:`~evaluators.isolation.HarnessJob` is made from a candidate.
- :func:`evaluate_built` — the engine's GPU actor: a candidate that already passed policy and
  compile (``so_bytes`` from a CPU compile worker) in, an :class:`~evo.core.records.Evaluation` out.

None initialises CUDA in the calling process: the GPU work happens in the child spawned
by :func:`evaluators.isolation.run_isolated`, and :func:`gpu_available` asks ``nvidia-smi``
and a throwaway subprocess, never ``torch.cuda`` here. The compile stage and the isolated run
are looked up when called (``evaluators.compile.compile_candidate``,
``evaluators.isolation.run_isolated``), so a test that replaces either replaces it for every
caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from evaluators import isolation
from evaluators.base import CompileSettings, HarnessSettings
from evaluators.isolation import HarnessJob, HarnessReport
from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status

if TYPE_CHECKING:
    from evaluators.compile import CompileOutcome

__all__ = ["build_and_run", "check_kernel", "compile_all", "evaluate_built", "gpu_available", "run_built",
           "NO_GPU_REASON", "STAGES"]

log = logging.getLogger(__name__)

STAGES = ("policy", "compile", "correctness", "timing")
NO_GPU_REASON = (
    "no CUDA GPU on this machine: compile-only check (run on a GPU machine for correctness "
    "and timing)"
)


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when a child process could run CUDA work here (checked without touching CUDA).

    ``nvidia-smi -L`` must list a GPU, and this process's torch must be a CUDA build (a
    CPU-only torch would fail every evaluation): ``torch.version.cuda``, read without
    initialising CUDA, so nothing here creates a context and no second interpreter has to
    import torch on the way to a search's start.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if out.returncode != 0 or "GPU" not in out.stdout:
        return False
    try:
        import torch
    except ImportError:
        return False
    return getattr(torch.version, "cuda", None) is not None


def _skipped(names: tuple[str, ...], reason: str) -> tuple[StageResult, ...]:
    return tuple(StageResult(n, Status.SKIPPED, reason) for n in names)


def _mode(settings: HarnessSettings) -> str:
    return "check" if settings.check_only else "check+time"


def compile_all(candidates: Sequence[Candidate], settings: CompileSettings, *, jobs: int,
                on_built: Callable[[int], None] | None = None) -> list["CompileOutcome"]:
    """The compile outcomes of ``candidates``, in their order, built by ``jobs`` threads at once.

    ``on_built(n)`` is called as the ``n``-th build finishes (a progress bar). A candidate's
    compile failure is its outcome; a failure of ours (:class:`~evaluators.base.InfrastructureError`)
    is raised.
    """
    from evaluators.compile import compile_candidate

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(compile_candidate, c, settings) for c in candidates]
        if on_built is not None:
            for n, _ in enumerate(cf.as_completed(futures), 1):
                on_built(n)
        return [f.result() for f in futures]


def run_built(
    candidate: Candidate,
    so_bytes: bytes,
    settings: HarnessSettings,
    *,
    mode: str | None = None,
    task_files: tuple[str, ...] = (),
    shapes: tuple[int, ...] | None = None,
    pool: Any = None,
) -> HarnessReport:
    """The GPU stages of a built candidate in a fresh isolated process (its report).

    ``mode``: one of :data:`evaluators.child.protocol.MODES`; default ``check`` or
    ``check+time`` from ``settings.check_only``. ``shapes``: indices of the task's shapes to
    check (``None``: all). ``pool``: the GPU actor's :class:`~evaluators.warm.WarmPool` (warm
    children and the GPU's schedule). Raises :class:`~evaluators.isolation.HarnessError`
    only for a failure of the harness itself.
    """
    job = HarnessJob(task=candidate.task, candidate_id=candidate.id, so_bytes=so_bytes, params=candidate.params,
                     mode=mode or _mode(settings), task_files=task_files, shapes=shapes)
    return isolation.run_isolated(job, settings, pool=pool)


def build_and_run(
    candidate: Candidate,
    compile_settings: CompileSettings,
    harness_settings: HarnessSettings,
    *,
    policy: Callable[[str], StageResult] | None = None,
    mode: str | None = None,
    task_files: tuple[str, ...] = (),
    shapes: tuple[int, ...] | None = None,
    gpu: bool | None = True,
) -> Evaluation:
    """Policy -> compile -> the isolated GPU stages of one candidate, in this process.

    A failing stage ends the evaluation: its stages are those run, the failed one last (no
    fitness). ``policy``: the policy check of the source (default
    :func:`evaluators.policy.check_policy`). ``gpu``:
    ``True`` runs the GPU stages, ``False`` does not, ``None`` asks :func:`gpu_available`
    once the candidate has compiled; without them the evaluation ends with ``correctness``
    and ``timing`` ``skipped`` with :data:`NO_GPU_REASON`. ``mode``, ``task_files``,
    ``shapes``: as :func:`run_built`.
    """
    from evaluators.compile import compile_candidate

    if policy is None:
        from evaluators.policy import check_policy as policy
    pol = policy(candidate.source)
    if not pol.passed:
        return Evaluation(candidate.id, (pol,))
    prior = (pol,)
    outcome = compile_candidate(candidate, compile_settings)
    prior += (outcome.result,)
    if not outcome.result.passed or not outcome.so_bytes:
        return Evaluation(candidate.id, prior)
    if not (gpu_available() if gpu is None else gpu):
        return Evaluation(candidate.id, prior + _skipped(STAGES[2:], NO_GPU_REASON))
    report = run_built(candidate, outcome.so_bytes, harness_settings, mode=mode, task_files=task_files,
                       shapes=shapes)
    return _evaluation(candidate, prior, report)


def check_kernel(
    source: str,
    task: str,
    params: Mapping[str, Any] | None = None,
    *,
    compile_settings: CompileSettings,
    harness_settings: HarnessSettings,
    gpu: bool | None = None,
    task_files: tuple[str, ...] = (),
    shapes: tuple[int, ...] | None = None,
) -> tuple[StageResult, ...]:
    """Run every stage on one kernel source; always returns four results (policy, compile,
    correctness, timing), later ones ``skipped`` with the reason when an earlier one failed.

    ``gpu``: ``None`` = detect (:func:`gpu_available`); ``True`` forces the GPU stages (a
    child without CUDA then raises :class:`~evaluators.isolation.HarnessError`); ``False``
    skips them. ``shapes``: indices of the task's shapes to check (``None``: all).
    """
    cand = Candidate.create(task, source, params, operator=Operator.USER)
    stages = build_and_run(cand, compile_settings, harness_settings, gpu=gpu, task_files=task_files,
                           shapes=shapes).stages
    if len(stages) < len(STAGES):
        last = stages[-1]
        stages += _skipped(STAGES[len(stages):], f"not run: {last.stage} {last.status.value}")
    return stages


def evaluate_built(
    candidate: Candidate,
    so_bytes: bytes,
    settings: HarnessSettings,
    *,
    prior: tuple[StageResult, ...] = (),
    mode: str | None = None,
    task_files: tuple[str, ...] = (),
    pool: Any = None,
) -> Evaluation:
    """Correctness + timing of a built candidate in a fresh isolated process.

    ``prior``: the policy/compile results to put in front (the engine may pass them).
    ``mode``: ``"time-only"`` re-times an already-correct candidate (champion
    re-confirmation); default ``check`` or ``check+time`` from ``settings.check_only``.
    Fitness is set only when every stage passed. ``pool``: as :func:`run_built` (the GPU actor
    passes its own).
    """
    return _evaluation(candidate, tuple(prior), run_built(candidate, so_bytes, settings, mode=mode,
                                                          task_files=task_files, pool=pool))


def _evaluation(candidate: Candidate, prior: tuple[StageResult, ...], report: HarnessReport) -> Evaluation:
    """``prior`` and the isolated run's stages as one evaluation; fitness only when every
    stage passed and the candidate was timed."""
    stages = prior + report.stages
    ok = all(s.status in (Status.OK, Status.SKIPPED) for s in stages)
    timed = any(s.stage == "timing" and s.status is Status.OK for s in stages)
    return Evaluation(
        candidate_id=candidate.id,
        stages=stages,
        fitness=report.fitness if (ok and timed) else None,
        gpu=report.env.get("gpu", ""),
        env=dict(report.env),
    )
