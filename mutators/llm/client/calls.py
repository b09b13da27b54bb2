"""What one chat call is, as data: :class:`LLMCall`, the :class:`ChatClient` Protocol and the
record/replay key of a prompt (:func:`prompt_hash`).

:class:`mutators.llm.client.chat.LLMClient` (an endpoint) and :class:`mutators.llm.replay.cassette.ReplayClient`
(recorded answers) both implement :class:`ChatClient`; every call either returns goes to a
:data:`CallSink` (the engine stores it in ``llm_calls``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from mutators.llm.client.model_spec import ModelSpec

__all__ = ["LLMCall", "CallSink", "ChatClient", "FATAL_KINDS", "norm_messages", "canonical_messages",
           "prompt_hash", "estimate_tokens", "CHARS_PER_TOKEN"]

#: Failure kinds that no retry and no other prompt can heal: the model is stopped for the run.
FATAL_KINDS = ("auth", "forbidden", "model_not_found", "unsupported_parameter", "quota", "wrong_api")
_FATAL_TAG_RE = re.compile(r"\[fatal:(\w+)\]")
_WINDOW_TAG_RE = re.compile(r"\[too_large\] window (\d+) tokens")
_PROMPT_TAG_RE = re.compile(r"\[too_large\][^;]*?; prompt (\d+) tokens")
_RATE_LIMIT_RE = re.compile(r"HTTP 429 rate limited")


@dataclass(frozen=True)
class LLMCall:
    """One ``complete`` call, successful or not, with everything the store keeps.

    ``response`` is the answer text ("" when none came; reasoning text the endpoint returns
    separately, ``reasoning_content``, is never part of it); ``error`` is ``None`` on success,
    else a one-line reason (the last attempt's failure). ``tokens_*`` and ``cost`` sum over
    all attempts, including attempts that timed out or came without a usage report: those
    are estimated (~4 characters a token of what was sent and streamed) and
    ``usage_estimated`` is set. ``reasoning_tokens`` is the part of ``tokens_out`` spent on
    reasoning when known, ``cached_tokens`` the part of ``tokens_in`` the endpoint reported
    as cached (priced at the model's cached-input price). ``cached`` marks calls answered by
    a replay client. ``attempts`` counts requests sent (``retries`` = ``attempts - 1``).
    The request settings as sent are kept: ``api`` (``chat`` or ``responses``, the one that
    answered), ``max_output_tokens``, ``reasoning_effort`` and the per-attempt ``timeout_s``.
    ``attempt_key`` is the caller's name for the attempt (the LLM mutator's proposal
    identity, see :class:`mutators.llm.attempts.AttemptRecord`), stored with the call: when
    the attempt's answer becomes a child, the engine links the call to that candidate by
    this key (:meth:`evo.store.Store.link_llm_call`).

    A failure no retry can heal (bad key, unknown model, a parameter the model rejects, no
    quota) carries ``[fatal:<kind>]`` in ``error``, so the stored row (and a replay of it)
    says so too: see :attr:`fatal`. A prompt over the endpoint's window is not fatal: it
    carries ``[too_large]`` and, when the endpoint said it, ``window N tokens`` (see
    :attr:`too_large`, :attr:`window`).
    """

    model: str
    prompt_hash: str
    messages: tuple[dict[str, str], ...]
    response: str
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    error: str | None = None
    attempts: int = 1
    finish_reason: str | None = None
    kind: str = ""
    cached: bool = False
    reasoning_tokens: int = 0
    usage_estimated: bool = False
    attempt_key: str = ""
    cached_tokens: int = 0
    api: str = "chat"
    max_output_tokens: int | None = None
    reasoning_effort: str | None = None
    timeout_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def retries(self) -> int:
        """Requests sent after the first."""
        return max(0, self.attempts - 1)

    @property
    def rate_limited(self) -> bool:
        """The call failed on rate limits (HTTP 429 after its retries; not a quota 429, which is fatal)."""
        return _RATE_LIMIT_RE.search(self.error or "") is not None

    @property
    def fatal(self) -> str | None:
        """The :data:`FATAL_KINDS` entry of a failure that cannot heal, else None."""
        m = _FATAL_TAG_RE.search(self.error or "")
        return m.group(1) if m else None

    @property
    def too_large(self) -> bool:
        """The endpoint refused the prompt as over its context window (not fatal)."""
        return "[too_large]" in (self.error or "")

    @property
    def window(self) -> int | None:
        """The context window the endpoint reported in a :attr:`too_large` answer, if any."""
        m = _WINDOW_TAG_RE.search(self.error or "") if self.too_large else None
        return int(m.group(1)) if m else None

    @property
    def prompt_tokens_reported(self) -> int | None:
        """The prompt's tokens as a :attr:`too_large` answer counted them, if it did."""
        m = _PROMPT_TAG_RE.search(self.error or "") if self.too_large else None
        return int(m.group(1)) if m else None

    def to_row(self, candidate_id: str | None = None) -> dict[str, Any]:
        """Fields for ``Store.add_llm_call`` (prompt stored as the canonical messages JSON)."""
        return {
            "prompt": canonical_messages(self.messages),
            "response": self.response,
            "model": self.model,
            "kind": self.kind,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost": self.cost,
            "latency_s": self.latency_s,
            "error": self.error,
            "prompt_hash": self.prompt_hash,
            "candidate_id": candidate_id,
            "cached": self.cached,
            "finish_reason": self.finish_reason,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_tokens": self.cached_tokens,
            "retries": self.retries,
            "api": self.api,
            "max_output_tokens": self.max_output_tokens,
            "reasoning_effort": self.reasoning_effort,
            "timeout_s": self.timeout_s,
            "attempt_key": self.attempt_key or None,
        }


#: Receives every LLMCall a client returns (the engine stores them in ``llm_calls``).
CallSink = Callable[[LLMCall], None]


class ChatClient(Protocol):
    """What :class:`mutators.llm.mutator.LLMMutator` needs: :class:`mutators.llm.client.chat.LLMClient`
    or :class:`mutators.llm.replay.cassette.ReplayClient`."""

    def complete(
        self, messages: Sequence[dict[str, str]], *, model: ModelSpec, kind: str = "", key: str = ""
    ) -> LLMCall:  # pragma: no cover - protocol
        """One chat completion. ``kind`` (genesis, repair, optimize) and ``key`` (the
        attempt's identity, which a replay answers by) are recorded on the returned call.
        May be called from several threads at once."""
        ...


def norm_messages(messages: Sequence[dict[str, str]]) -> tuple[dict[str, str], ...]:
    out = []
    for i, m in enumerate(messages):
        if "role" not in m or "content" not in m:
            raise ValueError(f"message {i} needs 'role' and 'content' keys, got {sorted(m)}")
        out.append({"role": str(m["role"]), "content": str(m["content"])})
    return tuple(out)


def canonical_messages(messages: Sequence[dict[str, str]]) -> str:
    """The one JSON spelling of a message list (role + content only, sorted keys)."""
    return json.dumps(list(norm_messages(messages)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_hash(messages: Sequence[dict[str, str]], model: str) -> str:
    """sha256 of the canonical messages and the endpoint's model id: the record/replay key."""
    h = hashlib.sha256()
    h.update(model.encode("utf-8"))
    h.update(b"\0")
    h.update(canonical_messages(messages).encode("utf-8"))
    return h.hexdigest()



#: Characters per token of the estimates (code and English prose tokenize at ~3-4.5).
CHARS_PER_TOKEN = 4.0


def estimate_tokens(content: str | Sequence[dict[str, str]]) -> int:
    """A rough token count (~4 characters a token, plus 4 a message for the chat framing).

    Used where the endpoint reports no usage (timed-out attempts, answers without a usage
    report) and to budget prompts; an estimate, never a measurement.
    """
    if isinstance(content, str):
        return int(len(content) / CHARS_PER_TOKEN + 0.999) if content else 0
    return sum(estimate_tokens(str(m.get("content", ""))) + 4 for m in content)
