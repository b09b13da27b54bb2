"""Prompt templates: ``mutators/llm/prompt/prompts/<kind>.md`` rendered into chat messages.

Templates are plain files in :class:`string.Template` syntax (``${field}``; a literal dollar
is ``$$``) plus one tiny construct for optional sections::

    <!-- if profile -->
    ## Profile
    ${profile}
    <!-- end if -->

An optional section is kept only when its field is given and non-empty (not ``None``, not
blank); the fields used inside it are then required. Every field used outside optional
sections is required: a missing one raises :class:`PromptError` naming it and the kind.
``system.md`` is the system message of every kind (the evaluation-contract rules and, when
the field ``card`` is given, the CuTe reference card: :mod:`mutators.llm.prompt.card`; a
stable first message, so endpoints that cache prompt prefixes reuse it across calls).

The first line of each user message is ``[kind:<kind>] task <task>``, a stable marker that
cassettes match on (``"match": "[kind:repair]"``).
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "PromptError", "render_prompt", "template_fields", "estimate_prompt_tokens", "PROMPTS_DIR",
           "BUDGET_CHARS_PER_TOKEN"]

#: Characters per token assumed when fitting a prompt to a model's window: conservative on
#: purpose (CUDA source tokenizes at ~3-3.5 characters a token), so an estimate that fits
#: leaves room; cost estimates use mutators.llm.client.calls.estimate_tokens (~4) instead.
BUDGET_CHARS_PER_TOKEN = 3.0

PROMPTS_DIR = Path(__file__).with_name("prompts")
KINDS = ("genesis", "repair", "optimize")

_IF_RE = re.compile(r"^<!-- if (\w+) -->[ \t]*\n(.*?)^<!-- end if -->[ \t]*\n?", re.MULTILINE | re.DOTALL)


class PromptError(ValueError):
    """A prompt cannot be rendered: unknown kind, missing field, or a broken template."""


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    p = PROMPTS_DIR / f"{name}.md"
    if not p.is_file():
        raise PromptError(f"prompt template {p} is missing; the package data of "
                          "mutators/llm/prompt/prompts is incomplete")
    return p.read_text(encoding="utf-8")


def _identifiers(text: str) -> set[str]:
    out = set()
    for m in string.Template.pattern.finditer(text):
        name = m.group("named") or m.group("braced")
        if name:
            out.add(name)
        elif m.group("invalid") is not None:
            line = text[: m.start()].count("\n") + 1
            raise PromptError(f"template has an invalid '$' placeholder at line {line}; write $$ for a dollar sign")
    return out


def template_fields(kind: str) -> tuple[set[str], set[str]]:
    """``(required, optional)`` field names of ``kind``'s prompt (its template and the
    system message's)."""
    required: set[str] = set()
    optional: set[str] = set()
    for text in (_template(kind), _read("system")):
        for m in _IF_RE.finditer(text):
            optional.add(m.group(1))
            optional |= _identifiers(m.group(2))
        required |= _identifiers(_IF_RE.sub("", text))
    return required, optional - required


def _template(kind: str) -> str:
    if kind not in KINDS:
        raise PromptError(f"unknown prompt kind {kind!r}; known kinds: {', '.join(KINDS)}")
    return _read(kind)


def _present(v: Any) -> bool:
    return v is not None and str(v).strip() != ""


def estimate_prompt_tokens(messages: list[dict[str, str]], chars_per_token: float = BUDGET_CHARS_PER_TOKEN) -> int:
    """A token count of a message list for budgeting: characters / ``chars_per_token`` (the
    conservative BUDGET_CHARS_PER_TOKEN until the endpoint's usage reports calibrate it)
    plus 8 a message for the chat framing."""
    return sum(int(len(m.get("content", "")) / chars_per_token) + 8 for m in messages)


def _render(text: str, kind: str, fields: dict[str, Any]) -> str:
    def keep(m: re.Match[str]) -> str:
        return m.group(2) if _present(fields.get(m.group(1))) else ""

    body = _IF_RE.sub(keep, text)
    needed = _identifiers(body)
    missing = sorted(n for n in needed if n not in fields or fields[n] is None)
    if missing:
        raise PromptError(f"prompt {kind!r} needs field(s) {', '.join(missing)}; got {', '.join(sorted(fields)) or 'none'}")
    values = {k: str(v) for k, v in fields.items() if v is not None}
    return string.Template(body).substitute(values).strip() + "\n"


def render_prompt(kind: str, **fields: Any) -> list[dict[str, str]]:
    """``[system, user]`` messages for ``kind`` with ``fields`` substituted (values via ``str``);
    ``system.md``'s optional sections (the CuTe reference card: field ``card``) take their
    fields from the same ``fields``."""
    user = _render(_template(kind), kind, fields)
    system = _render(_read("system"), kind, fields)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
