"""The policy's records: a :class:`Rule` and the :class:`Violation` it reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from evaluators.policy.reader import ParsedSource

__all__ = ["Rule", "Violation"]


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
