"""The trusted side of the evaluator: the judge, which decides every verdict and never loads
candidate code (:mod:`evaluators.judge.judge`), the memory it shares with runners
(:mod:`~evaluators.judge.exchange`, :mod:`~evaluators.judge.slots`), correctness
(:mod:`~evaluators.judge.trials`, its output checks :mod:`~evaluators.judge.checks`), timing and
its corroboration (:mod:`~evaluators.judge.timing`, the verdict from the samples
:mod:`~evaluators.judge.summary`), the references (:mod:`~evaluators.judge.reference`), the
timed calls' input draw (:mod:`~evaluators.judge.fill`), the task and the GPU's facts
(:mod:`~evaluators.judge.tasks`, :mod:`~evaluators.judge.environment`), the ncu profile
(:mod:`~evaluators.judge.profile`) and its handle on one runner process
(:mod:`~evaluators.judge.runner_process`).

The untrusted side is :mod:`evaluators.runner` (the C++ program that loads a candidate); what
passes between them is :mod:`evaluators.protocol`. Names are loaded on first use: importing
this package imports neither torch nor CUDA.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

__all__ = ["Judge", "judge_for", "reset_judges"]

_LAZY = {"Judge": "evaluators.judge.judge"}
_JUDGES: dict[str, Any] = {}
_LOCK = threading.Lock()


def judge_for(backend: str = "cuda") -> Any:
    """This process's judge for ``backend`` (made on first use, then kept warm)."""
    with _LOCK:
        if backend not in _JUDGES:
            from evaluators.judge.judge import Judge

            _JUDGES[backend] = Judge(backend=backend)
        return _JUDGES[backend]


def reset_judges() -> None:
    """Close and forget this process's judges (tests)."""
    with _LOCK:
        for judge in _JUDGES.values():
            judge.close()
        _JUDGES.clear()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'evaluators.judge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
