"""How many candidates the engine keeps in flight, from the rates it measured.

Little's law: to keep the slower of the two pools busy (the compile workers, or the GPUs)
the pipeline must hold throughput x latency candidates, plus what the GPU actors queue.
A fixed cap was wrong both ways: on one H200 with 15 compile workers and 16 s compiles
the compile pool alone could feed ~50 candidates a minute while in-flight was capped at 5.

:func:`inflight_bound` is pure; :class:`RateMeter` keeps the running means the engine
feeds it (each compile's seconds, each GPU result's start, end and busy seconds). The GPU
side is what a GPU *can* evaluate a second (its busy seconds per evaluation), not the
throughput it showed: a GPU starved by a low bound shows a low throughput, which would keep
the bound low and the GPU starved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["inflight_bound", "throughput", "build_seconds", "RateMeter", "Rates", "DRAIN_S"]

#: At most this many seconds of work stay queued behind the budget (everything in flight
#: drains when it ends): the bound never exceeds throughput x DRAIN_S.
DRAIN_S = 60.0


def build_seconds(seconds: float, metrics: Mapping[str, Any], cached: bool) -> float | None:
    """What building this candidate's source costs a compile worker, for the meters that
    predict the next compiles (this module's bound, :mod:`evo.engine.pacing`'s latencies):
    the compile's ``seconds``, or for a result read from the content cache (``cached``) the
    nvcc seconds its build stored (``metrics["nvcc_seconds"]``), None when it stored none.

    A cache hit takes no time, but the children proposed next are new sources that must be
    built: counting hits as free builds (a rerun with the same seed meets the cache on its
    first proposals, seeds included) made a 30 s GEMM look like the fastest task, so pacing
    gave it no lead and its children ended the run alone, and the bound fell below what the
    compile pool needed."""
    if not cached:
        return seconds
    built = metrics.get("nvcc_seconds")
    return float(built) if isinstance(built, (int, float)) and built >= 0 else None


@dataclass(frozen=True)
class Rates:
    """Measured means: ``compile_s`` a compile's seconds, ``gpu_s`` a GPU evaluation's
    seconds from submission to result, ``gpu_per_s`` evaluations a second per GPU."""

    compile_s: float
    gpu_s: float
    gpu_per_s: float


def throughput(rates: Rates, *, workers: int, n_gpus: int) -> float:
    """Evaluations a second the slower of the two pools allows:
    ``min(workers / compile_s, n_gpus * gpu_per_s)``."""
    return min(workers / max(rates.compile_s, 1e-6), n_gpus * max(rates.gpu_per_s, 1e-6))


def inflight_bound(rates: Rates | None, *, workers: int, n_gpus: int, gpu_slots: int) -> int:
    """Candidates to keep in flight.

    Without measurements (``rates`` None): enough to fill every GPU slot and every compile
    worker once, ``n_gpus * gpu_slots + workers``. With them: the throughput the slower pool
    allows, ``x = min(workers / compile_s, n_gpus * gpu_per_s)``, times a candidate's
    latency through both (``compile_s + gpu_s``), plus the GPU slots (the actors' queues),
    never under ``n_gpus * gpu_slots + 1`` and never more than ``x * DRAIN_S`` (or that
    floor).
    """
    floor = n_gpus * gpu_slots + 1
    if rates is None:
        return n_gpus * gpu_slots + max(1, workers)
    x = throughput(rates, workers=workers, n_gpus=n_gpus)
    want = math.ceil(x * (rates.compile_s + rates.gpu_s)) + n_gpus * gpu_slots
    cap = max(floor, math.floor(x * DRAIN_S))
    return max(floor, min(want, cap))


@dataclass
class RateMeter:
    """Running means of what :func:`inflight_bound` needs; ``rates()`` is None until at
    least ``min_samples`` compiles and GPU results were seen."""

    min_samples: int = 3
    _compiles: int = 0
    _compile_sum: float = 0.0
    _gpu: int = 0
    _gpu_sum: float = 0.0
    _first: float | None = None
    _last: float | None = None
    _busy: int = 0
    _busy_sum: float = 0.0

    @property
    def n_compiled(self) -> int:
        return self._compiles

    def compiled(self, seconds: float) -> None:
        self._compiles += 1
        self._compile_sum += max(0.0, seconds)

    def gpu_done(self, started: float, finished: float, busy_s: float | None = None) -> None:
        """One GPU result: when its evaluation started and finished on the actor, and
        ``busy_s``, the seconds its GPU stages took (what the GPU can do is read from these:
        a starved GPU's own throughput would keep the bound, and so the GPU, starved)."""
        if busy_s is not None and busy_s > 0:
            self._busy += 1
            self._busy_sum += busy_s
        self._gpu += 1
        self._gpu_sum += max(0.0, finished - started)
        self._first = started if self._first is None else min(self._first, started)
        self._last = finished if self._last is None else max(self._last, finished)

    def rates(self, n_gpus: int) -> Rates | None:
        if self._compiles < self.min_samples or self._gpu < self.min_samples:
            return None
        window = max((self._last or 0.0) - (self._first or 0.0), 1e-6)
        seen = self._gpu / window / max(n_gpus, 1)
        # what a GPU can evaluate a second: its busy seconds per evaluation, when known (the
        # throughput seen over the window is lower whenever the GPU waited for compiles)
        capacity = self._busy / self._busy_sum if self._busy and self._busy_sum > 0 else 0.0
        return Rates(compile_s=self._compile_sum / self._compiles, gpu_s=self._gpu_sum / self._gpu,
                     gpu_per_s=max(seen, capacity))
