"""The LLM mutator: prompts a model for a child kernel and turns its answer into a Proposal.

:class:`LLMMutator` implements :class:`mutators.base.Mutator`, plus the repair loop the
engine drives (:meth:`LLMMutator.offer_repair`, :meth:`next_repair`, :meth:`repair`). Per
attempt:

1. prompt kind: ``genesis`` when there is no parent (write a kernel from the task's
   reference), ``repair`` when the parent is incorrect, else ``optimize``;
2. :class:`mutators.health.ModelHealth` says which models may be called (stopped models and
   open circuit breakers are skipped) and the :class:`mutators.bandit.ModelBandit` picks one;
3. the prompt is rendered from ``mutators/prompts/<kind>.md`` with what the injected
   :class:`PromptContextProvider` knows: the reference with the module constants it uses,
   the task description, each tensor's shape and dtype, the parent *as it ran* (its tunable
   values written in as the defaults, see :func:`effective_source`), its measured times
   against torch, ptxas resources, the profile once allowed, other islands' kernels as a
   diff against the parent (or their body), for a repair the failing stage's error with the
   candidate's own lines first (:mod:`mutators.diagnostics`), and the outcomes of earlier
   attempts from the same parent with the reason the last answer was not used. With the
   model's ``context_tokens`` known, the least useful parts are dropped until the prompt
   fits, and the prompt says which (:meth:`LLMMutator.render`);
4. the client sends it (retries, budget; every call goes to the client's CallSink);
5. :func:`mutators.answer.interpret` turns the answer into a child or into reasons.

Any failure of steps 4-5 (an errored call, prose, broken or unmatched blocks, an empty or
oversized answer, a no-op, a duplicate, a child that breaks the ABI) returns ``None`` and is
reported as an :class:`AttemptRecord` to the ``attempt_sink`` and kept in
:attr:`LLMMutator.last_failure`; the reason goes back to the model in the next prompt for
that parent, and no parent is sent the same prompt twice in a row.

``propose`` / ``repair`` raise only :class:`mutators.base.MutatorStopped` (the budget is
spent: :class:`mutators.client.BudgetExhausted`; every model is stopped:
:class:`mutators.health.NoModelLeft`; the engine stops proposing and ends the run with its
one-line message), :class:`mutators.cassette.ReplayMiss` (a replay diverged) and
configuration errors. All methods are thread-safe (proposals may run concurrently).

The engine reports each evaluated child back through :meth:`LLMMutator.observe` so the
bandit learns which model pays off, and offers each failed child for repair through
:meth:`LLMMutator.offer_repair`.
"""

from __future__ import annotations

import difflib
import logging
import math
import random
import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from evo.records import Member, candidate_id, canonical_params
from evo.tunables import TunableError, parse_tunables, resolve_params
from mutators.answer import Interpretation, interpret
from mutators.bandit import ModelBandit
from mutators.base import MutationContext, Proposal
from mutators.client import ChatClient, LLMCall, LLMConfigError, ModelSpec, prompt_hash
from mutators.diagnostics import digest, kernel_lines, numbered_excerpt
from mutators.health import ModelHealth, NoModelLeft, StopSink
from mutators.patch import UnmatchedBlock
from mutators.templates import BUDGET_CHARS_PER_TOKEN, estimate_prompt_tokens, render_prompt

__all__ = [
    "TaskInfo",
    "ShapeTiming",
    "ParentFacts",
    "PromptContextProvider",
    "SimpleContextProvider",
    "AttemptRecord",
    "AttemptSink",
    "AttemptNote",
    "RepairRequest",
    "RenderedPrompt",
    "ModelBandit",
    "NoModelLeft",
    "LLMMutator",
    "REPAIRABLE_STAGES",
    "effective_source",
    "failing_lines",
    "trim_error",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# What the prompts need to know
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """Task facts rendered into prompts, already as text.

    ``reference_src`` includes the module constants and helpers the reference uses;
    ``description`` is the task's own description (layouts, structure: "A stored [K, M]");
    ``tensors_text`` lists each input and output with its dims and dtype; ``sol_text``
    describes the speed-of-light bound. Optional texts are "" when unknown.
    """

    reference_src: str
    abi_text: str
    shapes_text: str
    dtype: str
    tolerance_text: str
    sol_text: str = ""
    description: str = ""
    tensors_text: str = ""


@dataclass(frozen=True)
class ShapeTiming:
    """One benchmark shape's measured median times (ms) of a kernel and of torch."""

    shape: str
    ms: float
    torch_ms: float
    pct_sol: float | None = None


@dataclass(frozen=True)
class ParentFacts:
    """What the evaluation measured about a parent: times per benchmark shape, ptxas
    resources (one line per kernel), and the readable profile once the profile rule allows
    it ("" before)."""

    timings: tuple[ShapeTiming, ...] = ()
    ptxas: str = ""
    profile_text: str = ""


class PromptContextProvider(Protocol):
    """Read-only access to what a prompt may show (the engine implements it over the store).

    - ``task_info(task)``: the task's reference, ABI text, shapes, dtype, tolerance, SOL...
    - ``history(candidate_id)``: ``[(generation, fitness)]`` along the lineage, oldest first
      (incorrect ancestors carry ``None``).
    - ``inspirations(task, island, n)``: up to ``n`` ``(source, fitness)`` or ``(source,
      fitness, params)`` of good members of *other* islands.
    - ``profile(candidate_id)``: profile metrics, or ``None`` while the profile rule (lineage
      depth >= ``profile.feedback_after``) does not allow them yet.
    - ``failure(candidate_id)``: ``(stage, status, error_text)`` of the failed stage, or None
      (for a compile failure the full log, so the candidate's frames of an instantiation
      chain are not cut off).

    Optional: ``parent_facts(candidate_id) -> ParentFacts | None`` (times, ptxas, the
    readable profile text, which then replaces the ``profile`` dict).
    """

    def task_info(self, task: str) -> TaskInfo: ...

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]: ...

    def inspirations(self, task: str, island: int, n: int) -> list[tuple]: ...

    def profile(self, candidate_id: str) -> dict[str, Any] | None: ...

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None: ...


class SimpleContextProvider:
    """An in-memory :class:`PromptContextProvider` over plain dicts (tests, demos, replays)."""

    def __init__(
        self,
        tasks: dict[str, TaskInfo],
        *,
        histories: dict[str, list[tuple[int, float | None]]] | None = None,
        inspirations: dict[tuple[str, int], list[tuple]] | None = None,
        profiles: dict[str, dict[str, Any]] | None = None,
        failures: dict[str, tuple[str, str, str]] | None = None,
        facts: dict[str, ParentFacts] | None = None,
    ) -> None:
        self.tasks = tasks
        self.histories = histories or {}
        self.inspiration_map = inspirations or {}
        self.profiles = profiles or {}
        self.failures = failures or {}
        self.facts = facts or {}

    def task_info(self, task: str) -> TaskInfo:
        if task not in self.tasks:
            raise KeyError(f"no TaskInfo for task {task!r}; known: {', '.join(sorted(self.tasks)) or 'none'}")
        return self.tasks[task]

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]:
        return list(self.histories.get(candidate_id, []))

    def inspirations(self, task: str, island: int, n: int) -> list[tuple]:
        return list(self.inspiration_map.get((task, island), []))[:n]

    def profile(self, candidate_id: str) -> dict[str, Any] | None:
        return self.profiles.get(candidate_id)

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None:
        return self.failures.get(candidate_id)

    def parent_facts(self, candidate_id: str) -> ParentFacts | None:
        return self.facts.get(candidate_id)


# --------------------------------------------------------------------------------------
# Attempts and repairs
# --------------------------------------------------------------------------------------


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


AttemptSink = Callable[[AttemptRecord], None]

#: Stages whose failures the mutator repairs, earliest first (a later stage is "further").
REPAIRABLE_STAGES = ("policy", "compile", "correctness")
_STAGE_RANK = {s: i for i, s in enumerate(REPAIRABLE_STAGES)}


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


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt, its estimated size, and what was left out to fit the budget."""

    messages: list[dict[str, str]]
    tokens: int
    budget: int | None
    omitted: tuple[str, ...] = ()
    fits: bool = True


# --------------------------------------------------------------------------------------
# Formatting helpers
# --------------------------------------------------------------------------------------


def trim_error(text: str, max_lines: int = 40, max_chars: int = 4000) -> str:
    """The first ``max_lines`` lines / ``max_chars`` characters of an error text, marked if cut."""
    lines = (text or "").strip().splitlines()
    out = "\n".join(lines[:max_lines])
    cut = len(lines) > max_lines
    if len(out) > max_chars:
        out, cut = out[:max_chars], True
    return out + ("\n[... trimmed ...]" if cut else "")


def failing_lines(source: str, error_text: str, context: int = 2, max_locations: int = 6) -> str:
    """Numbered source excerpts around the candidate lines an error text points at ("" if none).

    Compiler messages in the candidate first, then the candidate frames of header messages'
    instantiation chains; never a header's own line number (:mod:`mutators.diagnostics`).
    """
    lines = kernel_lines(error_text, source, max_locations=max_locations)
    return numbered_excerpt(source, lines, context) if lines else ""


_TUNABLE_LINE_RE = re.compile(r"^(?P<pre>\s*//\s*@tunable\s+(?P<name>[A-Za-z_]\w*)\s*=\s*)(?P<val>-?\w+)(?P<post>\s+in\s*\{.*)$")
_IFNDEF_RE = re.compile(r"^\s*#\s*ifndef\s+(?P<name>[A-Za-z_]\w*)\s*$")
_DEFINE_RE = re.compile(r"^(?P<pre>\s*#\s*define\s+(?P<name>[A-Za-z_]\w*)\s+)(?P<val>-?\w+)(?P<post>.*)$")


def effective_source(source: str, params: dict[str, str]) -> str:
    """``source`` as it ran with ``params``: each tunable's ``// @tunable`` default and its
    ``#ifndef`` / ``#define`` default replaced by the value passed as ``-D``.

    The model sees what actually ran, and a child runs with the defaults it declares (the
    mutator passes no other values), so a patch that edits a tunable's default takes effect.
    Line numbers are unchanged. Values not in the declared set are left as they are.
    """
    if not params:
        return source
    lines = source.splitlines(keepends=True)
    guarded = False
    for i, line in enumerate(lines):
        body, nl = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")):]
        m = _TUNABLE_LINE_RE.match(body)
        if m and m.group("name") in params:
            lines[i] = f"{m.group('pre')}{params[m.group('name')]}{m.group('post')}{nl}"
            continue
        g = _IFNDEF_RE.match(body)
        if g:
            guarded = g.group("name")
            continue
        d = _DEFINE_RE.match(body)
        if d and guarded == d.group("name") and d.group("name") in params:
            lines[i] = f"{d.group('pre')}{params[d.group('name')]}{d.group('post')}{nl}"
        guarded = False
    out = "".join(lines)
    try:
        declared = {t.name: t for t in parse_tunables(out)}
    except TunableError:
        return source
    if any(k in declared and v not in declared[k].choices for k, v in params.items()):
        return source
    return out


def _fmt_fitness(f: float | None) -> str:
    return "incorrect" if f is None else f"{f:.3f}"


def _fmt_profile(profile: dict[str, Any]) -> str:
    """Fallback when the provider gives no readable profile text: sorted key: value lines."""
    rows = []
    for k in sorted(profile):
        v = profile[k]
        if isinstance(v, float):
            v = f"{v:.4g}"
        rows.append(f"- {k}: {v}")
    return "\n".join(rows)


def _tunables_text(view: str) -> str:
    try:
        ts = parse_tunables(view)
    except TunableError as e:
        return f"(the @tunable lines do not parse: {e})"
    if not ts:
        return ""
    rows = [f"- {t.name} = {t.default} (allowed: {', '.join(t.choices)})" for t in ts]
    return ("\n".join(rows) + "\nThese are the values this kernel ran with, written in as the defaults above. A child "
            "runs with the defaults it declares: to try another value, change the default in both the `// @tunable` "
            "line and its `#define`, and keep it within the allowed set.")


def _timings_text(facts: ParentFacts | None) -> str:
    if facts is None or not facts.timings:
        return ""
    rows = ["| shape | this kernel (ms) | torch (ms) | speedup | % of speed of light |", "|---|---|---|---|---|"]
    for t in facts.timings:
        sp = t.torch_ms / t.ms if t.ms > 0 else float("nan")
        sol = "-" if t.pct_sol is None else f"{t.pct_sol:.1f}%"
        rows.append(f"| {t.shape} | {t.ms:.4f} | {t.torch_ms:.4f} | {sp:.3f}x | {sol} |")
    return "\n".join(rows)


_HEADER_COMMENT_RE = re.compile(r"\A(?:[ \t]*(?://[^\n]*)?\n)+")


def _body(source: str) -> str:
    """A kernel without its leading comment header (the code starts at the first non-comment line)."""
    return _HEADER_COMMENT_RE.sub("", source, count=1).rstrip("\n")


def _inspiration_text(i: int, source: str, fitness: float, parent_view: str) -> str:
    body = _body(source)
    diff = "".join(difflib.unified_diff(parent_view.splitlines(keepends=True), source.splitlines(keepends=True),
                                        "current kernel", f"inspiration {i}", n=2))
    head = f"### Inspiration {i} (speedup {_fmt_fitness(fitness)})"
    if diff and len(diff) < 0.7 * len(body):
        return f"{head}: its difference from the current kernel\n```diff\n{diff.rstrip()}\n```"
    return f"{head}: its source without the header comment\n```cuda\n{body}\n```"


# --------------------------------------------------------------------------------------
# The mutator
# --------------------------------------------------------------------------------------


class LLMMutator:
    """The LLM mutator (see module docstring).

    ``max_response_kb``: answers larger than this are rejected (the client should also cap
    them; this guards replayed or custom clients). ``n_inspirations``: 0-3 inspirations in
    optimize prompts. ``history_parents`` / ``history_per_parent``: bounds of the per-parent
    memory of attempts. ``repair_rounds``: repair attempts per failure (a chain of repairs of
    one broken child); ``repair_per_lineage``: repair attempts queued per correct ancestor
    over the run. ``whole_file_lines`` / ``whole_file_fraction``: how large a diff a
    whole-file answer to a patch prompt may amount to (:mod:`mutators.answer`).
    """

    name = "llm"
    #: Can write a first kernel from the task alone (``propose([])``).
    genesis = True
    #: ``None`` from ``propose`` is a failed attempt, not exhaustion: ask again later.
    exhaustive = False
    #: Engine stops after this many failed attempts in a run (0 = 3 x the evaluation budget).
    max_failed_attempts = 0

    def __init__(
        self,
        client: ChatClient,
        models: Sequence[ModelSpec],
        context_provider: PromptContextProvider,
        *,
        bandit: ModelBandit | None = None,
        attempt_sink: AttemptSink | None = None,
        max_response_kb: int = 256,
        n_inspirations: int = 2,
        history_parents: int = 256,
        history_per_parent: int = 8,
        pending_max: int = 4096,
        health: ModelHealth | None = None,
        on_model_stop: StopSink | None = None,
        sleep: Callable[[float], None] = time.sleep,
        repair_rounds: int = 3,
        repair_per_lineage: int = 12,
        whole_file_lines: int = 40,
        whole_file_fraction: float = 0.2,
    ) -> None:
        if not 0 <= n_inspirations <= 3:
            raise ValueError(f"n_inspirations={n_inspirations}: must be within [0, 3]")
        if not models:
            raise LLMConfigError("LLMMutator needs at least one model ([[llm.models]] is empty)")
        if repair_rounds < 0 or repair_per_lineage < 0:
            raise ValueError(f"repair_rounds={repair_rounds}, repair_per_lineage={repair_per_lineage}: must be >= 0")
        self.client = client
        self.models = tuple(models)
        self.provider = context_provider
        self.bandit = bandit if bandit is not None else ModelBandit(self.models)
        self.attempt_sink = attempt_sink
        self.max_response_bytes = int(max_response_kb) * 1024
        self.n_inspirations = n_inspirations
        self.repair_rounds = repair_rounds
        self.repair_per_lineage = repair_per_lineage
        self.whole_file_lines = whole_file_lines
        self.whole_file_fraction = whole_file_fraction
        self.health = health if health is not None else ModelHealth(self.models)
        if on_model_stop is not None:
            self.health.on_stop = on_model_stop
        self._sleep = sleep
        self._lock = threading.RLock()
        self._history: OrderedDict[str, list[AttemptNote]] = OrderedDict()
        self._history_parents = history_parents
        self._history_per_parent = history_per_parent
        self._counts: dict[str, int] = {}
        self._last_hash: OrderedDict[str, str] = OrderedDict()
        self._pending: OrderedDict[str, tuple[str, float, float]] = OrderedDict()
        self._pending_max = pending_max
        self._results: OrderedDict[str, float | None] = OrderedDict()
        self._repair_of: OrderedDict[str, RepairRequest] = OrderedDict()
        self._repair_queue: deque[RepairRequest] = deque()
        self._queued_ids: set[str] = set()
        self._lineage_repairs: dict[str, int] = {}
        self._cpt: dict[str, float] = {}
        self.last_failure: AttemptRecord | None = None
        self.attempts = 0
        self.failures = 0

    def wants_parents(self) -> int:
        return 1

    # ---- engine feedback -----------------------------------------------------------------

    def observe(self, candidate_id: str, fitness: float | None) -> None:
        """Report the evaluated fitness of a child (feeds the bandit and later prompts).

        Reward = ``max(0, fitness - baseline)``; baseline = the parent's fitness for optimize,
        the fitness of the nearest correct ancestor for repair (a repair is credited with what
        its repaired lineage gained over the last correct kernel, not with the whole speedup),
        0 for genesis. An incorrect child earns 0. Ids this mutator did not propose only
        update the outcome shown in prompts.
        """
        with self._lock:
            self._results[candidate_id] = fitness if fitness is None or math.isfinite(fitness) else None
            while len(self._results) > self._pending_max:
                self._results.popitem(last=False)
            entry = self._pending.pop(candidate_id, None)
        if entry is None:
            return
        model, baseline, cost = entry
        reward = 0.0 if fitness is None or not math.isfinite(fitness) else max(0.0, fitness - baseline)
        if model in {m.name for m in self.bandit.models}:
            self.bandit.update(model, reward, cost)

    def unmatched_for(self, parent_id: str) -> tuple[UnmatchedBlock, ...]:
        """The unmatched blocks of the last attempt from a parent, if it was rejected for them."""
        with self._lock:
            notes = self._history.get(parent_id) or []
            return notes[-1].unmatched if notes and notes[-1].outcome == "rejected" else ()

    def attempts_for(self, parent_id: str) -> tuple[AttemptNote, ...]:
        """The remembered attempts from a parent (or a repair chain's root), oldest first."""
        with self._lock:
            return tuple(self._history.get(parent_id, ()))

    # ---- the repair loop -----------------------------------------------------------------

    def offer_repair(self, member: Member, island: int | None = None) -> RepairRequest | None:
        """Offer a failed child for repair; the queued :class:`RepairRequest`, or None.

        The engine calls this for every child it records as failed (any operator). Queued
        when the failure is at a repairable stage (:data:`REPAIRABLE_STAGES`), this failure's
        chain has rounds left (``repair_rounds``) and its lineage is under
        ``repair_per_lineage``. A child of a repair continues its chain (round + 1); if it
        fails at an earlier stage than the kernel it was to fix (a compile error where there
        was a wrong result), it made things worse: the next round repairs the previous kernel
        again, and the prompt reports the worse attempt.
        """
        if member.correct:
            return None
        stage, _status, _ = self._failure(member)
        if stage not in _STAGE_RANK:
            log.debug("no repair for %s: its %r failure is not repairable", member.id[:12], stage)
            return None
        with self._lock:
            if member.id in self._queued_ids:
                return None
            prev = self._repair_of.get(member.id)
            if prev is not None:
                rnd = prev.round + 1
                root, anchor = prev.root_id, prev.anchor_id
                worse = _STAGE_RANK[stage] < _STAGE_RANK.get(prev.stage, 0)
                target, tstage = (prev.broken, prev.stage) if worse else (member, stage)
            else:
                rnd, root = 1, member.id
                anchor = member.candidate.parents[0] if member.candidate.parents else member.id
                target, tstage = member, stage
            if rnd > self.repair_rounds:
                log.info("no repair round %d for %s: %d rounds per failure (llm.repair_rounds)", rnd,
                         root[:12], self.repair_rounds)
                return None
            if self._lineage_repairs.get(anchor, 0) >= self.repair_per_lineage:
                log.info("no repair of %s: its lineage (from %s) had %d repairs (llm.repair_per_lineage)",
                         member.id[:12], anchor[:12], self.repair_per_lineage)
                return None
            req = RepairRequest(broken=target, root_id=root, anchor_id=anchor, round=rnd, stage=tstage,
                                task=member.candidate.task,
                                island=member.candidate.island if island is None else island)
            self._lineage_repairs[anchor] = self._lineage_repairs.get(anchor, 0) + 1
            self._repair_queue.append(req)
            self._queued_ids.add(member.id)
            return req

    def next_repair(self, task: str | None = None) -> RepairRequest | None:
        """The oldest queued repair (of ``task`` if given), removed from the queue; or None."""
        with self._lock:
            for i, req in enumerate(self._repair_queue):
                if task is None or req.task == task:
                    del self._repair_queue[i]
                    return req
            return None

    def pending_repairs(self, task: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self._repair_queue if task is None or r.task == task)

    def repair(self, request: RepairRequest, context: MutationContext, rng: random.Random) -> Proposal | None:
        """One repair attempt of ``request.broken``; a Proposal whose parent is the broken
        kernel, or None (a recorded failed attempt). Raises like :meth:`propose`."""
        return self._attempt("repair", request.broken, context, rng, chain=request.root_id, request=request)

    # ---- propose -------------------------------------------------------------------------

    def propose(self, parents: list[Member], context: MutationContext, rng: random.Random) -> Proposal | None:
        parent = parents[0] if parents else None
        if parent is None:
            return self._attempt("genesis", None, context, rng, chain=f"genesis:{context.task}")
        if not parent.correct:
            with self._lock:
                prev = self._repair_of.get(parent.id)
            return self._attempt("repair", parent, context, rng, chain=prev.root_id if prev else parent.id)
        return self._attempt("optimize", parent, context, rng, chain=parent.id)

    # ---- prompts ---------------------------------------------------------------------------

    def render(self, kind: str, parent: Member | None, context: MutationContext, model: ModelSpec | None = None,
               *, chain: str | None = None) -> RenderedPrompt:
        """The prompt for an attempt, fitted to ``model``'s window when it is known.

        With ``model.context_tokens`` set, the budget is ``context_tokens -
        max_output_tokens`` (tokens estimated by :meth:`chars_per_token`), and optional
        parts are dropped, least useful first (other islands' kernels, the profile, older
        attempts, the lineage's fitness history, ptxas, times, tunables; for a repair the
        error text is shortened), until the prompt fits; the prompt's "Left out" section
        names them. ``fits`` is False when even the shortest prompt is over the budget.
        """
        fields, steps = self._fields(kind, parent, context, chain)
        budget = None
        if model is not None and model.context_tokens is not None:
            budget = model.context_tokens - model.max_output_tokens
        cpt = self.chars_per_token(model.name) if model is not None else BUDGET_CHARS_PER_TOKEN
        omitted: list[str] = []
        while True:
            fields["omitted"] = (", ".join(omitted) + ". Ask for nothing of them; work with what is shown.") \
                if omitted else None
            msgs = render_prompt(kind, **fields)
            tokens = estimate_prompt_tokens(msgs, cpt)
            if budget is None or tokens <= budget:
                return RenderedPrompt(msgs, tokens, budget, tuple(omitted), True)
            while steps:
                label, fn = steps.pop(0)
                if fn(fields):
                    omitted.append(label)
                    break
            else:
                return RenderedPrompt(msgs, tokens, budget, tuple(omitted), False)

    def chars_per_token(self, model_name: str) -> float:
        """Characters per prompt token for budgeting this model's prompts: 0.95 x the smallest
        ratio its endpoint's usage reports showed so far (prompt characters / prompt_tokens),
        or the conservative BUDGET_CHARS_PER_TOKEN before any report."""
        with self._lock:
            seen = self._cpt.get(model_name)
        return BUDGET_CHARS_PER_TOKEN if seen is None else 0.95 * seen

    def _calibrate(self, model: ModelSpec, messages: list[dict[str, str]], call: LLMCall) -> None:
        if call.usage_estimated or call.tokens_in <= 0 or call.attempts != 1:
            return
        ratio = sum(len(m["content"]) for m in messages) / call.tokens_in
        with self._lock:
            self._cpt[model.name] = min(self._cpt.get(model.name, ratio), ratio)

    def _fields(self, kind: str, parent: Member | None, context: MutationContext,
                chain: str | None) -> tuple[dict[str, Any], list[tuple[str, Callable[[dict[str, Any]], bool]]]]:
        info = self.provider.task_info(context.task)
        f: dict[str, Any] = {
            "task": context.task,
            "dtype": info.dtype,
            "shapes_text": info.shapes_text,
            "tolerance_text": info.tolerance_text,
            "reference_src": info.reference_src.rstrip(),
            "description": info.description or None,
            "tensors_text": info.tensors_text or None,
            "sol_text": info.sol_text or None,
        }
        steps: list[tuple[str, Callable[[dict[str, Any]], bool]]] = []
        if kind == "genesis":
            f["abi_text"] = info.abi_text.rstrip()
            f["feedback"] = self._feedback(chain)
            return f, steps
        assert parent is not None
        view = effective_source(parent.candidate.source, parent.candidate.params_dict)
        facts_fn = getattr(self.provider, "parent_facts", None)
        facts = facts_fn(parent.id) if callable(facts_fn) else None
        f["parent_source"] = view.rstrip("\n")
        f["tunables"] = _tunables_text(view) or None
        f["attempts"] = self._attempts_text(chain, kind, parent) or None
        f["feedback"] = self._feedback(chain)

        def drop(name: str) -> Callable[[dict[str, Any]], bool]:
            def fn(d: dict[str, Any]) -> bool:
                had = d.get(name) is not None
                d[name] = None
                return had
            return fn

        def attempts_last(k: int) -> Callable[[dict[str, Any]], bool]:
            def fn(d: dict[str, Any]) -> bool:
                short = self._attempts_text(chain, kind, parent, last=k) or None
                changed = short != d.get("attempts")
                d["attempts"] = short
                return changed
            return fn

        if kind == "repair":
            stage, status, err = self._failure(parent)
            f["stage"], f["status"] = stage or "unknown", status or "failed"
            f["error_text"] = digest(err, view) or "(no error text was recorded)"
            f["failing_lines"] = failing_lines(view, err) or None

            def shorter_error(limit: int) -> Callable[[dict[str, Any]], bool]:
                def fn(d: dict[str, Any]) -> bool:
                    short = digest(err, view, max_chars=limit)
                    changed = len(short) < len(d["error_text"])
                    d["error_text"] = short
                    return changed
                return fn

            steps = [("older repair attempts", attempts_last(2)), ("the error text beyond 1500 characters",
                                                                   shorter_error(1500)),
                     ("the tunables list", drop("tunables")), ("the earlier repair attempts", drop("attempts")),
                     ("the error text beyond 600 characters", shorter_error(600)), ("the task description",
                                                                                    drop("description"))]
            return f, steps
        history = self.provider.history(parent.id)
        f["parent_fitness"] = _fmt_fitness(parent.fitness)
        f["history_text"] = "\n".join(f"- generation {g}: {_fmt_fitness(x)}" for g, x in history) or \
            f"- generation {parent.candidate.generation}: {_fmt_fitness(parent.fitness)}"
        f["timings"] = _timings_text(facts) or None
        f["ptxas"] = (facts.ptxas if facts is not None else "") or None
        prof_text = facts.profile_text if facts is not None and facts.profile_text else None
        if prof_text is None:
            prof = self.provider.profile(parent.id)
            prof_text = _fmt_profile(prof) if prof else None
        f["profile"] = prof_text
        insp = self.provider.inspirations(context.task, context.island, self.n_inspirations) if self.n_inspirations else []
        parts = [_inspiration_text(i, effective_source(it[0], dict(it[2])) if len(it) > 2 else it[0], it[1], view)
                 for i, it in enumerate(insp[: self.n_inspirations], 1)]
        f["inspirations"] = "\n\n".join(parts) or None

        def fewer_inspirations(d: dict[str, Any]) -> bool:
            if not parts:
                return False
            parts.pop()
            d["inspirations"] = "\n\n".join(parts) or None
            return True

        steps = [("one kernel of another island", fewer_inspirations) for _ in parts]
        hist_short = "\n".join(f"- generation {g}: {_fmt_fitness(x)}" for g, x in history[-3:])

        def shorter_history(d: dict[str, Any]) -> bool:
            if len(history) <= 3:
                return False
            d["history_text"] = hist_short + f"\n- ({len(history) - 3} earlier generations not shown)"
            return True

        steps += [("the profile", drop("profile")), ("older attempts", attempts_last(2)),
                  ("the lineage's earlier fitness history", shorter_history), ("the ptxas resource usage", drop("ptxas")),
                  ("the measured times", drop("timings")), ("the earlier attempts", drop("attempts")),
                  ("the tunables list", drop("tunables")), ("the task description", drop("description"))]
        return f, steps

    def _failure(self, m: Member) -> tuple[str, str, str]:
        fail = self.provider.failure(m.id)
        if fail is None:
            st = m.status.value if hasattr(m.status, "value") else str(m.status)
            stage = {"rejected": "policy", "compile_error": "compile", "incorrect": "correctness"}.get(st, "unknown")
            return stage, st, m.error or ""
        return fail[0] or "unknown", fail[1] or "failed", fail[2] or ""

    def _outcome_text(self, note: AttemptNote, base_stage: str | None) -> str:
        if note.outcome != "child" or note.child_id is None:
            return note.text
        cid = note.child_id
        with self._lock:
            known = cid in self._results
            fit = self._results.get(cid)
        if known and fit is not None:
            return f"child {cid[:12]} is correct: {fit:.3f}x"
        fail = self.provider.failure(cid)
        if fail is None:
            return f"child {cid[:12]}: " + ("failed (no details recorded)" if known else "not evaluated yet")
        stage, status, err = fail
        first = next((ln.strip() for ln in (err or "").splitlines() if "error" in ln.lower()),
                     (err or "").strip().splitlines()[0] if (err or "").strip() else "")
        worse = ""
        if base_stage in _STAGE_RANK and stage in _STAGE_RANK and _STAGE_RANK[stage] < _STAGE_RANK[base_stage]:
            worse = (f" -- worse than the kernel being repaired (which fails only at {base_stage}); not used as the "
                     "base of the next attempt")
        return f"child {cid[:12]} fails {stage} ({status}): {first[:240]}{worse}"

    def _attempts_text(self, chain: str | None, kind: str, parent: Member | None, last: int = 5) -> str:
        if chain is None:
            return ""
        with self._lock:
            notes = list(self._history.get(chain, ()))
        if not notes:
            return ""
        base_stage = self._failure(parent)[0] if kind == "repair" and parent is not None else None
        shown = notes[-last:]
        lines = [f"- attempt {n.n} ({n.model}): {self._outcome_text(n, base_stage)}" for n in shown]
        if len(notes) > len(shown):
            lines.insert(0, f"- ({len(notes) - len(shown)} earlier attempts not shown)")
        lines.append("Do not repeat an attempt that failed; build on what the outcomes show.")
        return "\n".join(lines)

    def _feedback(self, chain: str | None) -> str | None:
        if chain is None:
            return None
        with self._lock:
            notes = self._history.get(chain) or []
            last = notes[-1] if notes else None
        if last is None or last.outcome != "rejected" or not last.feedback:
            return None
        return last.feedback

    # ---- one attempt ---------------------------------------------------------------------

    def _attempt(self, kind: str, parent: Member | None, context: MutationContext, rng: random.Random, *,
                 chain: str, request: RepairRequest | None = None) -> Proposal | None:
        model = self._choose_model(rng)  # may raise NoModelLeft
        pid = parent.id if parent is not None else None
        with self._lock:
            n = self._counts.get(chain, 0) + 1
            self._counts[chain] = n
        key = f"{kind}:{chain}:{n}"
        rendered = self.render(kind, parent, context, model, chain=chain)
        if not rendered.fits:
            problem = (f"prompt too large for model {model.name!r}: ~{rendered.tokens} tokens after leaving out "
                       f"{', '.join(rendered.omitted) or 'nothing'}, budget {rendered.budget} (context_tokens "
                       f"{model.context_tokens} - max_output_tokens {model.max_output_tokens}); not sent")
            self._fail(kind, pid, model, None, [problem], (), chain=chain, request=request, note_outcome="not_sent",
                       n=n)
            return None
        messages = self._not_twice(chain, rendered.messages, model, n)
        call = self.client.complete(messages, model=model, kind=kind)  # may raise BudgetExhausted
        self.health.record(model.name, call)
        self._calibrate(model, messages, call)
        with self._lock:
            self.attempts += 1
        if call.error is not None:
            self._fail(kind, pid, model, call, [f"call failed: {call.error}"], (), chain=chain, request=request,
                       note_outcome="call_failed", n=n)
            return None
        text = call.response or ""
        if len(text.encode("utf-8")) > self.max_response_bytes:
            self._fail(kind, pid, model, call, [f"answer too large: {len(text.encode('utf-8'))} bytes > "
                                                f"{self.max_response_bytes}"], (), chain=chain, request=request,
                       feedback="Your previous answer was far too long. Answer with small SEARCH/REPLACE blocks.", n=n)
            return None
        view = effective_source(parent.candidate.source, parent.candidate.params_dict) if parent is not None else None
        interp = interpret(text, kind=kind, parent_source=view, finish_reason=call.finish_reason,
                           whole_file_lines=self.whole_file_lines, whole_file_fraction=self.whole_file_fraction)
        problems = list(interp.problems)
        if interp.form == "empty" and (call.reasoning_tokens or call.finish_reason == "length") and \
                not any("unclosed" in p for p in problems):
            problems = [f"empty answer: the model spent its output tokens ({call.tokens_out}, {call.reasoning_tokens} "
                        f"of them reasoning) before writing an answer (finish_reason {call.finish_reason}); raise "
                        "max_output_tokens or lower reasoning_effort"]
        feedback = interp.feedback
        child = interp.child if not problems else None
        params: dict[str, str] = {}
        cid = None
        if child is not None:
            try:
                params = resolve_params(child, {})
            except TunableError as e:
                problems.append(f"the child's @tunable lines are malformed: {e}")
                feedback = f"Your previous answer broke a `// @tunable` line: {e}. Keep them well formed."
            else:
                cid = candidate_id(child, canonical_params(params), context.task)
                if cid in context.seen:
                    problems.append(f"duplicate: this child ({cid[:12]}) was already proposed in this run")
                    feedback = (f"Your previous answer produced kernel {cid[:12]}, which this run already tried; its "
                                f"outcome: {self._outcome_text(AttemptNote(0, '', kind, 'child', '', cid), None)}. "
                                "Propose a different change.")
        if problems or child is None or cid is None:
            self._fail(kind, pid, model, call, problems or ["no child produced"], interp.unmatched, chain=chain,
                       request=request, feedback=feedback or "Your previous answer could not be used.", interp=interp,
                       n=n)
            return None
        with self._lock:
            self._pending[cid] = (model.name, self._baseline(kind, parent), call.cost)
            while len(self._pending) > self._pending_max:
                self._pending.popitem(last=False)
            if kind == "repair" and parent is not None:
                req = request or RepairRequest(
                    broken=parent, root_id=chain, round=1, stage=self._failure(parent)[0], task=context.task,
                    anchor_id=parent.candidate.parents[0] if parent.candidate.parents else parent.id,
                    island=context.island)
                self._repair_of[cid] = req
                while len(self._repair_of) > self._pending_max:
                    self._repair_of.popitem(last=False)
        how = f"{interp.form}" + (f"; {'; '.join(interp.notes)}" if interp.notes else "")
        self._note(chain, AttemptNote(n, model.name, kind, "child", how, cid))
        rec = AttemptRecord(kind=kind, parent_id=pid, model=model.name, ok=True, prompt_hash=call.prompt_hash,
                            candidate_id=cid, cost=call.cost, form=interp.form, notes=interp.notes,
                            repair_round=request.round if request is not None else (1 if kind == "repair" else 0),
                            attempt_key=key)
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
        rnd = f" round {request.round}" if request is not None else ""
        return Proposal(
            source=child,
            params=params,
            parents=(pid,) if pid is not None else (),
            operator=f"llm:{model.name}",
            notes=f"{kind}{rnd} by {model.name} ({how}; prompt {call.prompt_hash[:12]}, ${call.cost:.4f})",
        )

    # ---- internals -----------------------------------------------------------------------

    def _choose_model(self, rng: random.Random) -> ModelSpec:
        """The bandit's pick among the models :class:`ModelHealth` allows.

        Raises :class:`NoModelLeft` when every model is stopped. When every live model's
        breaker is open, waits for the earliest cooldown (``sleep``) and tries that model.
        """
        names = [m.name for m in self.bandit.models]
        while True:
            self.health.check(names)
            usable = [n for n in self.health.usable() if n in names]
            if usable:
                break
            wait = self.health.wait_s()
            log.warning("every LLM model's circuit breaker is open; waiting %.0f s before trying again", wait)
            self._sleep(wait)
            self.health.force_half_open()
        model = self.bandit.choose(rng, among=usable)
        self.health.chose(model.name)
        return model

    def _not_twice(self, chain: str, messages: list[dict[str, str]], model: ModelSpec, n: int) -> list[dict[str, str]]:
        """Never the same prompt twice in a row for one parent: a repeat gets a line saying so."""
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
            while len(self._last_hash) > self._history_parents:
                self._last_hash.popitem(last=False)
        return messages

    def _note(self, chain: str, note: AttemptNote) -> None:
        with self._lock:
            lst = self._history.pop(chain, [])
            lst = sorted(lst + [note], key=lambda x: x.n)[-self._history_per_parent:]
            self._history[chain] = lst
            while len(self._history) > self._history_parents:
                old, _ = self._history.popitem(last=False)
                self._counts.pop(old, None)

    def _baseline(self, kind: str, parent: Member | None) -> float:
        """What a child must beat to earn bandit reward (see :meth:`observe`)."""
        if parent is None:
            return 0.0
        if parent.correct and parent.fitness is not None:
            return float(parent.fitness)
        fits = [f for _, f in self.provider.history(parent.id) if f is not None]
        return float(fits[-1]) if fits else 0.0

    def _fail(self, kind: str, pid: str | None, model: ModelSpec, call: LLMCall | None, problems: list[str],
              unmatched: tuple[UnmatchedBlock, ...], *, chain: str, request: RepairRequest | None = None,
              note_outcome: str = "rejected", feedback: str = "", interp: Interpretation | None = None,
              n: int = 0) -> None:
        with self._lock:
            self.failures += 1
        cost = call.cost if call is not None else 0.0
        self.bandit.update(model, 0.0, cost)
        summary = "; ".join(problems)
        if note_outcome == "rejected":
            text = f"rejected before compiling: {summary[:300]}"
        elif note_outcome == "call_failed":
            text = f"the endpoint failed, no answer: {summary[:200]}"
        else:
            text = f"not sent: {summary[:200]}"
        self._note(chain, AttemptNote(n, model.name, kind, note_outcome, text, None,
                                      feedback if note_outcome == "rejected" else "", tuple(unmatched)))
        rec = AttemptRecord(kind=kind, parent_id=pid, model=model.name, ok=False, problems=tuple(problems),
                            unmatched=unmatched, prompt_hash=call.prompt_hash if call is not None else "", cost=cost,
                            call_error=call.error if call is not None else None,
                            form=interp.form if interp is not None else "",
                            notes=interp.notes if interp is not None else (),
                            repair_round=request.round if request is not None else 0,
                            attempt_key=f"{kind}:{chain}:{n}")
        self.last_failure = rec
        log.info("LLM %s attempt by %s for %s rejected: %s", kind, model.name, (pid or "-")[:12], summary)
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
