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
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from evo.core.records import Candidate

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store

__all__ = [
    "LineageStep",
    "source_diff",
    "params_diff",
    "first_parent_chain",
    "lineage_tree",
    "profile_delta",
    "diff_stat",
    "candidate_details",
]


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


# --------------------------------------------------------------------------------------
# The full ancestry as a tree of edges (``evo lineage ID [--diff]``) and one candidate's
# details (``evo show ID``). Plain data: JSON-ready dicts; rendering is in evo.results.views.
# --------------------------------------------------------------------------------------


def diff_stat(diff: str) -> tuple[int, int]:
    """``(added, removed)`` source lines of a :func:`source_diff` text (headers excluded)."""
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def _flatten_numbers(d: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Finite numeric leaves of a nested mapping as ``{"a.b": value}`` (bools dropped)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten_numbers(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def profile_delta(parent: Mapping[str, Any] | None, child: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Numeric profile metrics present in both, that changed: ``{metric: {parent, child,
    delta}}`` (nested metrics flattened to dotted names). Empty when either is missing."""
    if not parent or not child:
        return {}
    a, b = _flatten_numbers(parent), _flatten_numbers(child)
    out = {}
    for k in sorted(set(a) & set(b)):
        if a[k] != b[k]:
            out[k] = {"parent": a[k], "child": b[k], "delta": b[k] - a[k]}
    return out


def _matched_profiles(store: "Store", parent_id: str, child_id: str) -> tuple[dict | None, dict | None, dict]:
    """The child's latest profile and the parent's profile on the same shape and GPU."""
    child_rows = store.profiles(child_id)
    if not child_rows:
        return None, None, {}
    parent_rows = {(r["shape"], r["gpu"]): r for r in store.profiles(parent_id)}
    for row in reversed(child_rows):
        match = parent_rows.get((row["shape"], row["gpu"]))
        if match is not None:
            return match["metrics"], row["metrics"], {"shape": row["shape"], "gpu": row["gpu"]}
    return None, child_rows[-1]["metrics"], {}


def _stages_view(ev: Any) -> list[dict[str, Any]]:
    if ev is None:
        return []
    return [{"stage": s.stage, "status": s.status.value, "reason": s.reason, "seconds": s.seconds}
            for s in ev.stages]


def lineage_tree(store: "Store", cid: str, *, run_id: str | None = None, context: int = 3) -> list[dict[str, Any]]:
    """Every stored ancestor of ``cid`` with the edges to its parents, ``cid`` first, then
    breadth-first (each candidate once), as JSON-ready dicts.

    Node keys: ``id``, ``task``, ``operator``, ``island``, ``generation``, ``params``,
    ``parents`` (ids, including ones missing from the store), ``notes``, ``fitness``,
    ``status`` (None when not evaluated), ``stages`` ([{stage, status, reason, seconds}]),
    ``profile`` (latest profile metrics or None) and ``edges``, one per parent::

        {"parent": id, "present": bool, "position": 0 | 1 ..., "operator": the child's operator,
         "diff": unified source diff with "# param" lines (source_diff), "params_diff": [...],
         "added": n, "removed": n, "fitness_delta": child - parent or None,
         "fitness_ratio": child / parent or None,
         "profile_delta": {metric: {parent, child, delta}}, "profile_on": {shape, gpu} or {}}

    Fitness and stages come from ``run_id``'s evaluations, or each candidate's latest
    evaluation when ``run_id`` is None. ``cid`` must be a full id (resolve prefixes with
    :meth:`Store.resolve_id`); an unknown one raises :class:`~evo.store.UnknownIdError`.
    """
    chain = store.ancestry(cid)
    by_id = {c.id: c for c in chain}
    evs = {c.id: store.get_evaluation(c.id, run_id) for c in chain}
    profiles = {c.id: store.get_profile(c.id) for c in chain}
    nodes: list[dict[str, Any]] = []
    for c in chain:
        ev = evs[c.id]
        fit = ev.fitness if ev else None
        edges = []
        for pos, pid in enumerate(c.parents):
            parent = by_id.get(pid)
            edge: dict[str, Any] = {"parent": pid, "present": parent is not None, "position": pos,
                                    "operator": c.operator}
            if parent is not None:
                diff = source_diff(parent, c, context=context)
                added, removed = diff_stat(diff)
                pev = evs.get(pid)
                pfit = pev.fitness if pev else None
                pprof, cprof, on = _matched_profiles(store, pid, c.id) if profiles[c.id] else (None, None, {})
                edge.update(
                    diff=diff,
                    params_diff=params_diff(parent, c),
                    added=added,
                    removed=removed,
                    fitness_delta=(fit - pfit) if fit is not None and pfit is not None else None,
                    fitness_ratio=(fit / pfit) if fit is not None and pfit else None,
                    profile_delta=profile_delta(pprof, cprof),
                    profile_on=on,
                )
            edges.append(edge)
        nodes.append({
            "id": c.id, "task": c.task, "operator": c.operator, "island": c.island,
            "generation": c.generation, "params": dict(c.params), "parents": list(c.parents),
            "notes": c.notes, "fitness": fit, "status": ev.status.value if ev else None,
            "stages": _stages_view(ev), "profile": profiles[c.id], "edges": edges,
        })
    return nodes


def _runs_of(store: "Store", cid: str) -> list[str]:
    """Ids of the runs that contain ``cid``, oldest link first.

    A read-only query on ``store.db`` (table ``run_candidates``, schema in docs/store.md):
    the store has no per-candidate method for it."""
    rows = store.db.execute(
        "SELECT run_id FROM run_candidates WHERE candidate_id = ? ORDER BY rowid", [cid]
    ).fetchall()
    return [r[0] for r in rows]


def candidate_details(store: "Store", cid: str, *, run_id: str | None = None) -> dict[str, Any]:
    """Everything ``evo show ID`` prints about one candidate, as a JSON-ready dict.

    Keys: the candidate's fields (``id``, ``task``, ``operator``, ``parents``, ``island``,
    ``generation``, ``params``, ``notes``, ``source``), ``runs`` (runs containing it),
    ``run_id`` (the run whose evaluation is shown: ``run_id`` if given, else the latest run
    that evaluated it), ``fitness``, ``reference`` (its basis: ``eager`` or ``compile``),
    ``fitness_eager``, ``fitness_compile`` and ``compile_mode`` (None where the timing did not
    record them, e.g. the compiled reference was not timed), ``status``, ``stages`` (with ``metrics`` and
    ``artifacts``), ``env`` and ``gpu`` of that evaluation, ``profiles`` (every stored
    profile), ``llm_calls`` (the calls whose answer became this candidate, linked by the
    engine as the child was made: every ``llm_calls`` column, the prompt as its messages'
    JSON; empty for a kernel no model wrote, or one stored before calls were linked), ``children`` (ids) and ``champion_of``
    ([{run_id, task, fitness, confirmation, gain, verdict}]: ``gain`` and ``verdict`` as
    :meth:`evo.store.StoreReader.champions` returns them, None without a measured gain).
    """
    c = store.get_candidate(cid)
    runs = _runs_of(store, cid)
    ev = None
    shown_run = run_id
    if run_id is not None:
        ev = store.get_evaluation(cid, run_id)
    else:
        for rid in reversed(runs):
            ev = store.get_evaluation(cid, rid)
            if ev is not None:
                shown_run = rid
                break
    champion_of: list[dict[str, Any]] = []
    calls = store.llm_calls_of(cid)
    for rid in runs:
        for ch in store.champions(rid):
            if ch["candidate_id"] == cid:
                champion_of.append({"run_id": rid, "task": ch["task"], "fitness": ch["fitness"],
                                    "confirmation": ch["confirmation"], "gain": ch["gain"],
                                    "verdict": ch["verdict"]})
    timing = ev.stage("timing") if ev else None
    tm = timing.metrics if timing is not None else {}
    return {
        "id": c.id, "task": c.task, "operator": c.operator, "parents": list(c.parents),
        "island": c.island, "generation": c.generation, "params": dict(c.params), "notes": c.notes,
        "source": c.source, "runs": runs, "run_id": shown_run,
        "fitness": ev.fitness if ev else None,
        **{k: tm.get(k) for k in ("reference", "fitness_eager", "fitness_compile", "compile_mode")},
        "status": ev.status.value if ev else "pending",
        "gpu": ev.gpu if ev else "",
        "env": dict(ev.env) if ev else {},
        "stages": [
            {"stage": s.stage, "status": s.status.value, "reason": s.reason, "seconds": s.seconds,
             "metrics": s.metrics, "artifacts": s.artifacts}
            for s in (ev.stages if ev else ())
        ],
        "profiles": store.profiles(cid),
        "llm_calls": calls,
        "children": [ch.id for ch in store.children(cid)],
        "champion_of": champion_of,
    }
