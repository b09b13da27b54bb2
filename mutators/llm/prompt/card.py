"""The CuTe reference card every prompt carries (in its system message).

The card (``prompts/cute_card.md``) holds what a model cannot know from the task alone: the
CUTLASS version of the installed headers, the kernel ABI, the CuTe idioms the seed kernels
use, the include allowlist and the policy rules one line each. The parts that can drift are
generated from their sources when the card is rendered, never written by hand:
:class:`CardFacts` carries them (the engine reads them from the toolchain, the ABI header and
the policy's own tables: :func:`evo.engine.llm_context.card_facts`), and :func:`render_card`
puts them into the card. The idioms are the card's own text (a test checks that every CuTe
name it uses exists in the installed headers).

:func:`example_kernel` turns a seed into the small example a genesis prompt shows: its
unreachable branches elided (:mod:`mutators.llm.prompt.elide`), its header comment dropped.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache

from mutators.llm.prompt.elide import MARKER_RE, elide_unreachable
from mutators.llm.prompt.ppscan import code_view
from mutators.llm.prompt.templates import PROMPTS_DIR, PromptError
from mutators.llm.prompt.text import kernel_body

__all__ = ["CardFacts", "render_card", "readable_include", "abi_summary", "example_kernel", "CARD_FILE"]

CARD_FILE = PROMPTS_DIR / "cute_card.md"


@dataclass(frozen=True)
class CardFacts:
    """What the card says that comes from elsewhere: ``cutlass_version`` of the headers a
    build uses; ``include_patterns``: the policy's allowlist (full-match regexes);
    ``rules``: ``(name, reason)`` of each policy rule, in the policy's order;
    ``abi_header``: the text of ``evo_abi.h``."""

    cutlass_version: str
    include_patterns: tuple[str, ...]
    rules: tuple[tuple[str, str], ...]
    abi_header: str

    def to_json(self) -> dict:
        return {"cutlass_version": self.cutlass_version, "include_patterns": list(self.include_patterns),
                "rules": [list(r) for r in self.rules], "abi_header": self.abi_header}

    @classmethod
    def from_json(cls, d: dict) -> "CardFacts":
        return cls(str(d["cutlass_version"]), tuple(d["include_patterns"]), tuple((str(a), str(b)) for a, b in d["rules"]),
                   str(d["abi_header"]))


_CLASSES = ((r"[\w./-]+", "*"), (r"[\w]*", "*"), (r"\w*", "*"), (r"\w+", "*"), (r"\.", "."), (r"\/", "/"))


def readable_include(pattern: str) -> list[str]:
    """An allowlist regex as the header names a person writes: ``cute/[\\w./-]+`` ->
    ``cute/*``, ``cstdint|cstddef`` -> ``cstdint``, ``cstddef`` (``*``: any name there).
    Raises :class:`PromptError` for a regex it cannot spell (the card would lie)."""
    out = []
    for alt in pattern.split("|"):
        text = alt
        for regex, plain in _CLASSES:
            text = text.replace(regex, plain)
        if re.search(r"[\\\[\]()+?{}^$]", text):
            raise PromptError(f"include allowlist pattern {pattern!r}: cannot spell {alt!r} for the card")
        out.append(text)
    return out


def abi_summary(header: str) -> str:
    """The declarations of ``evo_abi.h`` a kernel uses, one a line, comments dropped: the
    exported entry points, the tensor record, the dtype codes and the helpers' signatures."""
    code = code_view(header)
    if code is None:
        return header.strip()
    flat = " ".join(" ".join(ln for ln in code.split("\n") if not ln.lstrip().startswith("#")).split())
    lines = []
    for m in re.finditer(r"EVO_EXPORT\s+[^;{]*?\([^;{]*\)\s*;", flat):
        lines.append(f"- {m.group(0)}")
    for m in re.finditer(r"(struct|enum)\s+(\w+)\s*(?::\s*\w+\s*)?\{([^}]*)\}", flat):
        members = [x.strip() for x in re.split(r"[;,]", m.group(3)) if x.strip()]
        lines.append(f"- {m.group(1)} {m.group(2)} {{ {(', ' if m.group(1) == 'enum' else '; ').join(members)} }}")
    consts = re.findall(r"^\s*#\s*define\s+(\w+)\s+(\d+)\s*$", header, re.MULTILINE)
    if consts:
        lines.append("- " + ", ".join(f"{k} = {v}" for k, v in consts))
    for m in re.finditer(r"static\s+inline\s+([^;{]*?\))\s*\{", flat):
        lines.append(f"- helper: {m.group(1)}")
    return "\n".join(lines)


def render_card(facts: CardFacts) -> str:
    """The card's text for ``facts`` (see the module docstring)."""
    return _render(facts)


@lru_cache(maxsize=8)
def _render(facts: CardFacts) -> str:
    if not CARD_FILE.is_file():
        raise PromptError(f"{CARD_FILE} is missing; the package data of mutators/llm/prompt/prompts is incomplete")
    includes = []
    for p in facts.include_patterns:
        includes += readable_include(p)
    rules = "\n".join(f"- {name}: {reason}" for name, reason in facts.rules)
    return string.Template(CARD_FILE.read_text(encoding="utf-8")).substitute(
        cutlass_version=facts.cutlass_version, abi=abi_summary(facts.abi_header),
        includes=", ".join(f"`{i}`" for i in includes), rules=rules).strip()


def example_kernel(source: str, abi_header: str = "") -> str:
    """A seed as a genesis prompt's example: its unreachable branches and its header comment
    left out (no marker lines: nothing is patched against an example)."""
    shown = elide_unreachable(source, abi_header=abi_header).text
    return kernel_body(re.sub(MARKER_RE.pattern + r"\n?", "", shown, flags=re.MULTILINE))
