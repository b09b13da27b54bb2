"""The cascade's interfaces: settings records and the Stage protocol.

The cascade is: policy (static, ms) -> compile (CPU worker, cached) -> correctness and
timing (GPU, one fresh process per candidate) -> profile (delayed, survivors only). Each
stage turns a candidate into a :class:`~evo.records.StageResult`; a candidate's failure is a
result with a non-ok status, never an exception. Exceptions mean *our* failure (nvcc
missing, the GPU gone, a bug) and propagate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from evo.records import Candidate, StageResult

__all__ = ["CompileSettings", "HarnessSettings", "Stage"]


@dataclass(frozen=True)
class CompileSettings:
    """How candidates are built (config section ``[compile]``)."""

    arch: str = "sm_90a"
    timeout_s: float = 300.0
    memory_mb: int = 8192
    cache_dir: str = ".evo/cache"
    nvcc: str = "nvcc"
    extra_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessSettings:
    """How a built candidate is checked and timed on a GPU (config section ``[evaluator]``).

    ``trials``: fresh-seed correctness trials per shape (>= 5 by the contract).
    ``warmup`` / ``reps``: timing warm-up calls and timed calls per shape (median reported).
    ``flush_mb``: bytes written to flush L2 before every timed call.
    ``timeout_s``: wall clock for the whole isolated process; its group is killed after.
    ``check_only``: skip timing (used by ``evo check`` and the self-test).
    ``fresh_timing_process``: ``check+time`` times in a second fresh process after the
    correctness process passed (``False``: both stages in one process, one start-up less but
    memory-bound timings up to ~11% slow on an H200; see docs/evaluator.md).
    ``timeout_s`` applies to each process.
    """

    trials: int = 5
    warmup: int = 10
    reps: int = 50
    flush_mb: int = 256
    timeout_s: float = 300.0
    check_only: bool = False
    device: int = 0
    fresh_timing_process: bool = True


@runtime_checkable
class Stage(Protocol):
    """One cascade stage.

    Called by the cascade (``evaluators.pipeline``) or by an engine worker, once per
    candidate, in order; a stage never sees a candidate whose earlier stage failed.
    ``run`` returns a StageResult and raises only for failures of the system itself.
    Implementations must be picklable (they travel to Ray workers) and stateless between
    calls except for caches keyed by content.
    """

    name: str

    def run(self, candidate: Candidate) -> StageResult:  # pragma: no cover - protocol
        ...
