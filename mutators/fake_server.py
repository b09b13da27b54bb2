"""A local OpenAI-compatible chat-completions server that answers from a cassette.

Used by tests and demos (``evo fake-llm --cassette FILE --port N``): it is a real HTTP server
(``http.server.ThreadingHTTPServer`` in a background thread) on 127.0.0.1, so the real
``openai`` client and the whole retry path are exercised. It speaks:

- ``POST /v1/chat/completions``: the answer is the cassette entry chosen by
  :meth:`mutators.cassette.Cassette.next_for` (by prompt hash, by ``match`` substring of the
  last user message, else the next plain entry), with its scripted fault: a non-200 status
  (``500``, ``429`` + ``Retry-After``), a ``delay_s`` wait (a hang when longer than the
  client's timeout), a ``raw`` body (e.g. invalid JSON), or an empty ``response``. Usage is
  the entry's token counts, else ~4 characters per token. An exhausted cassette answers 500.
- ``GET /v1/models``: the models named in the cassette (or ``fake``).

Every request is appended to :attr:`FakeLLMServer.requests` (model, messages, the entry's
status) so tests can assert what was sent. ``stop()`` wakes pending delays at once.
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

from mutators.cassette import Cassette, CassetteEntry

__all__ = ["FakeLLMServer", "main"]

log = logging.getLogger(__name__)


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
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            names = sorted({e.model for e in self.server.fake.cassette.entries if e.model}) or ["fake"]
            self._json(200, {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "fake"} for n in names]})
        else:
            self._json(404, {"error": {"message": f"no route GET {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, {"error": {"message": f"no route POST {self.path}", "type": "not_found"}})
            return
        try:
            req = json.loads(body or b"{}")
            messages = req["messages"]
            model = str(req.get("model", ""))
        except (ValueError, KeyError, TypeError) as exc:
            self._json(400, {"error": {"message": f"bad request body: {exc}", "type": "invalid_request_error"}})
            return
        fake = self.server.fake
        entry = fake.cassette.next_for(messages, model)
        fake._log_request(model, messages, entry, req, dict(self.headers))
        if entry is None:
            self._json(500, {"error": {"message": f"cassette {fake.cassette.source} exhausted", "type": "server_error"}})
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
            kind = "rate_limit_exceeded" if entry.status == 429 else "server_error"
            self._json(entry.status, {"error": {"message": entry.response or f"scripted HTTP {entry.status}",
                                                "type": kind}}, headers)
            return
        self._json(200, _completion(entry, model, messages), headers)


def _completion(entry: CassetteEntry, model: str, messages: Sequence[dict]) -> dict[str, Any]:
    prompt_chars = sum(len(str(m.get("content", ""))) for m in messages)
    tin = entry.tokens_in if entry.tokens_in is not None else max(1, prompt_chars // 4)
    tout = entry.tokens_out if entry.tokens_out is not None else max(0, len(entry.response) // 4)
    return {
        "id": f"chatcmpl-fake-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": entry.response},
            "finish_reason": entry.finish_reason,
        }],
        "usage": {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout},
    }


class FakeLLMServer:
    """The fake endpoint (see module docstring). ``port=0`` picks a free port.

    Use as a context manager, or ``start()`` / ``stop()``. ``base_url`` is what a
    :class:`mutators.client.ModelSpec` points at (``http://127.0.0.1:<port>/v1``).
    """

    def __init__(self, cassette: Cassette | str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cassette = cassette if isinstance(cassette, Cassette) else Cassette.load(cassette)
        self.host = host
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    def _log_request(self, model: str, messages: Any, entry: CassetteEntry | None, body: dict[str, Any],
                     headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append({
                "model": model,
                "messages": messages,
                "status": None if entry is None else entry.status,
                "time": time.monotonic(),
                "body": body,
                "headers": headers,
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
        log.info("fake LLM server on %s (%d scripted answers from %s)", self.base_url,
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
    """``evo fake-llm --cassette FILE [--port N] [--host H]``: serve until Ctrl-C."""
    ap = argparse.ArgumentParser(prog="evo fake-llm", description="Serve a JSONL cassette as an OpenAI-compatible endpoint.")
    ap.add_argument("--cassette", required=True, help="JSONL file of scripted answers (see docs/llm.md)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    srv = FakeLLMServer(args.cassette, host=args.host, port=args.port).start()
    # CLI entry point: the URL goes to stdout so scripts can read it.
    print(f"fake LLM endpoint: {srv.base_url}  (cassette {args.cassette}, {len(srv.cassette.entries)} entries; Ctrl-C stops)",
          flush=True)
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
