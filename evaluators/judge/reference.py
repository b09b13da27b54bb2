"""The references a candidate is timed against (kept by the judge, once per task).

A user choosing this tool would otherwise run their PyTorch code eagerly or under
``torch.compile``; both are baselines worth a number. The judge's timing
(:mod:`evaluators.judge.timing`) times every reference returned here by the same loop as the
candidate, interleaved rep by rep with it, on the same GPU:

- ``eager``: the task's reference as written (always timed; fitness is measured against it
  unless ``[evaluator] reference = "compile"``);
- ``compile``: the same function under ``torch.compile(mode=COMPILE_MODE, dynamic=False)``,
  timed when the fitness basis is ``compile`` or the caller asks for it
  (``HarnessSettings.time_compiled_reference``, set by ``evo bench``).

Compilation happens on the first call for each shape; :func:`warm_up` makes those calls (in
the judge, before any runner starts) before any clock starts, so compile time never enters a timed
sample. A reference that fails to compile raises :class:`ReferenceCompileError`: it is
reported as such (a compile-basis run stops with that message; ``evo bench`` prints
"compile failed" in the column) and is never silently replaced by the eager one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = [
    "COMPILE_MODE",
    "REFERENCE_KINDS",
    "ReferenceCompileError",
    "TimedReference",
    "references_for",
    "warm_up",
]

#: The torch.compile mode of the compiled reference, recorded with every time it gives.
#: ``max-autotune-no-cudagraphs``: inductor's strongest mode that still launches on the
#: caller's stream (CUDA graphs would replay on a private pool and stream, outside the events).
COMPILE_MODE = "max-autotune-no-cudagraphs"
#: What fitness can be measured against (``[evaluator] reference``).
REFERENCE_KINDS = ("eager", "compile")


class ReferenceCompileError(RuntimeError):
    """torch.compile could not compile (or run) the task's reference."""

    def __init__(self, task: str, error: BaseException) -> None:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        super().__init__(
            f"torch.compile(mode={COMPILE_MODE!r}) failed on the reference of task {task!r}: "
            f"{type(error).__name__}: {first[:400]}")
        self.task = task


@dataclass
class TimedReference:
    """One reference to time: its kind, the callable, and what compiling it cost (s, summed
    over the shapes' first calls; 0 for eager)."""

    kind: str
    fn: Callable[..., Any]
    compile_s: float = 0.0


def references_for(task: Any, *, basis: str = "eager", time_compiled: bool = False,
                   compile_fn: Callable[..., Callable[..., Any]] | None = None) -> list[TimedReference]:
    """The references to time for ``task``: eager first, then the compiled one when ``basis``
    is ``compile`` or ``time_compiled``. ``compile_fn`` (default ``torch.compile``) is
    called as ``compile_fn(fn, mode=COMPILE_MODE, dynamic=False)``; tests pass another
    backend. Raises ValueError for an unknown ``basis``."""
    if basis not in REFERENCE_KINDS:
        raise ValueError(f"reference basis {basis!r} is not one of {', '.join(REFERENCE_KINDS)}")
    refs = [TimedReference("eager", task.reference)]
    if basis == "compile" or time_compiled:
        _ensure_user_name()
        if compile_fn is None:
            import torch

            compile_fn = torch.compile
        refs.append(TimedReference("compile", compile_fn(task.reference, mode=COMPILE_MODE, dynamic=False)))
    return refs


def _ensure_user_name() -> None:
    """Give inductor a user name to key its caches by. It asks ``getpass.getuser()``, which
    fails (``KeyError: 'getpwuid(): uid not found'``) for a uid without a passwd entry and no
    ``USER``/``LOGNAME`` (root in a minimal container, a scrubbed sandbox environment): seen
    on the H200 machine, where every compiled reference failed so."""
    import os
    import pwd

    if any(os.environ.get(k) for k in ("LOGNAME", "USER", "LNAME", "USERNAME")):
        return
    try:
        pwd.getpwuid(os.getuid())
    except KeyError:
        os.environ["USER"] = f"uid{os.getuid()}"


def warm_up(task_name: str, refs: Sequence[TimedReference], inputs: Sequence[Sequence[Any]], calls: int,
            synchronize: Callable[[], None] = lambda: None) -> None:
    """Call every reference ``calls`` times (at least once) on ``inputs`` (rotated copies),
    untimed. The compiled reference's first call on a new shape compiles; its duration is
    added to ``compile_s``. A failure of the compiled one raises :class:`ReferenceCompileError`
    (the eager reference's own failures propagate unchanged: the task is broken)."""
    for ref in refs:
        for i in range(max(int(calls), 1)):
            t0 = time.perf_counter()
            try:
                ref.fn(*inputs[i % len(inputs)])
                if i == 0:
                    synchronize()
            except Exception as e:  # noqa: BLE001 - inductor raises many kinds
                if ref.kind == "eager":
                    raise
                raise ReferenceCompileError(task_name, e) from e
            if i == 0 and ref.kind == "compile":
                ref.compile_s += time.perf_counter() - t0
