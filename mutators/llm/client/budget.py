"""The run's USD budget, shared by every client of a run."""

from __future__ import annotations

import threading

from mutators.base import MutatorStopped

__all__ = ["Budget", "BudgetExhausted"]


class BudgetExhausted(MutatorStopped):
    """The run's LLM budget is spent; raised before a request is sent.

    The engine catches it (as :class:`mutators.base.MutatorStopped`) and stops proposing
    LLM children (in-flight work drains).
    """


class Budget:
    """A USD budget shared by every client of a run (thread-safe).

    ``check()`` raises :class:`BudgetExhausted` once ``spent >= max_usd``; calls already on
    the wire when it runs out are still charged, so a run may end slightly above the budget
    (by at most ``concurrency`` calls). ``max_usd=None`` means unlimited (still counted).
    """

    def __init__(self, max_usd: float | None = None, spent: float = 0.0) -> None:
        if max_usd is not None and max_usd < 0:
            raise ValueError(f"Budget(max_usd={max_usd}): must be >= 0 or None for unlimited")
        self.max_usd = max_usd
        self._spent = float(spent)
        self._lock = threading.Lock()

    @property
    def spent(self) -> float:
        with self._lock:
            return self._spent

    @property
    def remaining(self) -> float | None:
        if self.max_usd is None:
            return None
        return max(0.0, self.max_usd - self.spent)

    @property
    def exhausted(self) -> bool:
        return self.max_usd is not None and self.spent >= self.max_usd

    def check(self) -> None:
        if self.exhausted:
            raise BudgetExhausted(
                f"LLM budget spent: ${self.spent:.4f} of ${self.max_usd:.4f}; raise llm.budget_usd "
                "to continue proposing LLM children"
            )

    def charge(self, usd: float) -> None:
        with self._lock:
            self._spent += max(0.0, float(usd))
