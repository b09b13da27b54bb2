"""What an endpoint's HTTP error answer means: fatal (stop the model), retryable, or neither.

:func:`classify_http_error` reads OpenAI's and vLLM's error bodies (message, type, param,
code); :data:`FATAL_FIXES` says what to do about each fatal kind, for the one line that stops
a model; :func:`retry_after_seconds` reads a 429's ``Retry-After`` header.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["classify_http_error", "FATAL_FIXES", "retry_after_seconds", "context_overflow", "TOO_LARGE_TAG",
           "responses_only"]

#: The tag in ``LLMCall.error`` of a prompt over the endpoint's window (not fatal: the model stays usable).
TOO_LARGE_TAG = "[too_large]"


def retry_after_seconds(headers: Any) -> float | None:
    """A 429's wait in seconds: ``retry-after-ms`` (OpenAI's, milliseconds), else
    ``Retry-After`` (seconds); None when neither is given as a number (an HTTP date falls
    back to our own backoff)."""
    if headers is None or not hasattr(headers, "get"):
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except (TypeError, ValueError):
            continue
    return None


def _error_fields(body: str) -> tuple[str, str, str, str]:
    """``(message, type, param, code)`` of an error body: OpenAI's ``{"error": {...}}``,
    vLLM's ``{"object": "error", "message": ...}``, or plain text."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError):
        return " ".join((body or "").split())[:300], "", "", ""
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, str):
        return err[:300], "", "", ""
    if not isinstance(err, dict):
        return str(err)[:300], "", "", ""
    def g(k: str) -> str:
        v = err.get(k)
        return "" if v is None else str(v)
    msg = g("message") or g("detail") or json.dumps(err)[:300]
    return " ".join(msg.split())[:300], g("type"), g("param"), g("code")


_CONTEXT_RES = re.compile(r"maximum context length|context length|context window|too many tokens|prompt is too long|"
                          r"reduce the length", re.IGNORECASE)
_UNSUPPORTED_RES = re.compile(r"unsupported (?:parameter|value)|unrecognized request argument|not supported with this "
                              r"model|extra (?:inputs|fields) (?:are|not) (?:not )?(?:permitted|allowed)|"
                              r"unknown (?:parameter|field)", re.IGNORECASE)
_MODEL_RES = re.compile(r"\bmodel\b.*(?:does not exist|not found|no such|unknown|not available)", re.IGNORECASE)
_QUOTA_RES = re.compile(r"insufficient_quota|exceeded your current quota|billing", re.IGNORECASE)


_WINDOW_RE = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
_PROMPT_RES = (re.compile(r"\((\d+) in the messages", re.IGNORECASE),
               re.compile(r"messages resulted in (\d+) tokens", re.IGNORECASE))


_RESPONSES_ONLY_RE = re.compile(r"only supported in v1/responses", re.IGNORECASE)


def responses_only(status: int, body: str) -> bool:
    """The answer says the model is served only by the Responses API (api.openai.com's
    404, or 400 behind some proxies: "This model is only supported in v1/responses and not
    in v1/chat/completions.")."""
    return status in (400, 404) and bool(_RESPONSES_ONLY_RE.search(_error_fields(body)[0]))


def context_overflow(status: int, body: str) -> tuple[int | None, int | None] | None:
    """For an answer that says the prompt is over the model's window (OpenAI's
    ``context_length_exceeded``, vLLM's "maximum context length is N tokens ... (P in the
    messages, C in the completion)"): ``(window, prompt_tokens)``, each None when the body
    does not say. None for any other answer."""
    if status not in (400, 413):
        return None
    msg, typ, _, code = _error_fields(body)
    if "context_length" not in f"{code} {typ}".lower() and not _CONTEXT_RES.search(msg) and status != 413:
        return None
    m = _WINDOW_RE.search(msg)
    window = int(m.group(1)) if m else None
    prompt = None
    for rx in _PROMPT_RES:
        pm = rx.search(msg)
        if pm:
            prompt = int(pm.group(1))
            break
    return window, prompt


def classify_http_error(status: int, body: str) -> tuple[str | None, bool, str]:
    """``(fatal_kind, retryable, detail)`` of an HTTP error answer.

    ``fatal_kind`` is one of :data:`FATAL_KINDS` for a failure that cannot heal (the model
    is stopped for the run), else None; ``retryable`` says whether the same request may
    succeed later (429 rate limits, 408, 409, 5xx); ``detail`` is one line from the body
    (message, then param / code when given).
    """
    msg, typ, param, code = _error_fields(body)
    detail = msg + "".join(f"; {k}={v}" for k, v in (("param", param), ("code", code)) if v)
    low = f"{code} {typ}".lower()
    if status == 429:
        if "insufficient_quota" in low or _QUOTA_RES.search(msg):
            return "quota", False, detail
        return None, True, detail
    if status >= 500 or status in (408, 409):
        return None, True, detail
    if status == 401:
        return "auth", False, detail
    if status == 403:
        return "forbidden", False, detail
    if status == 404:
        return "model_not_found", False, detail
    if "context_length" in low or _CONTEXT_RES.search(msg) or status == 413:
        return None, False, detail  # not fatal: see context_overflow (the next prompt is sized to the window)
    if "model_not_found" in low or _MODEL_RES.search(msg):
        return "model_not_found", False, detail
    if "unsupported" in low or _UNSUPPORTED_RES.search(msg):
        return "unsupported_parameter", False, detail
    return None, False, detail


#: What to do about each fatal kind, for the one line that stops a model.
FATAL_FIXES = {
    "auth": "the endpoint rejects the API key: check the variable key_env names",
    "forbidden": "the key has no access to this model or endpoint",
    "model_not_found": "the endpoint does not serve this model id (or base_url is wrong; it usually ends in /v1): "
                       "check model and base_url",
    "unsupported_parameter": "the model rejects a request setting: check token_param, temperature, top_p, "
                             "reasoning_effort and extra_body of this model",
    "quota": "the account has no quota left: add credit or switch the model off (weight = 0)",
    "wrong_api": 'the endpoint serves this model only through the Responses API: set api = "responses" (or "auto", '
                 "which switches by itself)",
}
