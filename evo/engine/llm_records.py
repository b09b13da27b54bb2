"""Where the LLM mutator's records go in the lineage database: :class:`LLMRecorder`.

The mutator and its client report three streams (:mod:`mutators.llm`): every call the client
returns (a :data:`mutators.llm.client.calls.CallSink`), every attempt's outcome (an
:data:`mutators.llm.attempts.AttemptSink`) and every model stopped for the run (a
:data:`mutators.llm.client.health.StopSink`). The recorder writes them to one run:

- a call: a row of ``llm_calls``, with the attempt's key (``attempt_key``);
- an attempt: an ``llm_attempt`` event (the :class:`~mutators.llm.attempts.AttemptRecord` as
  JSON); when its answer became a child, the call that answered it is linked to that
  candidate (:meth:`evo.store.Store.link_llm_call`), which is how ``evo show`` finds the prompt
  and answer that made a kernel;
- a stopped model: an ``llm_model_stopped`` event ``{"model", "reason"}``.

The client stores a call as it returns, before the mutator reads the answer, so the call
row exists when the attempt that links it is recorded. :func:`evo.results.llm_status.llm_status`
reads all three back for ``evo status``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store
    from mutators.llm.attempts import AttemptRecord
    from mutators.llm.client.calls import LLMCall

__all__ = ["LLMRecorder", "ATTEMPT_EVENT", "STOP_EVENT"]

#: Event kinds of the run's LLM attempts and stopped models.
ATTEMPT_EVENT = "llm_attempt"
STOP_EVENT = "llm_model_stopped"


class LLMRecorder:
    """The three sinks of an LLM mutator, writing to ``store`` for run ``run_id`` (see the
    module docstring). Thread-safe as far as the store is (one transaction per write)."""

    def __init__(self, store: "Store", run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def call(self, call: "LLMCall") -> None:
        """A :data:`~mutators.llm.client.calls.CallSink`: store the call."""
        self.store.add_llm_call(self.run_id, **call.to_row())

    def attempt(self, rec: "AttemptRecord") -> None:
        """An :data:`~mutators.llm.attempts.AttemptSink`: log the attempt, and link the call
        whose answer became a child to it."""
        d = asdict(rec)
        d["unmatched"] = [asdict(u) for u in rec.unmatched]
        self.store.log_event(self.run_id, ATTEMPT_EVENT, d)
        if rec.ok and rec.candidate_id and rec.attempt_key:
            self.store.link_llm_call(self.run_id, rec.attempt_key, rec.candidate_id)

    def model_stopped(self, model_name: str, line: str) -> None:
        """A :data:`~mutators.llm.client.health.StopSink`: log why a model was stopped."""
        self.store.log_event(self.run_id, STOP_EVENT, {"model": model_name, "reason": line})
