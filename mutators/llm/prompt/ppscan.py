"""The preprocessor directives of a CUDA source, read the way the compiler reads them.

:func:`scan_directives` lists every directive (``#if``, ``#define``, ...) with the lines it
spans and its body without comments. A ``#`` opens a directive only as the first token of a
line outside comments and literals (``/* #if */``, a string holding ``#endif`` and a raw
string across lines are not directives); a backslash-newline continues a directive on the
next line. The reader is for prompts, not for the policy: where it cannot be sure (an
unterminated comment or raw string) it stops, and the caller treats what it did not read as
unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Directive", "scan_directives", "code_view"]


@dataclass(frozen=True)
class Directive:
    """One directive: its first and last line (1-based, a continued directive spans several),
    its name (``if``, ``ifdef``, ``elif``, ``define``...) and its body with comments removed
    and continuations joined."""

    line: int
    last_line: int
    name: str
    body: str


_NAME_RE = re.compile(r"\s*([A-Za-z_]\w*)?")


def _raw_prefix(source: str, quote: int) -> bool:
    """Whether the ``"`` at ``quote`` opens a raw string (``R"``, ``u8R"``, ``LR"``...)."""
    if source[quote - 1:quote] != "R":
        return False
    start = quote - 1
    for prefix in ("u8", "u", "U", "L"):
        if source[start - len(prefix):start] == prefix:
            start -= len(prefix)
            break
    before = source[start - 1:start]
    return not (before.isalnum() or before in ("_", "$"))


def code_view(source: str) -> str | None:
    """``source`` with comments and literal contents blanked, newlines kept (same length);
    None when a comment or raw string does not end."""
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "/" and source.startswith("//", i):
            j = i
            while j < n and source[j] != "\n":  # a // comment continues over a backslash-newline
                if source[j] == "\\" and source.startswith("\n", j + 1):
                    out[j] = " "
                    j += 2
                    continue
                out[j] = " "
                j += 1
            i = j
        elif c == "/" and source.startswith("/*", i):
            j = source.find("*/", i + 2)
            if j < 0:
                return None
            for k in range(i, j + 2):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 2
        elif c == "'" and i > 0 and (source[i - 1].isalnum() or source[i - 1] == "_"):
            i += 1  # a digit separator (1'000) or the end of an identifier-like prefix
        elif c in "\"'":
            if c == '"' and _raw_prefix(source, i):
                open_paren = source.find("(", i + 1, i + 18)
                close = ")" + source[i + 1:open_paren] + '"' if open_paren > 0 else None
                j = source.find(close, open_paren) if close else -1
                if j < 0:
                    return None
                for k in range(i + 1, j + len(close) - 1):
                    if out[k] != "\n":
                        out[k] = " "
                i = j + len(close)
                continue
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def scan_directives(source: str) -> list[Directive] | None:
    """Every directive of ``source`` in order (see the module docstring); None when the
    source cannot be read with certainty (an unterminated comment or raw string)."""
    code = code_view(source)
    if code is None:
        return None
    lines = code.split("\n")
    out: list[Directive] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        first = i
        if text.lstrip().startswith("#"):
            body = text.lstrip()[1:]
            while body.endswith("\\") and i + 1 < len(lines):
                i += 1
                body = body[:-1] + " " + lines[i]
            m = _NAME_RE.match(body)
            name = m.group(1) or ""
            out.append(Directive(first + 1, i + 1, name, " ".join(body[m.end():].split())))
        i += 1
    return out
