"""Why an LLM attempt made no child, as a short code: :data:`REASONS`.

Every failed :class:`mutators.llm.attempts.AttemptRecord` carries one ``reason`` (its
``problems`` keep the full text), so a run's failures can be counted by cause (``evo status``
does, per model). The codes are stable: they are stored in ``llm_attempt`` events.
:func:`reason_of` gives the code of a stored attempt, also of one recorded before attempts
carried a code (read from what it does carry).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["REASONS", "NOT_ANSWERED", "reason_of", "validation_reason"]

#: code -> what it means. The first three are attempts no answer came back for; the rest are
#: answers rejected before compiling.
REASONS: dict[str, str] = {
    "prompt_too_large": "not sent: the prompt fits no window we know of",
    "window_exceeded": "the endpoint refused the prompt as over its context window",
    "call_failed": "the call failed after its retries (no answer)",
    "answer_too_large": "the answer was over max_response_kb",
    "empty": "the answer was empty (often: output tokens spent on reasoning)",
    "prose": "no SEARCH/REPLACE blocks (or, for genesis, no kernel file) in the answer",
    "broken_blocks": "SEARCH/REPLACE markers were broken",
    "unmatched": "a SEARCH block matched nowhere, more than once, or quoted replaced lines",
    "elided": "code left out ('// ... unchanged ...'): it would have been deleted",
    "whole_file_rewrite": "a patch prompt answered with a rewritten file changing too much",
    "no_op": "the child equals its parent",
    "abi": "the child broke the kernel ABI (evo_launch or evo_abi.h)",
    "conflict_marker": "a SEARCH/REPLACE marker was left in the source",
    "tunable": "a // @tunable line was malformed",
    "duplicate": "the child was already proposed in this run",
    "invalid": "another check before compiling refused the child",
}
#: The codes of attempts that got no answer to judge.
NOT_ANSWERED = ("prompt_too_large", "window_exceeded", "call_failed")


def validation_reason(problems: tuple[str, ...] | list[str]) -> str:
    """The code of the first problem :func:`mutators.llm.answer.patch.validate_child` found."""
    first = problems[0] if problems else ""
    if first.startswith("whole-file rewrite"):
        return "whole_file_rewrite"
    if first.startswith("no-op"):
        return "no_op"
    if first.startswith("conflict marker"):
        return "conflict_marker"
    if "evo_launch" in first or "evo_abi.h" in first:
        return "abi"
    if first.startswith("empty source"):
        return "empty"
    return "invalid"


def reason_of(attempt: Mapping[str, Any]) -> str | None:
    """The code of a stored failed attempt (an ``llm_attempt`` event payload); None for one
    that made a child. Payloads without a ``reason`` (recorded before codes existed) are
    read from their call error and form, else ``invalid``."""
    if attempt.get("ok"):
        return None
    code = attempt.get("reason")
    if code:
        return str(code)
    problems = [str(p) for p in attempt.get("problems") or ()]
    if attempt.get("call_error"):
        return "window_exceeded" if "[too_large]" in str(attempt["call_error"]) else "call_failed"
    if any(p.startswith("prompt too large") for p in problems):
        return "prompt_too_large"
    form = str(attempt.get("form") or "")
    if form in ("prose", "empty"):
        return form
    if form == "broken":
        return "broken_blocks"
    if attempt.get("unmatched"):
        return "unmatched"
    if any(p.startswith("duplicate") for p in problems):
        return "duplicate"
    return validation_reason(problems) if problems else "invalid"
