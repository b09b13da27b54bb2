"""One model behind one endpoint: :class:`ModelSpec`, the ``[[llm.models]]`` entry as a record.

What a request to the model carries is :meth:`ModelSpec.request_fields`; which field holds
``max_output_tokens`` follows OpenAI's reasoning-model rules (:func:`is_openai_reasoning_model`).
Its key is read from the environment variable the spec names, never stored in it.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

__all__ = ["ModelSpec", "LLMConfigError", "is_openai_reasoning_model", "is_reasoning_model", "TOKEN_PARAMS",
           "REASONING_EFFORTS", "RESERVED_BODY_KEYS", "LOCAL_DUMMY_KEY", "APIS", "DEFAULT_MAX_OUTPUT_TOKENS",
           "REASONING_MAX_OUTPUT_TOKENS", "REASONING_TIMEOUT_S", "default_max_output_tokens"]

#: The key sent to a local endpoint (127.0.0.1 / localhost) whose ``key_env`` is unset.
LOCAL_DUMMY_KEY = "sk-local-no-key"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class LLMConfigError(ValueError):
    """A model is misconfigured (missing key variable, bad price, bad base_url)."""



#: Model ids of OpenAI's reasoning families (o1, o3, o4, gpt-5 and their variants, optionally
#: behind a router prefix such as ``openai/``): they take ``max_completion_tokens`` instead of
#: ``max_tokens`` and only the default temperature / top_p.
_REASONING_RE = re.compile(r"^(?:[\w.-]+/)?(?:o[134]|gpt-5)(?:[.-][\w.:-]*)?$", re.IGNORECASE)

#: Open-weight and other reasoning ("thinking") models by name: their answers start with a long
#: chain of thought that counts against the output budget.
_OPEN_REASONING_RE = re.compile(r"deepseek-r1|deepseek-reasoner|qwq|gpt-oss|thinking|reasoning|magistral",
                                re.IGNORECASE)

#: Values of ``api``: which endpoint a request goes to (``auto``: chat completions until the
#: server says the model is served only by the Responses API).
APIS = ("auto", "chat", "responses")
#: ``max_output_tokens`` when unset, for other models and for reasoning models (whose
#: reasoning counts against it: OpenAI advises leaving at least 25,000 tokens for it).
DEFAULT_MAX_OUTPUT_TOKENS = 8192
REASONING_MAX_OUTPUT_TOKENS = 32768
#: Per-attempt timeout of a reasoning model whose ``timeout_s`` is unset (a high-effort
#: answer takes minutes).
REASONING_TIMEOUT_S = 600.0

#: Values of ``token_param``: where ``max_output_tokens`` goes in the request.
TOKEN_PARAMS = ("auto", "max_tokens", "max_completion_tokens")
#: Values of ``reasoning_effort`` that OpenAI-compatible endpoints document.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: Request fields the typed settings own; ``extra_body`` may not set them.
RESERVED_BODY_KEYS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                      "reasoning_effort", "stream", "stream_options", "input", "instructions", "max_output_tokens",
                      "reasoning")


def is_openai_reasoning_model(model_id: str) -> bool:
    """True for OpenAI reasoning model ids (``o1``, ``o3-mini``, ``o4-mini``, ``gpt-5``, ``gpt-5.1-mini``...)."""
    return bool(_REASONING_RE.match(model_id.strip()))


def is_reasoning_model(model_id: str, reasoning_effort: str | None = None) -> bool:
    """True for a model that reasons before it answers: ``reasoning_effort`` set (other than
    ``none``), an OpenAI reasoning id, or a known open reasoning family (DeepSeek-R1, QwQ,
    gpt-oss, ``*thinking*`` / ``*reasoning*`` ids, Magistral)."""
    if reasoning_effort is not None and reasoning_effort != "none":
        return True
    return is_openai_reasoning_model(model_id) or bool(_OPEN_REASONING_RE.search(model_id))


def default_max_output_tokens(reasoning: bool) -> int:
    """``max_output_tokens`` of a model that does not set it."""
    return REASONING_MAX_OUTPUT_TOKENS if reasoning else DEFAULT_MAX_OUTPUT_TOKENS


@dataclass(frozen=True)
class ModelSpec:
    """One model behind one endpoint, as the ``[[llm.models]]`` config entries describe it.

    ``name`` is the label recorded on candidates (``llm:<name>``) and in ``llm_calls``;
    ``model`` is the id the endpoint knows (``gpt-4.1``, ``Qwen/Qwen2.5-Coder-32B``...);
    ``key_env`` names the environment variable holding the API key (never the key itself).
    Prices are USD per million tokens (``price_cached_input_per_mtok``, the price of prompt
    tokens the endpoint reports as cached, defaults to ``price_in_per_mtok``); ``weight`` is
    the bandit's prior preference (0 turns the model off).

    ``api`` picks the endpoint: ``chat`` (``/chat/completions``), ``responses`` (OpenAI's
    ``/responses``) or ``auto`` (chat completions until the server answers that the model is
    served only by the Responses API; the client then switches, see
    :class:`mutators.llm.client.chat.LLMClient`).

    ``reasoning_model`` (``None``: detected, :func:`is_reasoning_model`) gives the defaults
    that fit a model whose reasoning counts against its output budget: ``max_output_tokens``
    :data:`REASONING_MAX_OUTPUT_TOKENS` instead of :data:`DEFAULT_MAX_OUTPUT_TOKENS`,
    ``timeout_s`` :data:`REASONING_TIMEOUT_S` instead of the client's, and a timed-out
    attempt retried at most once (the client's rule). After construction both fields and
    ``reasoning_model`` hold the resolved values.

    Request settings (see :meth:`request_fields` for exactly what is sent):

    - ``max_output_tokens`` is sent as ``max_completion_tokens`` when ``token_param`` is
      ``"max_completion_tokens"``, or ``"auto"`` and the model is an OpenAI reasoning model
      (:func:`is_openai_reasoning_model`); else as ``max_tokens``;
    - ``temperature`` / ``top_p`` / ``reasoning_effort`` are sent only when set (``None``
      leaves the endpoint's default);
    - ``extra_body`` is merged into the JSON body verbatim (e.g. vLLM's
      ``{"chat_template_kwargs": {"enable_thinking": false}}``); it may not set the fields the
      typed settings own (:data:`RESERVED_BODY_KEYS`). Treat it as read-only;
    - ``stream`` asks for server-sent events (with ``stream_options.include_usage``);
    - ``context_tokens`` is the model's window (prompt + answer), used to budget prompts;
      ``None`` means unknown (no budget);
    - ``timeout_s`` / ``concurrency`` override the client's per-attempt timeout and cap this
      model's requests on the wire (``None``: the client's settings).
    """

    name: str
    base_url: str
    model: str
    key_env: str = "OPENAI_API_KEY"
    weight: float = 1.0
    price_in_per_mtok: float = 0.0
    price_out_per_mtok: float = 0.0
    price_cached_input_per_mtok: float | None = None
    max_output_tokens: int = None  # type: ignore[assignment]  # None: resolved in __post_init__
    token_param: str = "auto"
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict, hash=False)
    context_tokens: int | None = None
    stream: bool = False
    timeout_s: float | None = None
    concurrency: int | None = None
    api: str = "auto"
    reasoning_model: bool | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise LLMConfigError("ModelSpec.name is empty; give every model a short label")
        where = f"model {self.name!r}"
        if self.reasoning_model is None:
            object.__setattr__(self, "reasoning_model", is_reasoning_model(self.model, self.reasoning_effort))
        if self.max_output_tokens is None:
            object.__setattr__(self, "max_output_tokens", default_max_output_tokens(bool(self.reasoning_model)))
        if self.timeout_s is None and self.reasoning_model:
            object.__setattr__(self, "timeout_s", REASONING_TIMEOUT_S)
        if self.price_cached_input_per_mtok is None:
            object.__setattr__(self, "price_cached_input_per_mtok", self.price_in_per_mtok)
        if self.api not in APIS:
            raise LLMConfigError(f"{where}: api={self.api!r}; allowed: {', '.join(APIS)}")
        parsed = urlparse(self.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise LLMConfigError(
                f"{where}: base_url={self.base_url!r} is not an http(s) URL "
                "(e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1)"
            )
        for fname in ("weight", "price_in_per_mtok", "price_out_per_mtok", "price_cached_input_per_mtok"):
            if getattr(self, fname) < 0:
                raise LLMConfigError(f"{where}: {fname}={getattr(self, fname)} must be >= 0")
        if self.max_output_tokens < 1:
            raise LLMConfigError(f"{where}: max_output_tokens={self.max_output_tokens} must be >= 1")
        if self.token_param not in TOKEN_PARAMS:
            raise LLMConfigError(f"{where}: token_param={self.token_param!r}; allowed: {', '.join(TOKEN_PARAMS)}")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise LLMConfigError(f"{where}: temperature={self.temperature} must be between 0 and 2 (or unset)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise LLMConfigError(f"{where}: top_p={self.top_p} must be in (0, 1] (or unset)")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise LLMConfigError(f"{where}: reasoning_effort={self.reasoning_effort!r}; allowed: "
                                 f"{', '.join(REASONING_EFFORTS)} (or unset)")
        if not isinstance(self.extra_body, dict):
            raise LLMConfigError(f"{where}: extra_body must be a table/dict, got {type(self.extra_body).__name__}")
        clash = sorted(set(self.extra_body) & set(RESERVED_BODY_KEYS))
        if clash:
            raise LLMConfigError(f"{where}: extra_body sets {', '.join(clash)}, which the typed settings own; use "
                                 "max_output_tokens / token_param / temperature / top_p / reasoning_effort / stream")
        if self.context_tokens is not None and self.context_tokens <= self.max_output_tokens:
            raise LLMConfigError(f"{where}: context_tokens={self.context_tokens} must be larger than "
                                 f"max_output_tokens={self.max_output_tokens} (the window holds prompt and answer)")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise LLMConfigError(f"{where}: timeout_s={self.timeout_s} must be > 0 (or unset)")
        if self.concurrency is not None and self.concurrency < 1:
            raise LLMConfigError(f"{where}: concurrency={self.concurrency} must be >= 1 (or unset)")

    @property
    def is_local(self) -> bool:
        """True for endpoints on this machine, which may run without an API key."""
        return (urlparse(self.base_url).hostname or "") in _LOCAL_HOSTS

    @property
    def reasoning(self) -> bool:
        """True when OpenAI's reasoning-model rules apply to this model's requests."""
        # token_param = "max_tokens" says this endpoint is not OpenAI's: its rules do not apply
        return self.token_param != "max_tokens" and is_openai_reasoning_model(self.model)

    @property
    def token_field(self) -> str:
        """The request field that carries ``max_output_tokens``."""
        if self.token_param != "auto":
            return self.token_param
        return "max_completion_tokens" if is_openai_reasoning_model(self.model) else "max_tokens"

    def request_fields(self) -> dict[str, Any]:
        """The JSON body fields besides ``messages`` (what :class:`LLMClient` sends).

        ``extra_body`` entries come last; ``stream_options.include_usage`` is set when
        streaming so that the last chunk carries the token usage.
        """
        body: dict[str, Any] = {"model": self.model, self.token_field: self.max_output_tokens}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.reasoning_effort is not None:
            body["reasoning_effort"] = self.reasoning_effort
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(copy.deepcopy(self.extra_body))
        return body

    def responses_fields(self) -> dict[str, Any]:
        """The JSON body fields of a Responses API request besides ``input`` and
        ``instructions``: ``max_output_tokens``, ``reasoning.effort`` and the sampling fields
        when set, ``stream`` when streaming, then ``extra_body``."""
        body: dict[str, Any] = {"model": self.model, "max_output_tokens": self.max_output_tokens}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.reasoning_effort is not None:
            body["reasoning"] = {"effort": self.reasoning_effort}
        if self.stream:
            body["stream"] = True
        body.update(copy.deepcopy(self.extra_body))
        return body

    def api_key(self) -> str:
        """The key from ``os.environ[key_env]``; a dummy key for local endpoints without one."""
        key = os.environ.get(self.key_env) if self.key_env else None
        if key:
            return key
        if self.is_local:
            return LOCAL_DUMMY_KEY
        raise LLMConfigError(
            f"model {self.name!r}: environment variable {self.key_env or '(key_env empty)'!s} is not set; "
            f"export {self.key_env or 'OPENAI_API_KEY'}=<your key> or set key_env in [[llm.models]] "
            "to the variable that holds it"
        )

    def cost(self, tokens_in: int, tokens_out: int, cached_in: int = 0) -> float:
        """USD for this many prompt and completion tokens, ``cached_in`` of the prompt tokens
        at the cached-input price."""
        cached = max(0, min(int(cached_in), int(tokens_in)))
        return ((tokens_in - cached) * self.price_in_per_mtok + cached * float(self.price_cached_input_per_mtok or 0)
                + tokens_out * self.price_out_per_mtok) / 1e6

    @property
    def free(self) -> bool:
        """Both prices are 0: the budget cannot limit this model's calls."""
        return self.price_in_per_mtok == 0 and self.price_out_per_mtok == 0
