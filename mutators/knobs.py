"""The offline mutator: moves through the tunable space the seeds declare.

Honest about what it is: it never edits code. It perturbs ``@tunable`` values within their
declared sets (mostly to a neighbouring value, sometimes anywhere), crosses the tunables of
two parents built from the same source, and flips the ``{0, 1}`` switches seeds expose as
tunables (source transformations guarded by ``#if``). Children that violate a
``@constraint`` or were already proposed in this run are never returned. It needs no
network, which makes it the embedded default (configs/demo.toml).

**Sweeps.** A tunable *matters* for a source once a child that changed only that tunable
came back (``observe``) with a fitness more than ``sweep_threshold`` away from its parent's,
either way. From then on, with probability ``sweep_rate``, a child of a parent with that
source moves that one tunable to its next value not yet tried from the parent's settings
(nearest in the declared set first), so the whole set is walked in a few children instead of
waiting for random perturbations to land on the good value; a sweep step is an ordinary
``knobs`` child (its notes say ``sweep``).

**Settings.** :class:`KnobsSettings` is the record of the ``[mutator]`` section's knobs keys
(:mod:`evo.core.settings`); :meth:`KnobsMutator.from_settings` builds the mutator from it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from dataclasses import dataclass

from evo.core.records import Member, Operator, candidate_id, canonical_params
from evo.core.tunables import Tunable, parse_tunables, resolve_params, violated_constraints
from evo.core.settings import config_key
from mutators.base import MutationContext, Proposal

__all__ = ["KnobsMutator", "KnobsSettings"]

log = logging.getLogger(__name__)

#: Attempts per proposal before reporting that these parents are exhausted.
_ATTEMPTS = 48
#: Probability that a perturbed tunable moves to a neighbouring value rather than anywhere.
_NEIGHBOUR_P = 0.7


def _source_key(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class KnobsSettings:
    """The knobs mutator's keys of ``[mutator]`` (docs/config.md); the meaning of each is in
    :class:`KnobsMutator`'s docstring. Bounds are checked when the config is loaded and again
    by the mutator's constructor."""

    crossover_rate: float = config_key(0.3, ge=0.0, le=1.0)
    perturb_max: int = config_key(2, ge=1)
    sweep_rate: float = config_key(0.5, ge=0.0, le=1.0)
    sweep_threshold: float = config_key(0.03, gt=0.0)


class KnobsMutator:
    """Tunable perturbation and crossover (see module docstring).

    ``crossover_rate``: probability of crossing two parents when two compatible parents are
    given. ``perturb_max``: at most this many tunables change per child. ``sweep_rate``,
    ``sweep_threshold``: how often a sweep step is taken once a tunable matters, and the
    relative fitness change that makes it matter (module docstring, "Sweeps").
    """

    name = "knobs"
    #: ``None`` from ``propose`` means these parents have no untried neighbour left.
    exhaustive = True
    #: Tunable moves read fitness only: the engine profiles champions, not every survivor.
    reads_profiles = False
    #: A child reads its parents' source and parameters only (fitness only steers sweeps,
    #: through ``observe``): a seed may be a parent before its verdict is back.
    unjudged_parents = True

    def __init__(self, crossover_rate: float = KnobsSettings.crossover_rate,
                 perturb_max: int = KnobsSettings.perturb_max, *, sweep_rate: float = KnobsSettings.sweep_rate,
                 sweep_threshold: float = KnobsSettings.sweep_threshold) -> None:
        if not 0.0 <= crossover_rate <= 1.0:
            raise ValueError(f"crossover_rate={crossover_rate}: must be within [0, 1]")
        if perturb_max < 1:
            raise ValueError(f"perturb_max={perturb_max}: must be >= 1")
        if not 0.0 <= sweep_rate <= 1.0:
            raise ValueError(f"sweep_rate={sweep_rate}: must be within [0, 1]")
        if sweep_threshold <= 0.0:
            raise ValueError(f"sweep_threshold={sweep_threshold}: must be > 0")
        self.crossover_rate = crossover_rate
        self.perturb_max = perturb_max
        self.sweep_rate = sweep_rate
        self.sweep_threshold = sweep_threshold
        # child id -> (source key, the one tunable it changed, its parent's fitness)
        self._single: dict[str, tuple[str, str, float]] = {}
        self.matters: dict[str, set[str]] = {}  # source key -> tunables that moved fitness

    @classmethod
    def from_settings(cls, settings: KnobsSettings) -> "KnobsMutator":
        """The mutator ``settings`` configure (the ``[mutator]`` section's record)."""
        return cls(settings.crossover_rate, settings.perturb_max, sweep_rate=settings.sweep_rate,
                   sweep_threshold=settings.sweep_threshold)

    def observe(self, candidate_id: str, fitness: float | None) -> None:
        """Learn which tunables matter (module docstring, "Sweeps")."""
        got = self._single.pop(candidate_id, None)
        if got is None or fitness is None or not math.isfinite(fitness) or fitness <= 0:
            return
        key, name, parent_fitness = got
        if abs(math.log(fitness / parent_fitness)) > math.log1p(self.sweep_threshold):
            if name not in self.matters.setdefault(key, set()):
                log.debug("tunable %s matters (%.4g -> %.4g)", name, parent_fitness, fitness)
            self.matters[key].add(name)

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
        key = _source_key(source)
        if self.matters.get(key) and rng.random() < self.sweep_rate:
            step = self._sweep(source, base, tunables, self.matters[key], context)
            if step is not None:
                name, child = step
                return self._proposal(source, child, parents[0], [name], f"sweep {name}: {base[name]} -> {child[name]}")
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
            if op == Operator.KNOBS.value:
                return self._proposal(source, child, parents[0], changed, note)
            return Proposal(source=source, params=child, parents=ids, operator=op, notes=note)
        return None

    def _proposal(self, source: str, child: dict[str, str], parent: Member, changed: list[str],
                  note: str) -> Proposal:
        """A ``knobs`` child of ``parent``; one that changed a single tunable of a correct parent
        is remembered, so ``observe`` can tell whether that tunable matters."""
        if len(changed) == 1 and parent.correct and parent.fitness > 0:
            cid = candidate_id(source, canonical_params(child), parent.candidate.task)
            self._single[cid] = (_source_key(source), changed[0], float(parent.fitness))
        return Proposal(source=source, params=child, parents=(parent.candidate.id,),
                        operator=Operator.KNOBS.value, notes=note)

    def _sweep(self, source: str, base: dict[str, str], tunables: tuple[Tunable, ...], names: set[str],
               context: MutationContext) -> tuple[str, dict[str, str]] | None:
        """The next untried value of a tunable that matters (declaration order, nearest value
        in its set first), as ``(name, child)``; None when each such tunable has been walked."""
        for t in tunables:
            if t.name not in names:
                continue
            at = t.choices.index(base[t.name])
            for i in sorted(range(len(t.choices)), key=lambda i: (abs(i - at), i)):
                child = {**base, t.name: t.choices[i]}
                if i == at or violated_constraints(source, child):
                    continue
                if candidate_id(source, canonical_params(child), context.task) not in context.seen:
                    return t.name, child
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
