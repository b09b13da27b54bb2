"""A vLLM server's own count of a prompt's tokens: :class:`ServerTokenCounter`.

``vllm serve`` answers ``POST /tokenize`` at the server's root (not under ``/v1``) with the
model's tokenizer and chat template: the body ``{"model": ..., "messages": [...]}`` is
answered ``{"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}``, N being
the prompt tokens a chat request with those messages will count (generation prompt
included). vLLM guards only ``/v1`` paths with its ``--api-key``; the key is sent anyway.

A model is counted here when its server's model list marks it as vLLM's
(:func:`mutators.llm.client.served.is_vllm_entry`; read once per model). Each distinct prompt
is counted once (cached by prompt hash), before it is sent. A server without the route
(HTTP 404: an older vLLM, a proxy that passes only ``/v1``) or whose answer fails or is
malformed is not asked again: the model's prompts are estimated from then on, and a warning
says so once.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Sequence

from mutators.llm.client.calls import prompt_hash
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec
from mutators.llm.client.served import is_vllm_entry, model_entry

__all__ = ["ServerTokenCounter", "tokenize_url"]

log = logging.getLogger(__name__)

_VLLM = "vllm"


def tokenize_url(base_url: str) -> str:
    """The server's ``/tokenize`` for a ``base_url`` ending in ``/v1`` (its root's)."""
    root = base_url.rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root) + "/tokenize"


class ServerTokenCounter:
    """Counts prompts for models served by vLLM with the server's ``/tokenize`` (module
    docstring); a :class:`mutators.llm.prompt.tokens.TokenCounter`. ``timeout_s`` bounds
    each request; ``cache_size`` prompts' counts are kept."""

    def __init__(self, *, timeout_s: float = 10.0, cache_size: int = 1024) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size={cache_size}: must be >= 1")
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], str] = {}  # (base_url, model id) -> "vllm", or why not counted
        self._counts: OrderedDict[str, int] = OrderedDict()
        #: Requests sent to ``/tokenize`` (tests and the dry run read it).
        self.requests = 0

    @staticmethod
    def _key(model: ModelSpec) -> tuple[str, str]:
        return model.base_url.rstrip("/"), model.model

    def _served_state(self, model: ModelSpec) -> str:
        key = self._key(model)
        with self._lock:
            state = self._state.get(key)
        if state is not None:
            return state
        try:
            state = _VLLM if is_vllm_entry(model_entry(model, timeout_s=self.timeout_s)) else "not a vLLM model list"
        except LLMConfigError as e:
            state = str(e)
        with self._lock:
            return self._state.setdefault(key, state)

    def name(self, model: ModelSpec) -> str | None:
        if self._served_state(model) != _VLLM:
            return None
        return f"the vLLM server's POST {tokenize_url(model.base_url)}"

    def count(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int | None:
        if self._served_state(model) != _VLLM:
            return None
        h = prompt_hash(messages, model.base_url.rstrip("/") + "\0" + model.model)
        with self._lock:
            if h in self._counts:
                self._counts.move_to_end(h)
                return self._counts[h]
        try:
            n = self._tokenize(model, messages)
        except _Unavailable as e:
            self._give_up(model, str(e))
            return None
        with self._lock:
            self._counts[h] = n
            while len(self._counts) > self.cache_size:
                self._counts.popitem(last=False)
        return n

    def _give_up(self, model: ModelSpec, why: str) -> None:
        with self._lock:
            said = self._state.get(self._key(model)) != _VLLM
            self._state[self._key(model)] = why
        if not said:
            log.warning("model %s: %s; its prompt sizes are estimated from characters instead (calibrated by the "
                        "server's usage reports)", model.name, why)

    def _tokenize(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int:
        url = tokenize_url(model.base_url)
        body = json.dumps({"model": model.model, "messages": [{"role": m["role"], "content": m["content"]}
                                                              for m in messages]}).encode("utf-8")
        try:
            key = model.api_key()
        except LLMConfigError:
            key = ""
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
        with self._lock:
            self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")[:200]
            if e.code == 404:
                raise _Unavailable(f"the server has no {url} (HTTP 404: {text})") from None
            raise _Unavailable(f"{url} answered HTTP {e.code}: {text}") from None
        except (OSError, ValueError) as e:  # refused, timed out, not JSON
            raise _Unavailable(f"{url} failed: {type(e).__name__}: {e}") from None
        n = data.get("count") if isinstance(data, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise _Unavailable(f"{url} answered without a token count ({str(data)[:200]})")
        return n


class _Unavailable(Exception):
    """The server's ``/tokenize`` cannot count (missing, failing, or a malformed answer)."""
