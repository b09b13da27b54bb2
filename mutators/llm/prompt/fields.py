"""The fields of one LLM prompt (:func:`prompt_fields`): what the templates in
``mutators/llm/prompt/prompts/`` are rendered with, from the task, the parent and its earlier attempts,
and the ordered ways to shorten a prompt that is over the model's budget.
"""

from __future__ import annotations

from typing import Any, Callable

from evo.core.records import Member
from mutators.base import MutationContext
from mutators.llm.prompt.diagnostics import digest
from mutators.llm.prompt.elide import ElidedSource, elide_unreachable
from mutators.llm.prompt.context import PromptContextProvider
from mutators.llm.prompt.text import (effective_source, elided_text, error_lines, failing_lines, fmt_fitness,
                                      fmt_profile, inspiration_text, timings_text, tunables_text)

__all__ = ["prompt_fields", "Step"]

#: One way to shorten a prompt: its label and a function that shortens the fields in place.
Step = tuple[str, Callable[[dict[str, Any]], bool]]


def prompt_fields(kind: str, parent: Member | None, context: MutationContext, *, provider: PromptContextProvider,
                  n_inspirations: int, attempts_text: Callable[[int], str], feedback: str | None,
                  failure: Callable[[Member], tuple[str, str, str]]) -> tuple[dict[str, Any], list[Step]]:
    """The template fields of one prompt and the steps that shorten it, least useful first.

    ``attempts_text(k)``: the last ``k`` earlier attempts from this parent as text;
    ``feedback``: why the last answer was not used (or None); ``failure(member)``: the
    ``(stage, status, error_text)`` a broken kernel fails with. Each step is ``(label,
    fn)``; ``fn(fields)`` shortens ``fields`` in place and returns whether it changed them
    (the label then goes into the prompt's "Left out" section).
    """
    info = provider.task_info(context.task)
    f: dict[str, Any] = {
        "task": context.task,
        "dtype": info.dtype,
        "shapes_text": info.shapes_text,
        "tolerance_text": info.tolerance_text,
        "reference_src": info.reference_src.rstrip(),
        "description": info.description or None,
        "tensors_text": info.tensors_text or None,
        "sol_text": info.sol_text or None,
        "card": info.card.strip() or None,
    }

    def drop(name: str) -> Callable[[dict[str, Any]], bool]:
        def fn(d: dict[str, Any]) -> bool:
            had = d.get(name) is not None
            d[name] = None
            return had
        return fn

    if kind == "genesis":
        f["abi_text"] = info.abi_text.rstrip()
        f["example"] = info.example_kernel.rstrip() or None
        f["feedback"] = feedback
        return f, [("the example kernel", drop("example")), ("the CuTe reference card", drop("card"))]
    assert parent is not None
    view = effective_source(parent.candidate.source, parent.candidate.params_dict)
    facts_fn = getattr(provider, "parent_facts", None)
    facts = facts_fn(parent.id) if callable(facts_fn) else None
    err = failure(parent)[2] if kind == "repair" else ""
    shown = elide_unreachable(view, abi_header=info.abi_text, keep_lines=error_lines(view, err))
    if shown.chars_saved <= len(elided_text(shown)):
        shown = ElidedSource(view)  # the note would cost more than the elision saves
    f["parent_source"] = shown.text.rstrip("\n")
    f["elided"] = elided_text(shown) or None
    f["tunables"] = tunables_text(view) or None
    f["attempts"] = attempts_text(5) or None
    f["feedback"] = feedback

    def attempts_last(k: int) -> Callable[[dict[str, Any]], bool]:
        def fn(d: dict[str, Any]) -> bool:
            short = attempts_text(k) or None
            changed = short != d.get("attempts")
            d["attempts"] = short
            return changed
        return fn

    if kind == "repair":
        stage, status, err = failure(parent)
        f["stage"], f["status"] = stage or "unknown", status or "failed"
        f["error_text"] = digest(err, view) or "(no error text was recorded)"
        f["failing_lines"] = failing_lines(view, err) or None

        def shorter_error(limit: int) -> Callable[[dict[str, Any]], bool]:
            def fn(d: dict[str, Any]) -> bool:
                short = digest(err, view, max_chars=limit)
                changed = len(short) < len(d["error_text"])
                d["error_text"] = short
                return changed
            return fn

        steps = [("older repair attempts", attempts_last(2)), ("the error text beyond 1500 characters",
                                                               shorter_error(1500)),
                 ("the tunables list", drop("tunables")), ("the earlier repair attempts", drop("attempts")),
                 ("the error text beyond 600 characters", shorter_error(600)),
                 ("the CuTe reference card", drop("card")), ("the task description", drop("description"))]
        return f, steps
    history = provider.history(parent.id)
    f["parent_fitness"] = fmt_fitness(parent.fitness)
    f["history_text"] = "\n".join(f"- generation {g}: {fmt_fitness(x)}" for g, x in history) or \
        f"- generation {parent.candidate.generation}: {fmt_fitness(parent.fitness)}"
    f["timings"] = timings_text(facts) or None
    f["ptxas"] = (facts.ptxas if facts is not None else "") or None
    prof_text = facts.profile_text if facts is not None and facts.profile_text else None
    if prof_text is None:
        prof = provider.profile(parent.id)
        prof_text = fmt_profile(prof) if prof else None
    f["profile"] = prof_text
    insp = provider.inspirations(context.task, context.island, n_inspirations) if n_inspirations else []
    parts = [inspiration_text(i, effective_source(it[0], dict(it[2])) if len(it) > 2 else it[0], it[1], view)
             for i, it in enumerate(insp[: n_inspirations], 1)]
    f["inspirations"] = "\n\n".join(parts) or None

    def fewer_inspirations(d: dict[str, Any]) -> bool:
        if not parts:
            return False
        parts.pop()
        d["inspirations"] = "\n\n".join(parts) or None
        return True

    steps = [("one kernel of another island", fewer_inspirations) for _ in parts]
    hist_short = "\n".join(f"- generation {g}: {fmt_fitness(x)}" for g, x in history[-3:])

    def shorter_history(d: dict[str, Any]) -> bool:
        if len(history) <= 3:
            return False
        d["history_text"] = hist_short + f"\n- ({len(history) - 3} earlier generations not shown)"
        return True

    steps += [("the profile", drop("profile")), ("older attempts", attempts_last(2)),
              ("the lineage's earlier fitness history", shorter_history), ("the ptxas resource usage", drop("ptxas")),
              ("the measured times", drop("timings")), ("the earlier attempts", drop("attempts")),
              ("the tunables list", drop("tunables")), ("the CuTe reference card", drop("card")),
              ("the task description", drop("description"))]
    return f, steps
