"""The LLM mutator: prompts a model for a child kernel and turns its answer into a Proposal.

:class:`LLMMutator` implements :class:`mutators.base.Mutator`, plus the repair loop the
engine drives (:meth:`LLMMutator.offer_repair`, :meth:`next_repair`, :meth:`repair`). Per
attempt:

1. prompt kind: ``genesis`` when there is no parent (write a kernel from the task's
   reference), ``repair`` when the parent is incorrect, else ``optimize``;
2. :class:`mutators.llm.client.health.ModelHealth` says which models may be called (stopped models and
   open circuit breakers are skipped) and the :class:`mutators.llm.bandit.ModelBandit` picks one;
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
reported as an :class:`AttemptRecord` to the ``attempt_sink`` and kept in
:attr:`LLMMutator.last_failure`; the reason goes back to the model in the next prompt for
that parent, and no parent is sent the same prompt twice in a row.

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

import logging
import math
import random
import threading
import time
from collections import OrderedDict
from typing import Callable, Sequence

from evo.core.records import Member, candidate_id, canonical_params
from evo.core.tunables import TunableError, resolve_params
from mutators.llm.answer.interpret import Interpretation, interpret
from mutators.llm.attempts import STAGE_RANK, AttemptNote, AttemptRecord, AttemptSink, RepairRequest
from mutators.llm.bandit import ModelBandit
from mutators.base import MutationContext, Proposal
from mutators.llm.client.calls import ChatClient, LLMCall, prompt_hash
from mutators.llm.client.health import ModelHealth, StopSink
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec
from mutators.llm.answer.patch import UnmatchedBlock
from mutators.llm.prompt.context import PromptContextProvider
from mutators.llm.prompt.fields import prompt_fields
from mutators.llm.prompt.text import RenderedPrompt, effective_source
from mutators.llm.repairs import RepairQueue
from mutators.llm.prompt.templates import BUDGET_CHARS_PER_TOKEN, estimate_prompt_tokens, render_prompt

#: Characters per token of a tokenizer's plausible best on our prompts (CUDA source, English):
#: an uncalibrated model is sent a prompt that fits its window at this ratio.
OPTIMISTIC_CHARS_PER_TOKEN = 4.5
#: More characters per token than any tokenizer gives on code: a usage report implying more is not used.
MAX_CHARS_PER_TOKEN = 8.0

__all__ = ["LLMMutator"]

log = logging.getLogger(__name__)


class LLMMutator:
    """The LLM mutator (see module docstring).

    ``max_response_kb``: answers larger than this are rejected (the client should also cap
    them; this guards replayed or custom clients). ``n_inspirations``: 0-3 inspirations in
    optimize prompts. ``history_parents`` / ``history_per_parent``: bounds of the per-parent
    memory of attempts. ``repair_rounds``: repair attempts per failure (a chain of repairs of
    one broken child); ``repair_per_lineage``: repair attempts queued per correct ancestor
    over the run. ``whole_file_lines`` / ``whole_file_fraction``: how large a diff a
    whole-file answer to a patch prompt may amount to (:mod:`mutators.llm.answer.interpret`).
    ``concurrency``: requests the client may have on the wire at once (its own cap); the
    mutator's :attr:`concurrency`, how many proposals the engine keeps in flight, is that
    cap or the sum of the models' own ``concurrency`` (unset: the cap), whichever is less.
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
        concurrency: int = 1,
    ) -> None:
        if not 0 <= n_inspirations <= 3:
            raise ValueError(f"n_inspirations={n_inspirations}: must be within [0, 3]")
        if not models:
            raise LLMConfigError("LLMMutator needs at least one model ([[llm.models]] is empty)")
        self.client = client
        self.models = tuple(models)
        self.provider = context_provider
        self.bandit = bandit if bandit is not None else ModelBandit(self.models)
        self.attempt_sink = attempt_sink
        self.max_response_bytes = int(max_response_kb) * 1024
        self.n_inspirations = n_inspirations
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency}: must be >= 1")
        live = [m for m in self.models if m.weight > 0]
        #: Proposals the engine may have in flight at once (:func:`mutators.base.concurrency`).
        self.concurrency = min(concurrency, sum(m.concurrency or concurrency for m in live) or 1)
        self.repairs = RepairQueue(repair_rounds, repair_per_lineage, pending_max)
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
        self._cpt: dict[str, float] = {}
        self._windows: dict[str, int] = {}  # context windows endpoints reported, by model name
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
        return self.repairs.offer(member, self._failure(member)[0], island)

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
        fields, steps = prompt_fields(
            kind, parent, context, provider=self.provider, n_inspirations=self.n_inspirations,
            attempts_text=lambda k: self._attempts_text(chain, kind, parent, last=k),
            feedback=self._feedback(chain), failure=self._failure)
        budget = self.prompt_budget(model) if model is not None else None
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
                # Not calibrated yet: the conservative estimate may be far off. Send what could
                # fit at a tokenizer's plausible best (the endpoint's usage, or its 400 with the
                # count, then calibrates this model).
                calibrated = model is not None and self.calibrated(model.name)
                could = budget is not None and estimate_prompt_tokens(msgs, OPTIMISTIC_CHARS_PER_TOKEN) <= budget
                return RenderedPrompt(msgs, tokens, budget, tuple(omitted), bool(could and not calibrated))

    def window(self, model: ModelSpec) -> int | None:
        """The model's context window: ``context_tokens``, or less when its endpoint reported
        a smaller one in a context-length answer."""
        with self._lock:
            seen = self._windows.get(model.name)
        known = [w for w in (model.context_tokens, seen) if w is not None]
        return min(known) if known else None

    def prompt_budget(self, model: ModelSpec) -> int | None:
        """Prompt tokens allowed for ``model``: its window less ``max_output_tokens`` (at most
        half the window, when a reported window is smaller than the configured output)."""
        w = self.window(model)
        if w is None:
            return None
        if model.context_tokens is not None and w == model.context_tokens:
            return w - model.max_output_tokens
        return w - min(model.max_output_tokens, w // 2)

    def chars_per_token(self, model_name: str) -> float:
        """Characters per prompt token for budgeting this model's prompts: 0.95 x the smallest
        ratio of its endpoint's plausible counts so far (prompt characters / (prompt_tokens
        less the chat framing), from answers' usage and from context-length 400s that counted
        the prompt), or the conservative BUDGET_CHARS_PER_TOKEN before any count."""
        with self._lock:
            seen = self._cpt.get(model_name)
        return BUDGET_CHARS_PER_TOKEN if seen is None else 0.95 * seen

    def calibrated(self, model_name: str) -> bool:
        """Whether a plausible count from this model's endpoint has calibrated its estimate."""
        with self._lock:
            return model_name in self._cpt

    def _calibrate(self, model: ModelSpec, messages: list[dict[str, str]], call: LLMCall) -> None:
        """Learn the model's characters per token from a count its endpoint reported: the
        usage of an answered call, or the prompt tokens a context-length 400 named. A count
        that is physically implausible (0, more tokens than characters, or over
        MAX_CHARS_PER_TOKEN characters a token) is ignored and logged."""
        if call.too_large:
            tokens = call.prompt_tokens_reported
        elif call.ok and not call.usage_estimated:
            tokens = call.tokens_in
        else:
            return
        if tokens is None:
            return
        chars = sum(len(m["content"]) for m in messages)
        framing = 8 * len(messages)
        if tokens <= 0 or tokens > chars or chars / max(1, tokens - framing) > MAX_CHARS_PER_TOKEN:
            log.warning("LLM %s: the endpoint counted %d prompt tokens for %d characters; implausible, not used to "
                        "size prompts", model.name, tokens, chars)
            return
        ratio = chars / max(1, tokens - framing) if tokens > 2 * framing else chars / tokens
        with self._lock:
            self._cpt[model.name] = min(self._cpt.get(model.name, ratio), ratio)

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
        if base_stage in STAGE_RANK and stage in STAGE_RANK and STAGE_RANK[stage] < STAGE_RANK[base_stage]:
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

        model = self._choose_model(rng, fits=fits)  # may raise NoModelLeft
        pid = parent.id if parent is not None else None
        with self._lock:
            n = self._counts.get(chain, 0) + 1
            self._counts[chain] = n
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
        self.health.record(model.name, call)
        self._calibrate(model, messages, call)
        with self._lock:
            self.attempts += 1
        if call.too_large:
            w = call.window
            if w is not None:
                with self._lock:
                    self._windows[model.name] = min(self._windows.get(model.name, w), w)
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
        if len(text.encode("utf-8")) > self.max_response_bytes:
            self._fail(kind, pid, model, call, [f"answer too large: {len(text.encode('utf-8'))} bytes > "
                                                f"{self.max_response_bytes}"], (), chain=chain, request=request,
                       feedback="Your previous answer was far too long. Answer with small SEARCH/REPLACE blocks.", n=n,
                       reason="answer_too_large")
            return None
        view = effective_source(parent.candidate.source, parent.candidate.params_dict) if parent is not None else None
        interp = interpret(text, kind=kind, parent_source=view, finish_reason=call.finish_reason,
                           whole_file_lines=self.whole_file_lines, whole_file_fraction=self.whole_file_fraction)
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
                                f"outcome: {self._outcome_text(AttemptNote(0, '', kind, 'child', '', cid), None)}. "
                                "Propose a different change.")
        if problems or child is None or cid is None:
            self._fail(kind, pid, model, call, problems or ["no child produced"], interp.unmatched, chain=chain,
                       request=request, feedback=feedback or "Your previous answer could not be used.", interp=interp,
                       n=n, reason=reason or "invalid")
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
                self.repairs.link(cid, req)
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

    def _choose_model(self, rng: random.Random, fits: Callable[[str], bool] | None = None) -> ModelSpec:
        """The bandit's pick among the models :class:`ModelHealth` allows and, when more than
        one is usable and ``fits`` is given, among those the prompt fits (all usable ones when
        it fits none: that attempt is then reported as too large).

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
        if fits is not None and len(usable) > 1:
            fitting = [n for n in usable if fits(n)]
            usable = fitting or usable
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
              n: int = 0, reason: str = "invalid") -> None:
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
                            attempt_key=f"{kind}:{chain}:{n}", reason=reason)
        self.last_failure = rec
        log.info("LLM %s attempt by %s for %s rejected: %s", kind, model.name, (pid or "-")[:12], summary)
        if self.attempt_sink is not None:
            self.attempt_sink(rec)
