"""Which model to ask next: UCB1 over the configured models on fitness gained per dollar
(:class:`ModelBandit`), and the chooser the LLM mutator asks (:class:`ModelChooser`: the
bandit's pick among the models :class:`mutators.llm.client.health.ModelHealth` allows, and the
reward ledger that credits each model with what its children gained).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import OrderedDict
from typing import Callable, Sequence

from mutators.llm.client.calls import LLMCall
from mutators.llm.client.health import ModelHealth
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec

__all__ = ["ModelBandit", "ModelChooser"]

log = logging.getLogger(__name__)


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


class ModelChooser:
    """Which model an attempt asks, and what each model earned. Thread-safe.

    :meth:`choose` is the :class:`ModelBandit`'s pick among the models :class:`ModelHealth`
    allows (stopped models and open circuit breakers are skipped). :meth:`called` reports
    every call to the health record; :meth:`failed` charges an attempt that made no child
    (reward 0, its cost); :meth:`expect` enters a child in the reward ledger (its model, the
    fitness it must beat, the call's cost) and :meth:`observe` pays it out once the child is
    evaluated: reward ``max(0, fitness - baseline)``, 0 for an incorrect child. The ledger
    keeps the last ``ledger_max`` children.
    """

    def __init__(self, models: Sequence[ModelSpec], *, bandit: ModelBandit | None = None,
                 health: ModelHealth | None = None, sleep: Callable[[float], None] = time.sleep,
                 ledger_max: int = 4096) -> None:
        self.bandit = bandit if bandit is not None else ModelBandit(models)
        self.health = health if health is not None else ModelHealth(models)
        self._sleep = sleep
        self._ledger_max = ledger_max
        self._lock = threading.Lock()
        self._ledger: OrderedDict[str, tuple[str, float, float]] = OrderedDict()

    def choose(self, rng: random.Random, fits: Callable[[str], bool] | None = None) -> ModelSpec:
        """The bandit's pick among the models health allows and, when more than one is usable
        and ``fits`` is given, among those the prompt fits (all usable ones when it fits none:
        that attempt is then reported as too large).

        Raises :class:`mutators.llm.client.health.NoModelLeft` when every model is stopped.
        When every live model's breaker is open, waits for the earliest cooldown (``sleep``)
        and tries that model.
        """
        names = [m.name for m in self.bandit.models]
        while True:
            self.health.check(names)
            usable = [n for n in self.health.usable() if n in names]
            if usable:
                break
            wait = self.health.wait_s()
            log.warning("every LLM model's circuit breaker is open; waiting %.0f s before trying again", wait)
            self._sleep(wait)
            self.health.force_half_open()
        if fits is not None and len(usable) > 1:
            fitting = [n for n in usable if fits(n)]
            usable = fitting or usable
        model = self.bandit.choose(rng, among=usable)
        self.health.chose(model.name)
        return model

    def called(self, model: ModelSpec, call: LLMCall) -> None:
        """A call came back (its failure may stop the model or open its breaker)."""
        self.health.record(model.name, call)

    def failed(self, model: ModelSpec, cost: float) -> None:
        """An attempt of ``model`` made no child: reward 0 for ``cost``."""
        self.bandit.update(model, 0.0, cost)

    def expect(self, candidate_id: str, model: ModelSpec, baseline: float, cost: float) -> None:
        """``model``'s answer became ``candidate_id``, which earns what it gains over ``baseline``."""
        with self._lock:
            self._ledger[candidate_id] = (model.name, baseline, cost)
            while len(self._ledger) > self._ledger_max:
                self._ledger.popitem(last=False)

    def observe(self, candidate_id: str, fitness: float | None) -> None:
        """A child was evaluated: credit the model that made it (ids not in the ledger are ignored)."""
        with self._lock:
            entry = self._ledger.pop(candidate_id, None)
        if entry is None:
            return
        model, baseline, cost = entry
        reward = 0.0 if fitness is None or not math.isfinite(fitness) else max(0.0, fitness - baseline)
        if model in {m.name for m in self.bandit.models}:
            self.bandit.update(model, reward, cost)
