"""cute-evo: evolutionary search for fast CuTe GPU kernels.

The engine package: records, config, the lineage store, the search loop and the CLI.
Importing ``evo`` needs neither a GPU nor Ray nor torch (``evo.tasks`` imports torch on first use).

The names below are loaded on first use (PEP 562), not at ``import evo``: every process that
imports a submodule runs this file first, and the GPU actor, the mutators and the
island actors import ``evo.core.records`` without wanting the lineage store (sqlite-utils, numpy).
``tests/test_store_lease.py`` checks that ``import evo.core.records`` loads neither.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    **{name: "evo.core.records" for name in (
        "Candidate", "Evaluation", "Member", "Operator", "StageResult", "Status", "candidate_id",
        "canonical_params")},
    **{name: "evo.store" for name in (
        "SCHEMA_VERSION", "AmbiguousIdError", "MigrationError", "NotALineageDatabaseError",
        "ReadOnlyStoreError", "RunExistsError", "SchemaTooNewError", "SchemaTooOldError", "Store",
        "StoreError", "StoreNotFoundError", "UnknownIdError")},
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # AttributeError (not ImportError) lets `from evo import tasks` fall back to the submodule.
        raise AttributeError(f"module 'evo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
