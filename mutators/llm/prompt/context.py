"""What a prompt may know about a task and a parent, and who provides it.

:class:`PromptContextProvider` is the read-only seam between the LLM mutator and the run's
records (:class:`evo.engine.llm_context.StoreContextProvider` implements it over the store;
:class:`SimpleContextProvider` over plain dicts). :class:`TaskInfo`, :class:`ParentFacts` and
:class:`ShapeTiming` are the facts it returns, already as text or numbers to render.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["TaskInfo", "ShapeTiming", "ParentFacts", "PromptContextProvider", "SimpleContextProvider"]


@dataclass(frozen=True)
class TaskInfo:
    """Task facts rendered into prompts, already as text.

    ``reference_src`` includes the module constants and helpers the reference uses;
    ``description`` is the task's own description (layouts, structure: "A stored [K, M]");
    ``tensors_text`` lists each input and output with its dims and dtype; ``sol_text``
    describes the speed-of-light bound; ``card`` is the CuTe reference card
    (:func:`mutators.llm.prompt.card.render_card`) and ``example_kernel`` the small example
    a genesis prompt shows (:func:`mutators.llm.prompt.card.example_kernel`). Optional texts
    are "" when unknown.
    """

    reference_src: str
    abi_text: str
    shapes_text: str
    dtype: str
    tolerance_text: str
    sol_text: str = ""
    description: str = ""
    tensors_text: str = ""
    card: str = ""
    example_kernel: str = ""


@dataclass(frozen=True)
class ShapeTiming:
    """One benchmark shape's measured median times (ms) of a kernel and of torch."""

    shape: str
    ms: float
    torch_ms: float
    pct_sol: float | None = None


@dataclass(frozen=True)
class ParentFacts:
    """What the evaluation measured about a parent: times per benchmark shape, ptxas
    resources (one line per kernel), and the readable profile once the profile rule allows
    it ("" before)."""

    timings: tuple[ShapeTiming, ...] = ()
    ptxas: str = ""
    profile_text: str = ""


class PromptContextProvider(Protocol):
    """Read-only access to what a prompt may show (the engine implements it over the store).

    - ``task_info(task)``: the task's reference, ABI text, shapes, dtype, tolerance, SOL...
    - ``history(candidate_id)``: ``[(generation, fitness)]`` along the lineage, oldest first
      (incorrect ancestors carry ``None``).
    - ``inspirations(task, island, n)``: up to ``n`` ``(source, fitness)`` or ``(source,
      fitness, params)`` of good members of *other* islands.
    - ``profile(candidate_id)``: profile metrics, or ``None`` while the profile rule (lineage
      depth >= ``profile.feedback_after``) does not allow them yet.
    - ``failure(candidate_id)``: ``(stage, status, error_text)`` of the failed stage, or None
      (for a compile failure the full log, so the candidate's frames of an instantiation
      chain are not cut off).

    Optional: ``parent_facts(candidate_id) -> ParentFacts | None`` (times, ptxas, the
    readable profile text, which then replaces the ``profile`` dict).
    """

    def task_info(self, task: str) -> TaskInfo: ...

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]: ...

    def inspirations(self, task: str, island: int, n: int) -> list[tuple]: ...

    def profile(self, candidate_id: str) -> dict[str, Any] | None: ...

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None: ...


class SimpleContextProvider:
    """An in-memory :class:`PromptContextProvider` over plain dicts (tests, demos, replays)."""

    def __init__(
        self,
        tasks: dict[str, TaskInfo],
        *,
        histories: dict[str, list[tuple[int, float | None]]] | None = None,
        inspirations: dict[tuple[str, int], list[tuple]] | None = None,
        profiles: dict[str, dict[str, Any]] | None = None,
        failures: dict[str, tuple[str, str, str]] | None = None,
        facts: dict[str, ParentFacts] | None = None,
    ) -> None:
        self.tasks = tasks
        self.histories = histories or {}
        self.inspiration_map = inspirations or {}
        self.profiles = profiles or {}
        self.failures = failures or {}
        self.facts = facts or {}

    def task_info(self, task: str) -> TaskInfo:
        if task not in self.tasks:
            raise KeyError(f"no TaskInfo for task {task!r}; known: {', '.join(sorted(self.tasks)) or 'none'}")
        return self.tasks[task]

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]:
        return list(self.histories.get(candidate_id, []))

    def inspirations(self, task: str, island: int, n: int) -> list[tuple]:
        return list(self.inspiration_map.get((task, island), []))[:n]

    def profile(self, candidate_id: str) -> dict[str, Any] | None:
        return self.profiles.get(candidate_id)

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None:
        return self.failures.get(candidate_id)

    def parent_facts(self, candidate_id: str) -> ParentFacts | None:
        return self.facts.get(candidate_id)
