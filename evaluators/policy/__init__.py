"""Static policy check: the first cascade stage (milliseconds, before anything is compiled).

A candidate is one CUDA C++ source that must compute its task with its own CuTe kernels,
launched on the harness's stream, with no way to reach outside the call it is given. This
module rejects, by reading the text only, the exploits that earlier kernel-search systems
fell for (see shared/EVALUATION.md): library fallbacks, side streams the timer does not wait
for, results cached in state that survives between calls, host code that runs processes,
touches files, the network, the environment or the clock.

Contract:
  ``check_policy(source, params=None) -> StageResult`` with stage ``"policy"`` and status
  ``ok`` or ``rejected``. On rejection ``reason`` names the first violated rule and its line;
  ``metrics["violations"]`` lists every violation as ``{"rule", "line", "message"}`` and
  ``artifacts["violations"]`` renders them with the offending source lines (for repair
  prompts). ``POLICY_RULES`` is the tuple of :class:`Rule` objects applied, in order.

How it reads C++ (and its deliberate limits):
  The source is first line-spliced (``\\``-newline, as the preprocessor does in phase 2, so
  ``sys\\<newline>tem`` is seen as ``system``), then comments and the contents of string and
  character literals (raw strings included) are blanked, keeping every offset and line. Rules
  run regexes over that view, so nothing inside ``//``, ``/* */`` or ``"..."`` is ever flagged.
  Preprocessor directives are read separately: ``#include`` paths go through the allowlist and
  ``#define`` bodies are scanned for forbidden names too (``#define S system`` is caught).
  Token pasting (``##``) is rejected outright, because it can assemble any identifier where
  no static check can see it. A small brace-structure scanner tells namespace, class and
  function scopes apart; it powers the global-state, host-asm and entry-point rules. It is a
  heuristic reader, not a C++ parser: its known blind spots are documented in
  docs/evaluator.md and each is backed by a later stage (poisoned outputs, fresh processes).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from evo.records import Candidate, Status, StageResult, canonical_params

__all__ = [
    "Rule",
    "Violation",
    "ParsedSource",
    "POLICY_RULES",
    "MAX_SOURCE_BYTES",
    "MAX_SOURCE_LINES",
    "ALLOWED_INCLUDE_PATTERNS",
    "check_policy",
    "check_candidate",
    "include_allowed",
    "param_violations",
    "parse_source",
    "PolicyStage",
]

logger = logging.getLogger(__name__)

MAX_SOURCE_BYTES = 200 * 1024
MAX_SOURCE_LINES = 5000


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Violation:
    """One broken rule at one place. ``line`` is 1-based in the original source."""

    rule: str
    line: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "line": self.line, "message": self.message}


@dataclass(frozen=True)
class Rule:
    """A named policy rule.

    ``check(parsed)`` returns the violations found in a :class:`ParsedSource` (empty when the
    source complies). ``reason`` says which exploit the rule closes; it is shown to people
    and to the LLM in repair prompts. Checks are module-level functions, so rules pickle.
    """

    name: str
    reason: str
    check: Callable[["ParsedSource"], Iterable[Violation]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class Directive:
    line: int
    name: str  # "include", "define", ...
    body: str  # text after the directive name, comments removed, strings kept
    offset: int  # offset of the '#' in the spliced text


@dataclass(frozen=True)
class Frame:
    """A brace scope found by the structure scanner.

    ``kind``: ``ns`` (file, namespace or ``extern "C" {}`` block), ``class`` (class, struct,
    union body), ``func`` (function body), ``block`` (any brace inside a function), ``init``
    (brace initialiser, enum body, anything inside parentheses). ``head`` is the text of the
    statement that opened it (for ``func``: the declaration). ``device``: a function compiled
    for the GPU (``__device__``/``__global__`` or a macro that expands to them).
    """

    kind: str
    start: int
    end: int
    head: str
    device: bool = False
    c_linkage: bool = False
    head_start: int = 0  # offset where the opening statement (e.g. the declaration) begins


@dataclass(frozen=True)
class ParsedSource:
    """The views of a source that rules read (built once by :func:`parse_source`).

    ``text``: spliced source. ``nocomment``: comments blanked, literals kept. ``code``:
    comments, literal contents and directive lines blanked (quotes kept). ``macro_code``: only
    the ``#define`` lines, literal contents blanked (so forbidden names hidden in macros are
    seen). All four have the same length, so an offset means the same place in each;
    :meth:`line` maps it back to the original line number.
    """

    original: str
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

    def source_line(self, line: int) -> str:
        lines = self.original.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def function_at(self, offset: int) -> Frame | None:
        """Innermost function frame containing ``offset`` (None at namespace/class scope)."""
        best = None
        for f in self.frames:
            if f.kind == "func" and f.start <= offset < f.end:
                if best is None or f.start >= best.start:
                    best = f
        return best


# ---------------------------------------------------------------------------------------------
# Lexing


def _splice(source: str) -> tuple[str, list[int]]:
    """Remove backslash-newline splices; return text and the offsets where splices were."""
    out: list[str] = []
    splices: list[int] = []
    i, n, pos = 0, len(source), 0
    for m in re.finditer(r"\\[ \t]*\r?\n", source):
        out.append(source[i : m.start()])
        pos += m.start() - i
        splices.append(pos)
        i = m.end()
    out.append(source[i:n])
    return "".join(out), splices


def _is_digit_separator(text: str, i: int) -> bool:
    """Whether the quote at ``i`` is a C++14 digit separator (``1'000``), not a char literal."""
    j = i - 1
    while j >= 0 and (text[j].isalnum() or text[j] in "_.'"):
        j -= 1
    run = text[j + 1 : i]
    return bool(run) and (run[0].isdigit() or (run[0] == "." and len(run) > 1 and run[1].isdigit()))


_RAW_PREFIX = re.compile(r"(?:u8|u|U|L)?R(?=$)")


def _blank(chars: list[str], a: int, b: int) -> None:
    chars[a:b] = [c if c == "\n" else " " for c in chars[a:b]]


def _blank_str(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def _apply_blanks(text: str, spans: list[tuple[int, int]]) -> str:
    out, pos = [], 0
    for a, b in spans:
        if b <= a:
            continue
        out.append(text[pos:a])
        out.append(_blank_str(text[a:b]))
        pos = b
    out.append(text[pos:])
    return "".join(out)


_LEX_EVENT = re.compile(r"//|/\*|[\"']")


def _lex(text: str) -> tuple[str, str]:
    """Return (nocomment, code-with-literal-contents-blanked); same length as ``text``."""
    comment_spans: list[tuple[int, int]] = []
    lit_spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        m = _LEX_EVENT.search(text, i)
        if not m:
            break
        i = m.start()
        tok = m.group(0)
        if tok == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
            comment_spans.append((i, j))
            i = j
        elif tok == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comment_spans.append((i, j))
            i = j
        elif tok == '"':
            pm = _RAW_PREFIX.search(text, max(0, i - 3), i)
            start_ok = pm is not None and (
                pm.start() == 0 or not (text[pm.start() - 1].isalnum() or text[pm.start() - 1] == "_"))
            if pm and start_ok:
                k = text.find("(", i + 1)
                delim = text[i + 1 : k] if k >= 0 else ""
                end = text.find(")" + delim + '"', k + 1) if k >= 0 else -1
                end = n if end < 0 else end + len(delim) + 2
                lit_spans.append((i + 1, end - 1))
                i = end
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                lit_spans.append((i + 1, min(j, n)))
                i = j + 1
        elif not _is_digit_separator(text, i):  # a character literal
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            lit_spans.append((i + 1, min(j, n)))
            i = j + 1
        else:
            i += 1
    nocomment = _apply_blanks(text, comment_spans)
    return nocomment, _apply_blanks(nocomment, lit_spans)


_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*([A-Za-z_]\w*)?(.*)$", re.M)


def _directives(nocomment: str) -> list[tuple[int, int, str, str]]:
    """(start, end, name, body) of every preprocessor directive line."""
    out = []
    for m in _DIRECTIVE.finditer(nocomment):
        out.append((m.start(), m.end(), m.group(1) or "", m.group(2)))
    return out


# ---------------------------------------------------------------------------------------------
# Structure scanning (namespace / class / function scopes)

_BUILTIN_DEVICE_MACROS = frozenset(
    {"CUTE_DEVICE", "CUTE_HOST_DEVICE", "CUTLASS_DEVICE", "CUTLASS_HOST_DEVICE", "CUTLASS_GLOBAL"}
)
_CONST_MACROS = frozenset({"CUTE_INLINE_CONSTANT"})


def _strip_balanced(s: str, keyword_re: str, open_ch: str = "(", close_ch: str = ")", keep: bool = True) -> str:
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


def _normalize_head(head: str) -> str:
    """Drop attributes and parenthesised specifiers that are not declarators."""
    s = _strip_template_prefix(head)
    s = re.sub(r"\[\[.*?\]\]", " ", s)
    if "(" in s:
        for kw in ("__attribute__", "__declspec", "alignas", "__align__", "__launch_bounds__",
                   "__cluster_dims__", "__maxnreg__", "CUTE_ALIGNAS", "CUTLASS_ALIGNAS"):
            if kw in s:
                s = _strip_balanced(s, r"\b" + kw, keep=False)
        for kw in ("decltype", "sizeof", "alignof", "noexcept", "__builtin_"):
            if kw in s:
                s = _strip_balanced(s, r"\b" + kw + r"\w*\s*(?:\.\.\.)?", keep=True)
    s = re.sub(r"\boperator\s*(\(\s*\)|\[\s*\]|[^\s(\w]+|\w+)", " operator_ ", s)
    return s.strip()


def _top_level_index(s: str, chars: str) -> int:
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


_CLASS_HEAD = re.compile(
    r"^(?:(?:typedef|static|const|constexpr|inline|volatile|extern|struct|class|union|"
    r"__device__|__host__|__constant__|__managed__|[A-Z_][A-Z0-9_]*)\s+)*?(struct|class|union|enum)\b"
)


_FUNC_TAIL = re.compile(r"\)\s*(?:const|volatile|noexcept|override|final|&&|&|\s)*$|->")


def _classify_brace(head: str, device_macros: frozenset[str]) -> tuple[str, bool, bool]:
    """Kind of scope a ``{`` opens at namespace or class scope: (kind, device, c_linkage)."""
    raw = head.strip()
    if re.match(r"^(?:inline\s+)?namespace\b", raw) and "=" not in raw:
        return "ns", False, False
    if re.match(r'^extern\s*"[^"]*"\s*$', raw):
        return "ns", False, True
    s = _normalize_head(raw)
    m = _CLASS_HEAD.match(s)
    if m and _top_level_index(s, "=") < 0 and not _FUNC_TAIL.search(s):
        # `struct X : B<(N > 1)> {` is a class; `struct X f(int) {` (ends in `)`) a function
        return ("init" if m.group(1) == "enum" else "class"), False, False
    eq = _top_level_index(s, "=")
    par = _top_level_index(s, "(")
    if re.search(r"\)\s*(?:noexcept\s*)?:(?!:)", s) and re.search(r"[\w>]\s*$", s):
        return "init", False, False  # `X() : member{...}`: a brace inside a mem-initializer list
    if par >= 0 and (eq < 0 or par < eq):
        words = set(re.findall(r"[A-Za-z_]\w*", s[:par]))
        device = bool(words & ({"__device__", "__global__"} | device_macros))
        return "func", device, False
    return "init", False, False


def _scan(code: str, device_macros: frozenset[str]) -> tuple[list[Frame], list[tuple[str, int, str]]]:
    """Walk braces/parens/semicolons; return frames and statements with their scope kind."""

    class _Open:
        __slots__ = ("kind", "start", "head", "device", "c_linkage", "stmt_start", "paren", "head_start")

        def __init__(self, kind, start, head, device, c_linkage, head_start=0):
            self.kind, self.start, self.head, self.head_start = kind, start, head, head_start
            self.device, self.c_linkage = device, c_linkage
            self.stmt_start = start + 1 if start >= 0 else 0
            self.paren = 0

    root = _Open("ns", -1, "", False, False)
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
                kind, dev, cl = "init", False, False
            elif top.kind in ("func", "block"):
                kind, dev, cl = "block", top.device, False
            else:
                head = code[top.stmt_start : i]
                kind, dev, cl = _classify_brace(head, device_macros)
            cl = cl or top.c_linkage
            lead = len(head) - len(head.lstrip())
            stack.append(_Open(kind, i, head.strip(), dev, cl, top.stmt_start + lead if head else i))
        elif c == "}":
            if len(stack) == 1:
                continue  # unbalanced; the compiler will say so
            fr = stack.pop()
            frames.append(Frame(fr.kind, fr.start, i + 1, fr.head, fr.device, fr.c_linkage, fr.head_start))
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


_INNER_BRACES = re.compile(r"\{[^{}]*\}")


def _collapse_braces(s: str) -> str:
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
# Parsing entry point


def parse_source(source: str, params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None = None) -> ParsedSource:
    """Build the views the rules read (see :class:`ParsedSource`)."""
    text, splices = _splice(source)
    nocomment, code = _lex(text)
    code_chars = list(code)
    directives = []
    # line starts of the spliced text, and the original line number each maps to
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    # original line = 1 + newlines before + splices before (each splice ate one newline)
    line_numbers = [1 + k + bisect.bisect_right(splices, ls) for k, ls in enumerate(line_starts)]
    macro_chars = [c if c == "\n" else " " for c in code]
    for start, end, name, body in _directives(nocomment):
        # body of a directive as written (strings kept) -- includes need the path
        directives.append(Directive(0, name, body.strip(), start))
        if name == "define":
            macro_chars[start:end] = code_chars[start:end]
        _blank(code_chars, start, end)
    code = "".join(code_chars)
    macro_code = "".join(macro_chars)
    pairs = params if isinstance(params, tuple) else canonical_params(params)

    # macros that expand to device-function specifiers (object-like, iterated to a fixpoint)
    device_macros = set(_BUILTIN_DEVICE_MACROS)
    defines = {}
    for d in directives:
        if d.name == "define":
            m = re.match(r"([A-Za-z_]\w*)(?!\()\s*(.*)", d.body)
            if m:
                defines[m.group(1)] = m.group(2)
    changed = True
    while changed:
        changed = False
        for name, body in defines.items():
            words = set(re.findall(r"[A-Za-z_]\w*", body))
            if name not in device_macros and words & ({"__device__", "__global__"} | device_macros):
                device_macros.add(name)
                changed = True
    dm = frozenset(device_macros)
    frames, statements = _scan(code, dm)
    parsed = ParsedSource(
        original=source,
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
        device_macros=dm,
        params=pairs,
    )
    # fill in directive line numbers now that the mapping exists
    dirs = tuple(Directive(parsed.line(d.offset), d.name, d.body, d.offset) for d in directives)
    return dataclasses.replace(parsed, directives=dirs)


# ---------------------------------------------------------------------------------------------
# Name scanning shared by the forbidden-call rules

_IDENT = re.compile(r"[A-Za-z_]\w*")


def _prev_nonspace(s: str, i: int) -> int:
    i -= 1
    while i >= 0 and s[i] in " \t\r\n":
        i -= 1
    return i


def _next_nonspace(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def _qualifier(s: str, start: int) -> str | None:
    """Return the qualifier before ``start``: None (unqualified), "" (``::x``), or the name."""
    j = _prev_nonspace(s, start)
    if j >= 1 and s[j] == ":" and s[j - 1] == ":":
        k = _prev_nonspace(s, j - 1)
        m = re.search(r"([A-Za-z_]\w*)$", s[: k + 1])
        return m.group(1) if m and k >= 0 and (s[k].isalnum() or s[k] == "_") else ""
    return None


def _is_member(s: str, start: int) -> bool:
    j = _prev_nonspace(s, start)
    return j >= 0 and (s[j] == "." or (s[j] == ">" and j >= 1 and s[j - 1] == "-"))


_NOT_TYPES = frozenset({"return", "else", "do", "case", "throw", "co_return", "co_yield", "co_await",
                        "new", "delete", "sizeof", "typeid", "not", "and", "or"})


def _declares(s: str, start: int) -> bool:
    """Whether the identifier at ``start`` follows a type name (so it is being declared)."""
    j = _prev_nonspace(s, start)
    if j < 0:
        return False
    if s[j] in "*&>":
        k = _prev_nonspace(s, j)  # `T* name(` / `X<T> name(`, but not `a > name(` style comparisons
        return s[j] != ">" or (k >= 0 and (s[k].isalnum() or s[k] in "_>"))
    m = re.search(r"([A-Za-z_]\w*)$", s[max(0, j - 64) : j + 1])
    return bool(m) and m.group(1) not in _NOT_TYPES


def _count_args(s: str, open_idx: int) -> int:
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


@dataclass(frozen=True)
class _Names:
    """Forbidden identifiers of one rule.

    ``anywhere``: flagged wherever they appear as an identifier (distinctive names).
    ``calls``: common words, flagged only when called (``name(``) or inside a ``#define``.
    ``patterns``: raw regexes flagged wherever they match in code and ``#define`` bodies.
    ``max_args``: for names in ``calls``, only flag calls with at most this many arguments.
    """

    anywhere: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    max_args: tuple[tuple[str, int], ...] = ()
    what: str = "forbidden name"


def _scan_names(p: ParsedSource, rule: str, names: _Names) -> list[Violation]:
    out: list[Violation] = []
    seen: set[tuple[int, str]] = set()
    anywhere = set(names.anywhere)
    calls = set(names.calls)
    max_args = dict(names.max_args)
    allowed_quals = {None, "", "std"}

    # the code view plus the bodies of #define directives (macro aliases of forbidden names)
    for view, in_define in ((p.code, False), (p.macro_code, True)):
        if names.anywhere or names.calls:
            alt = "|".join(sorted(anywhere | calls, key=len, reverse=True))
            for m in re.finditer(r"(?<![\w$])(" + alt + r")(?![\w$])", view):
                name = m.group(1)
                if in_define:
                    dm = re.match(r"\s*(?:#|%:)\s*define\s+" + re.escape(name) + r"\b",
                                  view[view.rfind("\n", 0, m.start()) + 1 :])
                    if dm:
                        continue  # a macro *named* like a libc function is not a call to it
                if _is_member(view, m.start()):
                    continue
                if _qualifier(view, m.start()) not in allowed_quals:
                    continue
                nxt = _next_nonspace(view, m.end())
                called = nxt < len(view) and view[nxt] == "("
                if called and name in calls and name not in anywhere and _declares(view, m.start()):
                    continue  # `void send(int)`: a declaration of the candidate's own function
                if name in calls and name not in anywhere and not (called or in_define):
                    continue
                if called and name in max_args and _count_args(view, nxt) > max_args[name]:
                    continue
                line = p.line(m.start())
                if (line, name) in seen:
                    continue
                seen.add((line, name))
                out.append(Violation(rule, line, f"{names.what} `{name}`" + (" (in a #define)" if in_define else "")))
        for pat in names.patterns:
            for m in re.finditer(pat, view):
                if _is_member(view, m.start()):
                    continue
                line = p.line(m.start())
                token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
                if (line, token) in seen:
                    continue
                seen.add((line, token))
                out.append(Violation(rule, line, f"{names.what} `{token}`" + (" (in a #define)" if in_define else "")))
    return sorted(out, key=lambda v: v.line)


# ---------------------------------------------------------------------------------------------
# Rules


def include_allowed(path: str) -> bool:
    """Whether an ``#include`` path is on the allowlist (see ``ALLOWED_INCLUDE_PATTERNS``)."""
    if ".." in path.split("/") or path.startswith("/") or "\\" in path:
        return False
    return any(re.fullmatch(p, path) for p in ALLOWED_INCLUDE_PATTERNS)


#: Regexes (full match) of the include paths a candidate may use. Standard headers are the
#: compile-time ones; no host I/O (<cstdio>, <iostream>, <fstream>), no <cstdlib>, <thread>,
#: <chrono>; no other CUDA libraries (cuBLAS, cuDNN, CUB, Thrust).
ALLOWED_INCLUDE_PATTERNS: tuple[str, ...] = (
    r"cute/[\w./-]+",
    r"cutlass/[\w./-]+",
    r"cuda/[\w./-]+",
    r"cuda[\w]*\.h",
    r"cooperative_groups\.h",
    r"cooperative_groups/[\w./-]+",
    r"mma\.h",
    r"evo_abi\.h",
    r"cstdint|cstddef|cmath|math\.h|stdint\.h|stddef\.h|float\.h|limits\.h|cfloat|climits",
    r"type_traits|utility|limits|algorithm|array|tuple|initializer_list|numeric|cassert|assert\.h",
)

_LIBRARY_INCLUDES = (
    r"cutlass/gemm/device/.*",
    r"cutlass/conv/device/.*",
    r"cutlass/reduction/device/.*",
    r"cutlass/library/.*",
)


def _check_includes(p: ParsedSource) -> list[Violation]:
    out = []
    for d in p.directives:
        if d.name not in ("include", "include_next", "import", "embed"):
            continue
        m = re.match(r'\s*(?:<([^>]*)>|"([^"]*)")', d.body)
        if d.name != "include":
            out.append(Violation("include-allowlist", d.line, f"#{d.name} is not allowed (only #include)"))
            continue
        if not m:
            out.append(Violation("include-allowlist", d.line,
                                 f"computed #include `{d.body[:60]}`: write the header path literally"))
            continue
        path = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        if not include_allowed(path):
            out.append(Violation("include-allowlist", d.line, f"#include of `{path}` is not on the allowlist"))
    return out


_PROCESS = _Names(
    anywhere=("system", "popen", "fork", "vfork", "execl", "execlp", "execle", "execv", "execvp",
              "execvpe", "execve", "fexecve", "posix_spawn", "posix_spawnp", "syscall", "ptrace",
              "prctl", "mmap", "mmap64", "mprotect", "dlopen", "dlmopen", "dlsym", "dlvsym",
              "sigaction", "at_quick_exit", "quick_exit", "atexit", "_Exit", "cuGetProcAddress",
              "cuGetProcAddress_v2", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"),
    calls=("clone", "kill", "signal", "raise", "exit", "_exit", "ioctl"),
    patterns=(r"\b__libc_\w+",),
    what="process/loader call",
)


def _check_process(p: ParsedSource) -> list[Violation]:
    out = _scan_names(p, "no-host-process", _PROCESS)
    # driver entry-point lookup is the one legitimate dynamic lookup (TMA descriptors): allow
    # it only with a literal cuTensorMap* name, so it cannot fetch a forbidden function.
    keep = []
    for v in out:
        if "GetDriverEntryPoint" in v.message or "GetProcAddress" in v.message:
            ok = False
            for m in re.finditer(r"\b(cudaGetDriverEntryPoint\w*|cuGetProcAddress\w*)\s*\(\s*\"(cuTensorMap\w*)\"",
                                 p.nocomment):
                if p.line(m.start()) == v.line:
                    ok = True
            if ok:
                continue
            v = Violation(v.rule, v.line, v.message + ": only a literal \"cuTensorMap...\" name may be looked up")
        keep.append(v)
    return keep


_FILE_IO = _Names(
    anywhere=("fopen", "fopen64", "freopen", "fdopen", "openat", "creat", "unlink", "unlinkat",
              "renameat", "fwrite", "fread", "fprintf", "fputs", "fgets", "fscanf", "mkdir", "rmdir",
              "chmod", "symlink", "truncate", "ftruncate", "opendir", "readdir", "FILE"),
    calls=("open", "rename", "remove"),
    patterns=(r"\bstd\s*::\s*(?:i|o)?fstream\b", r"\bstd\s*::\s*filebuf\b", r"\bstd\s*::\s*filesystem\b"),
    max_args=(("remove", 1),),
    what="file I/O",
)
_NETWORK = _Names(
    anywhere=("socket", "socketpair", "getaddrinfo", "gethostbyname", "inet_pton", "inet_addr",
              "sendto", "sendmsg", "recvfrom", "recvmsg", "accept4", "setsockopt"),
    calls=("connect", "bind", "listen", "accept", "send", "recv"),
    what="network call",
)
_THREADS = _Names(
    anywhere=("thrd_create", "__thread"),
    patterns=(r"\bpthread_\w+", r"\bstd\s*::\s*(?:j?thread|async|this_thread|packaged_task)\b"),
    what="host threading",
)
_ENV = _Names(
    anywhere=("getenv", "secure_getenv", "setenv", "unsetenv", "putenv", "clearenv", "environ", "__environ"),
    what="environment access",
)
_TIME = _Names(
    anywhere=("gettimeofday", "clock_gettime", "clock_getres", "timespec_get", "usleep", "nanosleep",
              "sleep_for", "sleep_until", "__rdtsc", "rdtsc"),
    calls=("time", "clock", "sleep"),
    patterns=(r"\bstd\s*::\s*chrono\b",),
    what="host time/sleep",
)
_LIBRARY = _Names(
    patterns=(
        r"\bcublas\w*", r"\bcudnn\w*", r"\bcusparse\w*", r"\bcufft\w*", r"\bcusolver\w*", r"\bcutensor\w*",
        r"(?<!::)(?<!:: )\btorch\s*::", r"(?<!::)\bat\s*::\s*\w", r"\bATen\b", r"\bc10\s*::",
        r"\bgemm\s*::\s*device\b", r"\bconv\s*::\s*device\b", r"\breduction\s*::\s*device\b",
        r"\bcutlass\s*::\s*library\b", r"\bthrust\s*::", r"\bcub\s*::\s*Device\w*",
    ),
    what="library fallback",
)


def _check_library(p: ParsedSource) -> list[Violation]:
    out = _scan_names(p, "no-library-fallback", _LIBRARY)
    for d in p.directives:
        m = re.match(r'\s*(?:<([^>]*)>|"([^"]*)")', d.body) if d.name == "include" else None
        if m:
            path = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
            if any(re.fullmatch(x, path) for x in _LIBRARY_INCLUDES):
                out.append(Violation("no-library-fallback", d.line,
                                     f"#include of `{path}`: CUTLASS device-level GEMM/conv wrappers are a library fallback"))
    return sorted(out, key=lambda v: v.line)


_SIDE_STREAM = _Names(
    anywhere=("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaThreadSynchronize", "cudaDeviceReset",
              "cudaSetDevice", "cudaHostAlloc", "cudaHostRegister", "cudaLaunchHostFunc", "cudaStreamAddCallback",
              "cudaStreamWaitEvent", "cudaStreamPerThread", "cudaStreamLegacy", "cudaStreamEndCapture",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuLaunchHostFunc", "cuStreamAddCallback",
              "cuDevicePrimaryCtxReset", "cuMemHostAlloc"),
    patterns=(
        r"\bcudaStreamCreate\w*", r"\bcudaMalloc\w*", r"\bcudaFree\w*", r"\bcudaEvent\w*", r"\bcudaGraph\w*",
        r"\bcudaStreamBeginCapture\w*",
        r"\bcudaMemcpy\w*(?<!Async)\s*\(", r"\bcudaMemset\w*(?<!Async)\s*\(",
        r"\bcuStreamCreate\w*", r"\bcuCtx(?:Create|Destroy|SetCurrent|PushCurrent|PopCurrent)\w*",
        r"\bcuEvent\w*", r"\bcuGraph\w*", r"\bcuMemAlloc\w*", r"\bcuMemFree\w*",
        r"\bcuMemcpy\w*(?<!Async)\s*\(", r"\bcuMemsetD\w*(?<!Async)\s*\(",
    ),
    what="stream/sync/allocation call",
)

_DEFAULT_STREAMS = {"0", "nullptr", "NULL", "0L", "0UL", "cudaStreamLegacy", "cudaStreamPerThread", "{}"}


def _check_side_stream(p: ParsedSource) -> list[Violation]:
    out = _scan_names(p, "no-side-stream-or-sync", _SIDE_STREAM)
    for code in (p.code, p.macro_code):
        out.extend(_check_launches(p, code))
    return sorted(out, key=lambda v: v.line)


def _check_launches(p: ParsedSource, code: str) -> list[Violation]:
    """Every ``<<<...>>>`` launch must name a stream, and not the default one."""
    out = []
    for m in re.finditer(r"<<<", code):
        end = code.find(">>>", m.end())
        if end < 0:
            continue
        args, depth, cur = [], 0, []
        for ch in code[m.end() : end]:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            if ch == "," and depth == 0:
                args.append("".join(cur).strip())
                cur = []
            else:
                cur.append(ch)
        args.append("".join(cur).strip())
        line = p.line(m.start())
        if len(args) < 4:
            out.append(Violation("no-side-stream-or-sync", line,
                                 "kernel launch without a stream runs on the default stream; pass the `stream` argument"))
        elif re.sub(r"\s+", "", args[3]) in _DEFAULT_STREAMS or re.fullmatch(r"\(\s*cudaStream_t\s*\)\s*0", args[3]):
            out.append(Violation("no-side-stream-or-sync", line,
                                 f"kernel launch on stream `{args[3]}`; launch on the harness's `stream`"))
    return out


def _is_const_decl(decl: str) -> bool:
    """Whether a declaration (text before its initializer) declares an immutable object."""
    words = re.findall(r"[A-Za-z_]\w*|\*", decl)
    wordset = set(words)
    if wordset & ({"constexpr", "__constant__", "__shared__", "consteval", "constinit"} | _CONST_MACROS):
        return "constinit" not in wordset or "const" in wordset
    if "const" not in wordset:
        return False
    # `const T* p` is a mutable pointer; `T* const p` / `const T* const p` are not
    if "*" in words:
        last_star = len(words) - 1 - words[::-1].index("*")
        return "const" in words[last_star + 1 :]
    return True


_LIT = r"(?:[-+]?(?:\d|\.\d)[\w.']*|nullptr|NULL|true|false|\"\s*\"|'\s*')"
_LITERAL_ARGS = re.compile(r"\(\s*(?:" + _LIT + r")?\s*(?:,\s*" + _LIT + r")*\s*\)")


def _variable_in(stmt: str) -> tuple[str, str] | None:
    """If a namespace/class-scope statement declares a variable: (declaration text, name)."""
    s = _collapse_braces(stmt)
    s = re.sub(r"^\s*(?:(?:public|private|protected)\s*:\s*)+", "", s)
    s = _normalize_head(s)
    s = re.sub(r'\bextern\s*"\s*"', " extern ", s).strip()
    if not s:
        return None
    first = s.split(None, 1)[0]
    if first in ("using", "typedef", "static_assert", "friend", "namespace", "template", "asm",
                 "__asm__", "__asm", "return"):
        return None
    # type declarations / definitions: `struct X;`, `struct X : B<Y...> {}`, `enum class E {}`;
    # a variable only if a declarator follows the body (`struct {...} g;`) or the name
    if re.match(r"(?:struct|class|union|enum)\b", s) and not _FUNC_TAIL.search(s.split("{}")[0]):
        if "{}" in s:
            tail = s[s.rindex("{}") + 2 :]
            if not re.search(r"[A-Za-z_]", tail):
                return None
            name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", tail.split("=")[0].strip())
            return s.split("=")[0], (name_m.group(1) if name_m else "?")
        body = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", s))  # drop (two levels of) template args
        if len(re.findall(r"[A-Za-z_]\w*", body.split("=")[0].split(":")[0])) <= 2:
            return None
    eq = _top_level_index(s, "=")
    par = _top_level_index(s, "(")
    if par >= 0 and (eq < 0 or par < eq):
        after = s[par + 1 :].lstrip()
        m = _LITERAL_ARGS.match(s[par:])
        if not (after.startswith("*") or after.startswith("&") or (m and m.group(0).strip("() \t") != "")):
            return None  # a function declaration
        decl = s[:par] if not (after.startswith("*") or after.startswith("&")) else s
    else:
        decl = s[:eq] if eq >= 0 else s
    decl_c = re.sub(r"\{\}", " ", decl)
    decl_c = re.sub(r"\[[^\]]*\]", " ", decl_c)
    idents = re.findall(r"[A-Za-z_]\w*", decl_c)
    if len([w for w in idents if w not in ("extern", "static", "inline", "volatile", "thread_local")]) < 2:
        return None  # a lone macro invocation or label, not a declaration
    name_m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:\{\})?\s*$", re.sub(r"\)\s*$", "", decl.strip()))
    name = name_m.group(1) if name_m else "?"
    return decl, name


def _check_global_state(p: ParsedSource) -> list[Violation]:
    out = []
    for kind, offset, stmt in p.statements:
        if kind == "ns":
            var = _variable_in(stmt)
            if var is None:
                continue
            decl, name = var
            if _is_const_decl(decl):
                continue
            what = "__device__ variable" if re.search(r"\b__device__\b", decl) else (
                "__managed__ variable" if "__managed__" in decl else "namespace-scope variable")
            if re.search(r"\b(thread_local|__thread)\b", decl):
                what = "thread_local variable"
            first = re.search(r"\S", stmt)
            line = p.line(offset + (first.start() if first else 0))
            out.append(Violation("no-global-state", line,
                                 f"mutable {what} `{name}` survives between calls; make it constexpr/const or "
                                 f"compute it inside evo_launch"))
        elif kind in ("class", "func", "block"):
            body = _collapse_braces(stmt)
            m = re.search(r"\b(static|thread_local)\b", body)
            if not m:
                continue
            if kind == "class":
                var = _variable_in(stmt)
                if var is None:
                    continue
                decl, name = var
            else:
                rest = body[m.start() :]
                eq = _top_level_index(rest, "=")
                decl = rest[:eq] if eq >= 0 else rest
                par = _top_level_index(decl, "(")
                decl = decl[:par] if par >= 0 else decl
                nm = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:\{\})?\s*$", decl.strip())
                name = nm.group(1) if nm else "?"
            if _is_const_decl(decl):
                continue
            ms = re.search(r"\b(static|thread_local)\b", stmt)
            line = p.line(offset + (ms.start() if ms else 0))
            out.append(Violation("no-global-state", line,
                                 f"mutable static `{name}` survives between calls; make it constexpr/const or "
                                 f"a plain local"))
    # `#define CACHE static int hits = 0;` hides the keyword from the statement scanner
    for m in re.finditer(r"\b(static|thread_local)\b([^;{}()#]*?)(=|;)", p.macro_code):
        if not _is_const_decl(m.group(0)[:-1]):
            out.append(Violation("no-global-state", p.line(m.start()),
                                 "mutable static declared inside a #define survives between calls"))
    return sorted(out, key=lambda v: v.line)


def _check_host_asm(p: ParsedSource) -> list[Violation]:
    out = []
    for m in re.finditer(r"(?<![\w$])(asm|__asm__|__asm)(?![\w$])", p.code):
        fn = p.function_at(m.start())
        if fn is None:
            out.append(Violation("no-host-asm", p.line(m.start()),
                                 "file-scope inline asm; asm belongs inside __device__/__global__ functions"))
        elif not fn.device:
            out.append(Violation("no-host-asm", p.line(m.start()),
                                 "inline asm in a host function; asm belongs inside __device__/__global__ functions"))
    return out


_EXPECTED_PARAMS = ("const EvoTensor*", "int", "EvoTensor*", "int", "const double*", "int", "cudaStream_t")
_TYPE_WORDS = {"const", "volatile", "struct", "unsigned", "signed", "long", "short"}


def _normalize_param(param: str) -> str:
    """Canonical spelling of a parameter's type: names, top-level const and restrict dropped."""
    param = param.split("=", 1)[0]
    param = re.sub(r"\b(__restrict__|__restrict|restrict|struct)\b", " ", param)
    param = re.sub(r"(?:(?<=\s)|^)::\s*(?=[A-Za-z_])", "", param.strip())
    param = re.sub(r"([A-Za-z_]\w*)?\s*\[[^\]]*\]\s*$", lambda m: "* " + (m.group(1) or ""), param)
    toks = re.findall(r"[A-Za-z_]\w*|\*|&", param)
    if len(toks) >= 2 and re.fullmatch(r"[A-Za-z_]\w*", toks[-1]) and toks[-1] not in _TYPE_WORDS:
        if any(t not in _TYPE_WORDS for t in toks[:-1]):  # a type precedes it: it is the name
            toks = toks[:-1]
    pieces: list[list[str]] = [[]]
    seps: list[str] = []
    for t in toks:
        if t in ("*", "&"):
            seps.append(t)
            pieces.append([])
        else:
            pieces[-1].append(t)

    def fmt(piece: list[str]) -> str:
        words = [w for w in piece if w not in ("const", "volatile")]
        quals = [w for w in ("const", "volatile") if w in piece]
        return " ".join(quals + words)

    # qualifiers after the last * or & apply to the parameter itself: not part of the signature
    out = "".join(fmt(pc) + sep for pc, sep in zip(pieces[:-1], seps))
    top = [w for w in pieces[-1] if w not in ("const", "volatile")]
    return out + " ".join(top)


def _split_params(head: str) -> tuple[str, list[str]] | None:
    m = re.search(r"\bevo_launch\s*\(", head)
    if not m:
        return None
    depth, j = 1, m.end()
    while j < len(head) and depth:
        if head[j] == "(":
            depth += 1
        elif head[j] == ")":
            depth -= 1
        j += 1
    inner = head[m.end() : j - 1]
    params, depth, cur = [], 0, []
    for ch in inner:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            params.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        params.append("".join(cur))
    return head[: m.start()], params


def _check_entry_point(p: ParsedSource) -> list[Violation]:
    out = []
    defs = [f for f in p.frames if f.kind == "func" and re.search(r"\bevo_launch\s*\(", f.head)
            and re.search(r"\bevo_launch\s*\(", _normalize_head(f.head))]
    includes_abi = any(d.name == "include" and re.search(r"[<\"]evo_abi\.h[>\"]", d.body) for d in p.directives)
    for d in p.directives:
        if d.name in ("define", "undef") and re.match(r"evo_launch\b", d.body):
            out.append(Violation("one-entry-point", d.line, f"#{d.name} of evo_launch hides the entry point"))
    if not defs:
        out.append(Violation("one-entry-point", 1, "no definition of `evo_launch` (include \"evo_abi.h\" and define it)"))
        return out
    defs.sort(key=lambda f: f.start)
    for extra in defs[1:]:
        out.append(Violation("one-entry-point", p.line(extra.head_start),
                             "a second definition of `evo_launch`; exactly one is allowed"))
    f = defs[0]
    line = p.line(f.head_start)
    split = _split_params(_normalize_head(f.head))
    if split is None:
        return out
    ret, params = split
    got = tuple(_normalize_param(x) for x in params)
    if got != _EXPECTED_PARAMS:
        out.append(Violation("one-entry-point", line,
                             f"evo_launch parameters are ({', '.join(got)}); the ABI is "
                             f"({', '.join(_EXPECTED_PARAMS)})"))
    ret_words = [w for w in re.findall(r"[A-Za-z_]\w*", re.sub(r'"[^"]*"', " ", ret))
                 if w not in ("EVO_EXPORT", "extern", "__host__")]
    if re.match(r"\s*template\b", f.head):
        ret_words = ["template<...>", *ret_words]
    if ret_words != ["int"]:
        out.append(Violation("one-entry-point", line,
                             f"evo_launch must be declared `EVO_EXPORT int evo_launch(...)`, not `{' '.join(ret_words)}`"))
    if not (includes_abi or f.c_linkage or "EVO_EXPORT" in ret or re.search(r'\bextern\s*"', ret)):
        out.append(Violation("one-entry-point", line,
                             "evo_launch needs C linkage: include \"evo_abi.h\" or use EVO_EXPORT"))
    return out


def _check_size(p: ParsedSource) -> list[Violation]:
    out = []
    raw = p.original.encode("utf-8")
    if len(raw) > MAX_SOURCE_BYTES:
        line = raw[:MAX_SOURCE_BYTES].count(b"\n") + 1
        out.append(Violation("size-limit", line, f"source is {len(raw)} bytes; the limit is {MAX_SOURCE_BYTES}"))
    n_lines = p.original.count("\n") + (0 if p.original.endswith("\n") or not p.original else 1)
    if n_lines > MAX_SOURCE_LINES:
        out.append(Violation("size-limit", MAX_SOURCE_LINES + 1,
                             f"source has {n_lines} lines; the limit is {MAX_SOURCE_LINES}"))
    return out


def _check_token_paste(p: ParsedSource) -> list[Violation]:
    out = []
    for d in p.directives:
        if d.name == "define":
            _, body_code = _lex(d.body)
            if "##" in body_code or "%:%:" in body_code:
                out.append(Violation("no-token-pasting", d.line,
                                     "token pasting (##) can assemble forbidden names; write identifiers out"))
    return out


_PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PARAM_VALUE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[A-Za-z]{0,3}|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*")


def _check_params(p: ParsedSource) -> list[Violation]:
    return param_violations(p.params)


def param_violations(params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None) -> list[Violation]:
    """Rule ``param-syntax`` on tunable values alone (the compile stage re-checks with it).

    Names must be plain identifiers (not reserved ``__x``), values numbers or identifiers, and
    an identifier value must not name anything the call rules forbid (``-DTILE=system``).
    """
    pairs = params if isinstance(params, tuple) else canonical_params(params)
    out = []
    for name, value in pairs:
        if not _PARAM_NAME.fullmatch(name) or name.startswith("__") or name == "evo_launch":
            out.append(Violation("param-syntax", 1, f"tunable name `{name[:40]}` is not a plain identifier"))
            continue
        if not _PARAM_VALUE.fullmatch(value):
            out.append(Violation("param-syntax", 1,
                                 f"tunable {name}={value[:40]!r}: values must be numbers or identifiers"))
            continue
        if re.match(r"[A-Za-z_]", value):
            # an identifier value must not smuggle a forbidden name into the source via -D
            probe = parse_source(f"int x = {value}(0);\n")
            for rule in POLICY_RULES:
                if rule.name in ("no-host-process", "no-host-file-io", "no-network", "no-threads", "no-env",
                                 "no-host-time", "no-library-fallback", "no-side-stream-or-sync"):
                    if list(rule.check(probe)):
                        out.append(Violation("param-syntax", 1,
                                             f"tunable {name}={value}: value names something {rule.name} forbids"))
    return out


def _names_rule(rule: str, names: _Names) -> Callable[[ParsedSource], list[Violation]]:
    return _NamesCheck(rule, names)


@dataclass(frozen=True)
class _NamesCheck:
    """Picklable callable: scan for one rule's forbidden names."""

    rule: str
    names: _Names

    def __call__(self, p: ParsedSource) -> list[Violation]:
        return _scan_names(p, self.rule, self.names)


POLICY_RULES: tuple[Rule, ...] = (
    Rule("size-limit", f"sources are capped at {MAX_SOURCE_BYTES} bytes and {MAX_SOURCE_LINES} lines, so "
         "prompts, the store and the compiler stay bounded", _check_size),
    Rule("include-allowlist", "only CuTe/CUTLASS, CUDA and compile-time standard headers may be included; "
         "anything else (stdio, cstdlib, thread, cuBLAS...) opens a door the other rules then have to close",
         _check_includes),
    Rule("no-token-pasting", "## can build any identifier (sys##tem) where no static check can see it",
         _check_token_paste),
    Rule("no-host-process", "the candidate runs inside the trusted harness: it must not start processes, "
         "load code (dlopen/dlsym), make raw syscalls, or end the process", _check_process),
    Rule("no-host-file-io", "reading or writing files could leak reference results between calls or tamper "
         "with the evaluator", _names_rule("no-host-file-io", _FILE_IO)),
    Rule("no-network", "a kernel has no business with sockets; results could be fetched from outside",
         _names_rule("no-network", _NETWORK)),
    Rule("no-threads", "host threads keep working after evo_launch returns, outside what the timer measures",
         _names_rule("no-threads", _THREADS)),
    Rule("no-env", "the environment is not an input; reading it lets a kernel detect the harness",
         _names_rule("no-env", _ENV)),
    Rule("no-host-time", "host clocks and sleeps let a kernel detect or pace the timer",
         _names_rule("no-host-time", _TIME)),
    Rule("no-library-fallback", "the search evolves hand-written CuTe kernels; calling cuBLAS/cuDNN/torch or "
         "CUTLASS's device-level GEMM wrappers would measure a library, not the candidate",
         _check_library),
    Rule("no-side-stream-or-sync", "all work must go on the harness's stream: side streams, the default stream, "
         "events, graphs, host callbacks, device-wide syncs and allocations escape or distort the timer",
         _check_side_stream),
    Rule("no-global-state", "mutable state that survives between calls lets a kernel cache results (by input "
         "pointer) and skip the work in timed runs", _check_global_state),
    Rule("no-host-asm", "inline asm is for device code; in host code it could issue syscalls no name check "
         "sees", _check_host_asm),
    Rule("one-entry-point", "the harness calls exactly one `evo_launch` with the ABI signature from evo_abi.h",
         _check_entry_point),
    Rule("param-syntax", "tunable values become -D macros; anything but a number or identifier could inject "
         "code past this check", _check_params),
)


# ---------------------------------------------------------------------------------------------
# Public entry points


def check_policy(source: str, params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None = None) -> StageResult:
    """Apply every rule of :data:`POLICY_RULES` to ``source`` (and its tunable ``params``).

    Returns a ``StageResult(stage="policy")``: ``ok``, or ``rejected`` with ``reason`` naming
    the first violation (by line) and how many more there are. An oversized source is rejected
    on size alone without running the other rules (they are linear, but a 100 MB string is not
    worth reading).
    """
    t0 = time.perf_counter()
    size_rule = POLICY_RULES[0]
    raw_len = len(source.encode("utf-8", errors="replace"))
    violations: list[Violation] = []
    if raw_len > 4 * MAX_SOURCE_BYTES:
        parsed = None
        violations = [Violation("size-limit", 1, f"source is {raw_len} bytes; the limit is {MAX_SOURCE_BYTES}")]
    else:
        parsed = parse_source(source, params)
        for rule in POLICY_RULES:
            violations.extend(rule.check(parsed))
        if any(v.rule == size_rule.name for v in violations):
            violations = [v for v in violations if v.rule == size_rule.name] + [
                v for v in violations if v.rule != size_rule.name]
    seconds = time.perf_counter() - t0
    if not violations:
        return StageResult(stage="policy", status=Status.OK, metrics={"violations": [], "n_violations": 0},
                           seconds=seconds)
    ordered = violations if violations[0].rule == size_rule.name else sorted(violations, key=lambda v: (v.line, v.rule))
    first = ordered[0]
    more = len(ordered) - 1
    reason = f"policy rule {first.rule} violated at line {first.line}: {first.message}"
    if more:
        reason += f" (+{more} more violation{'s' if more > 1 else ''})"
    lines = []
    reasons = {r.name: r.reason for r in POLICY_RULES}
    for v in ordered[:50]:
        src = parsed.source_line(v.line).strip() if parsed else ""
        lines.append(f"line {v.line}: [{v.rule}] {v.message}" + (f"\n    {src[:200]}" if src else ""))
    rules_hit = sorted({v.rule for v in ordered})
    lines.append("")
    lines.extend(f"{name}: {reasons[name]}" for name in rules_hit)
    logger.debug("policy rejected: %s", reason)
    return StageResult(
        stage="policy",
        status=Status.REJECTED,
        reason=reason,
        metrics={"violations": [v.as_dict() for v in ordered], "n_violations": len(ordered), "rules": rules_hit},
        artifacts={"violations": "\n".join(lines)[:8000]},
        seconds=seconds,
    )


def check_candidate(candidate: Candidate) -> StageResult:
    """:func:`check_policy` on a candidate's source and tunable values."""
    return check_policy(candidate.source, candidate.params)


@dataclass(frozen=True)
class PolicyStage:
    """The policy check as a cascade :class:`~evaluators.base.Stage` (stateless, picklable)."""

    name: str = "policy"

    def run(self, candidate: Candidate) -> StageResult:
        return check_candidate(candidate)
