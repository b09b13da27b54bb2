"""The task registry: built-in families plus user tasks, looked up by name.

Built-in tasks (``kernelbench-l1`` from :mod:`evo.tasks.kernelbench`, ``modern`` from
:mod:`evo.tasks.modern`) are registered when this module is imported; user tasks arrive
through :func:`evo.tasks.user.load_task_file`. Every registration is validated
(:func:`validate_task`), so a malformed task fails when it is added, not deep in a search.
Lookups fail loudly: an unknown name lists the valid names and the closest matches.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import threading
from collections.abc import Mapping
from typing import Any

from evo.tasks.base import Task, Tolerance
from evo.tasks.inputs import DISTRIBUTIONS, DTYPES

__all__ = [
    "UnknownTaskError",
    "UnknownFamilyError",
    "DuplicateTaskError",
    "InvalidTaskError",
    "validate_task",
    "register_task",
    "get_task",
    "task_names",
    "families",
    "tasks_for",
    "format_shape",
    "task_table",
]

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_TASK_DTYPES = ("float32", "bfloat16", "float16")
_REF_DTYPES = ("float32", "float64")
_BUILTIN_FAMILY_ORDER = ("kernelbench-l1", "modern")

_lock = threading.RLock()
_REGISTRY: dict[str, Task] = {}


class UnknownTaskError(KeyError):
    """No task of that name; the message lists close matches and the valid names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownFamilyError(UnknownTaskError):
    """No task family of that name; the message lists the known families."""


class DuplicateTaskError(ValueError):
    """A different task is already registered under that name."""


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
    if DTYPES[task.reference_dtype].itemsize < DTYPES[task.dtype].itemsize:
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


def register_task(task: Task) -> Task:
    """Validate and add ``task``. Re-registering an *equal* task is a no-op (so loading the
    same user file twice is harmless); a different task under a taken name raises
    :class:`DuplicateTaskError`. Returns the registered task."""
    validate_task(task)
    with _lock:
        old = _REGISTRY.get(task.name)
        if old is not None:
            if old == task:
                return old
            raise DuplicateTaskError(
                f"task {task.name!r} is already registered (family {old.family!r}); "
                f"rename the new task"
            )
        _REGISTRY[task.name] = task
    logger.debug("registered task %s (%s)", task.name, task.family)
    return task


def _unregister(name: str) -> None:
    """Remove a task (tests only)."""
    with _lock:
        _REGISTRY.pop(name, None)


def families() -> list[str]:
    """Families with at least one registered task: built-ins first, then the rest sorted."""
    with _lock:
        present = {t.family for t in _REGISTRY.values()}
    ordered = [f for f in _BUILTIN_FAMILY_ORDER if f in present]
    return ordered + sorted(present - set(ordered))


def _unknown_family(family: str) -> UnknownFamilyError:
    fams = families()
    close = difflib.get_close_matches(family, fams, n=2, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return UnknownFamilyError(f"unknown task family {family!r}{hint}; known: {', '.join(fams)}")


def task_names(family: str | None = None) -> list[str]:
    """Registered task names in registration order, optionally of one family."""
    with _lock:
        tasks = list(_REGISTRY.values())
    if family is None:
        return [t.name for t in tasks]
    if family not in {t.family for t in tasks}:
        raise _unknown_family(family)
    return [t.name for t in tasks if t.family == family]


def get_task(name: str) -> Task:
    """The task called ``name``; :class:`UnknownTaskError` (a KeyError) lists close matches
    and every valid name."""
    with _lock:
        task = _REGISTRY.get(name)
        names = list(_REGISTRY)
    if task is not None:
        return task
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise UnknownTaskError(
        f"unknown task {name!r}{hint}; valid names: {', '.join(names)} "
        f"(or \"family:<name>\" with families {', '.join(families())})"
    )


def tasks_for(selectors: list[str] | tuple[str, ...]) -> list[Task]:
    """Tasks named by ``selectors`` (task names or ``"family:<name>"``), in order, each once."""
    if isinstance(selectors, str):
        selectors = [selectors]
    out: dict[str, Task] = {}
    for sel in selectors:
        if sel.startswith("family:"):
            for n in task_names(sel[len("family:"):]):
                out.setdefault(n, get_task(n))
        else:
            out.setdefault(sel, get_task(sel))
    return list(out.values())


def format_shape(shape: Mapping[str, int]) -> str:
    """``{"M": 4096, "N": 4096}`` -> ``"M=4096 N=4096"``."""
    return " ".join(f"{k}={v}" for k, v in shape.items())


def task_table(gpu: Any = None) -> list[dict[str, Any]]:
    """One JSON-ready row per task for ``evo tasks``.

    Keys: ``name``, ``family``, ``dtype``, ``description``, ``shapes`` (all shapes, "; "-
    separated), ``bench_shape`` (the benchmark shapes, " | "-separated), ``n_shapes``,
    ``n_bench``, ``distributions``, ``flops`` / ``bytes`` / ``sol_ms`` (of the first
    benchmark shape; ``sol_ms`` is None without a ``gpu``), ``gpu`` (its name or None).
    """
    from evo.tasks.gpus import speed_of_light_ms

    rows = []
    with _lock:
        tasks = list(_REGISTRY.values())
    for t in tasks:
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


def _register_builtins() -> None:
    from evo.tasks import kernelbench, modern

    for task in kernelbench.TASKS + modern.TASKS:
        register_task(task)


_register_builtins()
