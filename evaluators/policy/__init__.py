"""Static policy check: the first cascade stage (milliseconds, before anything is compiled).

The policy is **lint**, not the security boundary: it gives the model fast, named feedback
("policy rule no-env violated at line 13: environment access `getenv`") for the exploits
that earlier kernel-search systems fell for (shared/EVALUATION.md): library fallbacks, side
streams the timer does not wait for, results cached in state that survives between calls,
host code that runs processes, touches files, the network, the environment, the clock or the
Python interpreter it runs in. What a candidate's process can actually do is bounded by the
sandbox (docs/SECURITY.md); the policy must only never be *trivially* fooled, which is why it
reads the characters the way the compiler does (:mod:`~evaluators.policy.lexer`).

Contract:
  ``check_policy(source, params=None) -> StageResult`` with stage ``"policy"`` and status
  ``ok`` or ``rejected``. On rejection ``reason`` names the first violated rule and its line;
  ``metrics["violations"]`` lists every violation as ``{"rule", "line", "message"}`` and
  ``artifacts["violations"]`` renders them with the offending source lines (for repair
  prompts). ``POLICY_RULES`` is the tuple of :class:`Rule` objects applied, in order.

Layout: :mod:`~evaluators.policy.lexer` and :mod:`~evaluators.policy.reader` are the C++
reader (normalisation, comments/literals/directives, brace scopes, macros, ``#ifdef
__CUDA_ARCH__`` regions); :mod:`~evaluators.policy.names`, :mod:`~evaluators.policy.structure`
and :mod:`~evaluators.policy.rules` are the rules. The reader is a heuristic, not a C++
parser: its known blind spots are documented in docs/evaluator.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping

from evo.core.records import Candidate, Status, StageResult

from evaluators.policy.base import Rule, Violation
from evaluators.policy.reader import ParsedSource, parse_source
from evaluators.policy.rules import (
    ALLOWED_INCLUDE_PATTERNS,
    MAX_SOURCE_BYTES,
    MAX_SOURCE_LINES,
    POLICY_RULES,
    include_allowed,
    param_violations,
)

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
    """The policy check as an object with ``name`` and ``run(candidate)`` (stateless, picklable)."""

    name: str = "policy"

    def run(self, candidate: Candidate) -> StageResult:
        return check_candidate(candidate)
