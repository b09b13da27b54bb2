"""The prompt of one LLM attempt, sized to the model it goes to: :class:`PromptBuilder`.

It renders ``prompt/prompts/<kind>.md`` (:func:`mutators.llm.prompt.templates.render_prompt`)
from what the :class:`mutators.llm.prompt.context.PromptContextProvider` knows
(:func:`mutators.llm.prompt.fields.prompt_fields`) and what the mutator's
:class:`mutators.llm.attempts.AttemptMemory` remembers of the chain (earlier attempts'
outcomes, the feedback on a rejected answer), and keeps what each model's endpoint taught
about sizes: its window when a context-length answer reported one smaller than configured
(:meth:`PromptBuilder.learn_window`) and its characters per token from plausible counts
(:meth:`PromptBuilder.calibrate`). Where a :class:`mutators.llm.prompt.tokens.TokenCounter`
knows the model's tokenizer (a vLLM server's ``/tokenize``, an OpenAI encoding), prompts are
counted instead of estimated. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from evo.core.records import Member
from mutators.base import MutationContext
from mutators.llm.attempts import STAGE_RANK, AttemptMemory, AttemptNote
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.prompt.context import PromptContextProvider
from mutators.llm.prompt.fields import prompt_fields
from mutators.llm.prompt.templates import BUDGET_CHARS_PER_TOKEN, estimate_prompt_tokens, render_prompt
from mutators.llm.prompt.tokens import TokenCounter
from mutators.llm.prompt.text import RenderedPrompt

__all__ = ["PromptBuilder", "OPTIMISTIC_CHARS_PER_TOKEN", "MAX_CHARS_PER_TOKEN"]

log = logging.getLogger(__name__)

#: Characters per token of a tokenizer's plausible best on our prompts (CUDA source, English):
#: an uncalibrated model is sent a prompt that fits its window at this ratio.
OPTIMISTIC_CHARS_PER_TOKEN = 4.5
#: More characters per token than any tokenizer gives on code: a usage report implying more is not used.
MAX_CHARS_PER_TOKEN = 8.0


class PromptBuilder:
    """Renders attempts' prompts (see the module docstring). ``n_inspirations``: 0-3 other
    islands' kernels in optimize prompts."""

    def __init__(self, provider: PromptContextProvider, memory: AttemptMemory, *, n_inspirations: int = 2,
                 counter: TokenCounter | None = None) -> None:
        if not 0 <= n_inspirations <= 3:
            raise ValueError(f"n_inspirations={n_inspirations}: must be within [0, 3]")
        self.provider = provider
        self.memory = memory
        self.n_inspirations = n_inspirations
        #: Counts prompts where it knows the model's tokenizer (None: every size is estimated).
        self.counter = counter
        self._lock = threading.Lock()
        self._cpt: dict[str, float] = {}
        self._windows: dict[str, int] = {}  # context windows endpoints reported, by model name

    # ---- the prompt ------------------------------------------------------------------------

    def render(self, kind: str, parent: Member | None, context: MutationContext, model: ModelSpec | None = None,
               *, chain: str | None = None) -> RenderedPrompt:
        """The prompt for an attempt, fitted to ``model``'s window when it is known.

        With ``model.context_tokens`` set, the budget is ``context_tokens -
        max_output_tokens``, and optional parts are dropped, least useful first (other
        islands' kernels, the profile, older attempts, the lineage's fitness history, ptxas,
        times, tunables; for a repair the error text is shortened), until the prompt fits;
        the prompt's "Left out" section names them. Tokens are counted by :attr:`counter`
        where it counts the model (``counted_by`` then names it), else estimated by
        :meth:`chars_per_token`. ``fits`` is False when even the shortest prompt is over the
        budget (an estimated one that could fit at a tokenizer's best is sent on trial).
        """
        fields, steps = prompt_fields(
            kind, parent, context, provider=self.provider, n_inspirations=self.n_inspirations,
            attempts_text=lambda k: self.attempts_text(chain, kind, parent, last=k),
            feedback=self.memory.feedback(chain), failure=self.failure)
        budget = self.prompt_budget(model) if model is not None else None
        cpt = self.chars_per_token(model.name) if model is not None else BUDGET_CHARS_PER_TOKEN
        omitted: list[str] = []
        while True:
            fields["omitted"] = (", ".join(omitted) + ". Ask for nothing of them; work with what is shown.") \
                if omitted else None
            msgs = render_prompt(kind, **fields)
            counted = self.count(model, msgs) if budget is not None and model is not None else None
            tokens = counted if counted is not None else estimate_prompt_tokens(msgs, cpt)
            by = self.counter_name(model) if counted is not None and model is not None else None
            if budget is None or tokens <= budget:
                return RenderedPrompt(msgs, tokens, budget, tuple(omitted), True, by)
            while steps:
                label, fn = steps.pop(0)
                if fn(fields):
                    omitted.append(label)
                    break
            else:
                if counted is not None:  # measured: over is over
                    return RenderedPrompt(msgs, tokens, budget, tuple(omitted), False, by)
                # Not calibrated yet: the conservative estimate may be far off. Send what could
                # fit at a tokenizer's plausible best (the endpoint's usage, or its 400 with the
                # count, then calibrates this model).
                calibrated = model is not None and self.calibrated(model.name)
                could = budget is not None and estimate_prompt_tokens(msgs, OPTIMISTIC_CHARS_PER_TOKEN) <= budget
                return RenderedPrompt(msgs, tokens, budget, tuple(omitted), bool(could and not calibrated))

    def attempts_text(self, chain: str | None, kind: str, parent: Member | None, last: int = 5) -> str:
        """The prompt's account of the chain's last ``last`` attempts ("" without any)."""
        notes = self.memory.notes(chain)
        if not notes:
            return ""
        base_stage = self.failure(parent)[0] if kind == "repair" and parent is not None else None
        shown = notes[-last:]
        lines = [f"- attempt {n.n} ({n.model}): {self.outcome_text(n, base_stage)}" for n in shown]
        if len(notes) > len(shown):
            lines.insert(0, f"- ({len(notes) - len(shown)} earlier attempts not shown)")
        lines.append("Do not repeat an attempt that failed; build on what the outcomes show.")
        return "\n".join(lines)

    def outcome_text(self, note: AttemptNote, base_stage: str | None) -> str:
        """One attempt's outcome as a prompt line: its note, or for a child what became of it
        (its fitness, the stage it fails, or that it is not evaluated yet)."""
        if note.outcome != "child" or note.child_id is None:
            return note.text
        cid = note.child_id
        known, fit = self.memory.result(cid)
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

    def failure(self, m: Member) -> tuple[str, str, str]:
        """``(stage, status, error)`` of a failed kernel, from the provider or its member record."""
        fail = self.provider.failure(m.id)
        if fail is None:
            st = m.status.value if hasattr(m.status, "value") else str(m.status)
            stage = {"rejected": "policy", "compile_error": "compile", "incorrect": "correctness"}.get(st, "unknown")
            return stage, st, m.error or ""
        return fail[0] or "unknown", fail[1] or "failed", fail[2] or ""

    # ---- sizes -------------------------------------------------------------------------------

    def count(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int | None:
        """The prompt's tokens as :attr:`counter` counts them for ``model``, or None (no
        counter, or it does not count this model: the caller estimates)."""
        return self.counter.count(model, messages) if self.counter is not None else None

    def counter_name(self, model: ModelSpec) -> str | None:
        """What counts ``model``'s prompts (None: they are estimated)."""
        return self.counter.name(model) if self.counter is not None else None

    def window(self, model: ModelSpec) -> int | None:
        """The model's context window: ``context_tokens``, or less when its endpoint reported
        a smaller one in a context-length answer."""
        with self._lock:
            seen = self._windows.get(model.name)
        known = [w for w in (model.context_tokens, seen) if w is not None]
        return min(known) if known else None

    def learn_window(self, model: ModelSpec, window: int) -> None:
        """The model's endpoint said its window is ``window`` tokens (the smallest said is kept)."""
        with self._lock:
            self._windows[model.name] = min(self._windows.get(model.name, window), window)

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

    def calibrate(self, model: ModelSpec, messages: Sequence[dict[str, str]], call: LLMCall) -> None:
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
