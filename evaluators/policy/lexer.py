"""The lexical half of the C++ reader: read the characters the way the compiler does.

nvcc preprocesses both passes with the host compiler (gcc), so the policy must split the
source into comments, literals, directives and code exactly where gcc's lexer does. Every
place where the two disagree is a hiding place: text the policy reads as a comment or a
string but the compiler reads as code is never checked. The bypasses this closes (each has
an attack fixture in tests/fixtures/attacks/):

- **Whitespace the compiler accepts**: form feed, vertical tab, NUL and a UTF-8 BOM are
  whitespace to gcc (``\\f#define`` is a directive, ``sys\\0tem`` two tokens), so
  :func:`normalize` turns them into spaces before anything else reads the text.
- **Line ends**: a lone ``\\r`` ends a line for gcc (so it ends a ``//`` comment); ``\\r\\n``
  is one line end. :func:`normalize` maps them to ``\\n`` (``\\r\\n`` to space + ``\\n``).
- **Identifiers**: gcc accepts ``$`` in identifiers, so ``$R"(`` is the identifier ``$R``
  and a plain string, not a raw string. :func:`lex` tokenises identifiers and pp-numbers
  (``1'000``, ``0x1p+3``, ``1$'a'``) so a quote or a raw-string prefix is only ever looked
  at where a token starts, as the compiler does.
- **Directives**: a ``#`` is a directive only as the first token of a line (block comments
  before it count as whitespace; a newline inside a comment does not start a line), never
  inside a literal (a multi-line raw string holding ``#ifdef`` is a string). Inside a
  directive a raw string ends with the line, as gcc ends it.
- **Digraphs** ``<% %> <: :>`` are braces and brackets to the compiler (with C++11's ``<::``
  exception), so the structure scanner sees them as such.

All views are offset-preserving: every function here returns text of the same length as its
input, so an offset means the same place everywhere and maps back to the original line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Lexed", "normalize", "splice", "lex", "blank_spans"]

_NORMALIZE = str.maketrans({"\f": " ", "\v": " ", "\0": " ", "\ufeff": " "})


def normalize(source: str) -> str:
    """Whitespace and line ends as gcc reads them; the result has the same length."""
    s = source.translate(_NORMALIZE)
    if "\r" in s:
        s = s.replace("\r\n", " \n").replace("\r", "\n")
    return s


_SPLICE = re.compile(r"\\[ \t]*\n")


def splice(text: str) -> tuple[str, list[int]]:
    """Remove backslash-newline splices (phase 2); return the text and where splices were."""
    out: list[str] = []
    splices: list[int] = []
    i, pos = 0, 0
    for m in _SPLICE.finditer(text):
        out.append(text[i : m.start()])
        pos += m.start() - i
        splices.append(pos)
        i = m.end()
    out.append(text[i:])
    return "".join(out), splices


def blank_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with every ``[a, b)`` span replaced by spaces (newlines kept)."""
    out, pos = [], 0
    for a, b in spans:
        if b <= a:
            continue
        out.append(text[pos:a])
        out.append(re.sub(r"[^\n]", " ", text[a:b]))
        pos = b
    out.append(text[pos:])
    return "".join(out)


_IDC = r"0-9A-Za-z_$\x80-\U0010ffff"
_PREFIX = r"(?:u8|u|U|L)"
# One event per match. `skip` swallows whole tokens that cannot start a comment, a literal
# or a directive (identifiers, pp-numbers, punctuation, blanks) up to the end of the line.
_EVENT = re.compile(
    r"(?P<skip>(?>"
    rf"[^\n/\"'#%.{_IDC}]++"
    rf"|(?!{_PREFIX}?R\")[A-Za-z_$\x80-\U0010ffff][{_IDC}]*+"
    rf"|\.?[0-9](?:[eEpP][+-]|'[{_IDC}]|[.{_IDC}])*+"
    r"|\.|/(?![/*])|%(?!:)"
    r")++)"
    r"|(?P<nl>\n)"
    r"|(?P<lc>//[^\n]*+)"
    r"|(?P<bc>/\*)"
    rf"|(?P<raw>{_PREFIX}?R\")"
    r"|(?P<str>\")"
    r"|(?P<chr>')"
    r"|(?P<hash>#|%:)"
)
_NONSPACE = re.compile(r"[^ \t]")
_STR_BODY = re.compile(r'(?:[^"\\\n]|\\.)*+')
_CHR_BODY = re.compile(r"(?:[^'\\\n]|\\.)*+")
_RAW_DELIM = re.compile(r'([^ ()\\\t\n]{0,16})\(')
_DIGRAPH = re.compile(r"<%|%>|<:(?!:[^:>])|:>")
_DIGRAPH_TO = {"<%": "{ ", "%>": "} ", "<:": "[ ", ":>": "] "}


@dataclass(frozen=True)
class Lexed:
    """What :func:`lex` found in a normalised, spliced text (all offsets into it).

    ``nocomment``: comments blanked, literals kept. ``code``: literal contents blanked too
    (quotes kept), digraphs rewritten to ``{ } [ ]`` and ``$`` to ``_`` so identifier regexes
    see the compiler's identifiers. ``directives``: ``(start, end)`` from the ``#`` to the line
    end that closes the directive. ``problems``: ``(offset, message)`` for text whose meaning
    to the compiler is not certain (malformed or unterminated raw strings).
    """

    nocomment: str
    code: str
    directives: tuple[tuple[int, int], ...]
    problems: tuple[tuple[int, str], ...]


def lex(text: str) -> Lexed:
    """Split ``text`` (already normalised and spliced) into comments, literals and directives."""
    comments: list[tuple[int, int]] = []
    literals: list[tuple[int, int]] = []
    directives: list[tuple[int, int]] = []
    problems: list[tuple[int, str]] = []
    n = len(text)
    pos = 0
    bol = True  # no token yet on this line
    dir_start = -1  # offset of the '#' of the directive being read, or -1
    match = _EVENT.match
    while pos < n:
        m = match(text, pos)
        kind = m.lastgroup
        end = m.end()
        if kind == "skip":
            if bol and _NONSPACE.search(text, pos, end):
                bol = False
            pos = end
        elif kind == "nl":
            if dir_start >= 0:
                directives.append((dir_start, pos))
                dir_start = -1
            bol = True
            pos = end
        elif kind == "lc":
            comments.append((pos, end))
            pos = end
        elif kind == "bc":
            j = text.find("*/", pos + 2)
            j = n if j < 0 else j + 2
            comments.append((pos, j))  # a newline inside a comment does not end the line
            pos = j
        elif kind == "hash":
            if bol and dir_start < 0:
                dir_start = pos
            bol = False
            pos = end
        elif kind == "raw":
            bol = False
            dm = _RAW_DELIM.match(text, end)
            if dm is None:
                problems.append((pos, "malformed raw string delimiter (at most 16 characters, no "
                                      "spaces, parentheses or backslashes)"))
                pos = end - 1  # read on as a plain string; the rule reports the problem
                continue
            close = ")" + dm.group(1) + '"'
            limit = n
            if dir_start >= 0:  # inside a directive a raw string ends with the line, as gcc reads it
                nl = text.find("\n", end)
                limit = n if nl < 0 else nl
            j = text.find(close, dm.end(), limit)
            if j < 0:
                problems.append((pos, "unterminated raw string"))
                literals.append((end, limit))
                pos = limit
            else:
                literals.append((end, j + len(close) - 1))
                pos = j + len(close)
        else:  # a plain string or a character literal
            bol = False
            body = (_STR_BODY if kind == "str" else _CHR_BODY).match(text, end)
            literals.append((end, body.end()))
            pos = body.end()
            if pos < n and text[pos] == m.group(0):
                pos += 1
    if dir_start >= 0:
        directives.append((dir_start, n))
    nocomment = blank_spans(text, comments)
    code = blank_spans(nocomment, literals)
    if "$" in code:
        code = code.replace("$", "_")
    if "<" in code or ":>" in code or "%>" in code:
        code = _DIGRAPH.sub(lambda d: _DIGRAPH_TO[d.group(0)], code)
    return Lexed(nocomment, code, tuple(directives), tuple(problems))
