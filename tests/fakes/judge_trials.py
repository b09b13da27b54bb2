"""The judge's correctness trials (:func:`evaluators.judge.trials.run_correctness`) of a Python
kernel, on the CPU: buffers of the judge's host exchange, the kernel called in place of a
runner. For tests of what the trials accept and refuse."""

from __future__ import annotations

import tempfile
from typing import Any, Callable, Sequence

from evo.core.records import StageResult


def judge_correctness(task: Any, kernel: Callable[[Sequence[Any], Sequence[Any]], None], *, trials: int,
                      seed: int, shape_indices: Sequence[int] | None = None) -> StageResult:
    """``kernel(inputs, outputs)`` through the judge's correctness stage on ``task``."""
    from evaluators.judge.exchange import HostExchange
    from evaluators.judge.slots import free_slots, make_slots, probe_specs
    from evaluators.judge.trials import run_correctness
    from evaluators.protocol import Done

    with tempfile.TemporaryDirectory() as d:
        ex = HostExchange(d)
        slots: dict[int, Any] = {}

        def slots_for(si: int) -> Any:
            if si not in slots:
                slots[si] = make_slots(ex, *probe_specs(task, dict(task.shapes[si]), ex.device))
            return slots[si]

        def call(s: Any) -> tuple[Done, float]:
            kernel(s.ins, s.outs)
            return Done(0, 0, 0.0), 0.0

        try:
            return run_correctness(task, call, slots_for, trials=trials, seed=seed, shape_indices=shape_indices)
        finally:
            for sl in slots.values():
                free_slots(ex, sl)
