"""Which models may still be called: failures that cannot heal stop a model, repeated
transient failures open its circuit breaker.

:class:`ModelHealth` watches every :class:`mutators.llm.client.calls.LLMCall` the LLM mutator gets back
(:meth:`ModelHealth.record`) and answers which models it may choose (:meth:`usable`).

- **Stop** (for the rest of the run): a call whose error is *fatal* (``LLMCall.fatal``: a
  rejected key, 403, an unknown model, a parameter the model rejects, a prompt over the
  no quota). Sending it again cannot succeed, so one such call is enough.
  The stop is logged once, as one line naming the model, the endpoint's answer and the
  fix, and handed to ``on_stop`` (the run records it as an event).
- **Circuit breaker** (for transient failures: timeouts, 5xx, 429 after retries, refused
  connections): after ``failures`` failed calls in a row the breaker *opens*: the model sits
  out the next ``failures * 2**(trips - 1)`` model choices while other models are usable,
  or, when no other model is usable, the caller waits ``cooldown_s * 2**(trips - 1)``
  seconds (:meth:`wait_s`). Then it is *half-open*: the next call decides (a success closes
  the breaker and forgets the trips; a failure opens it again at once). After ``trips``
  openings without a success in between the model is stopped like a fatal failure --
  except when the failure that would stop it is a rate limit (``LLMCall.rate_limited``: a
  429 after the client's retries): a busy endpoint heals, so the breaker opens again with
  the longest pause (that of trip ``trips``) instead, as often as it takes. A 429 never stops a model
  (a 429 for an exhausted *quota* is fatal, like a rejected key).
  Counting choices rather than seconds keeps which model is chosen reproducible in a
  replay, where calls take no time.
- A call that succeeded (whatever became of its answer) closes the breaker. A prompt the
  endpoint refused as over its window (``LLMCall.too_large``) changes nothing here: the
  mutator sizes later prompts to the window the endpoint reported.

When every model is stopped, :meth:`check` raises :class:`NoModelLeft`, a
:class:`mutators.base.MutatorStopped` whose message lists each model's stop line: the
engine ends the run with it. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from mutators.base import MutatorStopped
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.http_errors import FATAL_FIXES
from mutators.llm.client.model_spec import ModelSpec

__all__ = ["ModelHealth", "ModelState", "NoModelLeft", "StopSink"]

log = logging.getLogger(__name__)

#: Receives ``(model_name, one_line_reason)`` when a model is stopped.
StopSink = Callable[[str, str], None]


class NoModelLeft(MutatorStopped):
    """Every configured model is stopped; the message has one line per model."""


@dataclass(frozen=True)
class ModelState:
    """A model's health as :meth:`ModelHealth.states` reports it.

    ``status`` is ``ok``, ``open`` (breaker open), ``half_open`` or ``stopped``;
    ``reason`` is the stop line (``stopped``) or the last failure (``open``).
    """

    name: str
    status: str
    reason: str = ""
    failures_in_a_row: int = 0
    trips: int = 0


class ModelHealth:
    """Per-model stop / circuit-breaker state (see module docstring)."""

    def __init__(self, models: Sequence[ModelSpec], *, failures: int = 5, cooldown_s: float = 30.0, trips: int = 3,
                 on_stop: StopSink | None = None) -> None:
        if failures < 1:
            raise ValueError(f"failures={failures}: must be >= 1 (failed calls in a row that open the breaker)")
        if trips < 1:
            raise ValueError(f"trips={trips}: must be >= 1 (breaker openings before the model is stopped)")
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s={cooldown_s}: must be >= 0")
        self.failures = failures
        self.cooldown_s = float(cooldown_s)
        self.trips = trips
        self.on_stop = on_stop
        self._names = [m.name for m in models]
        self._lock = threading.Lock()
        self._tick = 0
        self._in_a_row = {n: 0 for n in self._names}
        self._trips = {n: 0 for n in self._names}
        self._open_until: dict[str, int] = {}  # name -> tick at which it turns half-open
        self._half_open: set[str] = set()
        self._last_error: dict[str, str] = {}
        self._stopped: dict[str, str] = {}

    # ---- queries ---------------------------------------------------------------------

    def usable(self) -> list[str]:
        """Names that may be chosen now (closed or half-open breaker, not stopped), in config order."""
        with self._lock:
            return [n for n in self._names if self._usable(n)]

    def _usable(self, n: str) -> bool:
        if n in self._stopped:
            return False
        until = self._open_until.get(n)
        if until is not None and self._tick >= until:
            del self._open_until[n]
            self._half_open.add(n)
            until = None
        return until is None

    def stopped(self) -> dict[str, str]:
        """``{name: stop line}`` of the stopped models."""
        with self._lock:
            return dict(self._stopped)

    def states(self) -> list[ModelState]:
        with self._lock:
            out = []
            for n in self._names:
                if n in self._stopped:
                    st, why = "stopped", self._stopped[n]
                elif n in self._open_until:
                    st, why = "open", self._last_error.get(n, "")
                elif n in self._half_open:
                    st, why = "half_open", self._last_error.get(n, "")
                else:
                    st, why = "ok", ""
                out.append(ModelState(n, st, why, self._in_a_row[n], self._trips[n]))
            return out

    def check(self, among: Sequence[str] | None = None) -> None:
        """Raise :class:`NoModelLeft` when every model (of ``among``, default all) is stopped."""
        names = list(among) if among is not None else self._names
        with self._lock:
            if names and all(n in self._stopped for n in names):
                lines = "; ".join(self._stopped[n] for n in names)
                raise NoModelLeft(f"every LLM model is stopped, so no more LLM children can be proposed: {lines}")

    def wait_s(self) -> float:
        """Seconds to wait before the earliest open breaker may be tried (0 if a model is usable)."""
        with self._lock:
            live = [n for n in self._names if n not in self._stopped]
            if not live or any(self._usable(n) for n in live):
                return 0.0
            return min(self.cooldown_s * 2 ** max(0, self._trips[n] - 1) for n in live)

    def force_half_open(self) -> str | None:
        """After :meth:`wait_s`: make the open model that has tripped least half-open; its name."""
        with self._lock:
            live = [n for n in self._names if n in self._open_until]
            if not live:
                return None
            n = min(live, key=lambda x: (self._trips[x], self._open_until[x]))
            del self._open_until[n]
            self._half_open.add(n)
            return n

    # ---- updates ---------------------------------------------------------------------

    def chose(self, name: str) -> None:
        """Count one model choice (the clock of open breakers)."""
        with self._lock:
            self._tick += 1

    def record(self, name: str, call: LLMCall) -> str | None:
        """Update from one finished call of model ``name``; the stop line if it stopped the model."""
        stop: str | None = None
        with self._lock:
            if name not in self._in_a_row or name in self._stopped:
                return None
            if call.too_large:  # the endpoint answered (the prompt was over its window): no fault of the model
                return None
            if call.ok:
                self._in_a_row[name] = 0
                self._trips[name] = 0
                self._half_open.discard(name)
                self._open_until.pop(name, None)
                return None
            err = " ".join((call.error or "").split())
            self._last_error[name] = err
            if call.fatal is not None:
                stop = f"model {name!r} stopped: {err[:400]} ({FATAL_FIXES.get(call.fatal, 'fix its settings')})"
            else:
                self._in_a_row[name] += 1
                if self._in_a_row[name] >= self.failures or name in self._half_open:
                    self._half_open.discard(name)
                    self._trips[name] += 1
                    self._in_a_row[name] = 0
                    if call.rate_limited:  # the endpoint is busy, not broken: sit out, never stop
                        self._trips[name] = min(self._trips[name], self.trips)
                    if self._trips[name] >= self.trips and not call.rate_limited:
                        stop = (f"model {name!r} stopped by its circuit breaker: {self.trips} openings without a "
                                f"successful call (each after {self.failures} failed calls in a row, or one failed "
                                f"retry); last error: {err[:300]} (check that the endpoint is up and answers)")
                    else:
                        k = 2 ** (self._trips[name] - 1)
                        self._open_until[name] = self._tick + self.failures * k
                        log.warning("LLM model %r: circuit breaker open after %d failed calls in a row (trip %d of "
                                    "%d); it sits out %d proposals (or %.0f s if no other model is usable); last "
                                    "error: %s", name, self.failures, self._trips[name], self.trips,
                                    self.failures * k, self.cooldown_s * k, err[:200])
            if stop is not None:
                self._stopped[name] = stop
                self._open_until.pop(name, None)
                self._half_open.discard(name)
        if stop is not None:
            log.error("%s", stop)
            if self.on_stop is not None:
                self.on_stop(name, stop)
        return stop
