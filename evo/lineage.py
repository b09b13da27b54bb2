"""Lineage helpers over the store: the path from a seed to a candidate and the diff of each step.

The store answers the graph questions (:meth:`evo.store.Store.ancestry`,
:meth:`~evo.store.Store.children`); this module turns them into what people read in
``evo lineage ID [--diff]``: one :class:`LineageStep` per generation along the *first-parent*
chain (the parent a mutation patched; a crossover's second parent is listed in
``other_parents``), with the fitness each step reached and a unified diff of the source and the
tunables against its parent. Rendering (tables, colours) is the CLI's job; everything here is
plain data and strings.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evo.records import Candidate

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store

__all__ = ["LineageStep", "source_diff", "params_diff", "first_parent_chain"]


@dataclass(frozen=True)
class LineageStep:
    """One generation on the path to a candidate.

    ``parent`` is None for the root (a seed, or where the stored lineage stops);
    ``fitness``/``status`` come from the candidate's evaluation (None when not evaluated);
    ``diff`` is :func:`source_diff` against ``parent`` ("" for the root).
    """

    candidate: Candidate
    parent: Candidate | None
    other_parents: tuple[str, ...]
    fitness: float | None
    status: str | None
    diff: str


def params_diff(parent: Candidate, child: Candidate) -> list[str]:
    """Tunable changes as ``NAME: old -> new`` lines (``-`` for absent), sorted by name."""
    a, b = parent.params_dict, child.params_dict
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            out.append(f"{name}: {a.get(name, '-')} -> {b.get(name, '-')}")
    return out


def source_diff(parent: Candidate, child: Candidate, *, context: int = 3) -> str:
    """Unified diff from ``parent`` to ``child`` (files named by short ids), preceded by
    ``# param NAME: old -> new`` lines for changed tunables; "" when nothing differs."""
    head = [f"# param {line}" for line in params_diff(parent, child)]
    body = difflib.unified_diff(
        parent.source.splitlines(keepends=True),
        child.source.splitlines(keepends=True),
        fromfile=f"{parent.short_id}.cu",
        tofile=f"{child.short_id}.cu",
        n=context,
    )
    lines = [ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in body]
    text = "".join(lines)
    if not head:
        return text
    return "\n".join(head) + "\n" + text


def first_parent_chain(store: "Store", cid: str, *, run_id: str | None = None) -> list[LineageStep]:
    """The first-parent path from the root to ``cid``, root first, each step with its diff.

    Uses one recursive ancestry query; a first parent missing from the store ends the walk
    (that step becomes the root). Fitness/status are taken from ``run_id``'s evaluations, or
    each candidate's latest evaluation when ``run_id`` is None.
    """
    by_id = {c.id: c for c in store.ancestry(cid)}
    path: list[Candidate] = []
    seen: set[str] = set()
    cur: Candidate | None = by_id[cid]
    while cur is not None and cur.id not in seen:
        seen.add(cur.id)
        path.append(cur)
        cur = by_id.get(cur.parents[0]) if cur.parents else None
    path.reverse()
    steps = []
    for i, c in enumerate(path):
        parent = path[i - 1] if i else None
        ev = store.get_evaluation(c.id, run_id)
        steps.append(
            LineageStep(
                candidate=c,
                parent=parent,
                other_parents=tuple(c.parents[1:]) if parent else tuple(c.parents),
                fitness=ev.fitness if ev else None,
                status=ev.status.value if ev else None,
                diff=source_diff(parent, c) if parent else "",
            )
        )
    return steps
