"""The repair queue of the CuTeGen loop: which failed children get a repair attempt, and when.

:class:`RepairQueue` holds the queued :class:`mutators.llm.attempts.RepairRequest`\\ s (oldest
first), the chain each repair child belongs to, and the per-lineage counts that bound them.
The LLM mutator owns one and decides a failure's stage; the engine drives it through
:meth:`mutators.llm.mutator.LLMMutator.offer_repair` / ``next_repair`` / ``repair``. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque

from evo.core.records import Member
from mutators.llm.attempts import STAGE_RANK, RepairRequest

__all__ = ["RepairQueue"]

log = logging.getLogger(__name__)


class RepairQueue:
    """Queued repairs and the chains they continue.

    ``rounds``: repair attempts per failure (a chain of repairs of one broken child);
    ``per_lineage``: repairs queued per correct ancestor over the run; ``max_links``: how many
    repair children are remembered (oldest forgotten first).
    """

    def __init__(self, rounds: int, per_lineage: int, max_links: int = 4096) -> None:
        if rounds < 0 or per_lineage < 0:
            raise ValueError(f"repair_rounds={rounds}, repair_per_lineage={per_lineage}: must be >= 0")
        self.rounds = rounds
        self.per_lineage = per_lineage
        self._max_links = max_links
        self._lock = threading.Lock()
        self._repair_of: OrderedDict[str, RepairRequest] = OrderedDict()
        self._queue: deque[RepairRequest] = deque()
        self._queued_ids: set[str] = set()
        self._lineage_repairs: dict[str, int] = {}

    def offer(self, member: Member, stage: str, island: int | None = None) -> RepairRequest | None:
        """Queue a repair of ``member`` (failing at ``stage``); the request, or None.

        Queued when ``stage`` is repairable, this failure's chain has rounds left and its
        lineage is under ``per_lineage``. A child of a repair continues its chain (round + 1);
        if it fails at an earlier stage than the kernel it was to fix, it made things worse:
        the next round repairs the previous kernel again.
        """
        if stage not in STAGE_RANK:
            log.debug("no repair for %s: its %r failure is not repairable", member.id[:12], stage)
            return None
        with self._lock:
            if member.id in self._queued_ids:
                return None
            prev = self._repair_of.get(member.id)
            if prev is not None:
                rnd = prev.round + 1
                root, anchor = prev.root_id, prev.anchor_id
                worse = STAGE_RANK[stage] < STAGE_RANK.get(prev.stage, 0)
                target, tstage = (prev.broken, prev.stage) if worse else (member, stage)
            else:
                rnd, root = 1, member.id
                anchor = member.candidate.parents[0] if member.candidate.parents else member.id
                target, tstage = member, stage
            if rnd > self.rounds:
                log.info("no repair round %d for %s: %d rounds per failure (llm.repair_rounds)", rnd,
                         root[:12], self.rounds)
                return None
            if self._lineage_repairs.get(anchor, 0) >= self.per_lineage:
                log.info("no repair of %s: its lineage (from %s) had %d repairs (llm.repair_per_lineage)",
                         member.id[:12], anchor[:12], self.per_lineage)
                return None
            req = RepairRequest(broken=target, root_id=root, anchor_id=anchor, round=rnd, stage=tstage,
                                task=member.candidate.task,
                                island=member.candidate.island if island is None else island)
            self._lineage_repairs[anchor] = self._lineage_repairs.get(anchor, 0) + 1
            self._queue.append(req)
            self._queued_ids.add(member.id)
            return req

    def next(self, task: str | None = None) -> RepairRequest | None:
        """The oldest queued repair (of ``task`` if given), removed from the queue; or None."""
        with self._lock:
            for i, req in enumerate(self._queue):
                if task is None or req.task == task:
                    del self._queue[i]
                    return req
            return None

    def pending(self, task: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self._queue if task is None or r.task == task)

    def link(self, child_id: str, request: RepairRequest) -> None:
        """``child_id`` is a repair attempt of ``request`` (its failure continues the chain)."""
        with self._lock:
            self._repair_of[child_id] = request
            while len(self._repair_of) > self._max_links:
                self._repair_of.popitem(last=False)

    def of(self, child_id: str) -> RepairRequest | None:
        """The request ``child_id`` was a repair attempt of, or None."""
        with self._lock:
            return self._repair_of.get(child_id)
