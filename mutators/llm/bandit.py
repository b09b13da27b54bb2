"""Which model to ask next: UCB1 over the configured models on fitness gained per dollar."""

from __future__ import annotations

import math
import random
import threading
from typing import Sequence

from mutators.llm.client.model_spec import LLMConfigError, ModelSpec

__all__ = ["ModelBandit"]


class ModelBandit:
    """UCB1 over models; value = fitness gained per dollar, with a floor on the dollars.

    A pull is counted when :meth:`choose` picks the arm (so results still in flight spread
    proposals instead of piling onto one arm); :meth:`update` adds a finished pull's gain
    (``max(0, reward)``) and cost. An arm's rate is ``sum(gain) / sum(max(cost, floor))``
    with ``floor = max(cost_floor_usd, floor_fraction * mean cost of the priced pulls so
    far)``: a free (or nearly free) model is charged as if each call cost a fraction of a
    typical paid call, so it wins only when it gains at least that fraction as much per
    call. (A fixed $0.0001 floor let a free model take 213 of 300 pulls for 0.32 total
    gain against 7.4 for the paid one.) Rates are normalised by the best arm's rate, so
    values stay in [0, 1] whatever the currency.

    Each arm starts with ``prior_n`` pseudo-pulls of value ``0.5 * weight / max(weight)``.
    Score = mean + ``c * sqrt(2 ln(N + 1) * w / n)`` with ``w = weight / max(weight)``: the
    weights also scale exploration, so while no reward has come back proposals are spread
    in proportion to the weights. Ties are broken by ``rng``. Models of weight 0 are never
    chosen.
    """

    def __init__(
        self, models: Sequence[ModelSpec], *, c: float = 1.0, prior_n: float = 1.0, cost_floor_usd: float = 1e-4,
        floor_fraction: float = 0.25,
    ) -> None:
        active = [m for m in models if m.weight > 0]
        if not active:
            raise LLMConfigError(
                "no model with weight > 0; give at least one [[llm.models]] entry a positive weight"
            )
        names = [m.name for m in active]
        if len(set(names)) != len(names):
            raise LLMConfigError(f"model names must be unique, got {names}")
        if not 0 <= floor_fraction <= 1:
            raise ValueError(f"floor_fraction={floor_fraction}: must be within [0, 1]")
        self.models = tuple(active)
        self.c = c
        self.prior_n = prior_n
        self.cost_floor_usd = cost_floor_usd
        self.floor_fraction = floor_fraction
        wmax = max(m.weight for m in active)
        self._prior = {m.name: 0.5 * m.weight / wmax for m in active}
        self._share = {m.name: m.weight / wmax for m in active}
        self._pulls = {m.name: 0 for m in active}
        self._gain = {m.name: 0.0 for m in active}
        self._costs: dict[str, list[float]] = {m.name: [] for m in active}
        self._lock = threading.Lock()

    def _arm(self, model: ModelSpec | str) -> str:
        name = model if isinstance(model, str) else model.name
        if name not in self._pulls:
            raise KeyError(f"unknown model {name!r}; bandit arms: {', '.join(self._pulls)}")
        return name

    def floor(self) -> float:
        """The per-pull cost floor now (see class docstring)."""
        priced = [c for cs in self._costs.values() for c in cs if c > 0]
        typical = sum(priced) / len(priced) if priced else 0.0
        return max(self.cost_floor_usd, self.floor_fraction * typical)

    def rates(self) -> dict[str, float]:
        """Gain per (floored) dollar of each arm's finished pulls (0 before any)."""
        fl = self.floor()
        return {n: (self._gain[n] / sum(max(c, fl) for c in cs)) if cs and fl > 0 else 0.0
                for n, cs in self._costs.items()}

    def scores(self) -> dict[str, float]:
        rates = self.rates()
        best = max(rates.values(), default=0.0)
        total = sum(self._pulls.values())
        out = {}
        for m in self.models:
            n = self.prior_n + self._pulls[m.name]
            norm = rates[m.name] / best if best > 0 else 0.0
            done = len(self._costs[m.name])
            # pulls still in flight count as 0 until they report (as the prior pseudo-pulls do)
            mean = (self.prior_n * self._prior[m.name] + done * norm) / n
            share = self._share[m.name]
            out[m.name] = mean + self.c * math.sqrt(2.0 * math.log(total + 1.0) * share / n)
        return out

    def choose(self, rng: random.Random, among: Sequence[str] | None = None) -> ModelSpec:
        """Pick an arm (of ``among``, default all) and count the pull."""
        with self._lock:
            s = self.scores()
            arms = [m for m in self.models if among is None or m.name in among]
            if not arms:
                raise LLMConfigError(f"no bandit arm among {list(among or [])}; arms: {', '.join(self._pulls)}")
            best = max(s[m.name] for m in arms)
            ties = [m for m in arms if s[m.name] >= best - 1e-12]
            pick = ties[0] if len(ties) == 1 else rng.choice(ties)
            self._pulls[pick.name] += 1
            return pick

    def update(self, model: ModelSpec | str, reward: float, cost: float) -> None:
        name = self._arm(model)
        with self._lock:
            self._gain[name] += max(0.0, float(reward)) if math.isfinite(reward) else 0.0
            self._costs[name].append(max(0.0, float(cost)))

    def stats(self) -> dict[str, dict[str, float]]:
        with self._lock:
            s, r = self.scores(), self.rates()
            return {
                m.name: {"pulls": self._pulls[m.name], "finished": len(self._costs[m.name]),
                         "gain": self._gain[m.name], "cost": sum(self._costs[m.name]), "rate": r[m.name],
                         "score": s[m.name]}
                for m in self.models
            }

