"""Parent selection: which correct members of an island get to have children.

A selector is a pure function of its inputs plus an injected ``random.Random``; it holds no
state of its own, so an island restored from :class:`~populations.island.IslandState` (which
carries the RNG state) makes exactly the same choices as the original.

The default, :class:`SigmoidSelector`, is the "sigmoid over robust z-score, damped by the
number of children" rule from the architecture::

    weight_i = sigmoid(lam * (f_i - median(f)) / MAD(f)) / (1 + children_i)

Members well above the median approach weight 1, members well below approach 0, and a
member that already had many children gives way to its siblings, so search pressure goes to
good *and* under-explored kernels. ``MAD`` (median absolute deviation) makes the scale
robust to one outlier kernel that is 10x faster than the rest.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from evo.core.records import Member

__all__ = [
    "Selector",
    "SigmoidSelector",
    "UniformSelector",
    "TopSelector",
    "SELECTORS",
    "make_selector",
    "sigmoid",
    "sample_without_replacement",
]

log = logging.getLogger(__name__)


@runtime_checkable
class Selector(Protocol):
    """Chooses parents among an island's correct members.

    Contract:

    * Called by the island with ``members`` (its *correct* members, in a deterministic order:
      best fitness first, ties by candidate id), ``children`` (same length; how many children
      each member already had), ``k`` and an injected ``rng``.
    * Returns ``min(k, len(members))`` *distinct* members (by identity in ``members``), in the
      order they were drawn. ``k <= 0`` or no members -> ``[]``.
    * All randomness comes from ``rng``; the selector keeps no state between calls, so the
      same inputs and RNG state give the same answer (this is what makes island resume exact).
    * Must not mutate ``members``, ``children`` or anything inside them.
    * ``name`` is the registry name; ``options`` the keyword arguments that rebuild it via
      :func:`make_selector` (stored in island state for resume).
    """

    name: str

    @property
    def options(self) -> dict[str, Any]: ...

    def select(
        self, members: Sequence[Member], children: Sequence[int], k: int, rng: random.Random
    ) -> list[Member]: ...


def sigmoid(z: float) -> float:
    """Numerically stable logistic function (no overflow for large ``|z|``)."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _check_inputs(members: Sequence[Member], children: Sequence[int]) -> None:
    if len(members) != len(children):
        raise ValueError(
            f"selector got {len(members)} members but {len(children)} child counts; "
            "pass one child count per member, in the same order"
        )
    for m in members:
        if not m.correct:
            raise ValueError(
                f"selector got incorrect member {m.candidate.short_id} (fitness={m.fitness!r}); "
                "islands pass only correct members, incorrect ones go to repair (fix mode)"
            )


def sample_without_replacement(
    items: Sequence[Member], weights: Sequence[float], k: int, rng: random.Random
) -> list[Member]:
    """Draw ``min(k, len(items))`` distinct items, each draw proportional to its weight.

    Sequential draws: one ``rng.random()`` per draw, a linear walk over the cumulative weights
    of the items not yet drawn. If every remaining weight is zero (all underflowed), the draw
    falls back to uniform over the remaining items (``rng.randrange``), so a selector never
    returns fewer than ``min(k, n)`` parents.
    """
    if len(items) != len(weights):
        raise ValueError(f"{len(items)} items but {len(weights)} weights")
    for w in weights:
        if not (w >= 0.0 and math.isfinite(w)):
            raise ValueError(f"weights must be finite and >= 0, got {w!r}")
    remaining = list(range(len(items)))
    out: list[Member] = []
    for _ in range(max(0, min(k, len(items)))):
        total = math.fsum(weights[i] for i in remaining)
        if total <= 0.0:
            pos = rng.randrange(len(remaining))
        else:
            r = rng.random() * total
            acc = 0.0
            pos = -1
            for j, i in enumerate(remaining):
                w = weights[i]
                if w <= 0.0:
                    continue
                acc += w
                pos = j
                if r < acc:
                    break
            # pos ends on the last positive-weight item if rounding left r >= acc
        out.append(items[remaining.pop(pos)])
    return out


class SigmoidSelector:
    """Default selector: ``sigmoid(lam * (f - median) / MAD) / (1 + children)``.

    ``lam`` (config ``search.selection_lambda``) sets the selection pressure: 0 would be
    uniform (not allowed: use ``uniform``), larger values approach "always the best".

    Scale: ``MAD = median(|f_i - median(f)|)``. When more than half the members share the
    median fitness MAD is 0; the scale then falls back to the *mean* absolute deviation
    (still > 0 when any fitness differs, so better kernels still get more weight), and when
    that is 0 too (all fitnesses equal) every z-score is 0, i.e. all members weigh
    ``0.5 / (1 + children)``. This avoids the 1e-9-scale alternative, which would turn the
    sigmoid into a hard step and starve every member below the median.
    """

    name = "sigmoid"

    def __init__(self, lam: float = 1.0) -> None:
        lam = float(lam)
        if not (lam > 0.0 and math.isfinite(lam)):
            raise ValueError(
                f"SigmoidSelector lam = {lam!r}: must be a finite number > 0 "
                "(config search.selection_lambda); use selector 'uniform' for no pressure"
            )
        self.lam = lam

    @property
    def options(self) -> dict[str, Any]:
        return {"lam": self.lam}

    def __repr__(self) -> str:
        return f"SigmoidSelector(lam={self.lam})"

    def weights(self, fitnesses: Sequence[float], children: Sequence[int]) -> list[float]:
        """The unnormalised selection weight of each member (exposed for tests and reports)."""
        if len(fitnesses) != len(children):
            raise ValueError(f"{len(fitnesses)} fitnesses but {len(children)} child counts")
        if not fitnesses:
            return []
        for c in children:
            if c < 0:
                raise ValueError(f"child counts must be >= 0, got {c}")
        med = statistics.median(fitnesses)
        dev = [abs(f - med) for f in fitnesses]
        scale = statistics.median(dev)
        if scale <= 0.0:
            scale = math.fsum(dev) / len(dev)
        if scale <= 0.0:
            return [0.5 / (1 + c) for c in children]
        return [sigmoid(self.lam * (f - med) / scale) / (1 + c) for f, c in zip(fitnesses, children)]

    def select(
        self, members: Sequence[Member], children: Sequence[int], k: int, rng: random.Random
    ) -> list[Member]:
        _check_inputs(members, children)
        w = self.weights([float(m.fitness) for m in members], list(children))  # type: ignore[arg-type]
        return sample_without_replacement(members, w, k, rng)


class UniformSelector:
    """Every correct member equally likely (ignores fitness and children). For ablations."""

    name = "uniform"

    @property
    def options(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return "UniformSelector()"

    def select(
        self, members: Sequence[Member], children: Sequence[int], k: int, rng: random.Random
    ) -> list[Member]:
        _check_inputs(members, children)
        n = max(0, min(k, len(members)))
        return rng.sample(list(members), n)


class TopSelector:
    """Greedy: the ``k`` fittest members (ties by candidate id). Uses no randomness.

    Deterministic and exploitative; meant for tests and ablations, not for real runs (it
    keeps mutating the same parent).
    """

    name = "top"

    @property
    def options(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return "TopSelector()"

    def select(
        self, members: Sequence[Member], children: Sequence[int], k: int, rng: random.Random
    ) -> list[Member]:
        _check_inputs(members, children)
        ranked = sorted(members, key=lambda m: (-float(m.fitness), m.id))  # type: ignore[arg-type]
        return ranked[: max(0, k)]


SELECTORS: dict[str, Callable[..., Selector]] = {
    SigmoidSelector.name: SigmoidSelector,
    UniformSelector.name: UniformSelector,
    TopSelector.name: TopSelector,
}


def make_selector(name: str, **options: Any) -> Selector:
    """Build a selector by registry name, e.g. ``make_selector("sigmoid", lam=1.5)``.

    Raises ``ValueError`` naming the valid selectors for an unknown name, and ``TypeError``
    naming the selector for options it does not take.
    """
    try:
        factory = SELECTORS[name]
    except KeyError:
        raise ValueError(
            f"unknown selector {name!r}; valid selectors: {', '.join(sorted(SELECTORS))}"
        ) from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise TypeError(
            f"selector {name!r} does not accept options {sorted(options)}: {exc}"
        ) from None
