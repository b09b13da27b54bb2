"""Counting a prompt's tokens the way a model's endpoint will: :class:`TokenCounter`.

:class:`mutators.llm.prompt.builder.PromptBuilder` sizes each prompt to its model's window.
Where a counter knows the model's tokenizer, the prompt is counted; elsewhere its tokens are
estimated from characters (calibrated by the endpoint's usage reports). The counters:

- :class:`ServerTokenCounter` (:mod:`mutators.llm.client.tokenize`): a model served by vLLM,
  counted by the server's own ``POST /tokenize`` (its tokenizer and chat template);
- :class:`EncodingCounter`: an OpenAI model id whose encoding is known
  (:data:`OPENAI_ENCODINGS`), counted with the optional package ``bpe-openai`` (``pip
  install 'cute-evo[tokens]'``), which ships the cl100k/o200k tables in its wheel and so
  works with no network (tiktoken downloads them on first use). Without the package, or for
  any other model id, it does not count;
- :class:`FirstCounter`: the first of several counters that counts a model.

:func:`default_counter` is what a run (and its dry run) uses.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from mutators.llm.client.model_spec import ModelSpec

__all__ = ["TokenCounter", "EncodingCounter", "FirstCounter", "OPENAI_ENCODINGS", "encoding_for",
           "load_bpe_openai", "default_counter", "ESTIMATE_NAME"]

log = logging.getLogger(__name__)

#: How the dry run names the estimate, for a model no counter counts.
ESTIMATE_NAME = "estimated from characters (3 a token until the endpoint's counts calibrate it)"


@runtime_checkable
class TokenCounter(Protocol):
    """Counts a chat prompt's tokens as one model's endpoint counts them.

    ``count(model, messages)``: the prompt tokens of ``messages`` for ``model``, the chat
    framing included, or None when this counter cannot count for that model (the caller
    then estimates). It never raises for an endpoint's problem: it falls back to None and
    says so once. ``name(model)``: what counts ``model``'s prompts, for the dry run (None:
    this counter does not). Thread-safe.
    """

    def count(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int | None: ...

    def name(self, model: ModelSpec) -> str | None: ...


#: OpenAI model ids -> their encoding, the families of tiktoken's own table (model.py):
#: ``o200k_base`` for gpt-4o, gpt-4.1, gpt-4.5, gpt-5, the o-series and gpt-oss (whose
#: ``o200k_harmony`` differs from it only in special tokens), ``cl100k_base`` for gpt-4 and
#: gpt-3.5-turbo. A dated or sized variant (``gpt-4.1-mini``, ``gpt-4o-2024-08-06``) has its
#: family's encoding; a router prefix (``openai/``) and a fine-tune's ``ft:`` are ignored.
#: Any other id has none (its tokens are not counted here).
OPENAI_ENCODINGS: tuple[tuple[str, str], ...] = (
    (r"gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5(?:\.\d+)?|o1|o3|o4|gpt-oss", "o200k_base"),
    (r"gpt-4|gpt-3\.5-turbo|gpt-35-turbo", "cl100k_base"),
)
_ENCODING_RES = tuple((re.compile(rf"(?:{p})(?:[-:@].*)?", re.IGNORECASE), enc) for p, enc in OPENAI_ENCODINGS)


def encoding_for(model_id: str) -> str | None:
    """The encoding of an OpenAI model id (:data:`OPENAI_ENCODINGS`), None for any other."""
    mid = model_id.strip()
    mid = mid.rsplit("/", 1)[-1] if mid.lower().startswith("openai/") else mid
    mid = mid[3:] if mid.lower().startswith("ft:") else mid
    return next((enc for rx, enc in _ENCODING_RES if rx.fullmatch(mid)), None)


def load_bpe_openai(encoding: str) -> Any | None:
    """``bpe_openai.get_encoding(encoding)`` (an object with tiktoken's ``encode_ordinary``),
    or None when the optional package is not installed or cannot load that encoding."""
    try:
        import bpe_openai  # optional: pip install 'cute-evo[tokens]'
    except ImportError:
        return None
    try:
        enc = bpe_openai.get_encoding(encoding)
    except Exception as exc:  # a broken install: the estimate stays
        log.warning("bpe-openai cannot load the %s encoding (%s); prompt sizes are estimated", encoding, exc)
        return None
    return enc


class EncodingCounter:
    """Counts an OpenAI model's prompts with its encoding (:func:`encoding_for`), loaded by
    ``load`` (None: :func:`load_bpe_openai`; an encoding it returns None for is not
    counted), once per encoding. The chat framing is OpenAI's documented rule for chat models: 3 tokens a
    message plus its role's tokens, plus 3 that prime the reply."""

    def __init__(self, load: Callable[[str], Any | None] | None = None) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._encodings: dict[str, Any | None] = {}

    def _encoding(self, model: ModelSpec) -> Any | None:
        name = encoding_for(model.model)
        if name is None:
            return None
        with self._lock:
            if name not in self._encodings:
                self._encodings[name] = (self._load or load_bpe_openai)(name)
            return self._encodings[name]

    def count(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int | None:
        enc = self._encoding(model)
        if enc is None:
            return None
        n = 3
        for m in messages:
            n += 3 + len(enc.encode_ordinary(str(m.get("role", "")))) + len(enc.encode_ordinary(str(m.get("content", ""))))
        return n

    def name(self, model: ModelSpec) -> str | None:
        enc = self._encoding(model)
        if enc is None:
            return None
        pkg = type(enc).__module__.split(".")[0]
        version = getattr(sys.modules.get(pkg), "__version__", None)
        return f"{encoding_for(model.model)} ({pkg}{' ' + str(version) if version else ''})"


class FirstCounter:
    """The first of ``counters`` that counts a model (for each prompt: one that cannot count
    this prompt, an endpoint that failed, leaves it to the next)."""

    def __init__(self, *counters: TokenCounter) -> None:
        self.counters = counters

    def count(self, model: ModelSpec, messages: Sequence[dict[str, str]]) -> int | None:
        for c in self.counters:
            n = c.count(model, messages)
            if n is not None:
                return n
        return None

    def name(self, model: ModelSpec) -> str | None:
        return next((n for c in self.counters if (n := c.name(model)) is not None), None)


def default_counter(*, server: bool = True, timeout_s: float = 10.0) -> TokenCounter:
    """A run's counter: the vLLM server's ``/tokenize`` for a model served by vLLM (unless
    ``server`` is False: nothing is sent, as in a dry run with ``--no-probe`` or a replayed
    run), then the OpenAI encodings when ``bpe-openai`` is installed."""
    counters: list[TokenCounter] = []
    if server:
        from mutators.llm.client.tokenize import ServerTokenCounter

        counters.append(ServerTokenCounter(timeout_s=timeout_s))
    counters.append(EncodingCounter())
    return FirstCounter(*counters)
