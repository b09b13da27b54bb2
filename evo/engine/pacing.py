"""Which island proposes next, so that the tasks' last candidates finish together.

The run's budget is shared by its tasks, and the engine proposes a child whenever a slot
frees. Taking the islands in turn gives every task the same number of proposals at the same
times, so a task whose candidates take longest (a GEMM's 30 s compile against an elementwise
kernel's 10 s) proposes its last child as late as the others and the run waits for it alone:
the run's tail is the slowest task's latency.

:class:`Pacing` spaces each task's proposals by its measured latency instead: a task runs
``lead`` proposals ahead of the fastest, where ``lead = (L_task - L_fastest) x X / n_tasks``
(``L`` a candidate's mean compile plus GPU seconds for that task, ``X`` the evaluations a
second the pipeline sustains, so ``X / n_tasks`` is one task's proposals a second): its
candidates then *finish* in step with the others'. The lead is capped by each task's share of
the in-flight window (a task runs ahead on parents its islands already judged, not on a guess
far ahead of them), and a task that has proposed its share of the budget waits while the
others catch up, so the tasks end with equal counts: the slow task stops proposing first,
the fast ones last.

Only the order changes, never what is proposed or how much. Without measurements of every
task, or in an ordered run (whose proposals must not depend on timing), there is no lead and
the islands are taken in turn, as before. Owned by :class:`evo.engine.engine.Engine` and used
from its thread only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["Pacing", "leads", "island_order"]


def leads(latency: Mapping[str, float], *, throughput: float, n_tasks: int, cap: float) -> dict[str, float]:
    """Proposals each task runs ahead of the fastest: ``(L - L_min) * throughput / n_tasks``,
    at most ``cap``. ``latency``: each measured task's mean seconds from compile to result;
    ``throughput``: evaluations a second the run sustains. Empty unless at least two tasks
    are measured and the throughput is known."""
    if len(latency) < 2 or throughput <= 0 or n_tasks < 2:
        return {}
    fastest = min(latency.values())
    return {t: min(cap, max(0.0, (l - fastest) * throughput / n_tasks)) for t, l in latency.items()}


def island_order(islands: Sequence[tuple[int, str]], *, proposed: Mapping[str, int],
                 island_proposed: Mapping[int, int], lead: Mapping[str, float], remaining: int,
                 start: int) -> list[int]:
    """The islands' indices, the one to propose for first at the front.

    ``islands``: ``(index, task)`` in the run's order; ``proposed`` / ``island_proposed``:
    proposals so far by task and by island; ``lead``: :func:`leads`; ``remaining``: the
    proposals the budget still allows; ``start``: the round-robin position (an index into
    ``islands``). Without a lead the order is the round-robin from ``start``. With one, the
    task least far along, less its lead, goes first; then its least-used island; then the
    round-robin. A task that has had its share of the whole budget (what was proposed and
    what remains, split evenly) has no lead left: the others catch up before it proposes
    again, so the counts end even and the slow task's last child is proposed early."""
    n = len(islands)
    turn = [islands[(start + k) % n][0] for k in range(n)] if n else []
    if not any(lead.values()):
        return turn
    tasks = dict.fromkeys(t for _, t in islands)
    share = (sum(proposed.get(t, 0) for t in tasks) + max(0, remaining)) / len(tasks)

    def ahead(task: str) -> float:
        done = proposed.get(task, 0)
        return done - (lead.get(task, 0.0) if done + 1 <= share else 0.0)

    task_of = dict(islands)
    pos = {idx: k for k, idx in enumerate(turn)}
    return sorted(turn, key=lambda idx: (ahead(task_of[idx]), island_proposed.get(idx, 0), pos[idx]))


@dataclass
class _Mean:
    n: int = 0
    total: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.total += max(0.0, x)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


class Pacing:
    """Per-task latencies and proposal counts, and the island order they give
    (:func:`island_order`). The engine reports each compile's and each GPU result's seconds
    with the task, and each proposal; it asks :meth:`order` before each proposal."""

    def __init__(self, *, enabled: bool = True, min_samples: int = 1) -> None:
        self.enabled = enabled
        self.min_samples = min_samples
        self._compile: dict[str, _Mean] = defaultdict(_Mean)
        self._gpu: dict[str, _Mean] = defaultdict(_Mean)
        self._proposed: dict[str, int] = defaultdict(int)
        self._island: dict[int, int] = defaultdict(int)

    def compiled(self, task: str, seconds: float) -> None:
        self._compile[task].add(seconds)

    def judged(self, task: str, seconds: float) -> None:
        self._gpu[task].add(seconds)

    def proposed(self, task: str, island: int) -> None:
        self._proposed[task] += 1
        self._island[island] += 1

    def proposals(self) -> dict[str, int]:
        """Proposals so far by task."""
        return dict(self._proposed)

    def latency(self) -> dict[str, float]:
        """Each task's mean compile plus GPU seconds, for tasks with ``min_samples`` compiles
        (a task's first compile is the first sign of its latency, and compiles are most of
        it: the GPU's part counts once measured)."""
        return {t: c.mean + self._gpu[t].mean for t, c in self._compile.items() if c.n >= self.min_samples}

    def lead(self, *, throughput: float, n_tasks: int, inflight: int) -> dict[str, float]:
        if not self.enabled:
            return {}
        return leads(self.latency(), throughput=throughput, n_tasks=n_tasks, cap=inflight / max(1, n_tasks))

    def order(self, islands: Sequence[tuple[int, str]], *, throughput: float, inflight: int, remaining: int,
              start: int) -> list[int]:
        n_tasks = len({t for _, t in islands})
        return island_order(islands, proposed=self._proposed, island_proposed=self._island,
                            lead=self.lead(throughput=throughput, n_tasks=n_tasks, inflight=inflight),
                            remaining=remaining, start=start)
