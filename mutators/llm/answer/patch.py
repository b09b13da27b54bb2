"""SEARCH/REPLACE patches: parse a model's answer, apply it tolerantly, validate the child.

The format is the one aider and OpenEvolve use::

    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE

Contracts:

- :func:`parse_blocks` tolerates prose and ```` ``` ```` fences around blocks (5 to 9
  marker characters, trailing spaces), fences inside a block's sections, a file name after
  the SEARCH / REPLACE word (``<<<<<<< SEARCH kernel.cu``) and aider's older marker words
  ``ORIGINAL`` / ``UPDATED`` for ``SEARCH`` / ``REPLACE``. A broken block (a SEARCH without
  its ``=======`` or ``>>>>>>> REPLACE``, or a stray REPLACE marker) becomes a
  :class:`ParseError` with its line number, never silently dropped. Block texts keep their
  lines with ``\\n`` endings.
- :func:`apply_blocks` applies blocks in order, each to the source as the blocks before it
  left it. Matching is line-based and tries, in order: exact lines; lines equal after
  stripping indentation and trailing whitespace (the replacement is re-indented by the
  difference); lines equal after collapsing all internal whitespace; the same ignoring blank
  lines; and, when every SEARCH line carries a line-number prefix copied from a numbered
  excerpt (``  16 | code``, ``>>   16 | code``, ``16: code``), all of these again without the
  prefixes. A block is applied only where the model meant it: its SEARCH text must match
  exactly once at the first of these levels that matches at all (two matches: refused as
  ambiguous, with the lines of both), and a block whose lines an earlier block already
  replaced is refused rather than applied at a looser match elsewhere (a draft block followed
  by the final one). Every block not applied is an :class:`UnmatchedBlock` saying why, with
  the closest source snippet (or the places it matched), for the next prompt.
- :func:`elided_lines` finds the lines of a whole file (or a REPLACE section) that stand for
  code left out (``// ... unchanged ...``, ``/* ... */``, ``// (unchanged)``).
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
    "elided_lines",
    "validate_child",
    "evo_launch_signature",
    "ABI_PARAM_TYPES",
]

#: an optional file name after a marker word: ``SEARCH kernel.cu``, ``SEARCH: `kernel.cu```
_FILE_NAME = r"(?:\s*:?\s+|\s*:\s*)[`'\"(\[]?[\w./\\-]+[`'\")\]]?"
_SEARCH_RE = re.compile(rf"^\s*<{{5,9}}\s*(?:SEARCH|ORIGINAL)(?:{_FILE_NAME})?\s*:?\s*$")
_DIVIDER_RE = re.compile(r"^\s*={5,9}\s*$")
_REPLACE_RE = re.compile(rf"^\s*>{{5,9}}\s*(?:REPLACE|UPDATED)(?:{_FILE_NAME})?\s*:?\s*$")
_FENCE_RE = re.compile(r"^\s*```")
#: a fence line alone (```` ```cuda ````, ```` ``` ````), as models put inside a block's sections
_FENCE_LINE_RE = re.compile(r"^\s*```[\w+.-]*\s*$")

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
    #: what was tolerated ("fences inside 2 block(s) removed", "ORIGINAL/UPDATED markers read as SEARCH/REPLACE")
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class UnmatchedBlock:
    """A block that was not applied, and why (``kind``):

    - ``not_found``: its SEARCH text matches nowhere; ``closest_match_snippet`` is the source
      window most similar to it, with ``closest_line`` its first line (1-based; 0 when the
      source is empty);
    - ``empty``: its SEARCH section is empty;
    - ``ambiguous``: it matches more than once; ``match_lines`` are the first lines of every
      match and ``match_context`` the lines around each (up to 3), in the source as the
      blocks before it left it;
    - ``replaced``: the lines it quotes were replaced by an earlier block (``replaced_by``,
      0-based), so it matches only elsewhere, more loosely (``match_lines``, the snippet
      there), or nowhere.

    ``reason`` says it in one sentence, for the next prompt.
    """

    index: int
    search_text: str
    closest_match_snippet: str
    closest_line: int = 0
    reason: str = "SEARCH text not found in the source"
    kind: str = "not_found"
    match_lines: tuple[int, ...] = ()
    match_context: tuple[str, ...] = ()
    replaced_by: int = -1


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
    fenced = 0
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
            s_kept, r_kept = _unfence(search), _unfence(replace)
            fenced += (s_kept != search or r_kept != replace)
            blocks.append(Block(_join(s_kept), _join(r_kept), start))
            i = k + 1
            continue
        if _REPLACE_RE.match(line):
            errors.append(ParseError(i + 1, "'>>>>>>> REPLACE' without a preceding '<<<<<<< SEARCH'"))
        i += 1
    markers = [ln for ln in lines if _SEARCH_RE.match(ln) or _REPLACE_RE.match(ln)]
    notes = []
    if any(re.search(r"<\s*ORIGINAL|>\s*UPDATED", ln) for ln in markers):
        notes.append("ORIGINAL/UPDATED markers read as SEARCH/REPLACE")
    if any(re.search(r"(SEARCH|ORIGINAL|REPLACE|UPDATED)\s*:?\s*[^\s:]", ln) for ln in markers):
        notes.append("file names after the markers ignored")
    if fenced:
        notes.append(f"code fences inside {fenced} block(s) removed")
    return ParseResult(tuple(blocks), tuple(errors), tuple(notes))


def _unfence(section: list[str]) -> list[str]:
    """A section without the fence lines a model put around its code inside the block (a
    kernel source never has a line starting with three backticks): a first line like
    ```` ```cuda ```` and a last line ```` ``` ````, blank lines around them included."""
    out = list(section)
    lead = next((i for i, ln in enumerate(out) if ln.strip()), None)
    if lead is not None and _FENCE_LINE_RE.match(out[lead]):
        out = out[lead + 1:]
    tail = next((i for i in range(len(out) - 1, -1, -1) if out[i].strip()), None)
    if tail is not None and _FENCE_LINE_RE.match(out[tail]) and out[tail].strip() == "```":
        out = out[:tail]
    return out if out != section else section


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


def _find_all(src: list[str], search: list[str], tier: int) -> list[tuple[int, int]]:
    """Every ``(start, end)`` span of ``src`` lines matching ``search`` at ``tier`` (overlapping
    ones included), first first."""
    spans: list[tuple[int, int]] = []
    if tier <= 2:
        keys = [_key(tier, s) for s in search]
        n = len(keys)
        first = keys[0]
        for i in range(0, len(src) - n + 1):
            if _key(tier, src[i]) != first:
                continue
            if all(_key(tier, src[i + k]) == keys[k] for k in range(1, n)):
                spans.append((i, i + n))
        return spans
    # tier 3: collapsed whitespace, blank lines ignored on both sides
    keys = [_key(2, s) for s in search if _key(2, s)]
    if not keys:
        return spans
    nonblank = [i for i, s in enumerate(src) if _key(2, s)]
    skeys = [_key(2, src[i]) for i in nonblank]
    n = len(keys)
    for p in range(0, len(skeys) - n + 1):
        if skeys[p : p + n] == keys:
            spans.append((nonblank[p], nonblank[p + n - 1] + 1))
    return spans


#: what each matching level is called in feedback
_TIER_WORDS = ("exactly", "ignoring indentation", "ignoring whitespace", "ignoring whitespace and blank lines")


def _locate(src: list[str], search: list[str]) -> tuple[list[tuple[int, int]], int, list[str], bool]:
    """``(spans, tier, search used, line numbers stripped)``: every match of ``search`` at the
    first level that has one (tiers 0-3, then the same without copied line-number prefixes,
    counted as tier >= 1); ``([], -1, ...)`` when none has."""
    for tier in range(4):
        spans = _find_all(src, search, tier)
        if spans:
            return spans, tier, search, False
    numbered = _strip_line_numbers(search)
    if numbered is None:
        return [], -1, search, False
    for tier in range(4):
        spans = _find_all(src, numbered, tier)
        if spans:
            return spans, max(tier, 1), numbered, True
    return [], -1, numbered, True


def _context(src: list[str], span: tuple[int, int], around: int = 2) -> str:
    return "".join(src[max(0, span[0] - around): span[1] + around])


def _lines_text(starts: list[int]) -> str:
    """``"12"``, ``"12 and 40"``, ``"12, 40 and 77"`` (1-based line numbers)."""
    words = [str(s) for s in starts]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


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

#: a line that is only a comment: its text in ``body``
_COMMENT_LINE_RE = re.compile(r"^\s*(?://+!?|/\*+)(?P<body>.*?)(?:\*+/)?\s*$")
_DOTS_RE = re.compile(r"\.{3,}|…")
#: words that, with "..." anywhere, make a comment stand for code left out
_ELIDED_WORDS_RE = re.compile(r"\b(unchanged|existing|rest|remain(?:s|ing|der)?|same|omitted|elided|skipped|previous|"
                              r"original|untouched|identical|as is)\b", re.IGNORECASE)
#: ... and words that do so only after leading dots ("// ... other kernels ...")
_ELIDED_AFTER_DOTS_RE = re.compile(r"\b(before|other|others|code|kernels?|functions?|body|implementation|here|as "
                                   r"before|helpers?|includes?|setup)\b", re.IGNORECASE)
#: a comment without "..." that stands for code left out: "(unchanged)", "rest of the file unchanged"
_ELIDED_PHRASE_RE = re.compile(
    r"(?:\(?\s*(?:unchanged|no changes?|same as (?:before|above|the original|original)|existing code|"
    r"(?:code|rest|body) unchanged|unchanged code|(?:code )?omitted(?: for brevity)?|(?:code )?elided)\s*\)?"
    r"|(?:the )?(?:rest|remainder) of (?:the )?[\w\s]{1,30}?(?:is |remains |stays )?"
    r"(?:unchanged|the same|as before|identical|as is|omitted))[.:]?", re.IGNORECASE)


def elided_lines(text: str, parent: str | None = None) -> list[tuple[int, str]]:
    """``(line, text)`` of every line of ``text`` that stands for code left out: a comment
    that is only dots (``/* ... */``, ``// ...``), one with dots and a word like
    ``unchanged``, ``rest``, ``existing`` (``// ... rest of the code ...``), a short phrase
    without dots (``// (unchanged)``, ``// rest of the kernel unchanged``), or ``...`` alone.
    Lines that ``parent`` has too (its own comments) are not counted."""
    known = {ln.strip() for ln in parent.splitlines()} if parent else set()
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped in known:
            continue
        if _DOTS_RE.fullmatch(stripped):
            found.append((n, stripped))
            continue
        m = _COMMENT_LINE_RE.match(line)
        if m is None:
            continue
        body = m.group("body").strip().strip("[](){}<>-=*#:;,").strip()
        if not body:
            continue
        dots = _DOTS_RE.search(body)
        only_dots = dots and not _DOTS_RE.sub("", body).strip(" .[](){}<>-=*#:;,")
        leading = dots and dots.start() == 0
        if only_dots or (dots and _ELIDED_WORDS_RE.search(body)) or (leading and _ELIDED_AFTER_DOTS_RE.search(body)) \
                or _ELIDED_PHRASE_RE.fullmatch(body):
            found.append((n, stripped))
    return found


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
    orig = _lines(source)
    src = list(orig)
    #: for each line of ``src``: its index in ``orig``, None for a line a block wrote
    origin: list[int | None] = list(range(len(orig)))
    #: index in ``orig`` -> the block that replaced that line
    replaced_by: dict[int, int] = {}
    applied: list[int] = []
    fuzzy: list[int] = []
    unmatched: list[UnmatchedBlock] = []
    for idx, b in enumerate(blocks):
        search = _lines(b.search)
        replace = _lines(b.replace)
        if not "".join(search).strip():
            unmatched.append(UnmatchedBlock(idx, b.search, "", 0, "SEARCH section is empty; quote the lines to replace",
                                            kind="empty"))
            continue
        spans, tier_used, search, numbered = _locate(src, search)
        if numbered:  # line numbers copied from a prompt's numbered excerpt ("  16 | code", ">>   16 | code", "16: code")
            replace = _strip_line_numbers(replace, partial=True) or replace
        gone = _replaced_lines(orig, _lines(b.search), replaced_by, spans, tier_used, origin)
        if gone is not None:
            first, last, by = gone
            reason = (f"the lines it quotes (lines {first}-{last} of the source before any block) were already "
                      f"replaced by block {by + 1}, so it no longer matches there")
            snippet, line, where = "", 0, ()
            if spans:
                where = tuple(s + 1 for s, _ in spans)
                reason += (f"; it matches only at line {_lines_text(list(where))} ({_TIER_WORDS[tier_used]}), "
                           "another place, where it was not applied")
                snippet, line = "".join(src[spans[0][0]:spans[0][1]]), where[0]
            reason += f". If block {by + 1} was a draft, send only the final block"
            unmatched.append(UnmatchedBlock(idx, b.search, snippet, line, reason, kind="replaced", match_lines=where,
                                            replaced_by=by))
            continue
        if not spans:
            snippet, line = _closest(src, search)
            reason = "SEARCH text not found in the source"
            if any(_ELISION_RE.match(_content(s)) for s in search):
                reason += " (it elides lines with '...'; quote every line of the span exactly)"
            unmatched.append(UnmatchedBlock(idx, b.search, snippet, line, reason))
            continue
        if len(spans) > 1:
            starts = [s + 1 for s, _ in spans]
            where = " (line numbers of the source as the blocks before it left it)" if applied else ""
            reason = (f"SEARCH text matches {len(spans)} times ({_TIER_WORDS[tier_used]}), at lines "
                      f"{_lines_text(starts)}{where}, so where to apply it is ambiguous; add unchanged lines "
                      "before or after it so that it matches exactly once")
            unmatched.append(UnmatchedBlock(idx, b.search, _context(src, spans[0]), max(1, starts[0] - 2), reason,
                                            kind="ambiguous", match_lines=tuple(starts),
                                            match_context=tuple(_context(src, s) for s in spans[:3])))
            continue
        a, z = spans[0]
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
        for o in origin[a:z]:
            if o is not None:
                replaced_by[o] = idx
        src = src[:a] + replace + src[z:]
        origin = origin[:a] + [None] * len(replace) + origin[z:]
        applied.append(idx)
    return PatchResult("".join(src), tuple(applied), tuple(unmatched), tuple(fuzzy))


def _replaced_lines(orig: list[str], search: list[str], replaced_by: dict[int, int], spans: list[tuple[int, int]],
                    tier: int, origin: list[int | None]) -> tuple[int, int, int] | None:
    """``(first line, last line, block)`` when ``search`` quotes lines of the original source
    that an earlier block replaced and it does not match in the current source as closely
    (exactly where it matched the original exactly), else None.

    A looser match elsewhere is then a different place (a draft block followed by its final
    version: the final one's SEARCH, no longer found where the draft applied, matched the same
    lines at another indentation). A match on lines an earlier block wrote is a follow-up edit
    of that block's result and stays allowed.
    """
    if not replaced_by or tier == 0:
        return None
    ospans, otier, _, _ = _locate(orig, search)
    if not ospans or (spans and otier >= tier):
        return None
    hits = [(replaced_by[i], s, z) for s, z in ospans for i in range(s, z) if i in replaced_by]
    if not hits:
        return None
    if spans and any(origin[i] is None for s, z in spans for i in range(s, z)):
        return None  # it matches what an earlier block wrote: an edit on top of that edit
    by, s, z = hits[0]
    return s + 1, z, by


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
