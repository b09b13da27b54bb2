"""User tasks: load ``Task`` definitions from a Python file (config ``[tasks] files``).

A task file is plain Python that defines either ``TASKS = [Task(...), ...]`` or a function
``tasks() -> list[Task]`` (see ``configs/examples/my_task.py`` and docs/tasks.md). Its
reference, ``make_inputs``, ``flops`` and ``bytes`` must be module-level functions (or
picklable objects such as :class:`evo.tasks.inputs.TensorInputs`): the task is pickled to
the GPU actor.

How that works: the file is imported as the module ``evo.tasks.user._f<hex of its absolute
path>``. This module (``evo.tasks.user``) acts as a package for those names and installs an
import hook that maps such a name back to its file, so *any* process (a spawned harness
worker, a Ray actor on the same filesystem) that unpickles a user task re-imports the file by
itself. A file is therefore executed at most once per process; edits need a new process.

Loading forces ``family = "user"``, resolves a ``seed`` that names a ``.cu`` file (relative
to the task file) to its absolute path, validates every task and checks that it pickles; it
registers nothing: :meth:`evo.tasks.registry.TaskRegistry.with_files` puts a file's tasks into
a new registry. Every failure raises :class:`TaskFileError` (a ValueError) that names the file
and the fix.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import pickle
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from evo.tasks.base import Task
from evo.tasks.registry import BUILTIN_TASKS, InvalidTaskError, TaskRegistry, validate_task

__all__ = ["USER_FAMILY", "TaskFileError", "load_task_file", "run_task_registry", "module_name_for",
           "seed_path"]

logger = logging.getLogger(__name__)

USER_FAMILY = "user"
_PREFIX = __name__ + "._f"

# Submodules of this module are user task files, found by _UserTaskFinder (not on disk).
__path__: list[str] = []


class TaskFileError(ValueError):
    """A user task file could not be loaded; the message names the file and the fix."""


class _UserTaskFinder(importlib.abc.MetaPathFinder):
    """Maps ``evo.tasks.user._f<hex path>`` to the file at that path."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if not fullname.startswith(_PREFIX):
            return None
        try:
            file = bytes.fromhex(fullname[len(_PREFIX):]).decode("utf-8")
        except ValueError:
            return None
        if not os.path.isfile(file):
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _install_finder() -> None:
    if not any(type(f).__name__ == "_UserTaskFinder" and getattr(f, "_evo", False)
               for f in sys.meta_path):
        finder = _UserTaskFinder()
        finder._evo = True  # type: ignore[attr-defined]
        sys.meta_path.append(finder)


_install_finder()


def module_name_for(path: str | os.PathLike[str]) -> str:
    """The module name a task file is imported under (stable for its absolute path)."""
    return _PREFIX + str(Path(path).expanduser().resolve()).encode("utf-8").hex()


def seed_path(task: Task) -> Path | None:
    """The seed kernel file of a task whose ``seed`` is a ``.cu`` path, else None (the seed
    is then a name in :mod:`evo.tasks.seeds`, or empty)."""
    if task.seed and task.seed.endswith(".cu"):
        return Path(task.seed)
    return None


def _import(path: Path) -> Any:
    name = module_name_for(path)
    if name in sys.modules:
        return sys.modules[name]
    # Task files may import modules next to them (`from helpers import ...`), in every
    # process that imports the file. Appended, not prepended: a sibling never shadows an
    # installed package (or this project) of the same name.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        return importlib.import_module(name)
    except SyntaxError as exc:
        raise TaskFileError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg}; fix the file and load it again"
        ) from exc
    except Exception as exc:
        raise TaskFileError(
            f"{path}: importing the task file raised {type(exc).__name__}: {exc}"
        ) from exc


def _collect(path: Path, mod: Any) -> list[Any]:
    has_list, has_fn = hasattr(mod, "TASKS"), hasattr(mod, "tasks")
    if has_list and has_fn:
        raise TaskFileError(f"{path}: defines both TASKS and tasks(); keep one of them")
    if has_list:
        items = mod.TASKS
        where = "TASKS"
    elif has_fn:
        if not callable(mod.tasks):
            raise TaskFileError(f"{path}: 'tasks' must be a function returning a list of Task")
        try:
            items = mod.tasks()
        except Exception as exc:
            raise TaskFileError(f"{path}: tasks() raised {type(exc).__name__}: {exc}") from exc
        where = "tasks()"
    else:
        raise TaskFileError(
            f"{path}: defines no tasks; add `TASKS = [Task(...), ...]` or a function "
            f"`def tasks() -> list[Task]` (see configs/examples/my_task.py)"
        )
    if isinstance(items, Task):
        items = [items]
    if not isinstance(items, (list, tuple)):
        raise TaskFileError(
            f"{path}: {where} must be a list of evo.tasks.Task, got {type(items).__name__}"
        )
    if not items:
        raise TaskFileError(f"{path}: {where} is empty")
    for i, t in enumerate(items):
        if not isinstance(t, Task):
            raise TaskFileError(
                f"{path}: {where}[{i}] is a {type(t).__name__}, not an evo.tasks.Task "
                f"(build it with `from evo.tasks import Task, Tolerance`)"
            )
    return list(items)


def _resolve_seed(path: Path, task: Task) -> str:
    seed = task.seed
    if not isinstance(seed, str) or not seed:
        return seed
    if seed.endswith(".cu") or "/" in seed or os.sep in seed:
        p = Path(seed).expanduser()
        if not p.is_absolute():
            p = path.parent / p
        p = p.resolve()
        if not p.is_file():
            raise TaskFileError(
                f"{path}: task {task.name!r}: seed kernel {seed!r} not found (looked for {p}); "
                f"a relative seed path is relative to the task file"
            )
        return str(p)
    return seed


def _check_pickles(path: Path, task: Task) -> None:
    for field_name in ("reference", "make_inputs", "flops", "bytes", "index_rule"):
        obj = getattr(task, field_name)
        if obj is None:
            continue
        try:
            back = pickle.loads(pickle.dumps(obj))
        except Exception as exc:
            raise TaskFileError(
                f"{path}: task {task.name!r}: {field_name} cannot be pickled "
                f"({type(exc).__name__}: {exc}); define it as a module-level function in the "
                f"task file (no lambdas or nested functions)"
            ) from exc
        if callable(obj) and back is not obj and type(back) is not type(obj):
            raise TaskFileError(
                f"{path}: task {task.name!r}: {field_name} does not survive pickling"
            )


def load_task_file(path: str | os.PathLike[str]) -> list[Task]:
    """Import a user task file and return its tasks (family ``user``), validated; no registry
    changes. Loading the same file again returns equal tasks (the file runs once per process)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskFileError(f"{path}: task file not found")
    if not p.is_file():
        raise TaskFileError(f"{path}: not a file (expected a .py file defining TASKS)")
    p = p.resolve()
    mod = _import(p)
    tasks = []
    seen: set[str] = set()
    for t in _collect(p, mod):
        if t.family != USER_FAMILY:
            logger.debug("%s: task %s family %r -> %r", p, t.name, t.family, USER_FAMILY)
        shapes = t.shapes
        if isinstance(shapes, list):
            shapes = tuple(shapes)
        if isinstance(shapes, tuple):
            shapes = tuple(dict(s) if isinstance(s, dict) else s for s in shapes)
        dists = tuple(t.distributions) if isinstance(t.distributions, list) else t.distributions
        scalars = tuple(t.scalars) if isinstance(t.scalars, list) else t.scalars
        t = replace(t, family=USER_FAMILY, shapes=shapes, distributions=dists, scalars=scalars,
                    seed=_resolve_seed(p, t))
        try:
            validate_task(t)
        except InvalidTaskError as exc:
            raise TaskFileError(f"{p}: {exc}") from exc
        if t.name in seen:
            raise TaskFileError(f"{p}: task name {t.name!r} is defined twice")
        seen.add(t.name)
        _check_pickles(p, t)
        tasks.append(t)
    logger.info("loaded %d user task(s) from %s", len(tasks), p)
    return tasks


def run_task_registry(config: Any, run_id: str = "", base: TaskRegistry | None = None) -> TaskRegistry:
    """The tasks a stored run was searched with: ``base`` (None: the built-ins) plus its config's
    ``tasks.files`` (absolute since config load), so ``evo bench --run``, ``evo tune`` and ``evo export`` know
    the run's user tasks and hand the files (:attr:`TaskRegistry.files`) to every child they
    start. A file that is gone raises :class:`TaskFileError` naming the run and the fix."""
    tasks = (config or {}).get("tasks") if isinstance(config, dict) else None
    files = tuple(str(f) for f in ((tasks or {}).get("files") or ()))
    for f in files:
        if not Path(f).is_file():
            who = f"run {run_id}" if run_id else "the run"
            raise TaskFileError(f"{f}: {who} was searched with this user task file, which is gone; restore "
                                f"it (same path) to inspect, bench, tune or export the run's user tasks")
    return (BUILTIN_TASKS if base is None else base).with_files(files)
