"""A model's answer -> a child source, or the exact reasons it cannot be one.

:func:`interpret` is the whole path from answer text to child (pure: no I/O, no state), so
the corpus of messy answers in ``tests/fixtures/llm/answers/`` can test it case by case:

1. reasoning is removed (``<think>`` blocks, :func:`mutators.llm.answer.patch.strip_reasoning`);
2. an answer wrapped in JSON (``{"code": ...}``, ``{"edits": [{"search", "replace"}]}``,
   optionally in a ```` ```json ```` fence) is unwrapped;
3. for ``genesis``: the whole ```` ```cuda ```` file (or an unfenced file) is the child;
4. for ``repair`` / ``optimize``: SEARCH/REPLACE blocks (fences around or inside blocks,
   CRLF, 5-9 marker characters, ``ORIGINAL`` / ``UPDATED`` marker words, a file name after
   the marker word, indentation and whitespace differences, copied line numbers tolerated;
   a SEARCH that matches more than once, or quotes lines an earlier block already replaced,
   is refused), else a unified diff's hunks, else a whole file, accepted as the diff it
   amounts to when that diff is small (at most ``max(whole_file_lines, whole_file_fraction
   x the parent's lines)`` changed lines), else prose;
5. a whole file (genesis too) or a REPLACE section with lines that stand for code left out
   (``// ... unchanged ...``, :func:`mutators.llm.answer.patch.elided_lines`) is refused:
   that code would be deleted;
6. the child is validated (:func:`mutators.llm.answer.patch.validate_child`).

The result is an :class:`Interpretation`: the child (or None), the problems, the unmatched
blocks, the form the answer took, notes on what was tolerated, and ``feedback``: what the
next prompt for this parent tells the model about this answer (the problem, how to fix it,
and for format problems a short example of the format). For a repair or optimize prompt it
always ends with :data:`ORDER_NOTE` (how blocks apply).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from mutators.llm.answer.patch import (
    Block,
    UnmatchedBlock,
    apply_blocks,
    elided_lines,
    extract_whole_file,
    parse_blocks,
    parse_unified_diff,
    strip_reasoning,
    validate_child,
)
from mutators.llm.answer.reasons import validation_reason

__all__ = ["Interpretation", "interpret", "FORMAT_EXAMPLE", "ORDER_NOTE", "WHOLE_FILE_LINES", "WHOLE_FILE_FRACTION"]

#: A whole-file answer to a patch prompt is accepted when it changes at most this many lines...
WHOLE_FILE_LINES = 40
#: ... or this fraction of the parent's lines, whichever is larger.
WHOLE_FILE_FRACTION = 0.2

FORMAT_EXAMPLE = """<<<<<<< SEARCH
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += a[k] * b[k];
=======
    float acc = 0.f;
    #pragma unroll 4
    for (int k = 0; k < K; ++k) acc = fmaf(a[k], b[k], acc);
>>>>>>> REPLACE"""

_FORMAT_HELP = ("Answer with SEARCH/REPLACE blocks only, each copying a few whole lines of the current source "
                "exactly (no line numbers, no '...'), for example:\n" + FORMAT_EXAMPLE)

#: how blocks apply; the last line of the feedback on every refused repair / optimize answer
ORDER_NOTE = ("How blocks apply: in order, each to the source as the blocks before it left it. A SEARCH must "
              "match that source exactly once (add unchanged lines around it until it does) and must not quote "
              "lines an earlier block already replaced; send each change once, not a draft and then a final block.")

_JSON_FENCE_RE = re.compile(r"```[ \t]*json[ \t]*\n(.*?)\n[ \t]*```", re.DOTALL | re.IGNORECASE)
_TEXT_KEYS = ("patch", "diff", "code", "source", "kernel", "cuda", "file", "content", "answer", "response", "text")
_LIST_KEYS = ("edits", "patches", "changes", "blocks", "replacements")
_PAIRS = (("search", "replace"), ("find", "replace"), ("old", "new"), ("original", "updated"), ("before", "after"))


@dataclass(frozen=True)
class Interpretation:
    """What an answer amounts to (see module docstring).

    ``form``: ``blocks``, ``unified_diff``, ``whole_file`` (a patch prompt answered with a
    file, accepted as its diff), ``file`` (genesis), ``prose``, ``broken``, ``empty``.
    ``notes`` say what was tolerated (JSON unwrapped, think block removed, line numbers
    stripped, fuzzy match, ...). ``feedback`` is "" when the child is fit. ``reason`` is the
    :data:`mutators.llm.answer.reasons.REASONS` code of the first problem ("" when fit).
    """

    child: str | None
    problems: tuple[str, ...] = ()
    unmatched: tuple[UnmatchedBlock, ...] = ()
    form: str = ""
    notes: tuple[str, ...] = ()
    feedback: str = ""
    changed_lines: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.child is not None and not self.problems


def _unwrap_json(text: str) -> tuple[str | None, tuple[Block, ...]]:
    """``(inner text, blocks)`` of a JSON-wrapped answer; ``(None, ())`` if it is not one."""
    m = _JSON_FENCE_RE.search(text)
    raw = m.group(1) if m else text.strip()
    if not raw.startswith(("{", "[")):
        return None, ()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None, ()

    def pair(d: Any) -> Block | None:
        if not isinstance(d, dict):
            return None
        for a, b in _PAIRS:
            if isinstance(d.get(a), str) and isinstance(d.get(b), str):
                s, r = d[a], d[b]
                return Block(s if s.endswith("\n") or not s else s + "\n", r if r.endswith("\n") or not r else r + "\n")
        return None

    items = data if isinstance(data, list) else None
    if isinstance(data, dict):
        for k in _LIST_KEYS:
            if isinstance(data.get(k), list):
                items = data[k]
                break
    if items is not None:
        blocks = tuple(b for b in (pair(x) for x in items) if b is not None)
        if blocks:
            return "", blocks
    if isinstance(data, dict):
        one = pair(data)
        if one is not None:
            return "", (one,)
        for k in _TEXT_KEYS:
            if isinstance(data.get(k), str) and data[k].strip():
                return data[k], ()
    return None, ()


def _changed_lines(parent: str, child: str) -> int:
    a, b = parent.splitlines(), child.splitlines()
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in sm.get_opcodes() if op != "equal")


def _unmatched_problem(blocks: tuple[UnmatchedBlock, ...], total: int) -> str:
    """One line: how many blocks were not applied, by why."""
    kinds = [u.kind for u in blocks]
    if all(k in ("not_found", "empty") for k in kinds):
        return f"{len(blocks)} of {total} SEARCH blocks matched nowhere"
    words = {"not_found": "matched nowhere", "empty": "empty", "ambiguous": "matched more than once",
             "replaced": "quoted lines an earlier block replaced"}
    parts = [f"{kinds.count(k)} {w}" for k, w in words.items() if k in kinds]
    return f"{len(blocks)} of {total} SEARCH blocks could not be applied ({', '.join(parts)})"


def _fmt_unmatched(blocks: tuple[UnmatchedBlock, ...], total: int) -> str:
    if all(u.kind in ("not_found", "empty") for u in blocks):
        head = (f"{len(blocks)} of {total} SEARCH blocks matched nowhere in the current source, so the answer was "
                "not applied. Copy SEARCH lines exactly from the current source (the closest lines are shown):")
    else:
        head = f"{len(blocks)} of {total} SEARCH blocks could not be applied, so the answer was not applied:"
    out = [head]
    for u in blocks:
        out.append(f"SEARCH block {u.index + 1} ({u.reason}):\n```\n{u.search_text.rstrip()[:1200]}\n```")
        if u.kind == "ambiguous":
            for line, ctx in zip(u.match_lines, u.match_context):
                out.append(f"it matches at line {line}; the lines around it there:\n```\n{ctx.rstrip()[:1200]}\n```")
        elif u.kind == "replaced" and u.closest_match_snippet:
            out.append(f"the other place it matches (line {u.closest_line}), where it was not applied:\n```\n"
                       f"{u.closest_match_snippet.rstrip()[:1200]}\n```")
        elif u.closest_match_snippet:
            out.append(f"closest lines in the source (from line {u.closest_line}):\n```\n"
                       f"{u.closest_match_snippet.rstrip()[:1200]}\n```")
    return "\n".join(out)


def _elided(found: list[tuple[int, str]], what: str, kind: str, notes: list[str], cut_note: str,
            changed: int = 0) -> Interpretation:
    """The refusal of a whole file (``what``) or REPLACE section with code left out."""
    shown = "; ".join(f"line {n}: {text[:80]!r}" for n, text in found[:3])
    p = f"{what} leaves code out ({shown}){cut_note}: that code would be deleted"
    if kind == "genesis":
        fix = "Send the complete file, every line written out, in one ```cuda fenced block."
    elif what.startswith("whole file"):
        fix = ("Send SEARCH/REPLACE blocks that change only what must change (or, if you must, the complete file "
               "with every line written out).")
    else:
        fix = "Write every line a REPLACE section keeps; to keep lines unchanged, leave them out of the block."
    return Interpretation(None, (p,), form="whole_file" if what.startswith("whole file") else "blocks",
                          notes=tuple(notes), changed_lines=changed, reason="elided",
                          feedback=f"Your previous answer was not used: the {what} leaves code out ({shown}); "
                                   f"lines elided like that would be deleted from the kernel. {fix}")


def interpret(
    text: str,
    *,
    kind: str,
    parent_source: str | None,
    finish_reason: str | None = None,
    whole_file_lines: int = WHOLE_FILE_LINES,
    whole_file_fraction: float = WHOLE_FILE_FRACTION,
) -> Interpretation:
    """The child an answer amounts to, or why it is none (see module docstring)."""
    res = _interpret(text, kind=kind, parent_source=parent_source, finish_reason=finish_reason,
                     whole_file_lines=whole_file_lines, whole_file_fraction=whole_file_fraction)
    if res.feedback and kind != "genesis":  # genesis asks for a whole file: no blocks to apply
        res = dataclasses.replace(res, feedback=res.feedback + "\n" + ORDER_NOTE)
    return res


def _interpret(text: str, *, kind: str, parent_source: str | None, finish_reason: str | None,
               whole_file_lines: int, whole_file_fraction: float) -> Interpretation:
    notes: list[str] = []
    cut = finish_reason == "length"
    cut_note = " (the answer was cut off at max_output_tokens)" if cut else ""
    body, think_note = strip_reasoning(text or "")
    if body != (text or ""):
        notes.append("reasoning block removed")
    if not body.strip():
        why = f"empty answer: {think_note}" if think_note else "empty answer"
        return Interpretation(None, (why + cut_note,), form="empty", reason="empty",
                              feedback=f"Your previous answer was empty{': ' + think_note if think_note else ''}"
                                       f"{cut_note}. Keep the reasoning short and give the blocks.\n{_FORMAT_HELP}")
    inner, json_blocks = _unwrap_json(body)
    if inner is not None:
        notes.append("JSON wrapper unwrapped")
        body = inner if inner else body

    if kind == "genesis":
        whole = extract_whole_file(body)
        if whole is None:
            p = f"genesis answer has no ```cuda file defining evo_launch{cut_note}"
            return Interpretation(None, (p,), form="prose", notes=tuple(notes), reason="prose",
                                  feedback=f"Your previous answer had no complete kernel file{cut_note}. Reply with "
                                           "the whole file in one ```cuda fenced block that defines evo_launch.")
        elided = elided_lines(whole)
        if elided:
            return _elided(elided, "whole file", kind, notes, cut_note)
        problems = validate_child(None, whole, whole_file=True, allow_whole_file=True)
        return _done(whole, problems, (), "file", notes)

    assert parent_source is not None, "repair / optimize need the parent's source"
    blocks: tuple[Block, ...] = json_blocks
    form = "blocks"
    if not blocks:
        parsed = parse_blocks(body)
        if parsed.errors:
            probs = tuple(f"broken SEARCH/REPLACE block at {e}{cut_note}" for e in parsed.errors)
            return Interpretation(None, probs, form="broken", notes=tuple(notes), reason="broken_blocks", feedback=(
                "Your previous answer had broken SEARCH/REPLACE markers: " + "; ".join(str(e) for e in parsed.errors)
                + cut_note + ". Every block needs all three marker lines.\n" + _FORMAT_HELP))
        blocks = parsed.blocks
        notes += parsed.notes
    for i, b in enumerate(blocks):
        elided = [(n, ln) for n, ln in elided_lines(b.replace, parent_source) if ln not in b.search]
        if elided:
            return _elided(elided, f"REPLACE section of block {i + 1}", kind, notes, cut_note)
    if not blocks:
        blocks = parse_unified_diff(body)
        if blocks:
            form = "unified_diff"
            notes.append(f"unified diff read as {len(blocks)} block(s)")
    if not blocks:
        whole = extract_whole_file(body)
        if whole is not None:
            changed = _changed_lines(parent_source, whole)
            elided = elided_lines(whole, parent_source)
            if elided:
                return _elided(elided, "whole file", kind, notes, cut_note, changed)
            limit = max(whole_file_lines, int(whole_file_fraction * len(parent_source.splitlines())))
            if changed > limit:
                p = (f"whole-file rewrite: the answer replaced the whole file, changing {changed} lines (at most "
                     f"{limit} are accepted as a patch){cut_note}; this prompt asks for SEARCH/REPLACE blocks")
                return Interpretation(None, (p,), form="whole_file", notes=tuple(notes), changed_lines=changed,
                                      reason="whole_file_rewrite", feedback=f"Your previous answer rewrote the whole file ({changed} changed "
                                               f"lines{cut_note}), which is not accepted. Change only the lines that "
                                               f"must change.\n{_FORMAT_HELP}")
            notes.append(f"whole file accepted as a diff of {changed} changed line(s)")
            problems = validate_child(parent_source, whole)
            return _done(whole, problems, (), "whole_file", notes, changed)
        p = f"no SEARCH/REPLACE blocks in the answer (prose only){cut_note}"
        return Interpretation(None, (p,), form="prose", notes=tuple(notes), reason="prose",
                              feedback=f"Your previous answer had no SEARCH/REPLACE blocks{cut_note}, so nothing "
                                       f"was applied.\n{_FORMAT_HELP}")
    res = apply_blocks(parent_source, blocks)
    if res.unmatched:
        p = _unmatched_problem(res.unmatched, len(blocks))
        return Interpretation(None, (p,), res.unmatched, form=form, notes=tuple(notes), reason="unmatched",
                              feedback=_fmt_unmatched(res.unmatched, len(blocks)))
    if res.fuzzy:
        notes.append(f"{len(res.fuzzy)} block(s) matched after normalising whitespace or line numbers")
    problems = validate_child(parent_source, res.source)
    return _done(res.source, problems, (), form, notes, _changed_lines(parent_source, res.source))


def _done(child: str, problems: list[str], unmatched: tuple[UnmatchedBlock, ...], form: str, notes: list[str],
          changed: int = 0) -> Interpretation:
    if not problems:
        return Interpretation(child, (), unmatched, form, tuple(notes), "", changed)
    fb = []
    for p in problems:
        if p.startswith("no-op"):
            fb.append("Your previous answer changed nothing: after applying it the kernel equals the current source "
                      "(modulo whitespace). Make a real change.")
        elif "evo_launch" in p or "evo_abi.h" in p:
            fb.append(f"Your previous answer broke the kernel ABI: {p}. Keep the entry point and the include exactly "
                      "as they are.")
        elif p.startswith("conflict marker"):
            fb.append(f"Your previous answer left a marker in the source: {p}. {_FORMAT_HELP}")
        else:
            fb.append(f"Your previous answer was rejected: {p}.")
    return Interpretation(child, tuple(problems), unmatched, form, tuple(notes), "\n".join(fb), changed,
                          validation_reason(problems))
