"""The task of an evaluation, looked up in the judge: the built-in tasks plus the run's task
files (user tasks travel with every candidate to every process that evaluates it)."""

from __future__ import annotations

from typing import Any

__all__ = ["TaskLoadError", "load_task"]


class TaskLoadError(RuntimeError):
    """The job's task (or one of its task files) cannot be loaded in the judge: our failure,
    reported as a :class:`~evaluators.harness_job.HarnessError` of kind ``task`` so the user is
    pointed at the task file."""


def load_task(name: str, files: list[str]) -> Any:
    """The task from the built-in tasks plus the user task files ``files`` (a registry of this
    call's own: nothing global changes)."""
    from evo.tasks.registry import BUILTIN_TASKS, UnknownTaskError
    from evo.tasks.user import TaskFileError

    tasks = BUILTIN_TASKS
    for f in files:
        try:
            tasks = tasks.with_files([f])
        except TaskFileError as e:
            raise TaskLoadError(f"task file {f} could not be loaded in the GPU process: {e}") from e
    try:
        return tasks.get(name)
    except UnknownTaskError as e:
        given = ", ".join(files) if files else "none"
        raise TaskLoadError(
            f"unknown task {name!r} in the GPU process (task files given to it: {given}); a user "
            f"task must come from a file in [tasks] files (or evo check --task-file)"
        ) from e
