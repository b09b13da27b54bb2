"""Task registries: tasks looked up by name, the built-in families plus user task files.

A :class:`TaskRegistry` is immutable: adding tasks (:meth:`TaskRegistry.with_tasks`) or user
task files (:meth:`TaskRegistry.with_files`) returns a new one, so nothing global changes
when a file is loaded. :data:`BUILTIN_TASKS` holds the built-in tasks only
(``kernelbench-l1`` from :mod:`evo.tasks.kernelbench`, ``modern`` from
:mod:`evo.tasks.modern`); the module functions :func:`get_task`, :func:`task_names`,
:func:`families`, :func:`tasks_for` and :func:`task_table` read it. Whoever knows of user task
files (a search's config, a command's ``--task-file``, a run's record) builds its own registry
at its start and passes it to what looks tasks up; the judge builds its own from the
job's ``task_files``.

Every task is validated (:func:`validate_task`) when it enters a registry, so a malformed
task fails when it is added, not deep in a search. Lookups fail loudly: an unknown name lists
the valid names and the closest matches.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from evo.tasks.base import Task, Tolerance
from evo.tasks.inputs import DISTRIBUTIONS, DTYPES

__all__ = [
    "UnknownTaskError",
    "UnknownFamilyError",
    "DuplicateTaskError",
    "InvalidTaskError",
    "validate_task",
    "TaskRegistry",
    "BUILTIN_TASKS",
    "get_task",
    "task_names",
    "families",
    "tasks_for",
    "format_shape",
    "task_table",
]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_TASK_DTYPES = ("float32", "bfloat16", "float16")
_REF_DTYPES = ("float32", "float64")
_BUILTIN_FAMILY_ORDER = ("kernelbench-l1", "modern")


class UnknownTaskError(KeyError):
    """No task of that name; the message lists close matches and the valid names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownFamilyError(UnknownTaskError):
    """No task family of that name; the message lists the known families."""


class DuplicateTaskError(ValueError):
    """A different task already has that name in the registry."""


class InvalidTaskError(ValueError):
    """A Task whose fields break the contract of :class:`evo.tasks.base.Task`."""


def _positive_finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def validate_task(task: Any) -> None:
    """Raise :class:`InvalidTaskError` naming the first field that breaks the contract.

    Checks types, names, dtypes, distributions, shapes (non-empty mappings of str to positive
    int), ``bench_shapes``, the tolerance, callables, and that ``flops``/``bytes`` give
    positive finite numbers on every shape.
    """
    if not isinstance(task, Task):
        raise InvalidTaskError(f"expected an evo.tasks.Task, got {type(task).__name__}")
    who = f"task {task.name!r}"
    if not isinstance(task.name, str) or not _NAME_RE.match(task.name):
        raise InvalidTaskError(
            f"task name {task.name!r}: use letters, digits, '_', '.', '-', starting with a "
            f"letter or '_'"
        )
    if not isinstance(task.family, str) or not task.family:
        raise InvalidTaskError(f"{who}: family must be a non-empty string")
    if task.dtype not in _TASK_DTYPES:
        raise InvalidTaskError(f"{who}: dtype {task.dtype!r}; allowed: {', '.join(_TASK_DTYPES)}")
    if task.reference_dtype not in _REF_DTYPES:
        raise InvalidTaskError(
            f"{who}: reference_dtype {task.reference_dtype!r}; allowed: {', '.join(_REF_DTYPES)}"
        )
    if DTYPES[task.reference_dtype] < DTYPES[task.dtype]:
        raise InvalidTaskError(
            f"{who}: reference_dtype {task.reference_dtype} is narrower than dtype {task.dtype}"
        )
    for field_name in ("reference", "make_inputs", "flops", "bytes"):
        if not callable(getattr(task, field_name)):
            raise InvalidTaskError(f"{who}: {field_name} must be callable")
    if not isinstance(task.tolerance, Tolerance):
        raise InvalidTaskError(f"{who}: tolerance must be an evo.tasks.Tolerance")
    tol = task.tolerance
    for f in ("atol", "rtol", "rel_l2", "nondeterminism"):
        v = getattr(tol, f)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InvalidTaskError(f"{who}: tolerance.{f} = {v!r} must be a finite number >= 0")
    if tol.rel_l2 <= 0:
        raise InvalidTaskError(f"{who}: tolerance.rel_l2 must be > 0")
    if not isinstance(task.distributions, tuple) or not task.distributions:
        raise InvalidTaskError(f"{who}: distributions must be a non-empty tuple")
    bad = [d for d in task.distributions if d not in DISTRIBUTIONS]
    if bad:
        raise InvalidTaskError(
            f"{who}: unknown distribution(s) {bad}; known: {', '.join(DISTRIBUTIONS)}"
        )
    if not isinstance(task.scalars, tuple) or not all(
        isinstance(s, (int, float)) and not isinstance(s, bool) for s in task.scalars
    ):
        raise InvalidTaskError(f"{who}: scalars must be a tuple of numbers, got {task.scalars!r}")
    if not isinstance(task.shapes, tuple) or not task.shapes:
        raise InvalidTaskError(f"{who}: shapes must be a non-empty tuple of dicts")
    for i, shape in enumerate(task.shapes):
        if not isinstance(shape, Mapping) or not shape:
            raise InvalidTaskError(f"{who}: shapes[{i}] must be a non-empty dict of dim -> size")
        for k, v in shape.items():
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InvalidTaskError(
                    f"{who}: shapes[{i}] = {dict(shape)}: keys must be str and sizes positive ints"
                )
    if not isinstance(task.bench_shapes, int) or not 1 <= task.bench_shapes <= len(task.shapes):
        raise InvalidTaskError(
            f"{who}: bench_shapes = {task.bench_shapes!r} must be between 1 and "
            f"len(shapes) = {len(task.shapes)}"
        )
    for i, shape in enumerate(task.shapes):
        for field_name in ("flops", "bytes"):
            try:
                v = getattr(task, field_name)(shape)
            except Exception as exc:
                raise InvalidTaskError(
                    f"{who}: {field_name}(shapes[{i}]) raised {type(exc).__name__}: {exc}"
                ) from exc
            if not _positive_finite(v):
                raise InvalidTaskError(
                    f"{who}: {field_name}(shapes[{i}]) = {v!r}; must be a positive finite number"
                )
    if task.index_rule is not None and not callable(task.index_rule):
        raise InvalidTaskError(f"{who}: index_rule must be callable (e.g. evo.tasks.ArgExtremum(dim=1)) or None")
    if not isinstance(task.seed, str):
        raise InvalidTaskError(f"{who}: seed must be a string (a seed name or a .cu path)")


class TaskRegistry:
    """Tasks by name, in the order they were added; immutable (see the module docstring).

    ``TaskRegistry(tasks)`` validates every task; an equal task twice is kept once, a
    different task under a taken name raises :class:`DuplicateTaskError`. :attr:`files` are
    the absolute paths of the user task files loaded into it, in order: what the judge
    is given to build the same registry (``HarnessSettings.task_files``).
    """

    __slots__ = ("_tasks", "_files")

    def __init__(self, tasks: Iterable[Task] = ()) -> None:
        self._tasks: dict[str, Task] = {}
        self._files: tuple[str, ...] = ()
        self._add(tasks)

    def _add(self, tasks: Iterable[Task]) -> None:
        new: dict[str, Task] = {}
        for task in tasks:
            validate_task(task)
            old = self._tasks.get(task.name, new.get(task.name))
            if old is not None and old != task:
                raise DuplicateTaskError(
                    f"task {task.name!r} is already registered (family {old.family!r}); rename the new task"
                )
            new.setdefault(task.name, task)
        for name, task in new.items():  # all or nothing
            self._tasks.setdefault(name, task)

    def with_tasks(self, tasks: Iterable[Task]) -> "TaskRegistry":
        """A new registry: this one plus ``tasks`` (validated; an equal task again is a no-op,
        a different one under a taken name raises :class:`DuplicateTaskError`)."""
        out = TaskRegistry()
        out._tasks, out._files = dict(self._tasks), self._files
        out._add(tasks)
        return out

    def with_files(self, paths: Iterable[str | os.PathLike[str]]) -> "TaskRegistry":
        """A new registry: this one plus the tasks of each user task file
        (:func:`evo.tasks.user.load_task_file`), in order; a file already loaded into it is
        skipped. Raises :class:`evo.tasks.user.TaskFileError` naming the file (a task whose
        name another task of the registry has included)."""
        from evo.tasks.user import TaskFileError, load_task_file

        out = self
        for path in paths:
            resolved = str(Path(path).expanduser().resolve())
            if resolved in out._files:
                continue
            tasks = load_task_file(path)
            for t in tasks:
                old = out._tasks.get(t.name)
                if old is not None and old != t:
                    raise TaskFileError(f"{resolved}: task {t.name!r} is already registered (family "
                                        f"{old.family!r}); rename it")
            out = out.with_tasks(tasks)
            out._files = (*out._files, resolved)
        return out

    @property
    def files(self) -> tuple[str, ...]:
        """Absolute paths of the user task files loaded into this registry, in order."""
        return self._files

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return f"TaskRegistry({len(self._tasks)} tasks, families {self.families()}, files {list(self._files)})"

    def families(self) -> list[str]:
        """Families with at least one task: built-ins first, then the rest sorted."""
        present = {t.family for t in self._tasks.values()}
        ordered = [f for f in _BUILTIN_FAMILY_ORDER if f in present]
        return ordered + sorted(present - set(ordered))

    def _unknown_family(self, family: str) -> UnknownFamilyError:
        fams = self.families()
        close = difflib.get_close_matches(family, fams, n=2, cutoff=0.5)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        return UnknownFamilyError(f"unknown task family {family!r}{hint}; known: {', '.join(fams)}")

    def names(self, family: str | None = None) -> list[str]:
        """Task names in the order they were added, optionally of one family
        (:class:`UnknownFamilyError` for a family no task has)."""
        tasks = list(self._tasks.values())
        if family is None:
            return [t.name for t in tasks]
        if family not in {t.family for t in tasks}:
            raise self._unknown_family(family)
        return [t.name for t in tasks if t.family == family]

    def get(self, name: str) -> Task:
        """The task called ``name``; :class:`UnknownTaskError` (a KeyError) lists close matches
        and every valid name."""
        task = self._tasks.get(name)
        if task is not None:
            return task
        names = list(self._tasks)
        close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        raise UnknownTaskError(
            f"unknown task {name!r}{hint}; valid names: {', '.join(names)} "
            f"(or \"family:<name>\" with families {', '.join(self.families())})"
        )

    def select(self, selectors: Iterable[str] | str) -> list[Task]:
        """Tasks named by ``selectors`` (task names or ``"family:<name>"``), in order, each once."""
        if isinstance(selectors, str):
            selectors = [selectors]
        out: dict[str, Task] = {}
        for sel in selectors:
            if sel.startswith("family:"):
                for n in self.names(sel[len("family:"):]):
                    out.setdefault(n, self.get(n))
            else:
                out.setdefault(sel, self.get(sel))
        return list(out.values())

    def table(self, gpu: Any = None) -> list[dict[str, Any]]:
        """One JSON-ready row per task for ``evo tasks``.

        Keys: ``name``, ``family``, ``dtype``, ``description``, ``shapes`` (all shapes, "; "-
        separated), ``bench_shape`` (the benchmark shapes, " | "-separated), ``n_shapes``,
        ``n_bench``, ``distributions``, ``flops`` / ``bytes`` / ``sol_ms`` (of the first
        benchmark shape; ``sol_ms`` is None without a ``gpu``), ``gpu`` (its name or None).
        """
        from evo.tasks.gpus import speed_of_light_ms

        rows = []
        for t in self._tasks.values():
            first = t.benchmark_shapes[0]
            rows.append({
                "name": t.name,
                "family": t.family,
                "dtype": t.dtype,
                "description": t.description,
                "shapes": "; ".join(format_shape(s) for s in t.shapes),
                "bench_shape": " | ".join(format_shape(s) for s in t.benchmark_shapes),
                "n_shapes": len(t.shapes),
                "n_bench": t.bench_shapes,
                "distributions": list(t.distributions),
                "flops": t.flops(first),
                "bytes": t.bytes(first),
                "sol_ms": speed_of_light_ms(t, first, gpu) if gpu is not None else None,
                "gpu": gpu.name if gpu is not None else None,
            })
        return rows


def format_shape(shape: Mapping[str, int]) -> str:
    """``{"M": 4096, "N": 4096}`` -> ``"M=4096 N=4096"``."""
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _builtins() -> TaskRegistry:
    from evo.tasks import kernelbench, modern

    return TaskRegistry(kernelbench.TASKS + modern.TASKS)


#: The built-in tasks only; user task files never enter it (they go into a registry of
#: their own: ``BUILTIN_TASKS.with_files(paths)``).
BUILTIN_TASKS: TaskRegistry = _builtins()


def get_task(name: str) -> Task:
    """The built-in task called ``name`` (:meth:`TaskRegistry.get` of :data:`BUILTIN_TASKS`)."""
    return BUILTIN_TASKS.get(name)


def task_names(family: str | None = None) -> list[str]:
    """Built-in task names (:meth:`TaskRegistry.names` of :data:`BUILTIN_TASKS`)."""
    return BUILTIN_TASKS.names(family)


def families() -> list[str]:
    """Built-in families (:meth:`TaskRegistry.families` of :data:`BUILTIN_TASKS`)."""
    return BUILTIN_TASKS.families()


def tasks_for(selectors: list[str] | tuple[str, ...]) -> list[Task]:
    """Built-in tasks named by ``selectors`` (:meth:`TaskRegistry.select` of :data:`BUILTIN_TASKS`)."""
    return BUILTIN_TASKS.select(selectors)


def task_table(gpu: Any = None) -> list[dict[str, Any]]:
    """``evo tasks`` rows of the built-in tasks (:meth:`TaskRegistry.table` of :data:`BUILTIN_TASKS`)."""
    return BUILTIN_TASKS.table(gpu)
