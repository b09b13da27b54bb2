"""Progress in the terminal (rich): the live search view and step bars for the rest.

:class:`LiveProgress` shows per island best speedup and fix mode, evaluations/min, slot
occupancy (time inside GPU actor calls: not the GPU's activity), GPU activity (NVML
utilisation sampled by the GPU actors, "not measured" without NVML), compile queue, GPU
queue and failures by stage. The engine logs the same numbers as
``progress`` events in the store, so `evo status` shows them for finished runs too.

:class:`StepProgress` is the bar of the commands that otherwise sit silent for a minute:
the dry run's seed compiles, ``evo bench`` (compiles, then one measurement per kernel),
``evo tune`` (trials) and ``evo export`` (builds). It draws on stderr and only when
:func:`progress_enabled` says so: asked for (``--progress``, the default) and both stdout
and stderr are terminals. Piped or redirected output never gets control sequences.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["LiveProgress", "render", "StepProgress", "progress_enabled"]


def progress_enabled(asked: bool = True) -> bool:
    """True when a progress bar should be drawn: ``asked`` and stdout and stderr are TTYs."""
    try:
        return bool(asked) and sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class StepProgress:
    """A bar over ``total`` steps (``label  3/8  0:00:41``); a no-op when not ``enabled``.

    Use as a context manager; call :meth:`update` with the step being worked on and how
    many are done. ``transient``: the bar disappears when done (the command's table is the
    record); messages printed meanwhile go through :attr:`console` above the bar.
    """

    def __init__(self, description: str, total: int, *, enabled: bool, console: Console | None = None) -> None:
        self.description = description
        self.enabled = enabled and total > 0
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None
        self._total = total

    def __enter__(self) -> "StepProgress":
        if self.enabled:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                      transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self._total)
        return self

    def update(self, label: str, done: int, total: int | None = None) -> None:
        """Step ``label`` is under way with ``done`` steps finished (``label`` may be empty)."""
        if self._progress is None:
            return
        desc = f"{self.description} {label}".rstrip()
        self._progress.update(self._task, completed=done, description=desc,
                              **({"total": total} if total is not None else {}))

    def print(self, *args: Any, **kw: Any) -> None:
        """Print above the bar (or plainly when there is none)."""
        (self._progress.console if self._progress is not None else self.console).print(*args, **kw)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def render(run_id: str, p) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"run [bold]{run_id}[/]",
        f"evals {p.evaluations} ({p.correct} correct)",
        f"{p.evals_per_min:.1f}/min",
        f"slot occupancy {100 * p.gpu_busy:.0f}% of {p.n_gpus} GPU(s)",
        "GPU activity " + ("not measured" if p.gpu_activity is None else f"{100 * p.gpu_activity:.0f}%"),
        f"compile queue {p.compile_queue}",
        f"GPU queue {p.gpu_queue}",
        f"in flight {p.in_flight}",
    )
    fails = ", ".join(f"{k} {v}" for k, v in sorted(p.failures.items())) or "none"
    isl = Table(show_header=True, header_style="bold", box=None)
    for col in ("island", "task", "best speedup", "mode"):
        isl.add_column(col)
    for row in p.islands:
        best = row.get("best")
        isl.add_row(str(row["island"]), row["task"], "-" if best is None else f"{best:.3f}x",
                    "fix" if row.get("fix_mode") else "optimize")
    return Group(head, f"failures by stage: {fails}", isl)


class LiveProgress:
    """Refreshes at most twice a second; safe to call ``update`` from the engine loop."""

    def __init__(self, run_id: str, console: Console | None = None) -> None:
        self.run_id = run_id
        self._live = Live(console=console or Console(stderr=True), refresh_per_second=2, transient=False)
        self._last = 0.0

    def start(self) -> None:
        self._live.start()

    def update(self, progress) -> None:
        now = time.time()
        if now - self._last < 0.5:
            return
        self._last = now
        self._live.update(render(self.run_id, progress))

    def stop(self) -> None:
        self._live.stop()
