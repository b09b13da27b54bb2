"""The offline mutator: moves through the tunable space the seeds declare.

Honest about what it is: it never edits code. It perturbs ``@tunable`` values within their
declared sets (mostly to a neighbouring value, sometimes anywhere), crosses the tunables of
two parents built from the same source, and flips the ``{0, 1}`` switches seeds expose as
tunables (source transformations guarded by ``#if``). Children that violate a
``@constraint`` or were already proposed in this run are never returned. It needs no
network, which makes it the embedded default (configs/demo.toml).
"""

from __future__ import annotations

import logging
import random

from evo.records import Member, Operator, candidate_id, canonical_params
from evo.tunables import Tunable, parse_tunables, resolve_params, violated_constraints
from mutators.base import MutationContext, Proposal

__all__ = ["KnobsMutator"]

log = logging.getLogger(__name__)

#: Attempts per proposal before reporting that these parents are exhausted.
_ATTEMPTS = 48
#: Probability that a perturbed tunable moves to a neighbouring value rather than anywhere.
_NEIGHBOUR_P = 0.7


class KnobsMutator:
    """Tunable perturbation and crossover (see module docstring).

    ``crossover_rate``: probability of crossing two parents when two compatible parents are
    given. ``perturb_max``: at most this many tunables change per child.
    """

    name = "knobs"
    #: ``None`` from ``propose`` means these parents have no untried neighbour left.
    exhaustive = True

    def __init__(self, crossover_rate: float = 0.3, perturb_max: int = 2) -> None:
        if not 0.0 <= crossover_rate <= 1.0:
            raise ValueError(f"crossover_rate={crossover_rate}: must be within [0, 1]")
        if perturb_max < 1:
            raise ValueError(f"perturb_max={perturb_max}: must be >= 1")
        self.crossover_rate = crossover_rate
        self.perturb_max = perturb_max

    def wants_parents(self) -> int:
        """How many parents the engine should select (2 lets crossover happen)."""
        return 2 if self.crossover_rate > 0 else 1

    def propose(
        self, parents: list[Member], context: MutationContext, rng: random.Random
    ) -> Proposal | None:
        if not parents:
            return None
        first = parents[0].candidate
        source = first.source
        tunables = parse_tunables(source)
        if not tunables:
            log.debug("parent %s declares no tunables; nothing to mutate", first.short_id)
            return None
        base = resolve_params(source, first.params_dict)
        mates = [p for p in parents[1:] if p.candidate.source == source]
        for _ in range(_ATTEMPTS):
            if mates and rng.random() < self.crossover_rate:
                mate = resolve_params(source, mates[0].candidate.params_dict)
                child = {t.name: (base[t.name] if rng.random() < 0.5 else mate[t.name]) for t in tunables}
                op, ids = Operator.CROSSOVER.value, (first.id, mates[0].candidate.id)
                note = "crossover of tunables"
            else:
                child, changed = self._perturb(base, tunables, rng)
                op, ids = Operator.KNOBS.value, (first.id,)
                note = "perturbed " + ", ".join(f"{k}: {base[k]} -> {child[k]}" for k in changed)
            if child == base:
                continue
            if violated_constraints(source, child):
                continue
            if candidate_id(source, canonical_params(child), context.task) in context.seen:
                continue
            return Proposal(source=source, params=child, parents=ids, operator=op, notes=note)
        return None

    def _perturb(
        self, base: dict[str, str], tunables: tuple[Tunable, ...], rng: random.Random
    ) -> tuple[dict[str, str], list[str]]:
        movable = [t for t in tunables if len(t.choices) > 1]
        if not movable:
            return dict(base), []
        n = rng.randint(1, min(self.perturb_max, len(movable)))
        child = dict(base)
        changed = []
        for t in rng.sample(movable, n):
            choices = list(t.choices)
            cur = choices.index(child[t.name]) if child[t.name] in choices else 0
            if rng.random() < _NEIGHBOUR_P:
                steps = [i for i in (cur - 1, cur + 1) if 0 <= i < len(choices)]
                new = choices[rng.choice(steps)]
            else:
                new = rng.choice([c for i, c in enumerate(choices) if i != cur])
            child[t.name] = new
            changed.append(t.name)
        return child, changed
