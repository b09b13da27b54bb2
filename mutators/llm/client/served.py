"""What the server says about the models it serves: the context window from ``GET
<base_url>/models``.

vLLM lists each served model with ``max_model_len``, the window it was started with (prompt
plus answer). For a model whose ``context_tokens`` is unset, :func:`with_server_windows`
reads it once, before a run (or a dry run) sizes its first prompt, so the prompts are fitted
to the window the server will enforce instead of being sent unsized. Servers that do not
report it (api.openai.com, Ollama, llama.cpp) leave the model as it was; so does a model
list that cannot be read (the probe and the run report the endpoint's problems).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Sequence

import openai

from mutators.llm.client.model_spec import LLMConfigError, ModelSpec

__all__ = ["server_window", "with_server_windows", "model_entry", "is_vllm_entry", "WINDOW_SOURCE"]

log = logging.getLogger(__name__)

#: How the dry run names where such a window came from.
WINDOW_SOURCE = "max_model_len in the server's model list"


def _listed(model: ModelSpec, timeout_s: float) -> list[dict[str, Any]]:
    client = openai.OpenAI(base_url=model.base_url, api_key=model.api_key(), timeout=timeout_s, max_retries=0)
    try:
        raw = client.models.with_raw_response.list()
        data = json.loads(raw.http_response.text)
    finally:
        client.close()
    entries = data.get("data") if isinstance(data, dict) else None
    return [e for e in entries or () if isinstance(e, dict)]


def model_entry(model: ModelSpec, *, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """``model.model``'s entry in its server's model list, or None when it is not listed or
    the list cannot be read (logged, not raised). Raises :class:`LLMConfigError` only for the
    model's own key variable being unset."""
    try:
        entries = _listed(model, timeout_s)
    except LLMConfigError:
        raise
    except (openai.OpenAIError, ValueError) as exc:
        log.info("model %s: could not read the model list at %s (%s)", model.name, model.base_url,
                 str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None
    return next((e for e in entries if e.get("id") == model.model), None)


def is_vllm_entry(entry: dict[str, Any] | None) -> bool:
    """A model-list entry of a vLLM server: vLLM's entries (its ``ModelCard``) always carry
    ``max_model_len``, which api.openai.com, Ollama and llama.cpp do not send."""
    return entry is not None and "max_model_len" in entry


def server_window(model: ModelSpec, *, timeout_s: float = 10.0) -> int | None:
    """``max_model_len`` of ``model.model`` in its server's model list, or None when the
    server does not say (or the list cannot be read: logged, not raised; the window then
    stays unknown). Raises :class:`LLMConfigError` only for the model's own key variable
    being unset."""
    n = (model_entry(model, timeout_s=timeout_s) or {}).get("max_model_len")
    return int(n) if isinstance(n, (int, float)) and n > 0 else None


def with_server_windows(models: Sequence[ModelSpec], *, timeout_s: float = 10.0) -> list[ModelSpec]:
    """``models`` with ``context_tokens`` set from :func:`server_window` where it was unset
    and the server reports a window. Raises :class:`LLMConfigError` (one line with the fix)
    when a reported window leaves no room past ``max_output_tokens``."""
    out = []
    for m in models:
        w = server_window(m, timeout_s=timeout_s) if m.context_tokens is None else None
        if w is None:
            out.append(m)
            continue
        if w <= m.max_output_tokens:
            raise LLMConfigError(
                f"model {m.name!r}: the server's window for {m.model} is {w} tokens ({WINDOW_SOURCE}), not more "
                f"than max_output_tokens = {m.max_output_tokens}; set max_output_tokens below {w} (e.g. {w // 4}) "
                "or serve the model with a larger --max-model-len")
        log.info("model %s: context window %d tokens (%s)", m.name, w, WINDOW_SOURCE)
        out.append(dataclasses.replace(m, context_tokens=w))
    return out
