"""A client for any OpenAI-compatible endpoint (chat completions, or OpenAI's Responses
API), with observable retries.

:class:`LLMClient` talks to OpenAI, vLLM, Ollama, a llama.cpp server or the local
:mod:`mutators.llm.replay.fake_server` through the ``openai`` package (``base_url`` + ``model`` + a key
read from the environment variable a :class:`ModelSpec` names). The ``openai`` client is built
with ``max_retries=0``: retries happen here so that every attempt, wait and failure is visible
in the returned :class:`LLMCall` and in the logs. What a request carries is
:meth:`ModelSpec.request_fields` for chat completions (``max_output_tokens`` as ``max_tokens``
or ``max_completion_tokens``, sampling fields only when set, ``extra_body`` passthrough,
streaming) and :func:`mutators.llm.client.responses.responses_body` for the Responses API.

Which API (:meth:`LLMClient.api_for`): the model's ``api``; for ``auto``, chat completions
until the endpoint answers a chat request with "only supported in v1/responses" (404, or
400): the same request then goes to the Responses API at once (not counted as a retry) and
every later request of that model goes there. A model pinned to ``chat`` gets a
``[fatal:wrong_api]`` call instead, naming the fix.

Contract of :meth:`LLMClient.complete`:

- it returns an :class:`LLMCall` for every outcome. A call that failed after all attempts
  (timeouts, 5xx, 429, connection errors, a body that is not JSON, a non-retryable 4xx, an
  answer over the size cap) is an ``LLMCall`` with ``error`` set, never an exception: a
  failed call is data the engine stores. A failure that cannot heal is tagged
  ``[fatal:<kind>]`` in ``error`` (:data:`mutators.llm.client.calls.FATAL_KINDS`; :func:`classify_http_error`), so
  the caller can stop that model (:mod:`mutators.llm.client.health`);
- it raises only :class:`mutators.llm.client.budget.BudgetExhausted` (the shared
  :class:`mutators.llm.client.budget.Budget` has no room for the request's worst case;
  raised *before* anything is sent, so the engine stops proposing) and
  :class:`mutators.llm.client.model_spec.LLMConfigError` (a misconfigured model, e.g. its
  key variable is unset). Each attempt reserves its worst case (:meth:`worst_cost`) before
  it is sent and settles it with its cost after; a retry the budget has no room for is not
  sent (the call fails, saying so);
- every returned call is also handed to the ``sink`` (the engine writes it to ``llm_calls``,
  with its finish reason, reasoning and cached tokens, retries and request settings);
- at most ``concurrency`` requests are on the wire at once (a bounded semaphore; a model's
  own ``concurrency`` caps it further), so the client can be shared by threads;
- costs count every attempt the endpoint processed: the reported usage (cached prompt
  tokens at the model's cached-input price), or, for an attempt that timed out (or was cut
  mid-stream) and for an answer without a usage report, an estimate from the characters
  sent and received (:func:`estimate_tokens`);
- the answer is ``message.content`` (Responses API: the ``output_text`` parts) only;
  ``reasoning_content`` (vLLM, DeepSeek) and reasoning summaries are counted for cost when
  no usage is reported and never returned as the answer.

Retry policy: 429 (waits ``retry-after-ms`` / ``Retry-After`` when the server gives it,
capped at ``retry_after_max_s``; a 429 for an exhausted quota is fatal), 5xx, 408, 409,
connection errors, timeouts, broken streams and invalid JSON are retried up to
``max_attempts`` attempts in total, with exponential backoff ``backoff_base_s * 2**(k-1)``
(capped at ``backoff_max_s``) stretched by a jitter factor in ``[1, 1 + jitter)`` drawn from
the injected ``random.Random``; the wait holds no reservation and no slot on the wire.
Attempts the endpoint processed without answering (a timeout, a stream cut mid-way) of a
reasoning model (``ModelSpec.reasoning_model``) are retried at most
:data:`REASONING_COSTLY_RETRIES` time: each pays for the whole prompt and reasoning again.
Other 4xx answers (bad request, auth, unknown model) are not retried: sending the same
request again cannot fix them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import openai

from mutators.llm.client.budget import Budget, BudgetExhausted
from mutators.llm.client.calls import CallSink, LLMCall, estimate_tokens, norm_messages, prompt_hash
from mutators.llm.client.http_errors import classify_http_error, context_overflow, responses_only, retry_after_seconds
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.client.responses import read_response, responses_body

__all__ = ["LLMClient", "REASONING_COSTLY_RETRIES"]

log = logging.getLogger(__name__)

#: Retries of a reasoning model's call after attempts the endpoint processed but did not
#: answer (a timeout, a stream cut mid-way): each pays for the whole prompt and the reasoning
#: again, so such a call is retried at most this often (other failures: ``max_attempts``).
REASONING_COSTLY_RETRIES = 1


class _Retryable(Exception):
    """One failed attempt that may succeed when repeated; ``wait_s`` overrides the backoff;
    ``costly``: the endpoint processed the prompt (a timeout, a stream cut mid-way), so a
    retry pays for it again."""

    def __init__(self, reason: str, wait_s: float | None = None, costly: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait_s = wait_s
        self.costly = costly


class _WrongApi(Exception):
    """The server serves this model only through the Responses API (its 404/400 answer)."""


class _Fatal(Exception):
    """One failed attempt that repeating cannot fix (4xx other than 429, oversize answer)."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(reason)
        self.text = text


class _TooLarge(Exception):
    """The endpoint refused the prompt as over its window; ``window`` / ``prompt`` as it said."""

    def __init__(self, reason: str, window: int | None, prompt: int | None) -> None:
        super().__init__(reason)
        self.window = window
        self.prompt = prompt


@dataclass
class _Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    reasoning: int = 0
    cached: int = 0
    estimated: bool = False

    def add(self, tokens_in: int, tokens_out: int, reasoning: int = 0, cached: int = 0) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.reasoning += reasoning
        self.cached += cached

    def cost(self, model: ModelSpec) -> float:
        return model.cost(self.tokens_in, self.tokens_out, self.cached)



def estimate_prompt_tokens_safe(msgs: Sequence[dict[str, str]]) -> int:
    """A prompt's tokens when the endpoint did not count them: 3 characters a token (errs high)."""
    return sum(len(m.get("content", "")) // 3 + 8 for m in msgs)


def _no_version(base_url: str) -> bool:
    """``base_url``'s path has no API version segment (``/v1``, ``/v1beta``, ``/openai/v1``...)."""
    from urllib.parse import urlparse

    path = urlparse(base_url).path if base_url else ""
    return bool(base_url) and not re.search(r"/v\d+[a-z0-9]*(?:/|$)", path)


def _is_transport(exc: BaseException, name: str) -> bool:
    """``exc`` is an httpx exception of class ``name`` (``TimeoutException``, ``TransportError``).

    By class name, so it holds for whichever httpx distribution the ``openai`` package uses
    (``httpx`` or ``httpx2``); such exceptions escape the SDK while a stream is read.
    """
    return any(c.__name__ == name and c.__module__.split(".")[0].startswith("httpx") for c in type(exc).__mro__)



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
        #: Context windows endpoints reported in context-length answers, by model name.
        self.windows: dict[str, int] = {}
        #: ``api = "auto"`` models the endpoint said are served only by the Responses API.
        self._apis: dict[str, str] = {}
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
        self, messages: Sequence[dict[str, str]], *, model: ModelSpec, kind: str = "", key: str = ""
    ) -> LLMCall:
        """Send one request (with retries); see the module docstring for the contract."""
        msgs = norm_messages(messages)
        phash = prompt_hash(msgs, model.model)
        self.budget.check(self.worst_cost(msgs, model))
        client = self._client_for(model)
        usage = _Usage()
        started = time.monotonic()
        error: str | None = None
        text = ""
        finish: str | None = None
        attempt = 0
        free = 0  # attempts that do not count against max_attempts (the switch to the Responses API)
        costly_retries = 0
        model_sem = self._model_sem(model)
        sent = model
        resent = False
        api = self.api_for(model)
        while True:
            attempt += 1
            pause: float | None = None
            before = dataclasses.replace(usage)
            try:
                held = self.budget.reserve(self.worst_cost(msgs, sent))
            except BudgetExhausted as exc:
                if attempt == 1:
                    raise
                error = f"{error} (not retried: {exc})"
                attempt -= 1
                break
            try:
                with model_sem, self._sem:
                    text, finish = self._attempt(client, msgs, sent, usage, api)
                error = None
                break
            except _WrongApi as exc:
                if model.api == "auto" and api == "chat":
                    with self._totals_lock:
                        self._apis[model.name] = "responses"
                    log.warning("LLM %s: the endpoint serves model %r only through the Responses API (%s); "
                                "switching this model to it (set api = \"responses\" to skip this request)",
                                model.name, model.model, exc)
                    api = "responses"
                    free += 1
                    continue
                error = f"HTTP 404 [fatal:wrong_api] (not retried): {exc}"
                log.warning("LLM %s attempt %d failed (not retried): %s", model.name, attempt, error)
                break
            except _TooLarge as exc:
                if exc.window is not None:
                    with self._totals_lock:
                        self.windows[model.name] = min(self.windows.get(model.name, exc.window), exc.window)
                room = self._room(exc, msgs, sent)
                if not resent and room is not None:
                    log.info("LLM %s: prompt over the %s-token window with max_output_tokens %d; resending once "
                             "with %d", model.name, exc.window, sent.max_output_tokens, room)
                    sent = dataclasses.replace(sent, max_output_tokens=room)
                    resent = True
                    continue
                error = (f"{exc} [too_large]" + (f" window {exc.window} tokens" if exc.window else "") +
                         (f"; prompt {exc.prompt} tokens" if exc.prompt else "") +
                         "; not stopped: later prompts are sized to the window")
                log.warning("LLM %s attempt %d: prompt too large (not retried): %s", model.name, attempt, error)
                break
            except _Fatal as exc:
                error = str(exc)
                text = exc.text
                log.warning("LLM %s attempt %d failed (not retried): %s", model.name, attempt, error)
                break
            except _Retryable as exc:
                error = exc.reason
                if attempt - free >= self.max_attempts:
                    log.warning("LLM %s attempt %d failed, giving up: %s", model.name, attempt, error)
                    error = f"{error} (gave up after {attempt} attempts)"
                    break
                if exc.costly and model.reasoning_model:
                    if costly_retries >= REASONING_COSTLY_RETRIES:
                        error = (f"{error} (gave up after {attempt} attempts: a reasoning model's call that timed out "
                                 f"is retried at most {REASONING_COSTLY_RETRIES} time, each retry paying for the "
                                 "whole prompt again; raise timeout_s or lower reasoning_effort)")
                        log.warning("LLM %s attempt %d failed, giving up: %s", model.name, attempt, error)
                        break
                    costly_retries += 1
                wait = self._backoff(attempt - free) if exc.wait_s is None else min(exc.wait_s, self.retry_after_max_s)
                log.info("LLM %s attempt %d failed: %s; retrying in %.2fs", model.name, attempt, error, wait)
                pause = wait
            finally:
                spent = _Usage(usage.tokens_in - before.tokens_in, usage.tokens_out - before.tokens_out,
                               cached=usage.cached - before.cached).cost(model)
                self.budget.settle(held, spent)
            if pause is not None:
                self._sleep(pause)  # holding no reservation and no slot on the wire
        cost = usage.cost(model)
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
            attempt_key=key,
            cached_tokens=usage.cached,
            api=api,
            max_output_tokens=sent.max_output_tokens,
            reasoning_effort=sent.reasoning_effort,
            timeout_s=self._timeout(sent),
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

    def api_for(self, model: ModelSpec) -> str:
        """The API a request of ``model`` goes to now: ``chat`` or ``responses`` (``auto``
        is ``chat`` until the endpoint said the model is served only by the Responses API)."""
        if model.api != "auto":
            return model.api
        with self._totals_lock:
            return self._apis.get(model.name, "chat")

    @staticmethod
    def worst_cost(msgs: Sequence[dict[str, str]], model: ModelSpec) -> float:
        """USD a request of ``msgs`` to ``model`` costs at most: its prompt counted high (3
        characters a token, none of it cached) plus ``max_output_tokens``."""
        return model.cost(estimate_prompt_tokens_safe(msgs), model.max_output_tokens)

    def probe(self, model: ModelSpec, *, max_output_tokens: int = 32) -> LLMCall:
        """One tiny request ("Reply with OK.") with ``model``'s own request settings and a
        small output cap: whether the endpoint takes them (``evo search --dry-run``).

        One attempt, no retries (but for an ``api = "auto"`` model the endpoint says is
        served only by the Responses API: then once more there, and the client keeps using
        it); not charged to the budget and not handed to the sink (a check, not a search
        call). The returned call's ``error`` is the endpoint's one-line
        answer when it failed (``[fatal:<kind>]`` for a setting that can never work).
        """
        spec = dataclasses.replace(model, max_output_tokens=max(1, min(max_output_tokens, model.max_output_tokens)),
                                   context_tokens=None)
        msgs = norm_messages([{"role": "user", "content": "Reply with OK."}])
        usage = _Usage()
        started = time.monotonic()
        error, text, finish = None, "", None
        api, attempts = self.api_for(model), 1
        try:
            with self._sem:
                try:
                    text, finish = self._attempt(self._client_for(spec), msgs, spec, usage, api)
                except _WrongApi as exc:
                    if model.api != "auto":
                        raise _Fatal(f"HTTP 404 [fatal:wrong_api] (not retried): {exc}") from None
                    with self._totals_lock:
                        self._apis[model.name] = api = "responses"
                    attempts = 2
                    text, finish = self._attempt(self._client_for(spec), msgs, spec, usage, api)
        except (_Fatal, _Retryable, _TooLarge, _WrongApi) as exc:
            error = str(exc)
        return LLMCall(model=model.name, prompt_hash=prompt_hash(msgs, model.model), messages=msgs, response=text,
                       tokens_in=usage.tokens_in, tokens_out=usage.tokens_out, cost=usage.cost(model),
                       latency_s=time.monotonic() - started, error=error, finish_reason=finish, kind="probe",
                       usage_estimated=usage.estimated, attempts=attempts, api=api,
                       max_output_tokens=spec.max_output_tokens, reasoning_effort=spec.reasoning_effort,
                       timeout_s=self._timeout(spec), reasoning_tokens=usage.reasoning, cached_tokens=usage.cached)

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

    def window(self, name: str) -> int | None:
        """The context window model ``name``'s endpoint reported (a context-length answer), if any."""
        with self._totals_lock:
            return self.windows.get(name)

    @staticmethod
    def _room(exc: _TooLarge, msgs: Sequence[dict[str, str]], sent: ModelSpec) -> int | None:
        """``max_output_tokens`` for a resend that fits the reported window, or None when
        what is left is under an eighth of the configured output budget (or 256 tokens)."""
        if exc.window is None:
            return None
        prompt = exc.prompt if exc.prompt is not None else estimate_prompt_tokens_safe(msgs)
        room = exc.window - prompt - 16
        if room < min(sent.max_output_tokens, max(256, sent.max_output_tokens // 8)) or room >= sent.max_output_tokens:
            return None
        return room

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_base_s * (2 ** (attempt - 1)))
        with self._rng_lock:
            j = self._rng.random()
        return base * (1.0 + self.jitter * j)

    def _timeout(self, model: ModelSpec) -> float:
        """Seconds an attempt of ``model`` may take (its own ``timeout_s``, else the client's)."""
        return model.timeout_s if model.timeout_s is not None else self.timeout_s

    def _attempt(self, client: openai.OpenAI, msgs: tuple[dict[str, str], ...], model: ModelSpec, usage: _Usage,
                 api: str = "chat") -> tuple[str, str | None]:
        """One request to ``api`` (``chat`` or ``responses``): the answer text and finish reason."""
        if api == "responses":
            return self._attempt_responses(client, msgs, model, usage)
        fields = model.request_fields()
        extra = {k: v for k, v in fields.items() if k not in ("model", "stream")}
        timeout = self._timeout(model)
        if model.stream:
            return self._attempt_stream(client, msgs, model, extra, timeout, usage)
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model.model, messages=list(msgs), extra_body=extra, timeout=timeout,  # type: ignore[arg-type]
            )
            body = raw.http_response.text
        except Exception as exc:
            self._charge_unanswered(exc, msgs, "", "", usage)
            raise self._translate(exc, timeout, base_url=model.base_url) from None
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
            raise self._translate(exc, timeout, streamed=len(parts), base_url=model.base_url) from None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        text = "".join(parts)
        self._account(reported, msgs, text, "".join(thoughts), usage)
        self._check_size(text)
        return text, finish

    def _attempt_responses(self, client: openai.OpenAI, msgs: tuple[dict[str, str], ...], model: ModelSpec,
                           usage: _Usage) -> tuple[str, str | None]:
        """One Responses API attempt (:mod:`mutators.llm.client.responses`), streamed when the
        model streams; failures are charged and translated as for chat completions."""
        body = responses_body(msgs, model)
        extra = {k: v for k, v in body.items() if k not in ("model", "input", "stream")}
        timeout = self._timeout(model)
        parts: list[str] = []
        data: Any = None
        try:
            if model.stream:
                stream = client.responses.create(model=model.model, input=body["input"], stream=True,
                                                 extra_body=extra, timeout=timeout)  # type: ignore[arg-type]
                nbytes = 0
                try:
                    for event in stream:
                        typ = getattr(event, "type", "")
                        if typ == "response.output_text.delta":
                            parts.append(str(getattr(event, "delta", "") or ""))
                            nbytes += len(parts[-1].encode("utf-8"))
                            if nbytes > self.max_response_bytes:
                                break
                        elif typ in ("response.completed", "response.incomplete", "response.failed"):
                            resp = getattr(event, "response", None)
                            data = resp.model_dump() if hasattr(resp, "model_dump") else resp
                        elif typ == "error":
                            raise _Retryable(f"stream error event: {str(getattr(event, 'message', event))[:300]}",
                                             costly=True)
                finally:
                    with contextlib.suppress(Exception):
                        stream.close()
            else:
                raw = client.responses.with_raw_response.create(model=model.model, input=body["input"],
                                                                extra_body=extra, timeout=timeout)  # type: ignore[arg-type]
                text = raw.http_response.text
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise _Retryable(f"invalid JSON in response body ({exc.msg} at {exc.pos}): {text[:120]!r}") from None
        except _Retryable:
            if parts:
                self._estimate(msgs, "".join(parts), "", usage)
            raise
        except Exception as exc:
            self._charge_unanswered(exc, msgs, "".join(parts), "", usage)
            raise self._translate(exc, timeout, streamed=len(parts), base_url=model.base_url) from None
        if not isinstance(data, dict):
            if parts:  # a stream cut off here (over the size cap), or one that ended without its final event
                self._estimate(msgs, "".join(parts), "", usage)
                self._check_size("".join(parts))
                raise _Retryable(f"stream ended after {len(parts)} chunks without response.completed", costly=True)
            raise _Retryable(f"response body is not a Responses API object: {str(data)[:120]!r}")
        ans = read_response(data)
        reported = ans.usage
        if reported is not None:
            usage.add(reported["tokens_in"], reported["tokens_out"], reported["reasoning"], reported["cached"])
        else:
            self._estimate(msgs, ans.text or "".join(parts), ans.reasoning, usage)
        if ans.failed is not None:
            raise _Retryable(f"response failed: {ans.failed}")
        text = ans.text or "".join(parts)
        self._check_size(text)
        return text, ans.finish

    def _account(self, reported: Any, msgs: Sequence[dict[str, str]], text: str, reasoning: str,
                 usage: _Usage) -> None:
        """Add an answered attempt's usage: the endpoint's report, else an estimate."""
        if isinstance(reported, dict) and (reported.get("prompt_tokens") or reported.get("completion_tokens")):
            details = reported.get("completion_tokens_details") or {}
            pdetails = reported.get("prompt_tokens_details") or {}
            usage.add(int(reported.get("prompt_tokens") or 0), int(reported.get("completion_tokens") or 0),
                      int(details.get("reasoning_tokens") or 0) if isinstance(details, dict) else 0,
                      int(pdetails.get("cached_tokens") or 0) if isinstance(pdetails, dict) else 0)
            return
        self._estimate(msgs, text, reasoning, usage)

    @staticmethod
    def _estimate(msgs: Sequence[dict[str, str]], text: str, reasoning: str, usage: _Usage) -> None:
        """Add an estimate of an attempt's tokens from the characters sent and received."""
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
        if cut:
            self._estimate(msgs, text, reasoning, usage)

    def _check_size(self, text: str) -> None:
        nbytes = len(text.encode("utf-8"))
        if nbytes > self.max_response_bytes:
            raise _Fatal(
                f"response too large: {nbytes} bytes > cap {self.max_response_bytes} "
                "(raise llm.max_response_kb or lower max_output_tokens)",
                text.encode("utf-8")[: self.max_response_bytes].decode("utf-8", "ignore"),
            )

    def _translate(self, exc: BaseException, timeout: float, streamed: int = 0, base_url: str = "") -> Exception:
        """An exception of the SDK / httpx as a :class:`_Retryable` or :class:`_Fatal`."""
        where = f" after {streamed} streamed chunks" if streamed else ""
        if (isinstance(exc, openai.APITimeoutError) or _is_transport(exc, "TimeoutException")):
            return _Retryable(f"timeout after {timeout:g}s{where}", costly=True)
        if isinstance(exc, openai.APIStatusError):
            code = exc.status_code
            body = exc.response.text if exc.response is not None else ""
            fatal, retryable, detail = classify_http_error(code, body)
            if responses_only(code, body):
                return _WrongApi(f"HTTP {code}: {detail}")
            over = context_overflow(code, body)
            if over is not None:
                return _TooLarge(f"HTTP {code} (not retried): {detail}", *over)
            if code == 429 and retryable:
                wait = retry_after_seconds(exc.response.headers)
                note = "" if wait is None else f" (Retry-After {wait:g}s)"
                return _Retryable(f"HTTP 429 rate limited{note}: {detail}", wait)
            if retryable:
                return _Retryable(f"HTTP {code}: {detail}")
            if code == 404 and _no_version(base_url):
                detail += (f" -- add /v1 to base_url? ({base_url!r} has no /v1; OpenAI-compatible servers answer "
                           "at <base_url>/chat/completions, e.g. http://127.0.0.1:8000/v1)")
            if fatal is not None:
                return _Fatal(f"HTTP {code} [fatal:{fatal}] (not retried): {detail}")
            return _Fatal(f"HTTP {code} (not retried): {detail}")
        if isinstance(exc, openai.APIConnectionError):
            return _Retryable(f"connection error{where}: {exc.__cause__ or exc}", costly=bool(streamed))
        if _is_transport(exc, "TransportError"):
            return _Retryable(f"connection broken{where}: {type(exc).__name__}: {exc}", costly=bool(streamed))
        if isinstance(exc, openai.APIError):  # e.g. a 200 whose body the SDK could not read, an SSE error event
            return _Retryable(f"API error{where}: {exc}")
        if isinstance(exc, (json.JSONDecodeError, ValueError)):
            return _Retryable(f"unreadable stream chunk{where}: {exc}")
        raise exc
