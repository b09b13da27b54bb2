"""Record and replay of LLM calls, keyed by prompt hash.

Two uses:

- A **cassette** (JSONL, one scripted answer per line) drives :class:`mutators.llm.replay.fake_server.
  FakeLLMServer` in tests and demos. Line fields::

      {"response": "...",            # answer text (default "")
       "status": 200,                 # 200 | 429 | 500 | any HTTP status
       "prompt_hash": "...",          # answer only this exact prompt (see client.prompt_hash)
       "match": "[kind:repair]",      # ... or any prompt whose last user message contains this
       "retry_after": 1,              # seconds, sent as the Retry-After header (429)
       "delay_s": 5,                  # wait before answering (a hang when > client timeout)
       "raw": "{not json",            # send this body verbatim instead of a JSON answer
       "finish_reason": "stop", "tokens_in": 100, "tokens_out": 50,  # usage to report
       "repeat": false,               # true: never used up (answers every matching request)
       "model": "...",                # only listed by GET /v1/models
       "reasoning": "...",            # sent as message.reasoning_content (or streamed first)
       "usage": true,                 # false: the answer carries no usage report
       "error_code": "...",           # the error body's code for a non-200 status
       "stream_stall_s": 0,           # a streamed answer stalls this long half way
       "cached_tokens": 0}            # prompt tokens reported as cached (usage details)

  Entries are used up in file order. A request is answered by the first unused entry whose
  ``prompt_hash`` equals its hash, else whose ``match`` occurs in its last user message,
  else the first unused entry with neither key (the plain script). No entry -> HTTP 500
  "cassette exhausted" (a recorded failed call, so a demo degrades instead of hanging).

- **Replay**: :class:`ReplayClient` answers ``complete`` from stored calls (rows of the
  store's ``llm_calls`` table, or a cassette) without any endpoint. Answers are keyed by the
  attempt's identity (``attempt_key``: kind, parent or repair chain, attempt number; see
  :class:`mutators.llm.attempts.AttemptRecord`) when the rows carry it
  (:meth:`ReplayClient.from_run` joins a run's calls with its ``llm_attempt`` events), so
  the answer to an attempt does not depend on the order in which concurrent proposals
  finished or on prompt text that reflects that order (attempt outcomes, other islands'
  kernels); else by prompt hash, in recorded order. A request it has no answer for raises
  :class:`ReplayMiss` (a :class:`mutators.base.MutatorStopped`: the run stops proposing
  and ends with its one line).

:class:`CassetteRecorder` is a :data:`mutators.llm.client.calls.CallSink` that appends successful calls
to a cassette file as ``prompt_hash`` entries, turning any live run into a replayable script.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mutators.base import MutatorStopped
from mutators.llm.client.budget import Budget
from mutators.llm.client.calls import CallSink, LLMCall, norm_messages, prompt_hash
from mutators.llm.client.model_spec import ModelSpec

__all__ = ["CassetteEntry", "Cassette", "CassetteError", "CassetteRecorder", "ReplayClient", "ReplayMiss"]

log = logging.getLogger(__name__)

_FIELDS = {
    "prompt_hash", "match", "response", "status", "retry_after", "delay_s", "raw",
    "finish_reason", "tokens_in", "tokens_out", "repeat", "model", "note",
    "reasoning", "usage", "error_code", "stream_stall_s", "cached_tokens",
}


class CassetteError(ValueError):
    """A cassette file or line is malformed; the message names the file and line."""


class ReplayMiss(MutatorStopped, LookupError):
    """A replayed run asked for an attempt the recording never answered (the run diverged).

    A :class:`mutators.base.MutatorStopped`: the engine stops proposing, drains, and the
    run ends with this message as its stop reason (one line, no traceback).
    """


@dataclass(frozen=True)
class CassetteEntry:
    """One scripted answer (see module docstring for the fields)."""

    response: str = ""
    status: int = 200
    prompt_hash: str | None = None
    match: str | None = None
    retry_after: float | None = None
    delay_s: float = 0.0
    raw: str | None = None
    finish_reason: str = "stop"
    tokens_in: int | None = None
    tokens_out: int | None = None
    repeat: bool = False
    model: str | None = None
    note: str = ""
    reasoning: str = ""
    usage: bool = True
    error_code: str | None = None
    stream_stall_s: float = 0.0
    cached_tokens: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "entry") -> "CassetteEntry":
        if not isinstance(d, Mapping):
            raise CassetteError(f"{where}: expected a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - _FIELDS)
        if unknown:
            raise CassetteError(f"{where}: unknown field(s) {unknown}; valid: {', '.join(sorted(_FIELDS))}")
        try:
            e = cls(**dict(d))
        except TypeError as exc:
            raise CassetteError(f"{where}: {exc}") from None
        if not isinstance(e.status, int) or not 100 <= e.status <= 599:
            raise CassetteError(f"{where}: status={e.status!r} must be an HTTP status code (200, 429, 500...)")
        if not isinstance(e.response, str):
            raise CassetteError(f"{where}: response must be a string")
        if e.delay_s < 0 or e.stream_stall_s < 0:
            raise CassetteError(f"{where}: delay_s={e.delay_s} / stream_stall_s={e.stream_stall_s} must be >= 0")
        if not isinstance(e.reasoning, str) or not isinstance(e.usage, bool):
            raise CassetteError(f"{where}: reasoning must be a string and usage true or false")
        return e

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        defaults = asdict(CassetteEntry())
        return {k: v for k, v in d.items() if v != defaults[k] or k == "response"}


class Cassette:
    """An ordered list of :class:`CassetteEntry`, plus the thread-safe state of which are used.

    ``next_for(messages, model)`` picks and uses up the entry that answers a request (rules in
    the module docstring); ``remaining`` counts unused non-repeating entries.
    """

    def __init__(self, entries: Iterable[CassetteEntry | Mapping[str, Any]] = (), source: str = "<memory>") -> None:
        self.source = source
        self.entries: list[CassetteEntry] = [
            e if isinstance(e, CassetteEntry) else CassetteEntry.from_dict(e, f"{source} entry {i + 1}")
            for i, e in enumerate(entries)
        ]
        self._used = [False] * len(self.entries)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path) -> "Cassette":
        """Read a JSONL cassette; blank lines and lines starting with ``#`` or ``//`` are skipped."""
        p = Path(path)
        if not p.is_file():
            raise CassetteError(f"cassette {p}: no such file")
        entries = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            s = line.strip()
            if not s or s.startswith("#") or s.startswith("//"):
                continue
            try:
                d = json.loads(s)
            except json.JSONDecodeError as exc:
                raise CassetteError(f"cassette {p} line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
            entries.append(CassetteEntry.from_dict(d, f"cassette {p} line {n}"))
        return cls(entries, source=str(p))

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(json.dumps(e.to_dict()) + "\n" for e in self.entries), encoding="utf-8")

    @property
    def remaining(self) -> int:
        with self._lock:
            return sum(1 for e, u in zip(self.entries, self._used) if not u and not e.repeat)

    def reset(self) -> None:
        with self._lock:
            self._used = [False] * len(self.entries)

    def next_for(self, messages: Sequence[Mapping[str, str]], model: str) -> CassetteEntry | None:
        """The entry answering this request (used up unless ``repeat``), or None."""
        msgs = norm_messages(list(messages)) if messages else ()
        h = prompt_hash(msgs, model)
        last_user = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), "")
        with self._lock:
            for pred in (
                lambda e: e.prompt_hash is not None and e.prompt_hash == h,
                lambda e: e.prompt_hash is None and e.match is not None and e.match in last_user,
                lambda e: e.prompt_hash is None and e.match is None,
            ):
                for i, e in enumerate(self.entries):
                    if not self._used[i] and pred(e):
                        if not e.repeat:
                            self._used[i] = True
                        return e
        return None


class CassetteRecorder:
    """A CallSink appending every successful call to a JSONL cassette (``prompt_hash`` entries).

    Failed calls are skipped by default (``include_errors=True`` records them as status-500
    entries so a replay through the fake server fails the same way).
    """

    def __init__(self, path: str | Path, include_errors: bool = False, then: CallSink | None = None) -> None:
        self.path = Path(path)
        self.include_errors = include_errors
        self.then = then
        self._lock = threading.Lock()

    def __call__(self, call: LLMCall) -> None:
        if call.ok or self.include_errors:
            e = CassetteEntry(
                response=call.response,
                status=200 if call.ok else 500,
                prompt_hash=call.prompt_hash,
                tokens_in=call.tokens_in,
                tokens_out=call.tokens_out,
                finish_reason=call.finish_reason or "stop",
                note=f"{call.kind} {call.model}".strip(),
            )
            with self._lock, self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(e.to_dict()) + "\n")
        if self.then is not None:
            self.then(call)


class ReplayClient:
    """Answers ``complete`` from recorded calls, never touching an endpoint (a ChatClient).

    ``rows`` are dicts with at least ``prompt_hash`` and ``response`` (the store's
    ``llm_calls`` rows fit; ``tokens_in``, ``tokens_out``, ``cost``, ``latency_s``, ``error``
    and the outcome and request settings (``finish_reason``, ``reasoning_tokens``,
    ``cached_tokens``, ``api``, ``max_output_tokens``, ``reasoning_effort``, ``timeout_s``)
    are used when present; ``attempt_key`` when given, see :meth:`from_run`). A request
    whose ``key`` names a recorded attempt gets that attempt's answer; any other gets the
    next unused answer to its prompt hash (several answers to one hash in recorded order).
    Each row answers once. The answer's ``model`` is the asking ModelSpec's name. Costs are
    charged to ``budget`` exactly as recorded, so a replay stops where the original run's
    budget stopped it. The calls returned have ``cached=True`` and go to ``sink`` like live
    ones. Thread-safe.
    """

    def __init__(
        self, rows: Iterable[Mapping[str, Any]], *, budget: Budget | None = None, sink: CallSink | None = None
    ) -> None:
        self._rows: list[Mapping[str, Any]] = []
        self._by_hash: dict[str, deque[int]] = defaultdict(deque)
        self._by_key: dict[str, deque[int]] = defaultdict(deque)
        for i, r in enumerate(rows):
            if not r.get("prompt_hash"):
                raise CassetteError(f"replay row {i + 1} has no prompt_hash; cannot key it (row keys: {sorted(r)})")
            self._by_hash[str(r["prompt_hash"])].append(len(self._rows))
            if r.get("attempt_key"):
                self._by_key[str(r["attempt_key"])].append(len(self._rows))
            self._rows.append(r)
        self._used = [False] * len(self._rows)
        self.budget = budget if budget is not None else Budget(None)
        self.sink = sink
        self._lock = threading.Lock()
        log.debug("replay client holds %d recorded calls over %d prompts, %d attempt keys", len(self._rows),
                  len(self._by_hash), len(self._by_key))

    @classmethod
    def from_run(cls, calls: Iterable[Mapping[str, Any]], attempts: Iterable[Mapping[str, Any]],
                 **kw: Any) -> "ReplayClient":
        """Replay a stored run: its ``llm_calls`` rows, keyed by their ``attempt_key``
        column, or where a row has none (a call stored before the column existed) by the
        ``attempt_key`` of the ``llm_attempt`` event payloads that name their
        ``prompt_hash`` (each event takes the first such call of that hash not yet taken, in
        recorded order)."""
        rows = [dict(c) for c in calls]
        free: dict[str, deque[int]] = defaultdict(deque)
        for i, r in enumerate(rows):
            if not r.get("attempt_key"):
                free[str(r.get("prompt_hash") or "")].append(i)
        keyed = {str(r["attempt_key"]) for r in rows if r.get("attempt_key")}
        for a in attempts:
            h, key = a.get("prompt_hash"), a.get("attempt_key")
            if h and key and str(key) not in keyed and free.get(str(h)):
                rows[free[str(h)].popleft()]["attempt_key"] = str(key)
        return cls(rows, **kw)

    @classmethod
    def from_cassette(cls, cassette: Cassette | str | Path, **kw: Any) -> "ReplayClient":
        """Replay a cassette's ``prompt_hash`` entries (entries without a hash are ignored)."""
        c = cassette if isinstance(cassette, Cassette) else Cassette.load(cassette)
        rows = []
        for e in c.entries:
            if e.prompt_hash is None:
                continue
            rows.append({
                "prompt_hash": e.prompt_hash,
                "response": e.response,
                "tokens_in": e.tokens_in or 0,
                "tokens_out": e.tokens_out or 0,
                "error": None if e.status == 200 and e.raw is None else f"recorded HTTP {e.status}",
            })
        return cls(rows, **kw)

    @property
    def remaining(self) -> int:
        with self._lock:
            return self._used.count(False)

    def _take(self, queue: deque[int] | None) -> Mapping[str, Any] | None:
        while queue:
            i = queue.popleft()
            if not self._used[i]:
                self._used[i] = True
                return self._rows[i]
        return None

    def complete(self, messages: Sequence[dict[str, str]], *, model: ModelSpec, kind: str = "",
                 key: str = "") -> LLMCall:
        msgs = norm_messages(messages)
        h = prompt_hash(msgs, model.model)
        self.budget.check()
        with self._lock:
            r = self._take(self._by_key.get(key)) if key else None
            if r is None:
                r = self._take(self._by_hash.get(h))
            if r is None:
                raise ReplayMiss(
                    f"replay has no recorded answer for attempt {key or '?'} (prompt {h[:16]}, model {model.name!r}, "
                    f"kind {kind or '?'}): the replayed run diverged from the recorded one (different config, seed, "
                    "parents or templates), or the recording was cut short"
                )
        tin, tout = int(r.get("tokens_in") or 0), int(r.get("tokens_out") or 0)
        cached_in = int(r.get("cached_tokens") or 0)
        cost = float(r["cost"]) if r.get("cost") is not None else model.cost(tin, tout, cached_in)
        self.budget.charge(cost)
        err = r.get("error") or None
        call = LLMCall(
            model=model.name,
            prompt_hash=h,
            messages=msgs,
            response=str(r.get("response") or ""),
            tokens_in=tin,
            tokens_out=tout,
            cost=cost,
            latency_s=float(r.get("latency_s") or 0.0),
            error=str(err) if err else None,
            attempts=1,
            finish_reason=r.get("finish_reason"),
            kind=kind,
            cached=True,
            attempt_key=key,
            reasoning_tokens=int(r.get("reasoning_tokens") or 0),
            cached_tokens=cached_in,
            api=str(r.get("api") or "chat"),
            max_output_tokens=r.get("max_output_tokens"),
            reasoning_effort=r.get("reasoning_effort"),
            timeout_s=r.get("timeout_s"),
        )
        if self.sink is not None:
            self.sink(call)
        return call
