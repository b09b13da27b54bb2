"""Attempts and repairs as records: what one LLM attempt did (:class:`AttemptRecord`, stored as
an ``llm_attempt`` event), how the next prompt for a parent reports it (:class:`AttemptNote`),
what the mutator remembers of them (:class:`AttemptMemory`), and a failed child offered for
repair (:class:`RepairRequest`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from evo.core.records import Member
from mutators.llm.answer.patch import UnmatchedBlock
from mutators.llm.client.calls import prompt_hash
from mutators.llm.client.model_spec import ModelSpec

__all__ = ["AttemptRecord", "AttemptSink", "AttemptNote", "AttemptMemory", "RepairRequest", "REPAIRABLE_STAGES",
           "STAGE_RANK"]


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt that reached the model (or was refused before it, ``call_error`` set),
    successful (``ok``) or not.

    ``problems`` says why the answer was rejected; ``unmatched`` holds the SEARCH blocks that
    matched nowhere; ``form`` / ``notes`` what the answer looked like and what was tolerated;
    ``candidate_id`` is the child's id when a proposal was made; ``prompt_hash`` links to the
    ``llm_calls`` row the client's sink stored. ``attempt_key`` (``<kind>:<parent or chain
    id>:<n>``, n counting the attempts from that parent) names the attempt independently of
    the prompt's text, so a replay can be keyed by proposal identity rather than by prompt.
    ``reason`` is the :data:`mutators.llm.answer.reasons.REASONS` code of a failed attempt
    ("" for one that made a child).
    """

    kind: str
    parent_id: str | None
    model: str
    ok: bool
    problems: tuple[str, ...] = ()
    unmatched: tuple[UnmatchedBlock, ...] = ()
    prompt_hash: str = ""
    candidate_id: str | None = None
    cost: float = 0.0
    call_error: str | None = None
    form: str = ""
    notes: tuple[str, ...] = ()
    repair_round: int = 0
    attempt_key: str = ""
    reason: str = ""


AttemptSink = Callable[[AttemptRecord], None]

#: Stages whose failures the mutator repairs, earliest first (a later stage is "further").
REPAIRABLE_STAGES = ("policy", "compile", "correctness")
STAGE_RANK = {s: i for i, s in enumerate(REPAIRABLE_STAGES)}


@dataclass(frozen=True)
class AttemptNote:
    """One earlier attempt from a parent, as the next prompt for that parent reports it."""

    n: int
    model: str
    kind: str
    outcome: str  # "child", "rejected", "call_failed", "not_sent"
    text: str = ""
    child_id: str | None = None
    feedback: str = ""
    unmatched: tuple[UnmatchedBlock, ...] = ()


class AttemptMemory:
    """What the LLM mutator remembers of its attempts, per chain (a parent's id, a repair
    chain's root, or ``genesis:<task>``), and of its children's outcomes. Thread-safe.

    - the attempts' numbers (:meth:`number`: 1, 2, ... per chain, in the order attempts
      start, so an attempt's key does not depend on which call finishes first);
    - the notes of the last ``per_parent`` attempts of the last ``parents`` chains
      (:meth:`note`, :meth:`notes`; a chain forgotten restarts its numbering);
    - the hash of the last prompt sent per chain, so no chain is sent the same prompt twice
      in a row (:meth:`not_twice`);
    - the evaluated fitness of the last ``results`` children (:meth:`result`).
    """

    def __init__(self, *, parents: int = 256, per_parent: int = 8, results: int = 4096) -> None:
        self.parents = parents
        self.per_parent = per_parent
        self.results_max = results
        self._lock = threading.Lock()
        self._notes: OrderedDict[str, list[AttemptNote]] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._last_hash: OrderedDict[str, str] = OrderedDict()
        self._results: OrderedDict[str, float | None] = OrderedDict()

    def number(self, chain: str) -> int:
        """The next attempt's number in ``chain`` (counted as started)."""
        with self._lock:
            n = self._counts.get(chain, 0) + 1
            self._counts[chain] = n
            return n

    def note(self, chain: str, note: AttemptNote) -> None:
        """Remember an attempt's outcome (kept in attempt order, the last ``per_parent``)."""
        with self._lock:
            lst = self._notes.pop(chain, [])
            self._notes[chain] = sorted(lst + [note], key=lambda x: x.n)[-self.per_parent:]
            while len(self._notes) > self.parents:
                old, _ = self._notes.popitem(last=False)
                self._counts.pop(old, None)

    def notes(self, chain: str | None) -> tuple[AttemptNote, ...]:
        """The remembered attempts of ``chain``, oldest first."""
        if chain is None:
            return ()
        with self._lock:
            return tuple(self._notes.get(chain, ()))

    def last(self, chain: str | None) -> AttemptNote | None:
        notes = self.notes(chain)
        return notes[-1] if notes else None

    def feedback(self, chain: str | None) -> str | None:
        """What the next prompt of ``chain`` tells the model about its last answer, when that
        answer was rejected."""
        last = self.last(chain)
        if last is None or last.outcome != "rejected" or not last.feedback:
            return None
        return last.feedback

    def unmatched(self, chain: str) -> tuple[UnmatchedBlock, ...]:
        """The unmatched blocks of the last attempt of ``chain``, if it was rejected for them."""
        last = self.last(chain)
        return last.unmatched if last is not None and last.outcome == "rejected" else ()

    def not_twice(self, chain: str, messages: list[dict[str, str]], model: ModelSpec, n: int) -> list[dict[str, str]]:
        """``messages``, or when they are the prompt ``chain`` was sent last, a copy with a
        line asking for a different answer; remembered as the chain's last prompt."""
        h = prompt_hash(messages, model.model)
        with self._lock:
            same = self._last_hash.get(chain) == h
        if same:
            messages = [dict(m) for m in messages]
            messages[-1]["content"] = messages[-1]["content"].rstrip("\n") + (
                f"\n\n(Attempt {n} from this kernel. The previous prompt was the same as this one; give a different "
                "answer than last time.)\n")
            h = prompt_hash(messages, model.model)
        with self._lock:
            self._last_hash[chain] = h
            self._last_hash.move_to_end(chain)
            while len(self._last_hash) > self.parents:
                self._last_hash.popitem(last=False)
        return messages

    def record_result(self, candidate_id: str, fitness: float | None) -> None:
        """A child's evaluated fitness (None: incorrect)."""
        with self._lock:
            self._results[candidate_id] = fitness
            while len(self._results) > self.results_max:
                self._results.popitem(last=False)

    def result(self, candidate_id: str) -> tuple[bool, float | None]:
        """``(known, fitness)`` of a child: whether its outcome was recorded, and its fitness."""
        with self._lock:
            return candidate_id in self._results, self._results.get(candidate_id)


@dataclass(frozen=True)
class RepairRequest:
    """A failed child offered for repair (see :meth:`LLMMutator.offer_repair`).

    ``broken`` is the kernel to fix now (the newest attempt of the chain, unless it made
    things worse); ``root_id`` the first broken child of this chain; ``anchor_id`` the
    correct parent the chain descends from (the per-lineage cap counts per anchor);
    ``round`` is 1 for the first repair of a failure; ``stage`` the stage ``broken`` fails.
    """

    broken: Member
    root_id: str
    anchor_id: str
    round: int
    stage: str
    task: str
    island: int
