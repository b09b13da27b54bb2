"""The C++ reader: the views of a candidate source that the policy rules read.

:func:`parse_source` normalises and lexes the text (:mod:`evaluators.policy.lexer`), reads
the preprocessor directives, and walks the braces to tell namespace, class and function
scopes apart. It is a heuristic reader, not a compiler: it never expands macros (it scans
their bodies, and records which macros stand for ``__device__``, ``__host__`` or ``asm``),
and it does not evaluate ``#if`` except for one question, whether a place is compiled only
for the GPU (inside ``#ifdef __CUDA_ARCH__`` and its spellings). Rules live in
:mod:`evaluators.policy.rules` and the modules it assembles.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping

from evo.core.records import canonical_params

from evaluators.policy.lexer import lex, normalize, splice
from evaluators.policy.preproc import (
    ASM_WORDS,
    BUILTIN_DEVICE_MACROS,
    BUILTIN_HOST_MACROS,
    CONST_MACROS,
    arch_marks,
    macro_sets,
    std_names,
)

__all__ = ["Directive", "Frame", "ParsedSource", "parse_source", "ASM_WORDS", "BUILTIN_DEVICE_MACROS",
           "BUILTIN_HOST_MACROS", "CONST_MACROS"]



@dataclass(frozen=True)
class Directive:
    line: int
    name: str  # "include", "define", ...
    body: str  # text after the directive name, comments removed, strings kept
    offset: int  # offset of the '#' in the spliced text
    end: int = 0  # offset of the line end that closes it


@dataclass(frozen=True)
class Frame:
    """A brace scope found by the structure scanner.

    ``kind``: ``ns`` (file, namespace or ``extern "C" {}`` block), ``class`` (class, struct,
    union body), ``func`` (function body), ``block`` (any brace inside a function), ``init``
    (brace initialiser, enum body, anything inside parentheses). ``head`` is the text of the
    statement that opened it (for ``func``: the declaration). ``device``: a function compiled
    for the GPU (``__device__``/``__global__`` or a macro that expands to them). ``host``: a
    function compiled for the CPU (no execution space, or ``__host__``: a ``__host__
    __device__`` function is both).
    """

    kind: str
    start: int
    end: int
    head: str
    device: bool = False
    c_linkage: bool = False
    head_start: int = 0  # offset where the opening statement (e.g. the declaration) begins
    host: bool = True


@dataclass(frozen=True)
class ParsedSource:
    """The views of a source that rules read (built once by :func:`parse_source`).

    ``normalized``: the source with whitespace and line ends as the compiler reads them
    (same length). ``text``: that, line-spliced. ``nocomment``: comments blanked, literals
    kept. ``code``: comments, literal contents and directive lines blanked (quotes kept;
    digraphs as ``{ } [ ]``, ``$`` as ``_``). ``macro_code``: only the ``#define`` lines, in the
    ``code`` spelling (so forbidden names hidden in macros are seen). All views have the same
    length, so an offset means the same place in each; :meth:`line` maps it back to the
    original line number. ``*_idents`` map each identifier of ``code`` / ``macro_code`` to its
    offsets.
    """

    original: str
    normalized: str
    text: str
    nocomment: str
    code: str
    macro_code: str
    directives: tuple[Directive, ...]
    frames: tuple[Frame, ...]
    statements: tuple[tuple[str, int, str], ...]  # (scope kind, offset, statement text)
    line_starts: tuple[int, ...]  # offsets in `text` where each spliced line starts
    line_numbers: tuple[int, ...]  # original line number of each spliced line
    splice_offsets: tuple[int, ...]  # offsets in `text` where a splice was removed
    device_macros: frozenset[str]
    params: tuple[tuple[str, str], ...] = ()
    host_macros: frozenset[str] = frozenset()
    asm_macros: frozenset[str] = frozenset()  # macros whose expansion contains asm
    macros: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # name -> bodies
    std_names: frozenset[str] = frozenset({"", "std"})  # qualifiers that may denote namespace std
    uses_std: bool = False  # a `using namespace std` (or alias) is in force somewhere
    arch_marks: tuple[tuple[int, bool], ...] = ()  # (offset, device-only from here on)
    problems: tuple[tuple[int, str], ...] = ()
    code_idents: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    macro_idents: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def line(self, offset: int) -> int:
        """Original 1-based line number of ``offset`` in the spliced text."""
        i = bisect.bisect_right(self.line_starts, offset) - 1
        base = self.line_numbers[max(i, 0)]
        # splices inside this spliced line push the original line further down
        lo = self.line_starts[max(i, 0)]
        extra = bisect.bisect_right(self.splice_offsets, offset) - bisect.bisect_right(
            self.splice_offsets, lo
        )
        return base + extra

    @functools.cached_property
    def _lines(self) -> list[str]:
        return self.normalized.split("\n")

    def source_line(self, line: int) -> str:
        """Line ``line`` as the compiler counts lines (a lone ``\\r`` ends one)."""
        return self._lines[line - 1] if 0 < line <= len(self._lines) else ""

    def function_at(self, offset: int) -> Frame | None:
        """Innermost function frame containing ``offset`` (None at namespace/class scope)."""
        best = None
        for f in self.frames:
            if f.kind == "func" and f.start <= offset < f.end:
                if best is None or f.start >= best.start:
                    best = f
        return best

    def device_only(self, offset: int) -> bool:
        """Whether ``offset`` lies in a preprocessor branch compiled only for the GPU
        (``#ifdef __CUDA_ARCH__``, ``#if defined(__CUDA_ARCH__) && ...``, the ``#else`` of
        ``#ifndef __CUDA_ARCH__``)."""
        i = bisect.bisect_right(self.arch_marks, (offset, True)) - 1
        return i >= 0 and self.arch_marks[i][1]

    def idents(self, view: str) -> Mapping[str, tuple[int, ...]]:
        return self.macro_idents if view is self.macro_code else self.code_idents


# ---------------------------------------------------------------------------------------------
# Context helpers (shared by the rules)

_IDENT_OR_NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|[\w.'])*+|([A-Za-z_]\w*+)")


def ident_index(view: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for m in _IDENT_OR_NUMBER.finditer(view):
        name = m.group(1)
        if name is not None:
            out.setdefault(name, []).append(m.start())
    return {k: tuple(v) for k, v in out.items()}


def prev_nonspace(s: str, i: int) -> int:
    i -= 1
    while i >= 0 and s[i] in " \t\r\n":
        i -= 1
    return i


def next_nonspace(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def qualifier(s: str, start: int) -> str | None:
    """Return the qualifier before ``start``: None (unqualified), "" (``::x``), or the name."""
    j = prev_nonspace(s, start)
    if j >= 1 and s[j] == ":" and s[j - 1] == ":":
        k = prev_nonspace(s, j - 1)
        m = re.search(r"([A-Za-z_]\w*)$", s[max(0, k - 80) : k + 1])
        return m.group(1) if m and k >= 0 and (s[k].isalnum() or s[k] == "_") else ""
    return None


def is_member(s: str, start: int) -> bool:
    j = prev_nonspace(s, start)
    return j >= 0 and (s[j] == "." or (s[j] == ">" and j >= 1 and s[j - 1] == "-"))


_NOT_TYPES = frozenset({"return", "else", "do", "case", "throw", "co_return", "co_yield", "co_await",
                        "new", "delete", "sizeof", "typeid", "not", "and", "or"})


def declares(s: str, start: int) -> bool:
    """Whether the identifier at ``start`` follows a type name (so it is being declared)."""
    j = prev_nonspace(s, start)
    if j < 0:
        return False
    if s[j] in "*&>":
        k = prev_nonspace(s, j)  # `T* name(` / `X<T> name(`, but not `a > name(` style comparisons
        return s[j] != ">" or (k >= 0 and (s[k].isalnum() or s[k] in "_>"))
    m = re.search(r"([A-Za-z_]\w*)$", s[max(0, j - 64) : j + 1])
    return bool(m) and m.group(1) not in _NOT_TYPES


def count_args(s: str, open_idx: int) -> int:
    depth, n, seen = 0, 1, False
    for k in range(open_idx, len(s)):
        ch = s[k]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                break
        elif ch == "," and depth == 1:
            n += 1
        elif not ch.isspace() and depth >= 1:
            seen = True
    return n if seen else 0


def matching_open(s: str, close_idx: int) -> int:
    """Offset of the ``(`` matching the ``)`` at ``close_idx`` (or -1)."""
    depth = 0
    for k in range(close_idx, max(-1, close_idx - 4000), -1):
        if s[k] == ")":
            depth += 1
        elif s[k] == "(":
            depth -= 1
            if depth == 0:
                return k
    return -1


def strip_balanced(s: str, keyword_re: str, open_ch: str = "(", close_ch: str = ")", keep: bool = True) -> str:
    """Remove ``KEYWORD(...)`` groups (balanced), leaving the keyword when ``keep``."""
    out = []
    i = 0
    pat = re.compile(keyword_re + r"\s*" + re.escape(open_ch))
    while True:
        m = pat.search(s, i)
        if not m:
            out.append(s[i:])
            break
        out.append(s[i : m.start()])
        if keep:
            out.append(" " + m.group(0)[: -1].strip() + " ")
        depth, j = 1, m.end()
        while j < len(s) and depth:
            if s[j] == open_ch:
                depth += 1
            elif s[j] == close_ch:
                depth -= 1
            j += 1
        i = j
    return "".join(out)


def _strip_template_prefix(s: str) -> str:
    s = s.lstrip()
    while True:
        m = re.match(r"template\s*<", s)
        if not m:
            return s
        depth, j = 1, m.end()
        while j < len(s) and depth:
            if s[j] == "<":
                depth += 1
            elif s[j] == ">":
                depth -= 1
            j += 1
        s = s[j:].lstrip()


def normalize_head(head: str) -> str:
    """Drop attributes and parenthesised specifiers that are not declarators."""
    s = _strip_template_prefix(head)
    s = re.sub(r"\[\[.*?\]\]", " ", s)
    if "(" in s:
        for kw in ("__attribute__", "__declspec", "alignas", "__align__", "__launch_bounds__",
                   "__cluster_dims__", "__maxnreg__", "CUTE_ALIGNAS", "CUTLASS_ALIGNAS"):
            if kw in s:
                s = strip_balanced(s, r"\b" + kw, keep=False)
        for kw in ("decltype", "sizeof", "alignof", "noexcept", "__builtin_"):
            if kw in s:
                s = strip_balanced(s, r"\b" + kw + r"\w*\s*(?:\.\.\.)?", keep=True)
    s = re.sub(r"\boperator\s*(\(\s*\)|\[\s*\]|[^\s(\w]+|\w+)", " operator_ ", s)
    return s.strip()


def top_level_index(s: str, chars: str) -> int:
    """Index of the first char in ``chars`` outside (), [], {} (or -1)."""
    depth = 0
    for i, c in enumerate(s):
        if c in "([{":
            if depth == 0 and c in chars:
                return i
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c in chars:
            return i
    return -1


_INNER_BRACES = re.compile(r"\{[^{}]*\}")


def collapse_braces(s: str) -> str:
    """``a {b {c}} d`` -> ``a {} d`` (brace contents removed, outermost pair kept)."""
    if "{" not in s:
        return s
    while True:
        s2 = _INNER_BRACES.sub("\x00", s)
        if s2 == s:
            break
        s = s2
    return s.replace("\x00", "{}")


# ---------------------------------------------------------------------------------------------
# Structure scanning (namespace / class / function scopes)

CLASS_HEAD = re.compile(
    r"^(?:(?:typedef|static|const|constexpr|inline|volatile|extern|struct|class|union|"
    r"__device__|__host__|__constant__|__managed__|[A-Z_][A-Z0-9_]*)\s+)*?(struct|class|union|enum)\b"
)
FUNC_TAIL = re.compile(r"\)\s*(?:const|volatile|noexcept|override|final|&&|&|\s)*$|->")


def _classify_brace(head: str, device_macros: frozenset[str],
                    host_macros: frozenset[str]) -> tuple[str, bool, bool, bool]:
    """Kind of scope a ``{`` opens at namespace or class scope: (kind, device, host, c_linkage)."""
    raw = head.strip()
    if re.match(r"^(?:inline\s+)?namespace\b", raw) and "=" not in raw:
        return "ns", False, True, False
    if re.match(r'^extern\s*"[^"]*"\s*$', raw):
        return "ns", False, True, True
    s = normalize_head(raw)
    m = CLASS_HEAD.match(s)
    if m and top_level_index(s, "=") < 0 and not FUNC_TAIL.search(s):
        # `struct X : B<(N > 1)> {` is a class; `struct X f(int) {` (ends in `)`) a function
        return ("init" if m.group(1) == "enum" else "class"), False, True, False
    eq = top_level_index(s, "=")
    par = top_level_index(s, "(")
    if re.search(r"\)\s*(?:noexcept\s*)?:(?!:)", s) and re.search(r"[\w>]\s*$", s):
        return "init", False, True, False  # `X() : member{...}`: a brace inside a mem-initializer list
    if par >= 0 and (eq < 0 or par < eq):
        words = set(re.findall(r"[A-Za-z_]\w*", s[:par]))
        device = bool(words & ({"__device__", "__global__"} | device_macros))
        host = not device or bool(words & ({"__host__"} | host_macros))
        return "func", device, host, False
    return "init", False, True, False


def _scan(code: str, device_macros: frozenset[str],
          host_macros: frozenset[str]) -> tuple[list[Frame], list[tuple[str, int, str]]]:
    """Walk braces/parens/semicolons; return frames and statements with their scope kind."""

    class _Open:
        __slots__ = ("kind", "start", "head", "device", "host", "c_linkage", "stmt_start", "paren", "head_start")

        def __init__(self, kind, start, head, device, host, c_linkage, head_start=0):
            self.kind, self.start, self.head, self.head_start = kind, start, head, head_start
            self.device, self.host, self.c_linkage = device, host, c_linkage
            self.stmt_start = start + 1 if start >= 0 else 0
            self.paren = 0

    root = _Open("ns", -1, "", False, True, False)
    stack = [root]
    frames: list[Frame] = []
    statements: list[tuple[str, int, str]] = []
    for m in re.finditer(r"[(){};]", code):
        i, c = m.start(), m.group(0)
        top = stack[-1]
        if c == "(":
            top.paren += 1
        elif c == ")":
            top.paren = max(0, top.paren - 1)
        elif c == "{":
            head = ""
            if top.paren > 0 or top.kind == "init":
                kind, dev, host, cl = "init", top.device, top.host, False
            elif top.kind in ("func", "block"):
                kind, dev, host, cl = "block", top.device, top.host, False
            else:
                head = code[top.stmt_start : i]
                kind, dev, host, cl = _classify_brace(head, device_macros, host_macros)
            cl = cl or top.c_linkage
            lead = len(head) - len(head.lstrip())
            stack.append(_Open(kind, i, head.strip(), dev, host, cl, top.stmt_start + lead if head else i))
        elif c == "}":
            if len(stack) == 1:
                continue  # unbalanced; the compiler will say so
            fr = stack.pop()
            frames.append(Frame(fr.kind, fr.start, i + 1, fr.head, fr.device, fr.c_linkage, fr.head_start, fr.host))
            parent = stack[-1]
            if fr.kind in ("func", "ns"):
                if parent.kind in ("ns", "class"):
                    # a function or namespace definition: kept (for completeness) but marked
                    statements.append((parent.kind + "-def", parent.stmt_start, code[parent.stmt_start : i + 1]))
                parent.stmt_start = i + 1
            elif fr.kind == "block":
                parent.stmt_start = i + 1
        elif c == ";" and top.paren == 0 and top.kind != "init":
            statements.append((top.kind, top.stmt_start, code[top.stmt_start : i]))
            top.stmt_start = i + 1
    return frames, statements


# ---------------------------------------------------------------------------------------------
# Parsing entry point

_DIRECTIVE_HEAD = re.compile(r"(?:#|%:)[ \t]*([A-Za-z_]\w*)?(.*)", re.S)
_DEFINE = re.compile(r"([A-Za-z_$][\w$]*+)(?:(\()[^)]*\))?\s*(.*)", re.S)


def parse_source(source: str, params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None = None) -> ParsedSource:
    """Build the views the rules read (see :class:`ParsedSource`)."""
    normalized = normalize(source)
    text, splices = splice(normalized)
    lexed = lex(text)
    nocomment = lexed.nocomment
    code_chars = list(lexed.code)
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
    # original line = 1 + newlines before + splices before (each splice ate one newline)
    line_numbers = [1 + k + bisect.bisect_right(splices, ls) for k, ls in enumerate(line_starts)]
    macro_chars = [c if c == "\n" else " " for c in lexed.code]
    raw_directives: list[tuple[int, int, str, str]] = []
    macros: dict[str, list[tuple[bool, str]]] = {}
    for start, end in lexed.directives:
        m = _DIRECTIVE_HEAD.match(nocomment[start:end].replace("\n", " "))
        name, body = (m.group(1) or ""), m.group(2).strip()
        raw_directives.append((start, end, name, body))
        if name == "define":
            macro_chars[start:end] = code_chars[start:end]
            dm = _DEFINE.match(lexed.code[start:end].replace("\n", " ").split("define", 1)[1].strip())
            if dm:
                macros.setdefault(dm.group(1).replace("$", "_"), []).append((dm.group(2) is not None, dm.group(3)))
        code_chars[start:end] = [c if c == "\n" else " " for c in code_chars[start:end]]
    code = "".join(code_chars)
    macro_code = "".join(macro_chars)
    pairs = params if isinstance(params, tuple) else canonical_params(params)
    device_macros, host_macros, asm_macros = macro_sets(macros)
    frames, statements = _scan(code, device_macros, host_macros)
    std_quals, uses_std = std_names(code, frames, macros)
    parsed = ParsedSource(
        original=source,
        normalized=normalized,
        text=text,
        nocomment=nocomment,
        code=code,
        macro_code=macro_code,
        directives=(),
        frames=tuple(frames),
        statements=tuple(statements),
        line_starts=tuple(line_starts),
        line_numbers=tuple(line_numbers),
        splice_offsets=tuple(splices),
        device_macros=device_macros,
        params=pairs,
        host_macros=host_macros,
        asm_macros=asm_macros,
        macros={k: tuple(b for _, b in v) for k, v in macros.items()},
        std_names=std_quals,
        uses_std=uses_std,
        problems=lexed.problems,
        code_idents=ident_index(code),
        macro_idents=ident_index(macro_code),
    )
    # directive line numbers need the line mapping; the #if regions need the directives
    dirs = tuple(Directive(parsed.line(s), n, b, s, e) for s, e, n, b in raw_directives)
    return dataclasses.replace(parsed, directives=dirs, arch_marks=tuple(arch_marks(list(dirs))))
