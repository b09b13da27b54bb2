"""Live progress of a search in the terminal (rich).

Shows per island best speedup and fix mode, evaluations/min, GPU busy %, compile queue,
GPU queue and failures by stage. The engine logs the same numbers as ``progress`` events
in the store, so `evo status` shows them for finished runs too.
"""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

__all__ = ["LiveProgress", "render"]


def render(run_id: str, p) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"run [bold]{run_id}[/]",
        f"evals {p.evaluations} ({p.correct} correct)",
        f"{p.evals_per_min:.1f}/min",
        f"GPU busy {100 * p.gpu_busy:.0f}% of {p.n_gpus}",
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
