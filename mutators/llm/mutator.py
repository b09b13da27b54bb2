"""The LLM mutator: prompts a model for a child kernel and turns its answer into a Proposal.

:class:`LLMMutator` implements :class:`mutators.base.Mutator`, plus the repair loop the
engine drives (:meth:`LLMMutator.offer_repair`, :meth:`next_repair`, :meth:`repair`). It is a
small coordinator, built from one :class:`LLMMutatorSettings` record, over four parts:

- :class:`mutators.llm.attempts.AttemptMemory`: the attempts per parent (their numbers, the
  outcomes the next prompt reports, the last prompt sent) and the children's results;
- :class:`mutators.llm.bandit.ModelChooser`: which model is asked (the bandit among the
  models :class:`mutators.llm.client.health.ModelHealth` allows) and the reward ledger;
- :class:`mutators.llm.prompt.builder.PromptBuilder`: the prompt, sized to the model's
  window with what its endpoint taught about token counts;
- :class:`mutators.llm.repairs.RepairQueue`: which failed children get a repair attempt.

Per attempt:

1. prompt kind: ``genesis`` when there is no parent (write a kernel from the task's
   reference), ``repair`` when the parent is incorrect, else ``optimize``;
2. the chooser picks a model among those allowed (and, when several are, those the prompt fits);
3. the prompt is rendered from ``mutators/llm/prompt/prompts/<kind>.md`` with what the injected
   :class:`PromptContextProvider` knows: the reference with the module constants it uses,
   the task description, each tensor's shape and dtype, the parent *as it ran* (its tunable
   values written in as the defaults, see :func:`effective_source`), its measured times
   against torch, ptxas resources, the profile once allowed, other islands' kernels as a
   diff against the parent (or their body), for a repair the failing stage's error with the
   candidate's own lines first (:mod:`mutators.llm.prompt.diagnostics`), and the outcomes of earlier
   attempts from the same parent with the reason the last answer was not used. With the
   model's ``context_tokens`` known, the least useful parts are dropped until the prompt
   fits, and the prompt says which (:meth:`LLMMutator.render`);
4. the client sends it (retries, budget; every call goes to the client's CallSink);
5. :func:`mutators.llm.answer.interpret.interpret` turns the answer into a child or into reasons.

Any failure of steps 4-5 (an errored call, prose, broken or unmatched blocks, an empty or
oversized answer, a no-op, a duplicate, a child that breaks the ABI) returns ``None`` and is
reported as an :class:`AttemptRecord` (with its :data:`mutators.llm.answer.reasons.REASONS`
code) to the ``attempt_sink`` and kept in :attr:`LLMMutator.last_failure`; the reason goes
back to the model in the next prompt for that parent, and no parent is sent the same prompt
twice in a row.

``propose`` / ``repair`` raise only :class:`mutators.base.MutatorStopped` (the budget is
spent: :class:`mutators.llm.client.budget.BudgetExhausted`; every model is stopped:
:class:`mutators.llm.client.health.NoModelLeft`; the engine stops proposing and ends the run with its
one-line message), :class:`mutators.llm.replay.cassette.ReplayMiss` (a replay diverged) and
configuration errors. All methods are thread-safe (proposals may run concurrently).

The engine reports each evaluated child back through :meth:`LLMMutator.observe` so the
bandit learns which model pays off, and offers each failed child for repair through
:meth:`LLMMutator.offer_repair`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from evo.core.records import Member, candidate_id, canonical_params
from evo.core.tunables import TunableError, resolve_params
from mutators.base import MutationContext, Proposal
from mutators.llm.answer.interpret import Interpretation, interpret
from mutators.llm.answer.patch import UnmatchedBlock
from mutators.llm.attempts import AttemptMemory, AttemptNote, AttemptRecord, AttemptSink, RepairRequest
from mutators.llm.bandit import ModelBandit, ModelChooser
from mutators.llm.client.calls import ChatClient, LLMCall
from mutators.llm.client.health import ModelHealth, StopSink
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec
from mutators.llm.prompt.builder import MAX_CHARS_PER_TOKEN, OPTIMISTIC_CHARS_PER_TOKEN, PromptBuilder
from mutators.llm.prompt.context import PromptContextProvider
from mutators.llm.prompt.text import RenderedPrompt, effective_source
from mutators.llm.prompt.tokens import TokenCounter
from mutators.llm.repairs import RepairQueue

__all__ = ["LLMMutator", "LLMMutatorSettings", "OPTIMISTIC_CHARS_PER_TOKEN", "MAX_CHARS_PER_TOKEN"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LLMMutatorSettings:
    """How the LLM mutator behaves (the ``[llm]`` keys it reads, once).

    ``max_response_kb``: answers larger than this are rejected (the client should also cap
    them; this guards replayed or custom clients). ``n_inspirations``: 0-3 inspirations in
    optimize prompts. ``history_parents`` / ``history_per_parent``: bounds of the per-parent
    memory of attempts; ``pending_max``: children remembered for their reward and outcome,
    and repair children for their chain. ``repair_rounds``: repair attempts per failure (a
    chain of repairs of one broken child); ``repair_per_lineage``: repair attempts queued per
    correct ancestor over the run. ``whole_file_lines`` / ``whole_file_fraction``: how large
    a diff a whole-file answer to a patch prompt may amount to
    (:mod:`mutators.llm.answer.interpret`). ``concurrency``: requests the client may have on
    the wire at once (its own cap). ``max_failed_attempts``: the engine stops after this many
    failed attempts in a run (0 = 3 x the evaluation budget).
    """

    max_response_kb: int = 256
    n_inspirations: int = 2
    history_parents: int = 256
    history_per_parent: int = 8
    pending_max: int = 4096
    repair_rounds: int = 3
    repair_per_lineage: int = 12
    whole_file_lines: int = 40
    whole_file_fraction: float = 0.2
    concurrency: int = 1
    max_failed_attempts: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.n_inspirations <= 3:
            raise ValueError(f"n_inspirations={self.n_inspirations}: must be within [0, 3]")
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency}: must be >= 1")
        for name in ("max_response_kb", "history_parents", "history_per_parent", "pending_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        for name in ("repair_rounds", "repair_per_lineage", "whole_file_lines", "max_failed_attempts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 0")
        if not 0.0 <= self.whole_file_fraction <= 1.0:
            raise ValueError(f"whole_file_fraction={self.whole_file_fraction}: must be within [0, 1]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LLMMutatorSettings":
        """The record of ``d``'s keys (the others at their defaults); an unknown key is a
        TypeError naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise TypeError(f"unknown LLM mutator setting(s) {unknown}; known: {', '.join(known)}")
        return cls(**dict(d))


class LLMMutator:
    """The LLM mutator (see module docstring), built from ``settings`` (any of its fields may
    also be given by keyword, overriding it).

    ``bandit`` / ``health``: the chooser's parts (default: a fresh :class:`ModelBandit` and
    :class:`ModelHealth` over ``models``); ``on_model_stop`` replaces the health's stop sink;
    ``sleep`` is how the chooser waits when every breaker is open; ``token_counter`` counts
    prompts for the models whose tokenizer it knows
    (:func:`mutators.llm.prompt.tokens.default_counter`; None: every prompt's size is
    estimated from characters). The mutator's
    :attr:`concurrency`, how many proposals the engine keeps in flight, is
    ``settings.concurrency`` or the sum of the models' own ``concurrency`` (unset: the cap),
    whichever is less.
    """

    name = "llm"
    #: Can write a first kernel from the task alone (``propose([])``).
    genesis = True
    #: ``None`` from ``propose`` is a failed attempt, not exhaustion: ask again later.
    exhaustive = False

    def __init__(
        self,
        client: ChatClient,
        models: Sequence[ModelSpec],
        context_provider: PromptContextProvider,
        settings: LLMMutatorSettings | None = None,
        *,
        bandit: ModelBandit | None = None,
        health: ModelHealth | None = None,
        attempt_sink: AttemptSink | None = None,
        on_model_stop: StopSink | None = None,
        sleep: Callable[[float], None] = time.sleep,
        token_counter: TokenCounter | None = None,
        **overrides: Any,
    ) -> None:
        base = settings if settings is not None else LLMMutatorSettings()
        if overrides:
            base = LLMMutatorSettings.from_dict({**base.to_dict(), **overrides})
        if not models:
            raise LLMConfigError("LLMMutator needs at least one model ([[llm.models]] is empty)")
        self.settings = s = base
        self.client = client
        self.models = tuple(models)
        self.attempt_sink = attempt_sink
        live = [m for m in self.models if m.weight > 0]
        #: Proposals the engine may have in flight at once (:func:`mutators.base.concurrency`).
        self.concurrency = min(s.concurrency, sum(m.concurrency or s.concurrency for m in live) or 1)
        #: Engine stops after this many failed attempts in a run (0 = 3 x the evaluation budget).
        self.max_failed_attempts = s.max_failed_attempts
        self.memory = AttemptMemory(parents=s.history_parents, per_parent=s.history_per_parent, results=s.pending_max)
        self.chooser = ModelChooser(self.models, bandit=bandit, health=health, sleep=sleep, ledger_max=s.pending_max)
        if on_model_stop is not None:
            self.chooser.health.on_stop = on_model_stop
        self.prompts = PromptBuilder(context_provider, self.memory, n_inspirations=s.n_inspirations,
                                     counter=token_counter)
        self.repairs = RepairQueue(s.repair_rounds, s.repair_per_lineage, s.pending_max)
        self._lock = threading.Lock()
        self.last_failure: AttemptRecord | None = None
        self.attempts = 0
        self.failures = 0

    @property
    def bandit(self) -> ModelBandit:
        return self.chooser.bandit

    @property
    def health(self) -> ModelHealth:
        return self.chooser.health

    @property
    def provider(self) -> PromptContextProvider:
        return self.prompts.provider

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
        self.memory.record_result(candidate_id, fitness if fitness is None or math.isfinite(fitness) else None)
        self.chooser.observe(candidate_id, fitness)

    def unmatched_for(self, parent_id: str) -> tuple[UnmatchedBlock, ...]:
        """The unmatched blocks of the last attempt from a parent, if it was rejected for them."""
        return self.memory.unmatched(parent_id)

    def attempts_for(self, parent_id: str) -> tuple[AttemptNote, ...]:
        """The remembered attempts from a parent (or a repair chain's root), oldest first."""
        return self.memory.notes(parent_id)

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
        return self.repairs.offer(member, self.prompts.failure(member)[0], island)

    def next_repair(self, task: str | None = None) -> RepairRequest | None:
        """The oldest queued repair (of ``task`` if given), removed from the queue; or None."""
        return self.repairs.next(task)

    def pending_repairs(self, task: str | None = None) -> int:
        return self.repairs.pending(task)

    def repair(self, request: RepairRequest, context: MutationContext, rng: random.Random) -> Proposal | None:
        """One repair attempt of ``request.broken``; a Proposal whose parent is the broken
        kernel, or None (a recorded failed attempt). Raises like :meth:`propose`."""
        return self.begin_repair(request, context, rng)()

    def begin_repair(self, request: RepairRequest, context: MutationContext,
                     rng: random.Random) -> Callable[[], Proposal | None]:
        """:meth:`repair` in two parts, like :meth:`begin`."""
        return self._begin("repair", request.broken, context, rng, chain=request.root_id, request=request)

    # ---- propose -------------------------------------------------------------------------

    def propose(self, parents: list[Member], context: MutationContext, rng: random.Random) -> Proposal | None:
        return self.begin(parents, context, rng)()

    def begin(self, parents: list[Member], context: MutationContext,
              rng: random.Random) -> Callable[[], Proposal | None]:
        """:meth:`propose` in two parts (:class:`mutators.base.Mutator`'s ``begin``): here, in
        the caller's thread and order, the model is chosen, the attempt numbered and the
        prompt rendered (what reads the run's state and ``rng``); the returned job sends the
        prompt and interprets the answer, and may run on any thread, concurrently with
        other jobs. It raises what :meth:`propose` raises."""
        parent = parents[0] if parents else None
        if parent is None:
            return self._begin("genesis", None, context, rng, chain=f"genesis:{context.task}")
        if not parent.correct:
            prev = self.repairs.of(parent.id)
            return self._begin("repair", parent, context, rng, chain=prev.root_id if prev else parent.id)
        return self._begin("optimize", parent, context, rng, chain=parent.id)

    # ---- prompts and sizes (the prompt builder's) -----------------------------------------

    def render(self, kind: str, parent: Member | None, context: MutationContext, model: ModelSpec | None = None,
               *, chain: str | None = None) -> RenderedPrompt:
        """The prompt for an attempt, fitted to ``model``'s window when it is known
        (:meth:`mutators.llm.prompt.builder.PromptBuilder.render`)."""
        return self.prompts.render(kind, parent, context, model, chain=chain)

    def window(self, model: ModelSpec) -> int | None:
        """The model's context window (:meth:`PromptBuilder.window`)."""
        return self.prompts.window(model)

    def prompt_budget(self, model: ModelSpec) -> int | None:
        """Prompt tokens allowed for ``model`` (:meth:`PromptBuilder.prompt_budget`)."""
        return self.prompts.prompt_budget(model)

    def chars_per_token(self, model_name: str) -> float:
        """Characters per prompt token for this model (:meth:`PromptBuilder.chars_per_token`)."""
        return self.prompts.chars_per_token(model_name)

    def counter_name(self, model: ModelSpec) -> str | None:
        """What counts this model's prompts, None when they are estimated (:meth:`PromptBuilder.counter_name`)."""
        return self.prompts.counter_name(model)

    def calibrated(self, model_name: str) -> bool:
        """Whether the endpoint's counts calibrated this model (:meth:`PromptBuilder.calibrated`)."""
        return self.prompts.calibrated(model_name)

    def _not_twice(self, chain: str, messages: list[dict[str, str]], model: ModelSpec, n: int) -> list[dict[str, str]]:
        """Never the same prompt twice in a row for one parent (:meth:`AttemptMemory.not_twice`)."""
        return self.memory.not_twice(chain, messages, model, n)

    # ---- one attempt ---------------------------------------------------------------------

    def _begin(self, kind: str, parent: Member | None, context: MutationContext, rng: random.Random, *,
               chain: str, request: RepairRequest | None = None) -> Callable[[], Proposal | None]:
        """What depends on the run's state, in the caller's order: the model, the attempt's
        number from this chain (so its key is the same whatever order calls finish in) and
        the prompt. The returned job sends it and interprets the answer."""
        renders: dict[str, RenderedPrompt] = {}
        by_name = {m.name: m for m in self.models}

        def fits(name: str) -> bool:
            m = by_name[name]
            if self.prompt_budget(m) is None:
                return True
            if name not in renders:
                renders[name] = self.render(kind, parent, context, m, chain=chain)
            return renders[name].fits

        model = self.chooser.choose(rng, fits=fits)  # may raise NoModelLeft
        pid = parent.id if parent is not None else None
        n = self.memory.number(chain)
        key = f"{kind}:{chain}:{n}"
        rendered = renders.get(model.name) or self.render(kind, parent, context, model, chain=chain)
        if not rendered.fits:
            problem = (f"prompt too large for model {model.name!r}: ~{rendered.tokens} tokens after leaving out "
                       f"{', '.join(rendered.omitted) or 'nothing'}, budget {rendered.budget} (context_tokens "
                       f"{model.context_tokens} - max_output_tokens {model.max_output_tokens}); not sent")
            self._fail(kind, pid, model, None, [problem], (), chain=chain, request=request, note_outcome="not_sent",
                       n=n, reason="prompt_too_large")
            return lambda: None
        messages = self._not_twice(chain, rendered.messages, model, n)
        return lambda: self._finish(kind, parent, context, model, messages, chain=chain, request=request, n=n,
                                    key=key)

    def _finish(self, kind: str, parent: Member | None, context: MutationContext, model: ModelSpec,
                messages: list[dict[str, str]], *, chain: str, request: RepairRequest | None, n: int,
                key: str) -> Proposal | None:
        """Send the prepared prompt and turn the answer into a Proposal (thread-safe)."""
        pid = parent.id if parent is not None else None
        call = self.client.complete(messages, model=model, kind=kind, key=key)  # may raise BudgetExhausted
        self.chooser.called(model, call)
        self.prompts.calibrate(model, messages, call)
        with self._lock:
            self.attempts += 1
        if call.too_large:
            w = call.window
            if w is not None:
                self.prompts.learn_window(model, w)
            problem = (f"prompt too large for model {model.name!r}: the endpoint's window is "
                       f"{w if w is not None else '(not said)'} tokens; later prompts for it are sized to that "
                       f"window ({call.error})")
            self._fail(kind, pid, model, call, [problem], (), chain=chain, request=request, note_outcome="not_sent",
                       n=n, reason="window_exceeded")
            return None
        if call.error is not None:
            self._fail(kind, pid, model, call, [f"call failed: {call.error}"], (), chain=chain, request=request,
                       note_outcome="call_failed", n=n, reason="call_failed")
            return None
        text = call.response or ""
        max_bytes = self.settings.max_response_kb * 1024
        if len(text.encode("utf-8")) > max_bytes:
            self._fail(kind, pid, model, call, [f"answer too large: {len(text.encode('utf-8'))} bytes > "
                                                f"{max_bytes}"], (), chain=chain, request=request,
                       feedback="Your previous answer was far too long. Answer with small SEARCH/REPLACE blocks.", n=n,
                       reason="answer_too_large")
            return None
        view = effective_source(parent.candidate.source, parent.candidate.params_dict) if parent is not None else None
        interp = interpret(text, kind=kind, parent_source=view, finish_reason=call.finish_reason,
                           whole_file_lines=self.settings.whole_file_lines,
                           whole_file_fraction=self.settings.whole_file_fraction)
        problems = list(interp.problems)
        reason = interp.reason
        if interp.form == "empty" and (call.reasoning_tokens or call.finish_reason == "length") and \
                not any("unclosed" in p for p in problems):
            problems = [f"empty answer: the model spent its output tokens ({call.tokens_out}, {call.reasoning_tokens} "
                        f"of them reasoning) before writing an answer (finish_reason {call.finish_reason}); raise "
                        "max_output_tokens or lower reasoning_effort"]
            reason = "empty"
        feedback = interp.feedback
        child = interp.child if not problems else None
        params: dict[str, str] = {}
        cid = None
        if child is not None:
            try:
                params = resolve_params(child, {})
            except TunableError as e:
                problems.append(f"the child's @tunable lines are malformed: {e}")
                reason = "tunable"
                feedback = f"Your previous answer broke a `// @tunable` line: {e}. Keep them well formed."
            else:
                cid = candidate_id(child, canonical_params(params), context.task)
                if cid in context.seen:
                    problems.append(f"duplicate: this child ({cid[:12]}) was already proposed in this run")
                    reason = "duplicate"
                    feedback = (f"Your previous answer produced kernel {cid[:12]}, which this run already tried; its "
                                f"outcome: {self.prompts.outcome_text(AttemptNote(0, '', kind, 'child', '', cid), None)}. "
                                "Propose a different change.")
        if problems or child is None or cid is None:
            self._fail(kind, pid, model, call, problems or ["no child produced"], interp.unmatched, chain=chain,
                       request=request, feedback=feedback or "Your previous answer could not be used.", interp=interp,
                       n=n, reason=reason or "invalid")
            return None
        self.chooser.expect(cid, model, self._baseline(parent), call.cost)
        if kind == "repair" and parent is not None:
            req = request or RepairRequest(
                broken=parent, root_id=chain, round=1, stage=self.prompts.failure(parent)[0], task=context.task,
                anchor_id=parent.candidate.parents[0] if parent.candidate.parents else parent.id,
                island=context.island)
            self.repairs.link(cid, req)
        how = f"{interp.form}" + (f"; {'; '.join(interp.notes)}" if interp.notes else "")
        self.memory.note(chain, AttemptNote(n, model.name, kind, "child", how, cid))
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

    def _baseline(self, parent: Member | None) -> float:
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
              n: int = 0, reason: str = "invalid") -> None:
        with self._lock:
            self.failures += 1
        cost = call.cost if call is not None else 0.0
        self.chooser.failed(model, cost)
        summary = "; ".join(problems)
        if note_outcome == "rejected":
            text = f"rejected before compiling: {summary[:300]}"
        elif note_outcome == "call_failed":
            text = f"the endpoint failed, no answer: {summary[:200]}"
        else:
            text = f"not sent: {summary[:200]}"
        self.memory.note(chain, AttemptNote(n, model.name, kind, note_outcome, text, None,
                                      feedback if note_outcome == "rejected" else "", tuple(unmatched)))
        rec = AttemptRecord(kind=kind, parent_id=pid, model=model.name, ok=False, problems=tuple(problems),
                            unmatched=unmatched, prompt_hash=call.prompt_hash if call is not None else "", cost=cost,
                            call_error=call.error if call is not None else None,
                            form=interp.form if interp is not None else "",
                            notes=interp.notes if interp is not None else (),
                            repair_round=request.round if request is not None else 0,
                            attempt_key=f"{kind}:{chain}:{n}", reason=reason)
        self.last_failure = rec
        log.info("LLM %s attempt by %s for %s rejected: %s", kind, model.name, (pid or "-")[:12], summary)
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
