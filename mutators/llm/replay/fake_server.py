"""A local OpenAI-compatible chat-completions server that answers from a cassette.

Used by tests and demos (``evo fake-llm --cassette FILE --port N [--dialect openai|vllm]``):
it is a real HTTP server (``http.server.ThreadingHTTPServer`` in a background thread) on
127.0.0.1, so the real ``openai`` client and the whole retry path are exercised. It speaks:

- ``POST /v1/chat/completions``: first the request is checked the way a real server checks
  it (below); a rejected request uses up no cassette entry. Then the answer is the cassette
  entry chosen by :meth:`mutators.llm.replay.cassette.Cassette.next_for` (by prompt hash, by ``match``
  substring of the last user message, else the next plain entry), with its scripted fault:
  a non-200 status (``500``, ``429`` with or without ``Retry-After``, ``401``...) with the
  dialect's error body, a ``delay_s`` wait (a hang when longer than the client's timeout),
  a ``raw`` body (e.g. invalid JSON), ``reasoning`` text (sent as ``reasoning_content``),
  no usage report (``usage: false``), or an empty ``response``. Usage is the entry's token
  counts, else ~4 characters per token. An exhausted cassette answers 500.
- ``"stream": true``: server-sent events, ``data: {chunk}`` lines (``chat.completion.chunk``
  objects: a first chunk with the role, the reasoning and content in pieces, a last chunk
  with ``finish_reason``), then, when ``stream_options.include_usage`` is set, a chunk with
  ``"choices": []`` and the usage (every other chunk then has ``"usage": null``), then
  ``data: [DONE]``. ``stream_stall_s`` on an entry stalls the stream half way (a timeout
  mid-stream).
- ``POST /v1/responses``: OpenAI's Responses API. ``instructions`` and ``input`` are read as
  the messages (so cassette entries match them by the same prompt hash); the answer is a
  ``response`` object whose ``output`` holds a ``reasoning`` item (the entry's reasoning as
  a summary) and a ``message`` item with one ``output_text`` part; ``finish_reason``
  ``length`` is ``status: incomplete`` with ``incomplete_details.reason:
  max_output_tokens``; usage ``input_tokens`` (``input_tokens_details.cached_tokens``),
  ``output_tokens`` (``output_tokens_details.reasoning_tokens``). Streamed: ``event:``/
  ``data:`` pairs (``response.created``, ``response.output_text.delta``...,
  ``response.completed`` or ``response.incomplete`` with the whole response).
- ``responses_only`` models: a chat-completions request for one is a 404 with
  api.openai.com's body ("This model is only supported in v1/responses and not in
  v1/chat/completions.", param ``model``).
- An entry's ``cached_tokens`` is reported as cached prompt tokens
  (``prompt_tokens_details.cached_tokens``; Responses: ``input_tokens_details``).
- Only paths under ``/v1`` are served; any other (a base_url without ``/v1``) is a 404 with
  the server's body (vLLM: ``{"detail": "Not Found"}``; OpenAI: ``Invalid URL (POST
  /chat/completions)``).
- ``GET /v1/models``: the models named in the cassette (or ``fake``), or ``models``; in the
  ``vllm`` dialect each entry carries ``max_model_len`` (``context_tokens``), as vLLM's does.
- ``POST /tokenize`` (``vllm`` dialect only, at the root as vLLM serves it, unless
  ``tokenize=False``: a vLLM behind a proxy that passes only ``/v1``): ``{"model",
  "messages"}`` or ``{"model", "prompt"}`` -> ``{"count": N, "max_model_len": M, "tokens":
  [...], "token_strs": null}``, N the same count the window check and the usage use; no key
  asked (vLLM's ``--api-key`` guards only ``/v1``); an unknown model is vLLM's 404, a body
  with neither field its 400 ``BadRequestError``.

Dialects (how strictly requests are checked, and which error bodies are sent):

- ``lenient`` (default): any parameters; OpenAI-style error bodies.
- ``openai``: like api.openai.com. Unknown request fields are 400 ``Unrecognized request
  argument supplied: X``. For reasoning models (o1/o3/o4/gpt-5 ids) ``max_tokens`` is 400
  ``unsupported_parameter`` ("Use 'max_completion_tokens' instead."), a temperature other
  than 1 is 400 ``unsupported_value``, ``top_p`` is 400 ``unsupported_parameter``; for other
  models ``reasoning_effort`` is 400 ``unsupported_parameter``. ``stream_options`` without
  ``stream`` is 400. Bodies are ``{"error": {"message", "type", "param", "code"}}``. On the
  Responses API: an unknown field (``max_tokens``, ``messages``...) is 400 ``Unknown
  parameter: 'X'.`` (``unknown_parameter``); ``reasoning`` for a model that does not reason,
  and ``temperature`` / ``top_p`` for one that does, are 400 ``unsupported_parameter``;
  over the window it is 400 ``context_length_exceeded`` ("Your input exceeds the context
  window of this model.").
- ``vllm``: like ``vllm serve``: any sampling fields (``chat_template_kwargs``, ``top_k``...);
  error bodies ``{"object": "error", "message", "type", "param", "code"}``.

With ``context_tokens`` set, a prompt (~4 characters a token) plus the requested completion
over the window is a 400 with the real bodies (vLLM: ``{"object": "error", "message": "This
model's maximum context length is N tokens. However, you requested M tokens (P in the
messages, C in the completion). Please reduce ...", "type": "BadRequestError", "param": null,
"code": 400}``; OpenAI: ``{"error": {"message": "... However, your messages resulted in P
tokens. ..." (or "you requested M tokens (P in the messages, C in the completion)"), "type":
"invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}``). With ``api_key`` set, any other bearer token is a 401 (OpenAI:
``invalid_api_key``); with ``models`` set, another model id is a 404 (``model_not_found`` /
vLLM ``NotFoundError``).

Every request is appended to :attr:`FakeLLMServer.requests` (model, messages, the JSON body,
headers, the HTTP status answered, time) so tests can assert what was sent. ``stop()`` wakes
pending delays at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

from mutators.llm.replay.cassette import Cassette, CassetteEntry
from mutators.llm.client.model_spec import is_openai_reasoning_model

__all__ = ["FakeLLMServer", "DIALECTS", "OPENAI_REQUEST_FIELDS", "main"]

log = logging.getLogger(__name__)

DIALECTS = ("lenient", "openai", "vllm")

#: The request fields api.openai.com's chat completions accept (others: 400 Unrecognized).
OPENAI_REQUEST_FIELDS = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
})

#: The request fields api.openai.com's Responses API accepts (others: 400 Unknown parameter).
OPENAI_RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "reasoning", "temperature", "top_p", "stream",
    "stream_options", "store", "metadata", "previous_response_id", "include", "parallel_tool_calls", "tool_choice",
    "tools", "text", "truncation", "user", "service_tier", "background", "prompt", "prompt_cache_key",
    "safety_identifier", "max_tool_calls", "top_logprobs", "conversation",
})

_CHUNK_CHARS = 24  # characters of content per streamed chunk


def prompt_tokens(messages: Sequence[Any]) -> int:
    """The fake's token count of a prompt: ~4 characters a token plus 4 a message."""
    return sum(len(str(m.get("content", ""))) // 4 + 4 for m in messages if isinstance(m, dict))


class _Rejection(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], fake: "FakeLLMServer") -> None:
        self.fake = fake
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: D401
        # A client that timed out and closed its socket is expected here (hang faults).
        log.debug("fake LLM server: connection from %s ended with an error", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # route http.server's stderr logs
        log.debug("fake LLM server: " + format, *args)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), headers)

    def do_GET(self) -> None:  # noqa: N802
        fake = self.server.fake
        if self.path.rstrip("/") == "/v1/models":
            names = fake.models or sorted({e.model for e in fake.cassette.entries if e.model}) or ["fake"]
            self._json(200, {"object": "list", "data": [fake.model_entry(n) for n in names]})
        else:
            self._json(404, fake.no_route("GET", self.path))

    def do_POST(self) -> None:  # noqa: N802
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.rstrip("/")
        if path == "/tokenize" and fake.dialect == "vllm" and fake.tokenize:
            self._tokenize(body)
            return
        if path not in ("/v1/chat/completions", "/v1/responses"):
            self._json(404, fake.no_route("POST", self.path))
            return
        api = "responses" if path == "/v1/responses" else "chat"
        try:
            req = json.loads(body or b"{}")
            messages = req["messages"] if api == "chat" else responses_messages(req)
            model = str(req.get("model", ""))
        except (ValueError, KeyError, TypeError) as exc:
            self._json(400, fake.error_body(400, f"bad request body: {exc}", "invalid_request_error"))
            return
        try:
            fake.check_request(req, self.headers.get("Authorization", ""), api=api, messages=messages)
        except _Rejection as rej:
            fake._log_request(model, messages, None, req, dict(self.headers), rej.status, path)
            self._json(rej.status, rej.body)
            return
        entry = fake.cassette.next_for(messages, model)
        fake._log_request(model, messages, entry, req, dict(self.headers), None if entry is None else entry.status,
                          path)
        if entry is None:
            self._json(500, fake.error_body(500, f"cassette {fake.cassette.source} exhausted", "server_error"))
            return
        if entry.delay_s > 0:
            fake._stopping.wait(entry.delay_s)
            if fake._stopping.is_set():
                return
        headers = {}
        if entry.retry_after is not None:
            headers["Retry-After"] = f"{entry.retry_after:g}"
        if entry.raw is not None:
            self._send(entry.status, entry.raw.encode("utf-8"), headers)
            return
        if entry.status != 200:
            self._json(entry.status, fake.scripted_error(entry, model), headers)
            return
        if api == "responses":
            if req.get("stream"):
                self._stream_response(entry, model, messages)
            else:
                self._json(200, _response(entry, model, messages), headers)
            return
        if req.get("stream"):
            self._stream(entry, model, messages, req)
            return
        self._json(200, _completion(entry, model, messages), headers)

    def _tokenize(self, body: bytes) -> None:
        """vLLM's ``POST /tokenize`` (module docstring): no key asked (vLLM guards only /v1)."""
        fake = self.server.fake
        status, answer, req = fake.tokenize_answer(body)
        fake._log_request(str(req.get("model") or ""), req.get("messages"), None, req, dict(self.headers), status,
                          "/tokenize")
        self._json(status, answer)

    # ---- server-sent events ------------------------------------------------------------

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, entry: CassetteEntry, model: str, messages: Sequence[dict], req: dict[str, Any]) -> None:
        fake = self.server.fake
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cid, created = f"chatcmpl-fake-{uuid.uuid4().hex[:12]}", int(time.time())

        def event(choices: list, usage: Any = None, with_usage: bool = include_usage) -> None:
            obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": choices}
            if with_usage:
                obj["usage"] = usage
            self._chunk(b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n")

        def delta(d: dict, finish: str | None = None) -> list:
            return [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]

        pieces = [("reasoning_content", entry.reasoning[i:i + _CHUNK_CHARS])
                  for i in range(0, len(entry.reasoning), _CHUNK_CHARS)]
        pieces += [("content", entry.response[i:i + _CHUNK_CHARS]) for i in range(0, len(entry.response), _CHUNK_CHARS)]
        event(delta({"role": "assistant", "content": ""}))
        half = len(pieces) // 2
        for k, (field, text) in enumerate(pieces):
            if k == half and entry.stream_stall_s > 0:
                fake._stopping.wait(entry.stream_stall_s)
                if fake._stopping.is_set():
                    return
            event(delta({field: text}))
        event(delta({}, entry.finish_reason))
        if include_usage and entry.usage:
            event([], _usage(entry, messages))
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_response(self, entry: CassetteEntry, model: str, messages: Sequence[dict]) -> None:
        """A streamed Responses API answer: ``event: <type>`` / ``data: {...}`` pairs,
        ``response.created``, the text in ``response.output_text.delta`` events, then
        ``response.completed`` (or ``response.incomplete``) carrying the whole response."""
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        final = _response(entry, model, messages)
        seq = iter(range(1 << 30))

        def event(typ: str, **fields: Any) -> None:
            obj = {"type": typ, "sequence_number": next(seq), **fields}
            self._chunk(f"event: {typ}\ndata: ".encode() + json.dumps(obj).encode("utf-8") + b"\n\n")

        event("response.created", response={**final, "status": "in_progress", "output": [], "usage": None})
        pieces = [entry.response[i:i + _CHUNK_CHARS] for i in range(0, len(entry.response), _CHUNK_CHARS)]
        item = final["output"][-1]["id"]
        half = len(pieces) // 2
        for k, text in enumerate(pieces):
            if k == half and entry.stream_stall_s > 0:
                fake._stopping.wait(entry.stream_stall_s)
                if fake._stopping.is_set():
                    return
            event("response.output_text.delta", item_id=item, output_index=len(final["output"]) - 1,
                  content_index=0, delta=text, logprobs=[])
        event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _usage(entry: CassetteEntry, messages: Sequence[dict]) -> dict[str, Any]:
    tin = entry.tokens_in if entry.tokens_in is not None else max(1, prompt_tokens(messages))
    tout = entry.tokens_out if entry.tokens_out is not None else max(0, (len(entry.response) + len(entry.reasoning)) // 4)
    u: dict[str, Any] = {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout}
    if entry.reasoning:
        u["completion_tokens_details"] = {"reasoning_tokens": len(entry.reasoning) // 4}
    if entry.cached_tokens:
        u["prompt_tokens_details"] = {"cached_tokens": entry.cached_tokens}
    return u


def responses_messages(req: dict[str, Any]) -> list[dict[str, str]]:
    """A Responses API request's ``instructions`` and ``input`` as chat messages (a string
    input is one user message; message items keep their role; text parts are joined), so
    that the cassette answers it by the same prompt hash as the chat request."""
    out: list[dict[str, str]] = []
    if req.get("instructions"):
        out.append({"role": "system", "content": str(req["instructions"])})
    inp = req.get("input")
    if isinstance(inp, str):
        return out + [{"role": "user", "content": inp}]
    if not isinstance(inp, list):
        raise TypeError(f"input must be a string or a list of items, got {type(inp).__name__}")
    for item in inp:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out.append({"role": str(item.get("role", "user")), "content": str(content or "")})
    return out


def _response(entry: CassetteEntry, model: str, messages: Sequence[dict]) -> dict[str, Any]:
    """A Responses API answer: a reasoning item (when the entry has reasoning), the message
    item with one ``output_text`` part, ``status`` ``incomplete`` with reason
    ``max_output_tokens`` for a ``finish_reason`` of ``length``, and the Responses usage."""
    u = _usage(entry, messages)
    cut = entry.finish_reason == "length"
    output: list[dict[str, Any]] = []
    if entry.reasoning:
        output.append({"id": f"rs_{uuid.uuid4().hex[:12]}", "type": "reasoning",
                       "summary": [{"type": "summary_text", "text": entry.reasoning}]})
    output.append({"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
                   "status": "incomplete" if cut else "completed",
                   "content": [{"type": "output_text", "text": entry.response, "annotations": []}]})
    out: dict[str, Any] = {
        "id": f"resp_fake{uuid.uuid4().hex[:12]}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": model, "output": output, "error": None,
    }
    if entry.usage:
        out["usage"] = {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": entry.cached_tokens},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": (u.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0)},
            "total_tokens": u["total_tokens"],
        }
    return out


def _completion(entry: CassetteEntry, model: str, messages: Sequence[dict]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": entry.response}
    if entry.reasoning:
        message["reasoning_content"] = entry.reasoning
    out: dict[str, Any] = {
        "id": f"chatcmpl-fake-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": entry.finish_reason}],
    }
    if entry.usage:
        out["usage"] = _usage(entry, messages)
    return out


class FakeLLMServer:
    """The fake endpoint (see module docstring). ``port=0`` picks a free port.

    Use as a context manager, or ``start()`` / ``stop()``. ``base_url`` is what a
    :class:`mutators.llm.client.model_spec.ModelSpec` points at (``http://127.0.0.1:<port>/v1``).
    """

    def __init__(self, cassette: Cassette | str | Path, host: str = "127.0.0.1", port: int = 0, *,
                 dialect: str = "lenient", api_key: str | None = None, models: Sequence[str] | None = None,
                 context_tokens: int | None = None, responses_only: Sequence[str] = (), tokenize: bool = True) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect={dialect!r}; known: {', '.join(DIALECTS)}")
        if context_tokens is not None and context_tokens < 1:
            raise ValueError(f"context_tokens={context_tokens}: must be >= 1")
        self.cassette = cassette if isinstance(cassette, Cassette) else Cassette.load(cassette)
        self.host = host
        self.dialect = dialect
        self.api_key = api_key
        self.models = list(models) if models else []
        self.context_tokens = context_tokens
        self.responses_only = frozenset(responses_only)
        self.tokenize = tokenize
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    # ---- what a real server would answer --------------------------------------------------

    def error_body(self, status: int, message: str, typ: str, param: str | None = None,
                   code: str | int | None = None) -> dict[str, Any]:
        """An error body in this dialect's shape."""
        if self.dialect == "vllm":
            vtype = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError"}.get(status, "InternalServerError")
            return {"object": "error", "message": message, "type": vtype, "param": param,
                    "code": code if isinstance(code, int) else status}
        return {"error": {"message": message, "type": typ, "param": param, "code": code}}

    def scripted_error(self, entry: CassetteEntry, model: str) -> dict[str, Any]:
        """The body of a cassette entry's non-200 status (its ``response`` is the message)."""
        st, msg = entry.status, entry.response
        if st == 429:
            if entry.error_code == "insufficient_quota":
                return self.error_body(429, msg or "You exceeded your current quota, please check your plan and "
                                       "billing details.", "insufficient_quota", code="insufficient_quota")
            return self.error_body(429, msg or f"Rate limit reached for {model} on requests per min (RPM): "
                                   "Limit 3, Used 3, Requested 1. Please try again in 20s.", "requests",
                                   code=entry.error_code or "rate_limit_exceeded")
        if st == 401:
            return self.error_body(401, msg or "Incorrect API key provided: sk-fake. You can find your API key at "
                                   "https://platform.openai.com/account/api-keys.", "invalid_request_error",
                                   code=entry.error_code or "invalid_api_key")
        if st == 404:
            return self.error_body(404, msg or self._no_model(model), "invalid_request_error",
                                   code=entry.error_code or "model_not_found")
        typ = "invalid_request_error" if 400 <= st < 500 else "server_error"
        return self.error_body(st, msg or f"scripted HTTP {st}", typ, code=entry.error_code)

    def no_route(self, method: str, path: str) -> dict[str, Any]:
        """A path the server does not serve (a base_url without /v1): vLLM (FastAPI) answers
        ``{"detail": "Not Found"}``, api.openai.com ``Invalid URL (POST /chat/completions)``."""
        if self.dialect == "vllm":
            return {"detail": "Not Found"}
        return {"error": {"message": f"Invalid URL ({method} {path})", "type": "invalid_request_error", "param": None,
                          "code": None}}

    def _no_model(self, model: str) -> str:
        if self.dialect == "vllm":
            return f"The model `{model}` does not exist."
        return f"The model `{model}` does not exist or you do not have access to it."

    def model_entry(self, name: str) -> dict[str, Any]:
        """One entry of ``GET /v1/models``; vLLM's carries ``max_model_len`` (the window),
        ``root`` and ``parent``."""
        entry: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "fake"}
        if self.dialect == "vllm":
            entry.update(owned_by="vllm", root=name, parent=None, max_model_len=self.context_tokens, permission=[])
        return entry

    def tokenize_answer(self, body: bytes) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """``(status, answer, request)`` of vLLM's ``POST /tokenize``: a body with ``messages``
        (a chat prompt, counted as a chat request's prompt is) or ``prompt`` (a plain text,
        ~4 characters a token plus a BOS) is answered ``{"count", "max_model_len", "tokens",
        "token_strs"}``; a body that is neither is vLLM's 400, an unknown ``model`` its 404."""
        try:
            req = json.loads(body or b"{}")
            if not isinstance(req, dict):
                raise ValueError("the body is not a JSON object")
            if isinstance(req.get("messages"), list):
                n = prompt_tokens(req["messages"])
            elif isinstance(req.get("prompt"), str):
                n = len(req["prompt"]) // 4 + 1
            else:
                raise ValueError("1 validation error: a 'prompt' (string) or 'messages' (list) field is required")
        except ValueError as exc:
            return 400, self.error_body(400, str(exc), "BadRequestError"), {}
        model = req.get("model")
        if model is not None and self.models and model not in self.models:
            return 404, self.error_body(404, self._no_model(str(model)), "NotFoundError"), req
        return 200, {"count": n, "max_model_len": self.context_tokens, "tokens": [(7 * i) % 50_000 for i in range(n)],
                     "token_strs": None}, req

    def check_request(self, req: dict[str, Any], authorization: str, *, api: str = "chat",
                      messages: Sequence[Any] | None = None) -> None:
        """Raise :class:`_Rejection` for a request the real server would refuse (``api``:
        ``chat`` for /v1/chat/completions, ``responses`` for /v1/responses)."""
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            if self.dialect == "vllm":
                raise _Rejection(401, {"error": "Unauthorized"})
            given = authorization.removeprefix("Bearer ")
            shown = (given[:3] + "*" * max(0, len(given) - 7) + given[-4:]) if len(given) > 7 else given
            raise _Rejection(401, self.error_body(
                401, f"Incorrect API key provided: {shown}. You can find your API key at "
                     "https://platform.openai.com/account/api-keys.", "invalid_request_error", code="invalid_api_key"))
        model = str(req.get("model", ""))
        if self.models and model not in self.models:
            raise _Rejection(404, self.error_body(404, self._no_model(model), "invalid_request_error",
                                                  code="model_not_found"))
        if api == "chat" and model in self.responses_only:  # api.openai.com's answer, word for word
            raise _Rejection(404, self.error_body(
                404, "This model is only supported in v1/responses and not in v1/chat/completions.",
                "invalid_request_error", "model", None))
        if api == "responses":
            if self.dialect == "openai":
                self._check_openai_responses(req, model)
            if self.context_tokens is not None:
                self._check_context_responses(req, messages or [])
            return
        if self.dialect == "openai":
            self._check_openai(req, model)
        if self.context_tokens is not None:
            self._check_context(req)

    def _check_openai(self, req: dict[str, Any], model: str) -> None:
        def bad(message: str, param: str | None, code: str | None) -> _Rejection:
            return _Rejection(400, self.error_body(400, message, "invalid_request_error", param, code))

        unknown = sorted(set(req) - OPENAI_REQUEST_FIELDS)
        if unknown:
            raise bad(f"Unrecognized request argument supplied: {unknown[0]}", None, None)
        if "stream_options" in req and not req.get("stream"):
            raise bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options",
                      "invalid_value")
        if is_openai_reasoning_model(model):
            if "max_tokens" in req:
                raise bad("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                          "'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
            t = req.get("temperature")
            if t is not None and t != 1:
                raise bad(f"Unsupported value: 'temperature' does not support {t} with this model. Only the default "
                          "(1) value is supported.", "temperature", "unsupported_value")
            if "top_p" in req:
                raise bad("Unsupported parameter: 'top_p' is not supported with this model.", "top_p",
                          "unsupported_parameter")
        elif "reasoning_effort" in req:
            raise bad("Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                      "reasoning_effort", "unsupported_parameter")

    def _check_openai_responses(self, req: dict[str, Any], model: str) -> None:
        def bad(message: str, param: str | None, code: str | None) -> _Rejection:
            return _Rejection(400, self.error_body(400, message, "invalid_request_error", param, code))

        unknown = sorted(set(req) - OPENAI_RESPONSES_FIELDS)
        if unknown:
            raise bad(f"Unknown parameter: '{unknown[0]}'.", unknown[0], "unknown_parameter")
        if "input" not in req:
            raise bad("Missing required parameter: 'input'.", "input", "missing_required_parameter")
        if is_openai_reasoning_model(model):
            for p in ("temperature", "top_p"):
                if p in req:
                    raise bad(f"Unsupported parameter: '{p}' is not supported with this model.", p,
                              "unsupported_parameter")
        elif "reasoning" in req:
            raise bad("Unsupported parameter: 'reasoning.effort' is not supported with this model.",
                      "reasoning.effort", "unsupported_parameter")

    def _check_context_responses(self, req: dict[str, Any], messages: Sequence[Any]) -> None:
        n = self.context_tokens
        assert n is not None
        c = req.get("max_output_tokens")
        c = int(c) if isinstance(c, (int, float)) else 0
        if prompt_tokens(messages) + c <= n:
            return
        if self.dialect == "vllm":
            self._check_context({"messages": messages, "max_tokens": c})
        raise _Rejection(400, self.error_body(
            400, "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "invalid_request_error", "input", "context_length_exceeded"))

    def _check_context(self, req: dict[str, Any]) -> None:
        n = self.context_tokens
        assert n is not None
        p = prompt_tokens(req.get("messages") or [])
        c = req.get("max_completion_tokens", req.get("max_tokens"))
        c = int(c) if isinstance(c, (int, float)) else 0
        if p + c <= n:
            return
        if self.dialect == "vllm":
            raise _Rejection(400, self.error_body(
                400, f"This model's maximum context length is {n} tokens. However, you requested {p + c} tokens "
                     f"({p} in the messages, {c} in the completion). Please reduce the length of the messages or "
                     "completion.", "BadRequestError"))
        if p > n or c == 0:  # api.openai.com's words when the messages alone are over the window
            said = f"your messages resulted in {p} tokens. Please reduce the length of the messages."
        else:
            said = (f"you requested {p + c} tokens ({p} in the messages, {c} in the completion). Please reduce the "
                    "length of the messages or completion.")
        raise _Rejection(400, self.error_body(
            400, f"This model's maximum context length is {n} tokens. However, {said}", "invalid_request_error",
            "messages", "context_length_exceeded"))

    # ---- bookkeeping -------------------------------------------------------------------------

    def _log_request(self, model: str, messages: Any, entry: CassetteEntry | None, body: dict[str, Any],
                     headers: dict[str, str], status: int | None, path: str = "/v1/chat/completions") -> None:
        with self._lock:
            self.requests.append({
                "path": path,
                "model": model,
                "messages": messages,
                "status": status,
                "time": time.monotonic(),
                "body": body,
                "headers": headers,
                "entry": entry,
            })

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not started; call start() or use it as a context manager")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "FakeLLMServer":
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _Server((self.host, self._port), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fake-llm:{self.port}", daemon=True)
        self._thread.start()
        log.info("fake LLM server on %s (%s dialect, %d scripted answers from %s)", self.base_url, self.dialect,
                 len(self.cassette.entries), self.cassette.source)
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``evo fake-llm --cassette FILE [--port N] [--host H] [--dialect D] [--context-tokens N]
    [--api-key K] [--models A,B] [--responses-only A,B]``: serve until Ctrl-C."""
    ap = argparse.ArgumentParser(prog="evo fake-llm", description="Serve a JSONL cassette as an OpenAI-compatible endpoint.")
    ap.add_argument("--cassette", required=True, help="JSONL file of scripted answers (see docs/llm.md)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--dialect", choices=DIALECTS, default="lenient",
                    help="check requests and shape errors like api.openai.com (openai) or vllm serve (vllm)")
    ap.add_argument("--context-tokens", type=int, default=None, help="answer 400 for prompts over this window")
    ap.add_argument("--api-key", default=None, help="answer 401 unless this bearer token is sent")
    ap.add_argument("--models", default="", help="comma-separated model ids served (others: 404)")
    ap.add_argument("--responses-only", default="",
                    help="comma-separated model ids served only by /v1/responses (chat completions: 404)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    srv = FakeLLMServer(args.cassette, host=args.host, port=args.port, dialect=args.dialect,
                        context_tokens=args.context_tokens, api_key=args.api_key,
                        models=[m for m in args.models.split(",") if m],
                        responses_only=[m for m in args.responses_only.split(",") if m]).start()
    # CLI entry point: the URL goes to stdout so scripts can read it.
    print(f"fake LLM endpoint: {srv.base_url}  ({args.dialect}; cassette {args.cassette}, "
          f"{len(srv.cassette.entries)} entries; Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
