"""Text pieces of the LLM prompts: the parent as it ran (:func:`effective_source`), failing
lines and errors, fitness, profile, tunables, timings and inspirations, and the rendered prompt
record (:class:`RenderedPrompt`). Pure functions of their inputs; the mutator assembles them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from evo.core.tunables import TunableError, parse_tunables
from mutators.llm.prompt.diagnostics import kernel_lines, numbered_excerpt
from mutators.llm.prompt.context import ParentFacts
from mutators.llm.prompt.elide import ElidedSource

__all__ = ["RenderedPrompt", "trim_error", "failing_lines", "error_lines", "elided_text", "effective_source", "fmt_fitness", "fmt_profile",
           "tunables_text", "timings_text", "kernel_body", "inspiration_text"]


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt, its size in tokens, and what was left out to fit the budget.
    ``counted_by`` names the tokenizer that counted ``tokens`` (None: estimated from characters)."""

    messages: list[dict[str, str]]
    tokens: int
    budget: int | None
    omitted: tuple[str, ...] = ()
    fits: bool = True
    counted_by: str | None = None


# --------------------------------------------------------------------------------------
# Formatting helpers
# --------------------------------------------------------------------------------------


def trim_error(text: str, max_lines: int = 40, max_chars: int = 4000) -> str:
    """The first ``max_lines`` lines / ``max_chars`` characters of an error text, marked if cut."""
    lines = (text or "").strip().splitlines()
    out = "\n".join(lines[:max_lines])
    cut = len(lines) > max_lines
    if len(out) > max_chars:
        out, cut = out[:max_chars], True
    return out + ("\n[... trimmed ...]" if cut else "")


def failing_lines(source: str, error_text: str, context: int = 2, max_locations: int = 6) -> str:
    """Numbered source excerpts around the candidate lines an error text points at ("" if none).

    Compiler messages in the candidate first, then the candidate frames of header messages'
    instantiation chains; never a header's own line number (:mod:`mutators.llm.prompt.diagnostics`).
    """
    lines = kernel_lines(error_text, source, max_locations=max_locations)
    return numbered_excerpt(source, lines, context) if lines else ""


def error_lines(source: str, error_text: str, context: int = 2) -> frozenset[int]:
    """Every candidate line an error text points at, with ``context`` lines either side
    (what a repair prompt must show, never elide)."""
    if not error_text:
        return frozenset()
    found = kernel_lines(error_text, source, max_locations=10_000)
    return frozenset(k for ln in found for k in range(ln - context, ln + context + 1))


def elided_text(shown: ElidedSource) -> str:
    """What the prompt says about the elided regions of the parent ("" when none)."""
    if not shown.regions:
        return ""
    ranges = ", ".join(f"{a}-{b}" for a, b in shown.regions)
    return (f"Lines {ranges} of this file are not shown ({shown.lines_elided} lines): code no child of this task "
            "compiles, the branches for the template's other ops and configurations, switched off by the task's "
            "fixed macros (`EVO_*` and the `// @evo:task-config` defines). Each `// [elided: ...]` line stands for "
            "one region. The code is still in the file: do not edit it, and copy SEARCH lines only from the lines "
            "shown, never across a marker line (SEARCH is matched against the whole file).")


_TUNABLE_LINE_RE = re.compile(r"^(?P<pre>\s*//\s*@tunable\s+(?P<name>[A-Za-z_]\w*)\s*=\s*)(?P<val>-?\w+)(?P<post>\s+in\s*\{.*)$")
_IFNDEF_RE = re.compile(r"^\s*#\s*ifndef\s+(?P<name>[A-Za-z_]\w*)\s*$")
_DEFINE_RE = re.compile(r"^(?P<pre>\s*#\s*define\s+(?P<name>[A-Za-z_]\w*)\s+)(?P<val>-?\w+)(?P<post>.*)$")


def effective_source(source: str, params: dict[str, str]) -> str:
    """``source`` as it ran with ``params``: each tunable's ``// @tunable`` default and its
    ``#ifndef`` / ``#define`` default replaced by the value passed as ``-D``.

    The model sees what actually ran, and a child runs with the defaults it declares (the
    mutator passes no other values), so a patch that edits a tunable's default takes effect.
    Line numbers are unchanged. Values not in the declared set are left as they are.
    """
    if not params:
        return source
    lines = source.splitlines(keepends=True)
    guarded = False
    for i, line in enumerate(lines):
        body, nl = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")):]
        m = _TUNABLE_LINE_RE.match(body)
        if m and m.group("name") in params:
            lines[i] = f"{m.group('pre')}{params[m.group('name')]}{m.group('post')}{nl}"
            continue
        g = _IFNDEF_RE.match(body)
        if g:
            guarded = g.group("name")
            continue
        d = _DEFINE_RE.match(body)
        if d and guarded == d.group("name") and d.group("name") in params:
            lines[i] = f"{d.group('pre')}{params[d.group('name')]}{d.group('post')}{nl}"
        guarded = False
    out = "".join(lines)
    try:
        declared = {t.name: t for t in parse_tunables(out)}
    except TunableError:
        return source
    if any(k in declared and v not in declared[k].choices for k, v in params.items()):
        return source
    return out


def fmt_fitness(f: float | None) -> str:
    return "incorrect" if f is None else f"{f:.3f}"


def fmt_profile(profile: dict[str, Any]) -> str:
    """Fallback when the provider gives no readable profile text: sorted key: value lines."""
    rows = []
    for k in sorted(profile):
        v = profile[k]
        if isinstance(v, float):
            v = f"{v:.4g}"
        rows.append(f"- {k}: {v}")
    return "\n".join(rows)


def tunables_text(view: str) -> str:
    try:
        ts = parse_tunables(view)
    except TunableError as e:
        return f"(the @tunable lines do not parse: {e})"
    if not ts:
        return ""
    rows = [f"- {t.name} = {t.default} (allowed: {', '.join(t.choices)})" for t in ts]
    return ("\n".join(rows) + "\nThese are the values this kernel ran with, written in as the defaults above. A child "
            "runs with the defaults it declares: to try another value, change the default in both the `// @tunable` "
            "line and its `#define`, and keep it within the allowed set.")


def timings_text(facts: ParentFacts | None) -> str:
    if facts is None or not facts.timings:
        return ""
    rows = ["| shape | this kernel (ms) | torch (ms) | speedup | % of speed of light |", "|---|---|---|---|---|"]
    for t in facts.timings:
        sp = t.torch_ms / t.ms if t.ms > 0 else float("nan")
        sol = "-" if t.pct_sol is None else f"{t.pct_sol:.1f}%"
        rows.append(f"| {t.shape} | {t.ms:.4f} | {t.torch_ms:.4f} | {sp:.3f}x | {sol} |")
    return "\n".join(rows)


_HEADER_COMMENT_RE = re.compile(r"\A(?:[ \t]*(?://[^\n]*)?\n)+")


def kernel_body(source: str) -> str:
    """A kernel without its leading comment header (the code starts at the first non-comment line)."""
    return _HEADER_COMMENT_RE.sub("", source, count=1).rstrip("\n")


def inspiration_text(i: int, source: str, fitness: float, parent_view: str) -> str:
    body = kernel_body(source)
    diff = "".join(difflib.unified_diff(parent_view.splitlines(keepends=True), source.splitlines(keepends=True),
                                        "current kernel", f"inspiration {i}", n=2))
    head = f"### Inspiration {i} (speedup {fmt_fitness(fitness)})"
    if diff and len(diff) < 0.7 * len(body):
        return f"{head}: its difference from the current kernel\n```diff\n{diff.rstrip()}\n```"
    return f"{head}: its source without the header comment\n```cuda\n{body}\n```"
