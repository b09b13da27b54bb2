"""The parent's source as a prompt shows it: code the task never compiles is cut out.

A seed template carries a family of ops (the elementwise template: 13 activations and a row
scale) and the task picks one by its task-config macros, so most of a parent's source can be
code that no child of this task will ever compile. :func:`elide_unreachable` replaces each
such region by one marker line (:data:`MARKER`) that names the lines it stands for.

What is cut: the branches of ``#if`` / ``#ifdef`` / ``#ifndef`` / ``#elif`` / ``#else``
groups whose condition is false on *fixed* macros alone, evaluated with three values
(:mod:`mutators.llm.prompt.ppcond`), so a branch that depends on anything else stays. The
fixed macros are the task's configuration, which a correct child keeps:

- the ``#define`` lines of the task-config block (the run of defines right after the
  ``// @evo:task-config`` marker line that :mod:`evo.tasks.seedspec` fills in);
- macros named ``EVO_*`` (:data:`CONFIG_PREFIX`: the framework's namespace, which no CuTe,
  CUTLASS or CUDA header defines): defined where the source defines them on a path that is
  compiled for certain, undefined where it never does; the ABI header's own ``EVO_*``
  macros are read from its text (``abi_header``).

Never fixed: tunables (``// @tunable`` names arrive as ``-D`` and a child may change their
defaults), any other macro of the source (a template's knob a child may flip), and every
macro of a header or the compiler (``__CUDA_ARCH__``): branches on them are kept.

Safe for patches: the real source is never changed; SEARCH blocks are matched against it,
and the prompt tells the model that marker lines stand for code it must not edit or quote.
Regions holding a line that a repair's error points at (``keep_lines``) are never cut, and
runs shorter than :data:`MIN_RUN` lines or than twice their marker stay (a marker would save
little). Marker lines
keep the real line numbers, so numbered excerpts of the full source still match.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

from evo.core.tunables import TunableError, parse_tunables
from mutators.llm.prompt.ppcond import UNKNOWN, Macros, evaluate
from mutators.llm.prompt.ppscan import Directive, code_view, scan_directives

__all__ = ["ElidedSource", "elide_unreachable", "MARKER", "MARKER_RE", "CONFIG_PREFIX", "TASK_CONFIG_MARKER",
           "MIN_RUN"]

#: Prefix of the macros that configure a task (module docstring).
CONFIG_PREFIX = "EVO_"
#: The line after which a rendered seed carries its task-config ``#define`` lines.
TASK_CONFIG_MARKER = "// @evo:task-config"
#: Fewest consecutive unreachable lines replaced by a marker.
MIN_RUN = 3
#: The line that stands for an elided region (``{first}``-``{last}``: real line numbers).
MARKER = "// [elided: lines {first}-{last}, unreachable for this task; not shown, do not edit]"
#: Matches a marker line (and gives its line range).
MARKER_RE = re.compile(r"^[ \t]*// \[elided: lines (\d+)-(\d+), unreachable for this task; not shown, do not edit\]$",
                       re.MULTILINE)

_DEFINE_RE = re.compile(r"([A-Za-z_]\w*)(\()?\s*(.*)$")


@dataclass(frozen=True)
class ElidedSource:
    """The prompt's view of a source: ``text`` with unreachable regions replaced by marker
    lines; ``regions``: each elided region's ``(first, last)`` line (1-based, inclusive);
    ``chars_saved``: characters of the source not shown (less the markers)."""

    text: str
    regions: tuple[tuple[int, int], ...] = ()
    chars_saved: int = 0

    @property
    def lines_elided(self) -> int:
        return sum(b - a + 1 for a, b in self.regions)


def _config_block(source: str) -> dict[str, str]:
    """The ``#define NAME VALUE`` lines right after the task-config marker line."""
    out: dict[str, str] = {}
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == TASK_CONFIG_MARKER:
            for nxt in lines[i + 1:]:
                m = re.match(r"\s*#\s*define\s+([A-Za-z_]\w*)(?:\s+(.*?))?\s*$", nxt)
                if m is None:
                    break
                out[m.group(1)] = m.group(2) or ""
            break
    return out


def _abi_macros(abi_header: str) -> dict[str, str]:
    ds = scan_directives(abi_header) or []
    out = {}
    for d in ds:
        m = _DEFINE_RE.match(d.body) if d.name == "define" else None
        if m and m.group(1).startswith(CONFIG_PREFIX):
            out[m.group(1)] = m.group(3) if not m.group(2) else ""
    return out


def _dead_lines(source: str, directives: list[Directive], abi_header: str) -> tuple[set[int], Macros]:
    """The 1-based lines of ``source`` that no child of this task compiles (from the
    directives), and what is known of the fixed macros at the end of the source."""
    try:
        tunables = {t.name for t in parse_tunables(source)}
    except TunableError:
        return set(), Macros()
    config = _config_block(source)
    fixed = (set(config) | {n for n in _abi_macros(abi_header)}) - tunables
    macros = Macros(undefined_prefixes=(CONFIG_PREFIX,))
    for name, value in _abi_macros(abi_header).items():
        macros.define(name, value)
    for name in tunables:
        macros.define(name, None)

    def tracked(name: str) -> bool:
        return name not in tunables and (name in fixed or name.startswith(CONFIG_PREFIX))

    # Every other macro the source defines is a knob a child may change: unknown from the start.
    defined_at: dict[str, int] = {}
    for d in directives:
        m = _DEFINE_RE.match(d.body) if d.name in ("define", "undef") else None
        if m and not tracked(m.group(1)):
            macros.define(m.group(1), None)
        elif m:
            defined_at[m.group(1)] = defined_at.get(m.group(1), 0) + 1

    # Group stack entries: [live of the enclosing region, some branch taken for certain,
    # some branch maybe taken, live of the current branch]; live is 1, 0 or UNKNOWN.
    stack: list[list] = []
    dead: set[int] = set()
    live: int | None = 1
    by_line = {d.line: d for d in directives}
    n_lines = source.count("\n") + 1
    line = 1
    while line <= n_lines:
        d = by_line.get(line)
        if d is None:
            if live == 0:
                dead.add(line)
            line += 1
            continue
        span = range(d.line, d.last_line + 1)
        line = d.last_line + 1
        name = d.name
        if name in ("if", "ifdef", "ifndef"):
            cond = _condition(name, d.body, macros)
            branch = _and(live, cond)
            stack.append([live, cond == 1, cond is UNKNOWN, branch])
            if live == 0:
                dead.update(span)
            live = branch
        elif name in ("elif", "elifdef", "elifndef", "else") and stack:
            top = stack[-1]
            if top[0] == 0 or top[1]:
                cond = 0
            elif name == "else":
                cond = 1
            else:
                cond = _condition({"elif": "if", "elifdef": "ifdef", "elifndef": "ifndef"}[name], d.body, macros)
            if cond == 1 and top[2]:
                cond = UNKNOWN  # an earlier branch may have been taken
            branch = _and(top[0], cond)
            if branch == 0 and (top[3] == 0 or top[0] == 0):
                dead.update(span)  # a dead branch's own line joins the dead code before it
            top[1] = top[1] or cond == 1
            top[2] = top[2] or cond is UNKNOWN
            top[3] = branch
            live = branch
        elif name == "endif" and stack:
            live = stack.pop()[0]
            if live == 0:
                dead.update(span)
        elif live == 0:
            dead.update(span)
        elif name in ("define", "undef"):
            m = _DEFINE_RE.match(d.body)
            if m and tracked(m.group(1)):
                if name == "undef":
                    macros.undef(m.group(1), certain=live == 1)
                else:
                    macros.define(m.group(1), None if (live is UNKNOWN or m.group(2)) else m.group(3))
    if stack:
        return set(), Macros()  # unbalanced conditionals: decide nothing
    for name, times in defined_at.items():
        if times > 1 and name not in config:
            macros.define(name, None)  # redefined along the way: its final value is not everywhere's
    return dead, macros


_IF_CONSTEXPR_RE = re.compile(r"\bif\s+constexpr\s*\(")
_ELSE_RE = re.compile(r"\s*else\b\s*")


def _matching(code: str, open_idx: int, opening: str, closing: str) -> int:
    """Index of the bracket closing the one at ``open_idx`` (-1 if none)."""
    depth = 0
    for k in range(open_idx, len(code)):
        c = code[k]
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return k
    return -1


def _block_interior(code: str, brace: int, line_of) -> tuple[range, int] | None:
    """The whole lines strictly inside the ``{...}`` at ``brace`` and the index of its ``}``
    (None when the block does not end)."""
    end = _matching(code, brace, "{", "}")
    if end < 0:
        return None
    return range(line_of(brace) + 1, line_of(end)), end


def _dead_constexpr(source: str, macros: Macros) -> set[int]:
    """Lines inside the discarded branches of ``if constexpr`` chains decided by fixed
    macros alone (``if constexpr (EPILOGUE == 2) { ... }`` of a task with EPILOGUE 1)."""
    code = code_view(source)
    if code is None:
        return set()
    # directive lines hold no C++ braces
    code = "\n".join(" " * len(ln) if ln.lstrip().startswith("#") else ln for ln in code.split("\n"))
    starts = [0] + [i + 1 for i, c in enumerate(code) if c == "\n"]

    def line_of(offset: int) -> int:
        return bisect_right(starts, offset)

    dead: set[int] = set()
    for m in _IF_CONSTEXPR_RE.finditer(code):
        if re.search(r"\belse\s*$", code[max(0, m.start() - 40):m.start()]):
            continue  # the `else if constexpr` of a chain: handled from the chain's first `if`
        pos, taken, maybe = m.end() - 1, False, False
        while True:  # one branch of the chain per step; pos is at its `(` (or at `{` of a final else)
            if code[pos] == "(":
                close = _matching(code, pos, "(", ")")
                if close < 0:
                    break
                cond = evaluate(code[pos + 1:close], macros)
                cond = UNKNOWN if cond is UNKNOWN else int(cond != 0)
                brace = close + 1 + (len(code[close + 1:]) - len(code[close + 1:].lstrip()))
            else:
                cond, brace = 1, pos
            if code[brace:brace + 1] != "{":
                break  # a single statement: too short to elide
            block = _block_interior(code, brace, line_of)
            if block is None:
                break
            lines, end = block
            if taken or cond == 0:
                dead.update(lines)
            taken = taken or (cond == 1 and not maybe)
            maybe = maybe or cond is UNKNOWN
            e = _ELSE_RE.match(code, end + 1)
            if e is None:
                break
            nxt = _IF_CONSTEXPR_RE.match(code, e.end())
            if nxt is not None:
                pos = nxt.end() - 1
            elif code[e.end():e.end() + 1] == "{":
                pos = e.end()
            else:
                break
    return dead


def _and(parent: int | None, cond: int | None) -> int | None:
    if parent == 0 or cond == 0:
        return 0
    if parent is UNKNOWN or cond is UNKNOWN:
        return UNKNOWN
    return 1


def _condition(kind: str, body: str, macros: Macros) -> int | None:
    if kind in ("ifdef", "ifndef"):
        m = re.match(r"([A-Za-z_]\w*)", body)
        if m is None:
            return UNKNOWN
        d = macros.defined(m.group(1))
        if d is UNKNOWN:
            return UNKNOWN
        return int(d) if kind == "ifdef" else int(not d)
    v = evaluate(body, macros)
    return UNKNOWN if v is UNKNOWN else int(v != 0)


def elide_unreachable(source: str, *, abi_header: str = "", keep_lines: tuple[int, ...] | frozenset[int] = ()
                      ) -> ElidedSource:
    """``source`` with its unreachable regions replaced by marker lines (module docstring).

    ``abi_header``: the text of ``evo_abi.h`` (its ``EVO_*`` macros are fixed);
    ``keep_lines``: lines that must stay visible (a repair's error lines). A source that
    cannot be read with certainty (unbalanced conditionals, an unterminated comment) is
    returned whole.
    """
    return _elide(source, abi_header, frozenset(keep_lines))


@lru_cache(maxsize=256)
def _elide(source: str, abi_header: str, keep: frozenset[int]) -> ElidedSource:
    directives = scan_directives(source)
    if not directives:
        return ElidedSource(source)
    dead, macros = _dead_lines(source, directives, abi_header)
    dead |= _dead_constexpr(source, macros)
    if not dead:
        return ElidedSource(source)
    lines = source.split("\n")
    out: list[str] = []
    regions: list[tuple[int, int]] = []
    saved = 0
    i = 0
    while i < len(lines):
        n = i + 1
        if n not in dead:
            out.append(lines[i])
            i += 1
            continue
        j = i
        while j + 1 < len(lines) and (j + 2) in dead:
            j += 1
        run = lines[i:j + 1]
        indent = re.match(r"[ \t]*", next((ln for ln in run if ln.strip()), "")).group(0)
        marker = indent + MARKER.format(first=n, last=j + 1)
        if j - i + 1 < MIN_RUN or sum(len(ln) + 1 for ln in run) < 2 * len(marker) or \
                any(k in keep for k in range(n, j + 2)):
            out.extend(run)
        else:
            out.append(marker)
            regions.append((n, j + 1))
            saved += sum(len(ln) + 1 for ln in run) - len(marker) - 1
        i = j + 1
    if not regions:
        return ElidedSource(source)
    return ElidedSource("\n".join(out), tuple(regions), saved)
