"""A chat-completions client for any OpenAI-compatible endpoint, with observable retries.

:class:`LLMClient` talks to OpenAI, vLLM, Ollama, a llama.cpp server or the local
:mod:`mutators.fake_server` through the ``openai`` package (``base_url`` + ``model`` + a key
read from the environment variable a :class:`ModelSpec` names). The ``openai`` client is built
with ``max_retries=0``: retries happen here so that every attempt, wait and failure is visible
in the returned :class:`LLMCall` and in the logs. What a request carries is
:meth:`ModelSpec.request_fields` (``max_output_tokens`` as ``max_tokens`` or
``max_completion_tokens``, sampling fields only when set, ``extra_body`` passthrough,
streaming).

Contract of :meth:`LLMClient.complete`:

- it returns an :class:`LLMCall` for every outcome. A call that failed after all attempts
  (timeouts, 5xx, 429, connection errors, a body that is not JSON, a non-retryable 4xx, an
  answer over the size cap) is an ``LLMCall`` with ``error`` set, never an exception: a
  failed call is data the engine stores. A failure that cannot heal is tagged
  ``[fatal:<kind>]`` in ``error`` (:data:`FATAL_KINDS`; :func:`classify_http_error`), so
  the caller can stop that model (:mod:`mutators.health`);
- it raises only :class:`BudgetExhausted` (the shared :class:`Budget` is spent; raised
  *before* anything is sent, so the engine stops proposing) and :class:`LLMConfigError`
  (a misconfigured model, e.g. its key variable is unset);
- every returned call is also handed to the ``sink`` (the engine writes it to ``llm_calls``);
- at most ``concurrency`` requests are on the wire at once (a bounded semaphore; a model's
  own ``concurrency`` caps it further), so the client can be shared by threads;
- costs count every attempt the endpoint processed: the reported usage, or, for an attempt
  that timed out (or was cut mid-stream) and for an answer without a usage report, an
  estimate from the characters sent and received (:func:`estimate_tokens`);
- the answer is ``message.content`` only; ``reasoning_content`` (vLLM, DeepSeek) is counted
  for cost when no usage is reported and never returned as the answer.

Retry policy: 429 (waits the ``Retry-After`` seconds when the header is given, capped at
``retry_after_max_s``; a 429 for an exhausted quota is fatal), 5xx, 408, 409, connection
errors, timeouts, broken streams and invalid JSON are retried up to ``max_attempts``
attempts in total, with exponential backoff ``backoff_base_s * 2**(k-1)`` (capped at
``backoff_max_s``) stretched by a jitter factor in ``[1, 1 + jitter)`` drawn from the
injected ``random.Random``. Other 4xx answers (bad request, auth, unknown model) are not
retried: sending the same request again cannot fix them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence
from urllib.parse import urlparse

import openai

from mutators.base import MutatorStopped

__all__ = [
    "ModelSpec",
    "is_openai_reasoning_model",
    "classify_http_error",
    "estimate_tokens",
    "FATAL_KINDS",
    "FATAL_FIXES",
    "TOKEN_PARAMS",
    "REASONING_EFFORTS",
    "RESERVED_BODY_KEYS",
    "LLMCall",
    "Budget",
    "BudgetExhausted",
    "LLMConfigError",
    "LLMClient",
    "ChatClient",
    "CallSink",
    "prompt_hash",
    "canonical_messages",
    "LOCAL_DUMMY_KEY",
]

log = logging.getLogger(__name__)

#: The key sent to a local endpoint (127.0.0.1 / localhost) whose ``key_env`` is unset.
LOCAL_DUMMY_KEY = "sk-local-no-key"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class LLMConfigError(ValueError):
    """A model is misconfigured (missing key variable, bad price, bad base_url)."""


class BudgetExhausted(MutatorStopped):
    """The run's LLM budget is spent; raised before a request is sent.

    The engine catches it (as :class:`mutators.base.MutatorStopped`) and stops proposing
    LLM children (in-flight work drains).
    """


#: Model ids of OpenAI's reasoning families (o1, o3, o4, gpt-5 and their variants, optionally
#: behind a router prefix such as ``openai/``): they take ``max_completion_tokens`` instead of
#: ``max_tokens`` and only the default temperature / top_p.
_REASONING_RE = re.compile(r"^(?:[\w.-]+/)?(?:o[134]|gpt-5)(?:[.-][\w.:-]*)?$", re.IGNORECASE)

#: Values of ``token_param``: where ``max_output_tokens`` goes in the request.
TOKEN_PARAMS = ("auto", "max_tokens", "max_completion_tokens")
#: Values of ``reasoning_effort`` that OpenAI-compatible endpoints document.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: Request fields the typed settings own; ``extra_body`` may not set them.
RESERVED_BODY_KEYS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                      "reasoning_effort", "stream", "stream_options")


def is_openai_reasoning_model(model_id: str) -> bool:
    """True for OpenAI reasoning model ids (``o1``, ``o3-mini``, ``o4-mini``, ``gpt-5``, ``gpt-5.1-mini``...)."""
    return bool(_REASONING_RE.match(model_id.strip()))


@dataclass(frozen=True)
class ModelSpec:
    """One model behind one endpoint, as the ``[[llm.models]]`` config entries describe it.

    ``name`` is the label recorded on candidates (``llm:<name>``) and in ``llm_calls``;
    ``model`` is the id the endpoint knows (``gpt-4.1``, ``Qwen/Qwen2.5-Coder-32B``...);
    ``key_env`` names the environment variable holding the API key (never the key itself).
    Prices are USD per million tokens; ``weight`` is the bandit's prior preference (0 turns
    the model off).

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
    max_output_tokens: int = 4096
    token_param: str = "auto"
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict, hash=False)
    context_tokens: int | None = None
    stream: bool = False
    timeout_s: float | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise LLMConfigError("ModelSpec.name is empty; give every model a short label")
        where = f"model {self.name!r}"
        parsed = urlparse(self.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise LLMConfigError(
                f"{where}: base_url={self.base_url!r} is not an http(s) URL "
                "(e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1)"
            )
        for fname in ("weight", "price_in_per_mtok", "price_out_per_mtok"):
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

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """USD for this many prompt and completion tokens."""
        return (tokens_in * self.price_in_per_mtok + tokens_out * self.price_out_per_mtok) / 1e6

    @property
    def free(self) -> bool:
        """Both prices are 0: the budget cannot limit this model's calls."""
        return self.price_in_per_mtok == 0 and self.price_out_per_mtok == 0


#: Failure kinds that no retry and no other prompt can heal: the model is stopped for the run.
FATAL_KINDS = ("auth", "forbidden", "model_not_found", "unsupported_parameter", "context_length", "quota")
_FATAL_TAG_RE = re.compile(r"\[fatal:(\w+)\]")


@dataclass(frozen=True)
class LLMCall:
    """One ``complete`` call, successful or not, with everything the store keeps.

    ``response`` is the answer text ("" when none came; reasoning text the endpoint returns
    separately, ``reasoning_content``, is never part of it); ``error`` is ``None`` on success,
    else a one-line reason (the last attempt's failure). ``tokens_*`` and ``cost`` sum over
    all attempts, including attempts that timed out or came without a usage report: those
    are estimated (~4 characters a token of what was sent and streamed) and
    ``usage_estimated`` is set. ``reasoning_tokens`` is the part of ``tokens_out`` spent on
    reasoning when known. ``cached`` marks calls answered by a replay client.

    A failure no retry can heal (bad key, unknown model, a parameter the model rejects, a
    prompt over the context window, no quota) carries ``[fatal:<kind>]`` in ``error``, so
    the stored row (and a replay of it) says so too: see :attr:`fatal`.
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

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def fatal(self) -> str | None:
        """The :data:`FATAL_KINDS` entry of a failure that cannot heal, else None."""
        m = _FATAL_TAG_RE.search(self.error or "")
        return m.group(1) if m else None

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
        }


#: Receives every LLMCall a client returns (the engine stores them in ``llm_calls``).
CallSink = Callable[[LLMCall], None]


class ChatClient(Protocol):
    """What :class:`mutators.llm.LLMMutator` needs: :class:`LLMClient` or a replay client."""

    def complete(
        self, messages: Sequence[dict[str, str]], *, model: ModelSpec, kind: str = ""
    ) -> LLMCall:  # pragma: no cover - protocol
        ...


def _norm_messages(messages: Sequence[dict[str, str]]) -> tuple[dict[str, str], ...]:
    out = []
    for i, m in enumerate(messages):
        if "role" not in m or "content" not in m:
            raise ValueError(f"message {i} needs 'role' and 'content' keys, got {sorted(m)}")
        out.append({"role": str(m["role"]), "content": str(m["content"])})
    return tuple(out)


def canonical_messages(messages: Sequence[dict[str, str]]) -> str:
    """The one JSON spelling of a message list (role + content only, sorted keys)."""
    return json.dumps(list(_norm_messages(messages)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_hash(messages: Sequence[dict[str, str]], model: str) -> str:
    """sha256 of the canonical messages and the endpoint's model id: the record/replay key."""
    h = hashlib.sha256()
    h.update(model.encode("utf-8"))
    h.update(b"\0")
    h.update(canonical_messages(messages).encode("utf-8"))
    return h.hexdigest()


class Budget:
    """A USD budget shared by every client of a run (thread-safe).

    ``check()`` raises :class:`BudgetExhausted` once ``spent >= max_usd``; calls already on
    the wire when it runs out are still charged, so a run may end slightly above the budget
    (by at most ``concurrency`` calls). ``max_usd=None`` means unlimited (still counted).
    """

    def __init__(self, max_usd: float | None = None, spent: float = 0.0) -> None:
        if max_usd is not None and max_usd < 0:
            raise ValueError(f"Budget(max_usd={max_usd}): must be >= 0 or None for unlimited")
        self.max_usd = max_usd
        self._spent = float(spent)
        self._lock = threading.Lock()

    @property
    def spent(self) -> float:
        with self._lock:
            return self._spent

    @property
    def remaining(self) -> float | None:
        if self.max_usd is None:
            return None
        return max(0.0, self.max_usd - self.spent)

    @property
    def exhausted(self) -> bool:
        return self.max_usd is not None and self.spent >= self.max_usd

    def check(self) -> None:
        if self.exhausted:
            raise BudgetExhausted(
                f"LLM budget spent: ${self.spent:.4f} of ${self.max_usd:.4f}; raise llm.budget_usd "
                "to continue proposing LLM children"
            )

    def charge(self, usd: float) -> None:
        with self._lock:
            self._spent += max(0.0, float(usd))


class _Retryable(Exception):
    """One failed attempt that may succeed when repeated; ``wait_s`` overrides the backoff."""

    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait_s = wait_s


class _Fatal(Exception):
    """One failed attempt that repeating cannot fix (4xx other than 429, oversize answer)."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(reason)
        self.text = text


@dataclass
class _Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    reasoning: int = 0
    estimated: bool = False


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


def _retry_after_seconds(headers: Any) -> float | None:
    if headers is None:
        return None
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return None  # HTTP-date form: fall back to our own backoff


def _is_transport(exc: BaseException, name: str) -> bool:
    """``exc`` is an httpx exception of class ``name`` (``TimeoutException``, ``TransportError``).

    By class name, so it holds for whichever httpx distribution the ``openai`` package uses
    (``httpx`` or ``httpx2``); such exceptions escape the SDK while a stream is read.
    """
    return any(c.__name__ == name and c.__module__.split(".")[0].startswith("httpx") for c in type(exc).__mro__)


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
        return "context_length", False, detail
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
    "context_length": "the prompt and max_output_tokens exceed the model's window: set context_tokens to the "
                      "window the endpoint reports (prompts are then trimmed to fit) or lower max_output_tokens",
    "quota": "the account has no quota left: add credit or switch the model off (weight = 0)",
}


class LLMClient:
    """Chat completions against OpenAI-compatible endpoints (see module docstring).

    ``timeout_s`` bounds each attempt (connect + read; for a streamed answer, the wait for
    each chunk) unless the model sets its own ``timeout_s``; ``max_attempts`` counts the
    first try; ``max_response_bytes`` caps an answer (a larger one is a failed call whose
    stored response is truncated to the cap). ``concurrency`` caps requests on the wire
    over all models; a model's own ``concurrency`` caps its requests further. ``rng`` draws
    the backoff jitter; ``sleep`` is the wait function (tests may pass one that records
    waits). ``models`` is optional: passing them checks their keys up front, so a
    misconfiguration fails at start, not mid-run, and warns once per model whose prices are
    0 while a budget is set (the budget cannot limit it).
    """

    def __init__(
        self,
        models: Sequence[ModelSpec] = (),
        *,
        timeout_s: float = 120.0,
        max_attempts: int = 4,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        jitter: float = 0.5,
        retry_after_max_s: float = 120.0,
        concurrency: int = 4,
        max_response_bytes: int = 256 * 1024,
        budget: Budget | None = None,
        sink: CallSink | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts={max_attempts}: must be >= 1")
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency}: must be >= 1")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s}: must be > 0")
        self.timeout_s = float(timeout_s)
        self.max_attempts = int(max_attempts)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.jitter = float(jitter)
        self.retry_after_max_s = float(retry_after_max_s)
        self.max_response_bytes = int(max_response_bytes)
        self.budget = budget if budget is not None else Budget(None)
        self.sink = sink
        self._rng = rng if rng is not None else random.Random(0)
        self._rng_lock = threading.Lock()
        self._sleep = sleep
        self._sem = threading.BoundedSemaphore(concurrency)
        self._model_sems: dict[str, threading.BoundedSemaphore] = {}
        self._clients: dict[tuple[str, str], openai.OpenAI] = {}
        self._clients_lock = threading.Lock()
        self._totals_lock = threading.Lock()
        self.calls = 0
        self.errors = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.cost = 0.0
        for m in models:
            m.api_key()  # raises LLMConfigError naming the unset variable
        if self.budget.max_usd is not None:
            for m in models:
                if m.free and m.weight > 0:
                    log.warning(
                        "model %r has price_in_per_mtok = price_out_per_mtok = 0, so llm.budget_usd = %g does not "
                        "limit its calls; set its prices (USD per million tokens), or ignore this for a free "
                        "local model", m.name, self.budget.max_usd)

    # ---- public ------------------------------------------------------------------------

    def complete(
        self, messages: Sequence[dict[str, str]], *, model: ModelSpec, kind: str = ""
    ) -> LLMCall:
        """Send one chat completion (with retries); see the module docstring for the contract."""
        msgs = _norm_messages(messages)
        phash = prompt_hash(msgs, model.model)
        self.budget.check()
        client = self._client_for(model)
        usage = _Usage()
        started = time.monotonic()
        error: str | None = None
        text = ""
        finish: str | None = None
        attempt = 0
        model_sem = self._model_sem(model)
        while True:
            attempt += 1
            try:
                with model_sem, self._sem:
                    text, finish = self._attempt(client, msgs, model, usage)
                error = None
                break
            except _Fatal as exc:
                error = str(exc)
                text = exc.text
                log.warning("LLM %s attempt %d failed (not retried): %s", model.name, attempt, error)
                break
            except _Retryable as exc:
                error = exc.reason
                if attempt >= self.max_attempts:
                    log.warning("LLM %s attempt %d failed, giving up: %s", model.name, attempt, error)
                    error = f"{error} (gave up after {attempt} attempts)"
                    break
                wait = self._backoff(attempt) if exc.wait_s is None else min(exc.wait_s, self.retry_after_max_s)
                log.info("LLM %s attempt %d failed: %s; retrying in %.2fs", model.name, attempt, error, wait)
                self._sleep(wait)
        cost = model.cost(usage.tokens_in, usage.tokens_out)
        self.budget.charge(cost)
        call = LLMCall(
            model=model.name,
            prompt_hash=phash,
            messages=msgs,
            response=text,
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost=cost,
            latency_s=time.monotonic() - started,
            error=error,
            attempts=attempt,
            finish_reason=finish,
            kind=kind,
            reasoning_tokens=usage.reasoning,
            usage_estimated=usage.estimated,
        )
        with self._totals_lock:
            self.calls += 1
            self.errors += 0 if call.ok else 1
            self.tokens_in += call.tokens_in
            self.tokens_out += call.tokens_out
            self.cost += call.cost
        if self.sink is not None:
            self.sink(call)
        return call

    def probe(self, model: ModelSpec, *, max_output_tokens: int = 32) -> LLMCall:
        """One tiny request ("Reply with OK.") with ``model``'s own request settings and a
        small output cap: whether the endpoint takes them (``evo search --dry-run``).

        One attempt, no retries; not charged to the budget and not handed to the sink (a
        check, not a search call). The returned call's ``error`` is the endpoint's one-line
        answer when it failed (``[fatal:<kind>]`` for a setting that can never work).
        """
        spec = dataclasses.replace(model, max_output_tokens=max(1, min(max_output_tokens, model.max_output_tokens)),
                                   context_tokens=None)
        msgs = _norm_messages([{"role": "user", "content": "Reply with OK."}])
        usage = _Usage()
        started = time.monotonic()
        error, text, finish = None, "", None
        try:
            with self._sem:
                text, finish = self._attempt(self._client_for(spec), msgs, spec, usage)
        except (_Fatal, _Retryable) as exc:
            error = str(exc)
        return LLMCall(model=model.name, prompt_hash=prompt_hash(msgs, model.model), messages=msgs, response=text,
                       tokens_in=usage.tokens_in, tokens_out=usage.tokens_out,
                       cost=model.cost(usage.tokens_in, usage.tokens_out), latency_s=time.monotonic() - started,
                       error=error, finish_reason=finish, kind="probe", usage_estimated=usage.estimated)

    def totals(self) -> dict[str, Any]:
        """Calls, errors, tokens and USD spent through this client."""
        with self._totals_lock:
            return {
                "n_calls": self.calls,
                "n_errors": self.errors,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "cost": self.cost,
            }

    def close(self) -> None:
        """Close the HTTP connection pools (the client stays usable; pools reopen on demand)."""
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    # ---- internals -----------------------------------------------------------------------

    def _client_for(self, model: ModelSpec) -> openai.OpenAI:
        key = model.api_key()
        ck = (model.base_url, key)
        with self._clients_lock:
            c = self._clients.get(ck)
            if c is None:
                c = openai.OpenAI(base_url=model.base_url, api_key=key, timeout=self.timeout_s, max_retries=0)
                self._clients[ck] = c
            return c

    def _model_sem(self, model: ModelSpec) -> Any:
        if model.concurrency is None:
            return contextlib.nullcontext()
        with self._clients_lock:
            sem = self._model_sems.get(model.name)
            if sem is None:
                sem = self._model_sems[model.name] = threading.BoundedSemaphore(model.concurrency)
            return sem

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))
        with self._rng_lock:
            j = self._rng.random()
        return base * (1.0 + self.jitter * j)

    def _attempt(
        self, client: openai.OpenAI, msgs: tuple[dict[str, str], ...], model: ModelSpec, usage: _Usage
    ) -> tuple[str, str | None]:
        fields = model.request_fields()
        extra = {k: v for k, v in fields.items() if k not in ("model", "stream")}
        timeout = model.timeout_s if model.timeout_s is not None else self.timeout_s
        if model.stream:
            return self._attempt_stream(client, msgs, model, extra, timeout, usage)
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model.model, messages=list(msgs), extra_body=extra, timeout=timeout,  # type: ignore[arg-type]
            )
            body = raw.http_response.text
        except Exception as exc:
            self._charge_unanswered(exc, msgs, "", "", usage)
            raise self._translate(exc, timeout) from None
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _Retryable(f"invalid JSON in response body ({exc.msg} at {exc.pos}): {body[:120]!r}") from None
        if not isinstance(data, dict):
            raise _Retryable(f"response body is JSON but not an object: {body[:120]!r}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            if "error" in data:
                raise _Retryable(f"endpoint error: {str(data['error'])[:300]}")
            raise _Retryable(f"response has no choices: {body[:120]!r}")
        msg = choices[0].get("message") or {}
        msg = msg if isinstance(msg, dict) else {}
        text = msg.get("content")
        text = text if isinstance(text, str) else ""
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        reasoning = reasoning if isinstance(reasoning, str) else ""
        self._account(data.get("usage"), msgs, text, reasoning, usage)
        finish = choices[0].get("finish_reason")
        self._check_size(text)
        return text, finish if isinstance(finish, str) else None

    def _attempt_stream(self, client: openai.OpenAI, msgs: tuple[dict[str, str], ...], model: ModelSpec,
                        extra: dict[str, Any], timeout: float, usage: _Usage) -> tuple[str, str | None]:
        """One streamed attempt: collect the chunks; a failure mid-stream charges what was
        sent and streamed so far (estimated) and is retried like any other."""
        parts: list[str] = []
        thoughts: list[str] = []
        nbytes = 0
        finish: str | None = None
        reported: Any = None
        stream = None
        try:
            stream = client.chat.completions.create(
                model=model.model, messages=list(msgs), stream=True, extra_body=extra, timeout=timeout,  # type: ignore[arg-type]
            )
            for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    reported = chunk.usage.model_dump() if hasattr(chunk.usage, "model_dump") else chunk.usage
                for ch in chunk.choices or ():
                    delta = ch.delta
                    if delta is not None:
                        if delta.content:
                            parts.append(delta.content)
                            nbytes += len(delta.content.encode("utf-8"))
                        extra_fields = getattr(delta, "model_extra", None) or {}
                        th = extra_fields.get("reasoning_content") or extra_fields.get("reasoning")
                        if isinstance(th, str):
                            thoughts.append(th)
                    if ch.finish_reason:
                        finish = ch.finish_reason
                if nbytes > self.max_response_bytes:
                    break
        except Exception as exc:
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
            self._charge_unanswered(exc, msgs, "".join(parts), "".join(thoughts), usage)
            raise self._translate(exc, timeout, streamed=len(parts)) from None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        text = "".join(parts)
        self._account(reported, msgs, text, "".join(thoughts), usage)
        self._check_size(text)
        return text, finish

    def _account(self, reported: Any, msgs: Sequence[dict[str, str]], text: str, reasoning: str,
                 usage: _Usage) -> None:
        """Add an answered attempt's usage: the endpoint's report, else an estimate."""
        if isinstance(reported, dict) and (reported.get("prompt_tokens") or reported.get("completion_tokens")):
            usage.tokens_in += int(reported.get("prompt_tokens") or 0)
            usage.tokens_out += int(reported.get("completion_tokens") or 0)
            details = reported.get("completion_tokens_details") or {}
            if isinstance(details, dict):
                usage.reasoning += int(details.get("reasoning_tokens") or 0)
            return
        usage.tokens_in += estimate_tokens(msgs)
        r = estimate_tokens(reasoning)
        usage.tokens_out += estimate_tokens(text) + r
        usage.reasoning += r
        usage.estimated = True

    def _charge_unanswered(self, exc: BaseException, msgs: Sequence[dict[str, str]], text: str, reasoning: str,
                           usage: _Usage) -> None:
        """A timed-out (or cut) attempt was still processed by the endpoint: charge the
        prompt and what was streamed, estimated. Refused connections, HTTP errors: nothing."""
        cut = (isinstance(exc, openai.APITimeoutError) or _is_transport(exc, "TimeoutException")) or (
            bool(text or reasoning) and (isinstance(exc, openai.APIConnectionError) or _is_transport(exc, "TransportError")))
        if not cut:
            return
        usage.tokens_in += estimate_tokens(msgs)
        r = estimate_tokens(reasoning)
        usage.tokens_out += estimate_tokens(text) + r
        usage.reasoning += r
        usage.estimated = True

    def _check_size(self, text: str) -> None:
        nbytes = len(text.encode("utf-8"))
        if nbytes > self.max_response_bytes:
            raise _Fatal(
                f"response too large: {nbytes} bytes > cap {self.max_response_bytes} "
                "(raise llm.max_response_kb or lower max_output_tokens)",
                text.encode("utf-8")[: self.max_response_bytes].decode("utf-8", "ignore"),
            )

    def _translate(self, exc: BaseException, timeout: float, streamed: int = 0) -> Exception:
        """An exception of the SDK / httpx as a :class:`_Retryable` or :class:`_Fatal`."""
        where = f" after {streamed} streamed chunks" if streamed else ""
        if (isinstance(exc, openai.APITimeoutError) or _is_transport(exc, "TimeoutException")):
            return _Retryable(f"timeout after {timeout:g}s{where}")
        if isinstance(exc, openai.APIStatusError):
            code = exc.status_code
            body = exc.response.text if exc.response is not None else ""
            fatal, retryable, detail = classify_http_error(code, body)
            if code == 429 and retryable:
                wait = _retry_after_seconds(exc.response.headers)
                note = "" if wait is None else f" (Retry-After {wait:g}s)"
                return _Retryable(f"HTTP 429 rate limited{note}: {detail}", wait)
            if retryable:
                return _Retryable(f"HTTP {code}: {detail}")
            if fatal is not None:
                return _Fatal(f"HTTP {code} [fatal:{fatal}] (not retried): {detail}")
            return _Fatal(f"HTTP {code} (not retried): {detail}")
        if isinstance(exc, openai.APIConnectionError):
            return _Retryable(f"connection error{where}: {exc.__cause__ or exc}")
        if _is_transport(exc, "TransportError"):
            return _Retryable(f"connection broken{where}: {type(exc).__name__}: {exc}")
        if isinstance(exc, openai.APIError):  # e.g. a 200 whose body the SDK could not read, an SSE error event
            return _Retryable(f"API error{where}: {exc}")
        if isinstance(exc, (json.JSONDecodeError, ValueError)):
            return _Retryable(f"unreadable stream chunk{where}: {exc}")
        raise exc
