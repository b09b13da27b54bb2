"""Compile then judge: the one place that builds a candidate and has its GPU stages decided by
the judge (:mod:`evaluators.judge`: a trusted process that never loads candidate code, driving
one sandboxed runner per candidate), for every caller (the engine's GPU actor, ``evo check``,
``evo bench``, ``evo export``, the self-test, local tuning, the kernel lab's probe).

- :func:`build_and_run` — policy (optional) -> compile -> the judge, for one candidate in
  this process; a failing stage ends the evaluation.
- :func:`check_kernel` — ``evo check``: a source file in, every stage's result out. Without
  a CUDA GPU the GPU stages come back ``skipped`` with :data:`NO_GPU_REASON`.
- :func:`compile_all` — many candidates built in parallel (nvcc runs in its own process, so
  threads suffice), for callers that build everything before measuring anything.
- :func:`run_built` — a built candidate's ``.so`` through the judge: the one place a
  :class:`~evaluators.harness_job.HarnessJob` is made from a candidate.
- :func:`judge_job` — one job through this process's judge.
- :func:`evaluate_built` — the engine's GPU actor: a candidate that already passed policy and
  compile (``so_bytes`` from a CPU compile worker) in, an :class:`~evo.core.records.Evaluation` out.

Only :func:`judge_job` initialises CUDA in the calling process (the judge's context, kept warm
across candidates); :func:`gpu_available` asks ``nvidia-smi``, never ``torch.cuda``. The
compile stage and the judge are looked up when called (``evaluators.compile.compile_candidate``,
``evaluators.pipeline.judge_job``), so a test that replaces either replaces it for every caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import logging
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.harness_job import HarnessJob, HarnessReport
from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status

if TYPE_CHECKING:
    from evaluators.compile import CompileOutcome

__all__ = ["build_and_run", "check_kernel", "compile_all", "evaluate_built", "gpu_available", "judge_job",
           "run_built", "NO_GPU_REASON", "STAGES"]

log = logging.getLogger(__name__)

STAGES = ("policy", "compile", "correctness", "timing")
NO_GPU_REASON = (
    "no CUDA GPU on this machine: compile-only check (run on a GPU machine for correctness "
    "and timing)"
)


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when the judge could run CUDA work here (checked without touching CUDA).

    ``nvidia-smi -L`` must list a GPU, and this process's torch must be a CUDA build (a
    CPU-only torch would fail every evaluation): ``torch.version.cuda``, read without
    initialising CUDA, so nothing here creates a context.
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
    return torch_cuda_build()


def torch_cuda_build() -> bool:
    """Whether the torch this process would import is a CUDA build: ``torch.version.cuda``,
    read from torch's ``version.py`` without importing torch (seconds, which ``evo search``
    spends at entry beside its Ray start otherwise), or from the imported module when the
    file cannot be read as a plain literal assignment. False without torch."""
    import sys

    if "torch" not in sys.modules:
        import importlib.util

        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            return False
        cuda = _literal(Path(spec.origin).with_name("version.py"), "cuda")
        if cuda is not _UNREAD:
            return cuda is not None
    try:
        import torch
    except ImportError:
        return False
    return getattr(torch.version, "cuda", None) is not None


#: what :func:`_literal` returns when the value cannot be read as a literal
_UNREAD = object()


def _literal(path: Path, name: str) -> Any:
    """The literal value assigned to ``name`` at the top level of the Python file ``path``
    (``name = ...`` or ``name: T = ...``), read without running it; :data:`_UNREAD` when the
    file cannot be read or holds no such literal assignment."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return _UNREAD
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return _UNREAD
    return _UNREAD


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


def judge_job(job: HarnessJob, settings: HarnessSettings, *, sandbox: Any = None) -> HarnessReport:
    """One job through this process's CUDA judge (:func:`evaluators.judge.judge_for`); never
    raises for the candidate. ``settings.check_only`` downgrades ``check+time`` to ``check``.
    ``sandbox``: the runner's :class:`evaluators.sandbox.SandboxSettings` (``None``: from the
    environment, docs/SECURITY.md). Raises :class:`~evaluators.harness_job.HarnessError` (or
    another :class:`~evaluators.base.InfrastructureError`) for our own failures only."""
    from evaluators.judge import judge_for

    if settings.check_only and job.mode == "check+time":
        job = dataclasses.replace(job, mode="check")
    return judge_for("cuda").evaluate(job, settings, sandbox=sandbox)


def run_built(
    candidate: Candidate,
    so_bytes: bytes,
    settings: HarnessSettings,
    *,
    mode: str | None = None,
    task_files: tuple[str, ...] = (),
    shapes: tuple[int, ...] | None = None,
    baseline: tuple[Candidate, bytes] | None = None,
) -> HarnessReport:
    """The GPU stages of a built candidate, decided by the judge (its report).

    ``mode``: one of :data:`evaluators.harness_job.MODES`; default ``check`` or
    ``check+time`` from ``settings.check_only``. ``shapes``: indices of the task's shapes to
    check (``None``: all). ``baseline``: ``(candidate, built .so)`` timed beside it, mode
    ``paired`` only. Raises :class:`~evaluators.harness_job.HarnessError` only for a
    failure of ours.
    """
    base = {"baseline_id": baseline[0].id, "baseline_so": baseline[1]} if baseline is not None else {}
    job = HarnessJob(task=candidate.task, candidate_id=candidate.id, so_bytes=so_bytes, params=candidate.params,
                     mode=mode or _mode(settings), task_files=task_files, shapes=shapes, **base)
    return judge_job(job, settings)


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
    """Policy -> compile -> the GPU stages of one candidate (the judge of this process).

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
    machine without CUDA then raises :class:`~evaluators.harness_job.HarnessError`); ``False``
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
    baseline: tuple[Candidate, bytes] | None = None,
) -> Evaluation:
    """Correctness + timing of a built candidate, decided by the judge.

    ``prior``: the policy/compile results to put in front (the engine may pass them).
    ``mode``: ``"paired"`` (champion confirmation) checks the candidate again and times it
    call by call with ``baseline`` (``(candidate, built .so)``, the task's seed), the paired
    times in the timing stage's ``metrics["paired"]``; ``"time-only"`` re-times an
    already-correct candidate; default ``check`` or ``check+time`` from
    ``settings.check_only``. Fitness is set only when every stage passed.
    """
    return _evaluation(candidate, tuple(prior), run_built(candidate, so_bytes, settings, mode=mode,
                                                          task_files=task_files, baseline=baseline))


def _evaluation(candidate: Candidate, prior: tuple[StageResult, ...], report: HarnessReport) -> Evaluation:
    """``prior`` and the judge's stages as one evaluation; fitness only when every
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
