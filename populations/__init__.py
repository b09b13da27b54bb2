"""Populations: islands of kernels of one task, parent selection, MAP-Elites archive, migration.

Pure Python and importable without Ray; the Ray wrapper lives in :mod:`populations.actor`
(imported explicitly, never from here). See docs/populations.md.
"""

from .archive import DEFAULT_DIMS, MISSING, Archive, descriptor_from_params, merge_descriptor
from .island import Island, IslandSpec, IslandState, IslandSummary, island_seed
from .migration import RingMigration, Transfer, migrate, ring_plan
from .selection import (
    SELECTORS,
    Selector,
    SigmoidSelector,
    TopSelector,
    UniformSelector,
    make_selector,
)

__all__ = [
    "Archive",
    "DEFAULT_DIMS",
    "MISSING",
    "descriptor_from_params",
    "merge_descriptor",
    "Island",
    "IslandSpec",
    "IslandState",
    "IslandSummary",
    "island_seed",
    "RingMigration",
    "Transfer",
    "migrate",
    "ring_plan",
    "SELECTORS",
    "Selector",
    "SigmoidSelector",
    "TopSelector",
    "UniformSelector",
    "make_selector",
]
