"""SEARCH/REPLACE patches: parse a model's answer, apply it tolerantly, validate the child.

The format is the one aider and OpenEvolve use::

    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE

Contracts:

- :func:`parse_blocks` tolerates prose and ```` ``` ```` fences around blocks (5 to 9
  marker characters, trailing spaces). A broken block (a SEARCH without its ``=======`` or
  ``>>>>>>> REPLACE``, or a stray REPLACE marker) becomes a :class:`ParseError` with its line
  number, never silently dropped. Block texts keep their lines with ``\\n`` endings.
- :func:`apply_blocks` applies blocks in order, each once at its first match in the source as
  it stands after the previous blocks. Matching is line-based and tries, in order: exact
  lines; lines equal after stripping indentation and trailing whitespace (the replacement is
  re-indented by the difference); lines equal after collapsing all internal whitespace; the
  same ignoring blank lines; and, when every SEARCH line carries a line-number prefix copied
  from a numbered excerpt (``  16 | code``, ``>>   16 | code``, ``16: code``), all of these
  again without the prefixes. Every block that matches nowhere is an :class:`UnmatchedBlock`
  carrying the closest source snippet, for the next prompt.
- :func:`parse_unified_diff` turns a unified diff's hunks into blocks (matched by content).
- :func:`validate_child` lists what makes a child unfit to compile: no-op, missing or changed
  ``evo_launch``, removed ``#include "evo_abi.h"``, leftover conflict markers, and a whole-file
  rewrite where only patches were asked for.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

__all__ = [
    "Block",
    "ParseError",
    "ParseResult",
    "UnmatchedBlock",
    "PatchResult",
    "parse_blocks",
    "parse_unified_diff",
    "render_blocks",
    "apply_blocks",
    "extract_whole_file",
    "strip_reasoning",
    "validate_child",
    "evo_launch_signature",
    "ABI_PARAM_TYPES",
]

_SEARCH_RE = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER_RE = re.compile(r"^\s*={5,9}\s*$")
_REPLACE_RE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_FENCE_RE = re.compile(r"^\s*```")

#: The parameter types of ``evo_launch`` (evo_abi.h), names stripped.
ABI_PARAM_TYPES = ("const EvoTensor*", "int", "EvoTensor*", "int", "const double*", "int", "cudaStream_t")


@dataclass(frozen=True)
class Block:
    """One SEARCH/REPLACE edit. Texts are whole lines, each ending in ``\\n`` ("" = none).

    ``line`` (1-based line of the SEARCH marker in the answer) is informational and does not
    take part in equality.
    """

    search: str
    replace: str
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ParseError:
    """A broken block: where it starts in the answer and what is missing."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class ParseResult:
    blocks: tuple[Block, ...]
    errors: tuple[ParseError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class UnmatchedBlock:
    """A block whose SEARCH text was found nowhere (or was empty).

    ``closest_match_snippet`` is the source window most similar to the SEARCH text, with
    ``closest_line`` its first line (1-based; 0 when the source is empty).
    """

    index: int
    search_text: str
    closest_match_snippet: str
    closest_line: int = 0
    reason: str = "SEARCH text not found in the source"


@dataclass(frozen=True)
class PatchResult:
    """The patched source, which blocks applied (indices) and which did not."""

    source: str
    applied: tuple[int, ...]
    unmatched: tuple[UnmatchedBlock, ...]
    fuzzy: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.unmatched


# --------------------------------------------------------------------------------------
# parse / render
# --------------------------------------------------------------------------------------


def parse_blocks(text: str) -> ParseResult:
    """Every SEARCH/REPLACE block of ``text`` and every broken one (see module docstring)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[Block] = []
    errors: list[ParseError] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if _SEARCH_RE.match(line):
            start = i + 1
            j = i + 1
            search: list[str] = []
            while j < n and not (_DIVIDER_RE.match(lines[j]) or _SEARCH_RE.match(lines[j]) or _REPLACE_RE.match(lines[j])):
                search.append(lines[j])
                j += 1
            if j >= n or not _DIVIDER_RE.match(lines[j]):
                what = "end of answer" if j >= n else f"line {j + 1} ({lines[j].strip()})"
                errors.append(ParseError(start, f"SEARCH block has no '=======' divider before {what}"))
                i = j
                continue
            k = j + 1
            replace: list[str] = []
            while k < n and not (_REPLACE_RE.match(lines[k]) or _SEARCH_RE.match(lines[k]) or _DIVIDER_RE.match(lines[k])):
                replace.append(lines[k])
                k += 1
            if k >= n or not _REPLACE_RE.match(lines[k]):
                what = "end of answer" if k >= n else f"line {k + 1} ({lines[k].strip()})"
                errors.append(ParseError(start, f"SEARCH block has no '>>>>>>> REPLACE' end before {what}"))
                i = k if (k < n and _SEARCH_RE.match(lines[k])) else k + 1
                continue
            blocks.append(Block(_join(search), _join(replace), start))
            i = k + 1
            continue
        if _REPLACE_RE.match(line):
            errors.append(ParseError(i + 1, "'>>>>>>> REPLACE' without a preceding '<<<<<<< SEARCH'"))
        i += 1
    return ParseResult(tuple(blocks), tuple(errors))


def _join(lines: list[str]) -> str:
    return "".join(ln + "\n" for ln in lines)


def render_blocks(blocks: list[Block] | tuple[Block, ...]) -> str:
    """The canonical text of ``blocks`` (what :func:`parse_blocks` reads back)."""
    out = []
    for b in blocks:
        out.append("<<<<<<< SEARCH\n" + _ensure_nl(b.search) + "=======\n" + _ensure_nl(b.replace) + ">>>>>>> REPLACE\n")
    return "\n".join(out)


def _ensure_nl(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


_THINK_TAGS = "think|thinking|reasoning"
_THINK_BLOCK_RE = re.compile(rf"<({_THINK_TAGS})>.*?</\1>[ \t]*\n?", re.DOTALL | re.IGNORECASE)
_THINK_OPEN_RE = re.compile(rf"<(?:{_THINK_TAGS})>", re.IGNORECASE)
_THINK_CLOSE_RE = re.compile(rf"</(?:{_THINK_TAGS})>[ \t]*\n?", re.IGNORECASE)


def strip_reasoning(text: str) -> tuple[str, str]:
    """``(answer, note)``: the answer without ``<think>...</think>`` reasoning.

    Removes every closed ``<think>`` (``<thinking>``, ``<reasoning>``) block; a lone
    ``</think>`` drops everything before it (chat templates that open the block in the
    prompt, as Qwen3 and DeepSeek-R1 do); an unclosed ``<think>`` drops everything after it
    and ``note`` says the answer was cut inside its reasoning. ``note`` is "" otherwise.
    """
    out = _THINK_BLOCK_RE.sub("", text)
    note = ""
    close = _THINK_CLOSE_RE.search(out)
    if close is not None and not _THINK_OPEN_RE.search(out[: close.start()]):
        out = out[close.end():]
    opened = _THINK_OPEN_RE.search(out)
    if opened is not None:
        out = out[: opened.start()]
        note = "the answer ended inside an unclosed <think> block (the reasoning used up the output budget)"
    return out, note


_WHOLE_FENCE_RE = re.compile(r"```[ \t]*(cuda|cu|cpp|c\+\+|cxx|c|cc|h|hpp)?[ \t]*\n(.*?)\n[ \t]*```", re.DOTALL | re.IGNORECASE)


def extract_whole_file(text: str) -> str | None:
    """The kernel source of an answer that is a whole file, or None.

    Takes the largest ```` ```cuda ```` (or cpp/c++/untagged) fenced block that defines
    ``evo_launch`` or includes ``evo_abi.h``; an unfenced answer counts when it itself starts
    like a source file and defines ``evo_launch``. SEARCH/REPLACE answers never count.
    """
    if any(_SEARCH_RE.match(ln) for ln in text.splitlines()):
        return None
    best: str | None = None
    for m in _WHOLE_FENCE_RE.finditer(text.replace("\r\n", "\n")):
        body = m.group(2)
        if ("evo_launch" in body or "evo_abi.h" in body) and (best is None or len(body) > len(best)):
            best = body
    if best is not None:
        return best if best.endswith("\n") else best + "\n"
    stripped = text.lstrip()
    if "evo_launch" in text and (stripped.startswith("#include") or stripped.startswith("//")):
        return text if text.endswith("\n") else text + "\n"
    return None


# --------------------------------------------------------------------------------------
# apply
# --------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """Lines with their terminators (the last one may have none)."""
    return text.splitlines(keepends=True)


def _content(line: str) -> str:
    return line.rstrip("\r\n")


def _key(tier: int, line: str) -> str:
    c = _content(line)
    if tier == 0:
        return c
    if tier == 1:
        return c.strip()
    return " ".join(c.split())


def _find(src: list[str], search: list[str], tier: int) -> tuple[int, int] | None:
    """First ``(start, end)`` span of ``src`` lines matching ``search`` at ``tier``."""
    if tier <= 2:
        keys = [_key(tier, s) for s in search]
        n = len(keys)
        first = keys[0]
        for i in range(0, len(src) - n + 1):
            if _key(tier, src[i]) != first:
                continue
            if all(_key(tier, src[i + k]) == keys[k] for k in range(1, n)):
                return i, i + n
        return None
    # tier 3: collapsed whitespace, blank lines ignored on both sides
    keys = [_key(2, s) for s in search if _key(2, s)]
    if not keys:
        return None
    nonblank = [i for i, s in enumerate(src) if _key(2, s)]
    skeys = [_key(2, src[i]) for i in nonblank]
    n = len(keys)
    for p in range(0, len(skeys) - n + 1):
        if skeys[p : p + n] == keys:
            return nonblank[p], nonblank[p + n - 1] + 1
    return None


def _indent(line: str) -> str:
    c = _content(line)
    return c[: len(c) - len(c.lstrip())]


def _reindent(replace: list[str], search: list[str], matched: list[str]) -> list[str]:
    """Shift ``replace`` by the indentation difference between the source and the SEARCH."""
    pair = next(((s, m) for s, m in zip(search, matched) if _content(s).strip() and _content(m).strip()), None)
    if pair is None:
        return replace
    s_ind, m_ind = _indent(pair[0]), _indent(pair[1])
    if s_ind == m_ind:
        return replace
    out = []
    if len(m_ind) > len(s_ind) and m_ind.endswith(s_ind):
        extra = m_ind[: len(m_ind) - len(s_ind)]
        for r in replace:
            out.append(extra + r if _content(r).strip() else r)
        return out
    if len(s_ind) > len(m_ind) and s_ind.endswith(m_ind):
        drop = len(s_ind) - len(m_ind)
        for r in replace:
            lead = len(_indent(r))
            out.append(r[min(drop, lead):] if _content(r).strip() else r)
        return out
    if s_ind and set(s_ind) == {"\t"} and m_ind and set(m_ind) == {" "} and len(m_ind) % len(s_ind) == 0:
        # SEARCH indented with tabs where the source has spaces: one tab = the source's step
        step = " " * (len(m_ind) // len(s_ind))
        for r in replace:
            c = _content(r)
            tabs = len(c) - len(c.lstrip("\t"))
            out.append(step * tabs + r[tabs:] if c.strip() else r)
        return out
    return replace  # other mixes of tabs and spaces: leave the model's indentation alone


def _closest(src: list[str], search: list[str]) -> tuple[str, int]:
    if not src:
        return "", 0
    n = max(1, len(search))
    target = "".join(_key(2, s) + "\n" for s in search)
    best, best_i = -1.0, 0
    sm = difflib.SequenceMatcher(autojunk=False)
    sm.set_seq2(target)
    for i in range(0, max(1, len(src) - n + 1)):
        window = "".join(_key(2, s) + "\n" for s in src[i : i + n])
        sm.set_seq1(window)
        if sm.real_quick_ratio() <= best or sm.quick_ratio() <= best:
            continue
        r = sm.ratio()
        if r > best:
            best, best_i = r, i
    snippet = "".join(src[best_i : best_i + n])
    return snippet, best_i + 1


_LINE_NO_RE = re.compile(r"^(?:\s*>>)?\s*\d{1,6}\s*(?:\||:(?=\s))\s?")
_ELISION_RE = re.compile(r"^\s*(?://|/\*|#)?\s*(?:\.\.\.|…)|\.\.\.\s*(?:rest|existing|unchanged|same)", re.IGNORECASE)


def _strip_line_numbers(lines: list[str], partial: bool = False) -> list[str] | None:
    """``lines`` without copied line-number prefixes, or None when not every non-blank line
    has one (``partial``: strip the prefixed lines, keep the others)."""
    body = [ln for ln in lines if _content(ln).strip()]
    if not body:
        return None
    has = [bool(_LINE_NO_RE.match(_content(ln))) for ln in body]
    if not any(has) or (not partial and not all(has)):
        return None
    return [_LINE_NO_RE.sub("", ln, count=1) if _LINE_NO_RE.match(_content(ln)) else ln for ln in lines]


_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def parse_unified_diff(text: str) -> tuple[Block, ...]:
    """Blocks from a unified diff's hunks (``@@ -a,b +c,d @@`` then `` ``/``-``/``+`` lines).

    Each hunk becomes one block: SEARCH = its context and removed lines, REPLACE = its
    context and added lines (applied by content, so wrong hunk line numbers do not matter).
    An empty line inside a hunk counts as an empty context line (models often drop its
    leading space). Returns () when ``text`` has no hunk.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[Block] = []
    i, n = 0, len(lines)
    while i < n:
        if not _HUNK_RE.match(lines[i]):
            i += 1
            continue
        start = i + 1
        search: list[str] = []
        replace: list[str] = []
        i += 1
        while i < n and not _HUNK_RE.match(lines[i]) and not lines[i].startswith(("--- ", "+++ ", "diff ", "```")):
            ln = lines[i]
            if ln.startswith("\\"):  # "\ No newline at end of file"
                pass
            elif ln.startswith("-"):
                search.append(ln[1:])
            elif ln.startswith("+"):
                replace.append(ln[1:])
            elif ln.startswith(" ") or ln == "":
                search.append(ln[1:])
                replace.append(ln[1:])
            else:
                break
            i += 1
        while search and replace and search[-1] == "" and replace[-1] == "":
            search.pop()
            replace.pop()
        if search or replace:
            blocks.append(Block(_join(search), _join(replace), start))
    return tuple(blocks)


def apply_blocks(source: str, blocks: list[Block] | tuple[Block, ...]) -> PatchResult:
    """Apply ``blocks`` in order (see module docstring); never raises for a bad block."""
    src = _lines(source)
    applied: list[int] = []
    fuzzy: list[int] = []
    unmatched: list[UnmatchedBlock] = []
    for idx, b in enumerate(blocks):
        search = _lines(b.search)
        replace = _lines(b.replace)
        if not "".join(search).strip():
            unmatched.append(UnmatchedBlock(idx, b.search, "", 0, "SEARCH section is empty; quote the lines to replace"))
            continue
        span = None
        tier_used = -1
        for tier in range(4):
            span = _find(src, search, tier)
            if span is not None:
                tier_used = tier
                break
        numbered = _strip_line_numbers(search)
        if span is None and numbered is not None:
            # line numbers copied from a prompt's numbered excerpt ("  16 | code", ">>   16 | code", "16: code")
            search = numbered
            replace = _strip_line_numbers(replace, partial=True) or replace
            for tier in range(4):
                span = _find(src, search, tier)
                if span is not None:
                    tier_used = max(tier, 1)
                    break
        if span is None:
            snippet, line = _closest(src, search)
            reason = "SEARCH text not found in the source"
            if any(_ELISION_RE.match(_content(s)) for s in search):
                reason += " (it elides lines with '...'; quote every line of the span exactly)"
            unmatched.append(UnmatchedBlock(idx, b.search, snippet, line, reason))
            continue
        a, z = span
        matched = src[a:z]
        if tier_used >= 1:
            replace = _reindent(replace, search, matched)
            fuzzy.append(idx)
        # keep the source's final-line terminator state: a replacement of the last line that
        # had no newline stays without one; a replaced middle line always keeps its newline
        if replace and z < len(src) and not replace[-1].endswith("\n"):
            replace = replace[:-1] + [replace[-1] + "\n"]
        if replace and z == len(src) and matched and not matched[-1].endswith("\n") and replace[-1].endswith("\n"):
            replace = replace[:-1] + [replace[-1][:-1]]
        src = src[:a] + replace + src[z:]
        applied.append(idx)
    return PatchResult("".join(src), tuple(applied), tuple(unmatched), tuple(fuzzy))


# --------------------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------------------

_LAUNCH_RE = re.compile(r"\bevo_launch\s*\(([^()]*)\)\s*\{", re.DOTALL)
_INCLUDE_ABI_RE = re.compile(r'^\s*#\s*include\s*[<"](?:[^">]*/)?evo_abi\.h[">]', re.MULTILINE)
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _strip_comments(src: str) -> str:
    return _COMMENT_RE.sub(" ", src)


def _param_type(param: str) -> str:
    p = re.sub(r"\b__restrict__\b|\b__restrict\b", " ", param)
    p = " ".join(p.replace("*", " * ").replace("&", " & ").split())
    toks = p.split(" ")
    if len(toks) > 1 and re.fullmatch(r"[A-Za-z_]\w*", toks[-1]) and toks[-1] not in ("int", "cudaStream_t"):
        toks = toks[:-1]  # drop the parameter name
    return " ".join(toks).replace(" *", "*").replace(" &", "&")


def evo_launch_signature(source: str) -> tuple[str, ...] | None:
    """Parameter types of the ``evo_launch`` *definition* in ``source`` (None if absent)."""
    m = _LAUNCH_RE.search(_strip_comments(source))
    if m is None:
        return None
    params = [p for p in m.group(1).split(",") if p.strip()]
    return tuple(_param_type(p) for p in params)


def _squash(s: str) -> str:
    return "".join(s.split())


def validate_child(
    parent: str | None, child: str, *, whole_file: bool = False, allow_whole_file: bool = False
) -> list[str]:
    """Problems that reject ``child`` before compiling (empty list = fit to compile).

    ``parent`` is None for genesis (then the canonical ABI is the reference). ``whole_file``
    says the child came from a whole-file answer; it is a problem unless ``allow_whole_file``
    (genesis prompts allow it; repair and optimize ask for patches).
    """
    problems: list[str] = []
    if whole_file and not allow_whole_file:
        problems.append(
            "whole-file rewrite: the answer replaced the whole file, but this prompt asks for "
            "SEARCH/REPLACE blocks that patch only what must change"
        )
    if not child.strip():
        problems.append("empty source")
        return problems
    if parent is not None and _squash(parent) == _squash(child):
        problems.append("no-op: the child equals the parent (modulo whitespace)")
    for ln, line in enumerate(child.splitlines(), 1):
        if _SEARCH_RE.match(line) or _REPLACE_RE.match(line):
            problems.append(f"conflict marker left in the source at line {ln}: {line.strip()[:40]!r}")
            break
    sig = evo_launch_signature(child)
    if sig is None:
        problems.append("evo_launch entry point missing: the child must define "
                        "int evo_launch(const EvoTensor*, int, EvoTensor*, int, const double*, int, cudaStream_t)")
    else:
        ref = evo_launch_signature(parent) if parent is not None else None
        expected = ref if ref is not None else ABI_PARAM_TYPES
        if sig != expected:
            problems.append(
                f"evo_launch signature changed: ({', '.join(sig)}) instead of ({', '.join(expected)})"
            )
        if len(_LAUNCH_RE.findall(_strip_comments(child))) > 1:
            problems.append("evo_launch is defined more than once")
    had_include = parent is None or bool(_INCLUDE_ABI_RE.search(parent))
    if had_include and not _INCLUDE_ABI_RE.search(child):
        problems.append('#include "evo_abi.h" removed: the ABI header must stay included')
    return problems
