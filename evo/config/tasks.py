"""The tasks a config searches: the built-ins plus its ``[tasks] files``, loaded by the search.

Validating a config checks that each task file exists and runs none of them
(:mod:`evo.config.sections`). Whoever searches with the config (``evo search``,
:func:`evo.engine.search.run_search`) calls :func:`load_tasks` once at its start and passes the
:class:`~evo.tasks.registry.TaskRegistry` on; no global registry changes. Problems found only
now (a file that fails to run, an included name that none of the files defines) raise the
same :class:`~evo.config.errors.ConfigError` lines validation would have: the file, the key,
the value, what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evo.config.errors import ConfigError
from evo.config.messages import value_line
from evo.config.sections import task_entry_problem

__all__ = ["load_tasks"]


def _as_written(path: Path, base: Path) -> str:
    """A task file as the config most likely spells it: relative to the config's directory
    when inside it, else absolute."""
    try:
        return os.path.relpath(path, base) if path.is_relative_to(base) else str(path)
    except ValueError:
        return str(path)


def load_tasks(config: Any) -> Any:
    """The :class:`~evo.tasks.registry.TaskRegistry` of ``config`` (a :class:`~evo.config.Config`):
    :data:`~evo.tasks.registry.BUILTIN_TASKS` plus the tasks of ``tasks.files``, in order.

    Raises :class:`ConfigError` with one line per task file that fails to load (``tasks.files[i]``;
    the include entries are then not checked, as at validation) or else per ``tasks.include``
    entry that names no task or family of the registry (``tasks.include[i]``).
    """
    from evo.tasks.registry import BUILTIN_TASKS  # lazy: the registry builds every task

    tasks = BUILTIN_TASKS
    files = config.tasks.files
    if not files:
        return tasks  # validation checked every entry against the built-ins
    base = config.source_path.resolve().parent if config.source_path is not None else Path.cwd()
    problems: list[tuple[str, str]] = []
    for i, f in enumerate(files):
        try:
            tasks = tasks.with_files([f])
        except Exception as exc:  # user code: any failure of it is a config problem
            key = f"tasks.files[{i}]"
            problems.append((key, value_line(key, _as_written(Path(f), base),
                                             f"could not load task file: {type(exc).__name__}: {exc}")))
    if not problems:
        for i, entry in enumerate(config.tasks.include):
            msg = task_entry_problem(entry, tasks)
            if msg is not None:
                key = f"tasks.include[{i}]"
                problems.append((key, value_line(key, entry, msg)))
    if problems:
        raise ConfigError(config.source, problems)
    return tasks
