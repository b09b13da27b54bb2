"""OpenAI's Responses API as the client speaks it: the request body for a message list and
what an answer means (text, finish reason, usage).

:class:`mutators.llm.client.chat.LLMClient` sends ``POST <base_url>/responses`` for a model
whose ``api`` is ``responses`` (or ``auto`` after the server said the model is served only
there). The wire format, as api.openai.com documents it:

- request: ``instructions`` (the system messages, joined), ``input`` (the other messages as
  ``{"role", "content"}`` items), ``max_output_tokens`` (reasoning counts against it),
  ``reasoning: {"effort"}`` when ``reasoning_effort`` is set, the sampling fields when set;
- answer: ``output`` items; the text is the ``output_text`` parts of the ``message`` items
  (``reasoning`` items carry only summaries, never the answer); ``status`` ``completed``, or
  ``incomplete`` with ``incomplete_details.reason`` (``max_output_tokens`` is the chat
  API's ``finish_reason`` ``length``); usage ``input_tokens`` (of which
  ``input_tokens_details.cached_tokens``) and ``output_tokens`` (of which
  ``output_tokens_details.reasoning_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mutators.llm.client.model_spec import ModelSpec

__all__ = ["responses_body", "ResponsesAnswer", "read_response", "read_usage", "FINISH_OF_INCOMPLETE"]

#: ``incomplete_details.reason`` as the chat API's ``finish_reason``.
FINISH_OF_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def responses_body(msgs: Sequence[Mapping[str, str]], model: ModelSpec) -> dict[str, Any]:
    """The JSON body of one Responses API request for ``msgs`` (see module docstring)."""
    system = [m["content"] for m in msgs if m["role"] in ("system", "developer")]
    body: dict[str, Any] = {}
    if system:
        body["instructions"] = "\n\n".join(system)
    body["input"] = [{"role": m["role"], "content": m["content"]} for m in msgs
                     if m["role"] not in ("system", "developer")]
    body.update(model.responses_fields())
    return body


@dataclass(frozen=True)
class ResponsesAnswer:
    """What one Responses API answer says: the answer ``text``, the reasoning summary (never
    part of the answer), the chat-style ``finish`` reason and the usage (None: not reported)."""

    text: str
    reasoning: str
    finish: str | None
    usage: dict[str, int] | None
    failed: str | None = None


def read_usage(usage: Any) -> dict[str, int] | None:
    """``{"tokens_in", "tokens_out", "reasoning", "cached"}`` of a Responses ``usage`` object,
    or None when it reports no tokens."""
    if not isinstance(usage, Mapping) or not (usage.get("input_tokens") or usage.get("output_tokens")):
        return None
    din = usage.get("input_tokens_details") or {}
    dout = usage.get("output_tokens_details") or {}
    return {
        "tokens_in": int(usage.get("input_tokens") or 0),
        "tokens_out": int(usage.get("output_tokens") or 0),
        "reasoning": int(dout.get("reasoning_tokens") or 0) if isinstance(dout, Mapping) else 0,
        "cached": int(din.get("cached_tokens") or 0) if isinstance(din, Mapping) else 0,
    }


def read_response(data: Mapping[str, Any]) -> ResponsesAnswer:
    """Read a Responses API answer object (see module docstring); ``failed`` is the error of
    a ``failed`` response, else None."""
    texts: list[str] = []
    thoughts: list[str] = []
    for item in data.get("output") or ():
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
        elif item.get("type") == "reasoning":
            for part in [*(item.get("summary") or ()), *(item.get("content") or ())]:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    thoughts.append(part["text"])
    status = data.get("status")
    finish: str | None = None
    failed: str | None = None
    if status == "completed":
        finish = "stop"
    elif status == "incomplete":
        reason = (data.get("incomplete_details") or {}).get("reason") if isinstance(
            data.get("incomplete_details"), Mapping) else None
        finish = FINISH_OF_INCOMPLETE.get(str(reason), str(reason or "incomplete"))
    elif status == "failed":
        err = data.get("error") or {}
        failed = str(err.get("message") if isinstance(err, Mapping) else err)[:300] or "response failed"
    return ResponsesAnswer("".join(texts), "".join(thoughts), finish, read_usage(data.get("usage")), failed)
