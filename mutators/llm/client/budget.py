"""The run's USD budget, shared by every client of a run."""

from __future__ import annotations

import threading

from mutators.base import MutatorStopped

__all__ = ["Budget", "BudgetExhausted"]


class BudgetExhausted(MutatorStopped):
    """The run's LLM budget is spent; raised before a request is sent.

    The engine catches it (as :class:`mutators.base.MutatorStopped`) and stops proposing
    LLM children (in-flight work drains). Also raised when the budget left is smaller than
    the worst case of the next call (see :class:`Budget`).
    """


class Budget:
    """A USD budget shared by every client of a run (thread-safe).

    Contract: a client reserves the worst case of a request before sending it
    (:meth:`reserve`: the prompt's tokens counted high plus ``max_output_tokens``, at the
    model's prices) and settles the reservation with what the request cost once it is done
    (:meth:`settle`). So calls in flight can never together spend past ``max_usd``:

    - :meth:`check` and :meth:`reserve` raise :class:`BudgetExhausted` when what is spent
      plus the new worst case is over ``max_usd`` (spent money alone decides: reservations
      are only upper bounds);
    - when it is the reservations of calls in flight that leave no room, :meth:`reserve`
      waits until they settle (they usually release most of what they held).

    The budget is kept exactly when every answer stays within ``max_output_tokens`` and the
    prompt within the estimate; a run may end above it only by an endpoint's usage beyond
    the worst case. ``max_usd=None`` means unlimited (still counted, nothing reserved).
    """

    def __init__(self, max_usd: float | None = None, spent: float = 0.0) -> None:
        if max_usd is not None and max_usd < 0:
            raise ValueError(f"Budget(max_usd={max_usd}): must be >= 0 or None for unlimited")
        self.max_usd = max_usd
        self._spent = float(spent)
        self._reserved = 0.0
        self._waiting = 0
        self._cond = threading.Condition(threading.Lock())

    @property
    def spent(self) -> float:
        with self._cond:
            return self._spent

    @property
    def reserved(self) -> float:
        """USD held by requests in flight (their worst case)."""
        with self._cond:
            return self._reserved

    @property
    def waiting(self) -> int:
        """Requests waiting in :meth:`reserve` for reservations in flight to settle."""
        with self._cond:
            return self._waiting

    @property
    def remaining(self) -> float | None:
        if self.max_usd is None:
            return None
        return max(0.0, self.max_usd - self.spent)

    @property
    def exhausted(self) -> bool:
        return self.max_usd is not None and self.spent >= self.max_usd

    def _over(self, worst: float) -> str | None:
        if self.max_usd is None:
            return None
        if self._spent >= self.max_usd:
            return f"LLM budget spent: ${self._spent:.4f} of ${self.max_usd:.4f}"
        if worst > 0 and self._spent + worst > self.max_usd:
            return (f"LLM budget nearly spent: ${self._spent:.4f} of ${self.max_usd:.4f}, and the next call may "
                    f"cost up to ${worst:.4f} (its prompt plus max_output_tokens at the model's prices)")
        return None

    def check(self, worst: float = 0.0) -> None:
        """Raise :class:`BudgetExhausted` when the budget is spent, or has no room for a call
        whose worst case is ``worst`` USD."""
        with self._cond:
            why = self._over(worst)
        if why:
            raise BudgetExhausted(f"{why}; raise llm.budget_usd to continue proposing LLM children")

    def reserve(self, worst: float) -> float:
        """Hold ``worst`` USD for a request about to be sent; returns what is held (give it
        to :meth:`settle`). Raises :class:`BudgetExhausted` when spending ``worst`` would
        pass the budget; waits while only other requests' reservations are in the way."""
        worst = max(0.0, float(worst))
        if self.max_usd is None:
            return 0.0
        with self._cond:
            while True:
                why = self._over(worst)
                if why:
                    raise BudgetExhausted(f"{why}; raise llm.budget_usd to continue proposing LLM children")
                if self._spent + self._reserved + worst <= self.max_usd or self._reserved <= 0:
                    self._reserved += worst
                    return worst
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1

    def settle(self, held: float, usd: float) -> None:
        """Release a reservation of ``held`` USD and charge what the request cost."""
        with self._cond:
            self._reserved = max(0.0, self._reserved - max(0.0, float(held)))
            self._spent += max(0.0, float(usd))
            self._cond.notify_all()

    def charge(self, usd: float) -> None:
        self.settle(0.0, usd)
