"""A GPU stage that does, in the GPU actor's process, what the judge does first with a job:
look its task up from the settings' task files (:func:`evaluators.judge.tasks.load_task`), and
report a task it cannot load as our failure, as the judge does (a ``HarnessError`` of kind
``task`` with its fix). What a test learns: whatever the engine, the runtime and the GPU actor
hand to the evaluating process really arrives there (task files above all)."""

from __future__ import annotations

from evaluators.base import HarnessSettings
from evaluators.harness_job import HARNESS_FIXES, HarnessError
from evo.core.records import Candidate, Evaluation, StageResult, Status


def isolated_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    """Like ``evaluators.pipeline.evaluate_built`` up to the judge's task lookup; every task it
    can load is correct and timed (fitness 1)."""
    from evaluators.judge.tasks import TaskLoadError, load_task

    try:
        task = load_task(candidate.task, list(settings.task_files))
    except TaskLoadError as e:
        raise HarnessError(str(e), kind="task", fix=HARNESS_FIXES["task"]) from e
    env = {"task": task.name, "task_family": task.family}
    return Evaluation(candidate.id, (StageResult("correctness", Status.OK), StageResult("timing", Status.OK,
                                                                                          metrics={"fitness": 1.0})),
                      1.0, gpu="fake", env=env)


def raising_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    """A GPU stage whose own code is broken (not a failure the judge reports): raises every time."""
    raise ValueError("simulated bug in the GPU stage")
