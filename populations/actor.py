"""``IslandActor``: one :class:`~populations.island.Island` living in a Ray actor.

This is the only module in ``populations/`` that touches Ray, and it imports Ray lazily
inside :func:`make_island_actor`: importing this module (or building the plain
:class:`IslandActor` class in a test) costs nothing and needs no running Ray instance.

The actor is CPU-light bookkeeping, so it asks for ``num_cpus=0`` by default: islands never
compete with compile workers for CPU slots. Ray runs one method call at a time on a
(non-async) actor, which is exactly the single-owner discipline :class:`Island` expects.

Construction: from an :class:`~populations.island.IslandSpec` (fresh run) or from an
:class:`~populations.island.IslandState` (resume; the selector recorded in the state is
rebuilt unless a spec is also given, whose selector then wins).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from evo.core.records import Member

from .island import Island, IslandSpec, IslandState, IslandSummary
from .selection import make_selector

__all__ = ["IslandActor", "make_island_actor"]

log = logging.getLogger(__name__)


class IslandActor:
    """Plain class wrapped by Ray in :func:`make_island_actor`; every method forwards to the
    island (see :class:`~populations.island.Island` for the contracts). Usable in-process too.
    """

    def __init__(self, spec: IslandSpec | None = None, state: IslandState | None = None) -> None:
        if spec is None and state is None:
            raise ValueError("IslandActor needs an IslandSpec (fresh island) or an IslandState (resume)")
        if state is not None:
            selector = None
            if spec is not None:
                if (spec.task, spec.index) != (state.task, state.index):
                    raise ValueError(
                        f"IslandActor: spec is island {spec.index} of {spec.task!r} but the state "
                        f"is island {state.index} of {state.task!r}; pass the matching state"
                    )
                selector = make_selector(spec.selector, **dict(spec.selector_options))
            self._island = Island.from_state(state, selector)
        else:
            assert spec is not None
            self._island = spec.build()
        log.info("island actor %d (%s) ready: %d members", self._island.index,
                 self._island.task, len(self._island))

    def ready(self) -> bool:
        """Cheap call to wait on actor construction."""
        return True

    def add(self, member: Member) -> bool:
        return self._island.add(member)

    def add_many(self, members: Iterable[Member]) -> list[bool]:
        """Several :meth:`add` calls in one round trip, in order."""
        return [self._island.add(m) for m in members]

    def seed(self, members: Iterable[Member]) -> None:
        self._island.seed(members)

    def parents(self, k: int = 1) -> list[Member]:
        return self._island.parents(k)

    def record_child(self, parent_id: str) -> bool:
        return self._island.record_child(parent_id)

    def best(self) -> Member | None:
        return self._island.best()

    def members(self) -> list[Member]:
        return self._island.members()

    def failures(self) -> list[Member]:
        return self._island.failures()

    def emigrants(self, n: int) -> list[Member]:
        return self._island.emigrants(n)

    def immigrate(self, members: Iterable[Member]) -> int:
        return self._island.immigrate(members)

    def fix_mode(self) -> bool:
        """A method, not a property: Ray actors expose methods only."""
        return self._island.fix_mode

    def summary(self) -> IslandSummary:
        return self._island.summary()

    def state(self) -> IslandState:
        return self._island.state()


def make_island_actor(
    spec: IslandSpec | None = None,
    *,
    state: IslandState | None = None,
    num_cpus: float = 0,
    **options: Any,
):
    """Start an ``IslandActor`` on the current Ray instance and return its handle.

    ``options`` go to ``ActorClass.options`` (e.g. ``name=``, ``namespace=``,
    ``max_restarts=``, ``lifetime=``). Ray must already be initialised (``evo.engine.runtime`` does
    that); otherwise this raises ``RuntimeError`` saying so rather than silently starting a
    second, unconfigured Ray instance.
    """
    import ray  # the only Ray import in populations/

    if not ray.is_initialized():
        raise RuntimeError(
            "make_island_actor: Ray is not initialised; start it first (evo.engine.runtime, or "
            "ray.init(...) in a script/test)"
        )
    cls = ray.remote(IslandActor)
    return cls.options(num_cpus=num_cpus, **options).remote(spec, state)
