"""A chat-completions client for any OpenAI-compatible endpoint, with observable retries.

:class:`LLMClient` talks to OpenAI, vLLM, Ollama, a llama.cpp server or the local
:mod:`mutators.fake_server` through the ``openai`` package (``base_url`` + ``model`` + a key
read from the environment variable a :class:`ModelSpec` names). The ``openai`` client is built
with ``max_retries=0``: retries happen here so that every attempt, wait and failure is visible
in the returned :class:`LLMCall` and in the logs.

Contract of :meth:`LLMClient.complete`:

- it returns an :class:`LLMCall` for every outcome. A call that failed after all attempts
  (timeouts, 5xx, 429, connection errors, a body that is not JSON, a non-retryable 4xx, an
  answer over the size cap) is an ``LLMCall`` with ``error`` set, never an exception: a
  failed call is data the engine stores;
- it raises only :class:`BudgetExhausted` (the shared :class:`Budget` is spent; raised
  *before* anything is sent, so the engine stops proposing) and :class:`LLMConfigError`
  (a misconfigured model, e.g. its key variable is unset);
- every returned call is also handed to the ``sink`` (the engine writes it to ``llm_calls``);
- at most ``concurrency`` requests are on the wire at once (a bounded semaphore), so the
  client can be shared by threads.

Retry policy: 429 (waits the ``Retry-After`` seconds when the header is given, capped at
``retry_after_max_s``), 5xx, connection errors, timeouts and invalid JSON are retried up to
``max_attempts`` attempts in total, with exponential backoff ``backoff_base_s * 2**(k-1)``
(capped at ``backoff_max_s``) stretched by a jitter factor in ``[1, 1 + jitter)`` drawn from
the injected ``random.Random``. Other 4xx answers (bad request, auth, unknown model) are not
retried: sending the same request again cannot fix them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence
from urllib.parse import urlparse

import openai

__all__ = [
    "ModelSpec",
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


class BudgetExhausted(RuntimeError):
    """The run's LLM budget is spent; raised before a request is sent.

    The engine catches it and stops proposing LLM children (in-flight work drains).
    """


@dataclass(frozen=True)
class ModelSpec:
    """One model behind one endpoint, as the ``[[llm.models]]`` config entries describe it.

    ``name`` is the label recorded on candidates (``llm:<name>``) and in ``llm_calls``;
    ``model`` is the id the endpoint knows (``gpt-4.1``, ``Qwen/Qwen2.5-Coder-32B``...);
    ``key_env`` names the environment variable holding the API key (never the key itself).
    Prices are USD per million tokens; ``weight`` is the bandit's prior preference (0 turns
    the model off).
    """

    name: str
    base_url: str
    model: str
    key_env: str = "OPENAI_API_KEY"
    weight: float = 1.0
    price_in_per_mtok: float = 0.0
    price_out_per_mtok: float = 0.0
    max_tokens: int = 4096
    temperature: float = 0.7

    def __post_init__(self) -> None:
        if not self.name:
            raise LLMConfigError("ModelSpec.name is empty; give every model a short label")
        parsed = urlparse(self.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise LLMConfigError(
                f"model {self.name!r}: base_url={self.base_url!r} is not an http(s) URL "
                "(e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1)"
            )
        for fname in ("weight", "price_in_per_mtok", "price_out_per_mtok"):
            if getattr(self, fname) < 0:
                raise LLMConfigError(f"model {self.name!r}: {fname}={getattr(self, fname)} must be >= 0")
        if self.max_tokens < 1:
            raise LLMConfigError(f"model {self.name!r}: max_tokens={self.max_tokens} must be >= 1")

    @property
    def is_local(self) -> bool:
        """True for endpoints on this machine, which may run without an API key."""
        return (urlparse(self.base_url).hostname or "") in _LOCAL_HOSTS

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


@dataclass(frozen=True)
class LLMCall:
    """One ``complete`` call, successful or not, with everything the store keeps.

    ``response`` is the answer text ("" when none came); ``error`` is ``None`` on success,
    else a one-line reason (the last attempt's failure). ``tokens_*`` and ``cost`` sum over
    all attempts that reported usage. ``cached`` marks calls answered by a replay client.
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

    @property
    def ok(self) -> bool:
        return self.error is None

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


@dataclass
class _Usage:
    tokens_in: int = 0
    tokens_out: int = 0


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


class LLMClient:
    """Chat completions against OpenAI-compatible endpoints (see module docstring).

    ``timeout_s`` bounds each attempt (connect + read); ``max_attempts`` counts the first
    try; ``max_response_bytes`` caps an answer (a larger one is a failed call whose stored
    response is truncated to the cap). ``rng`` draws the backoff jitter; ``sleep`` is the
    wait function (tests may pass one that records waits). ``models`` is optional: passing
    them checks their keys up front so a misconfiguration fails at start, not mid-run.
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
        while True:
            attempt += 1
            try:
                with self._sem:
                    text, finish = self._attempt(client, msgs, model, usage)
                error = None
                break
            except _Fatal as exc:
                error = str(exc)
                text = getattr(exc, "text", "")
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

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))
        with self._rng_lock:
            j = self._rng.random()
        return base * (1.0 + self.jitter * j)

    def _attempt(
        self, client: openai.OpenAI, msgs: tuple[dict[str, str], ...], model: ModelSpec, usage: _Usage
    ) -> tuple[str, str | None]:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model.model,
                messages=list(msgs),  # type: ignore[arg-type]
                max_tokens=model.max_tokens,
                temperature=model.temperature,
            )
            body = raw.http_response.text
        except openai.APITimeoutError:
            raise _Retryable(f"timeout after {self.timeout_s:g}s") from None
        except openai.APIConnectionError as exc:
            raise _Retryable(f"connection error: {exc.__cause__ or exc}") from None
        except openai.RateLimitError as exc:
            wait = _retry_after_seconds(exc.response.headers)
            raise _Retryable(f"HTTP 429 rate limited{'' if wait is None else f' (Retry-After {wait:g}s)'}", wait) from None
        except openai.APIStatusError as exc:
            code = exc.status_code
            detail = (exc.response.text or "")[:300].replace("\n", " ")
            if code >= 500 or code in (408, 409):
                raise _Retryable(f"HTTP {code}: {detail}") from None
            raise _Fatal(f"HTTP {code} (not retried): {detail}") from None
        except openai.APIError as exc:  # e.g. a 200 whose body the SDK could not read
            raise _Retryable(f"API error: {exc}") from None
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _Retryable(f"invalid JSON in response body ({exc.msg} at {exc.pos}): {body[:120]!r}") from None
        if not isinstance(data, dict):
            raise _Retryable(f"response body is JSON but not an object: {body[:120]!r}")
        u = data.get("usage") or {}
        if isinstance(u, dict):
            usage.tokens_in += int(u.get("prompt_tokens") or 0)
            usage.tokens_out += int(u.get("completion_tokens") or 0)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            if "error" in data:
                raise _Retryable(f"endpoint error: {str(data['error'])[:300]}")
            raise _Retryable(f"response has no choices: {body[:120]!r}")
        msg = choices[0].get("message") or {}
        text = msg.get("content") if isinstance(msg, dict) else None
        text = text if isinstance(text, str) else ""
        finish = choices[0].get("finish_reason")
        nbytes = len(text.encode("utf-8"))
        if nbytes > self.max_response_bytes:
            exc = _Fatal(
                f"response too large: {nbytes} bytes > cap {self.max_response_bytes} "
                "(raise llm.max_response_kb or lower max_tokens)"
            )
            exc.text = text.encode("utf-8")[: self.max_response_bytes].decode("utf-8", "ignore")  # type: ignore[attr-defined]
            raise exc
        return text, finish if isinstance(finish, str) else None
