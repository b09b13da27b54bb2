"""Attempts and repairs as records: what one LLM attempt did (:class:`AttemptRecord`, stored as
an ``llm_attempt`` event), how the next prompt for a parent reports it (:class:`AttemptNote`),
and a failed child offered for repair (:class:`RepairRequest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evo.core.records import Member
from mutators.llm.answer.patch import UnmatchedBlock

__all__ = ["AttemptRecord", "AttemptSink", "AttemptNote", "RepairRequest", "REPAIRABLE_STAGES", "STAGE_RANK"]


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
