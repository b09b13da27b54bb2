"""cute-evo: evolutionary search for fast CuTe GPU kernels.

The engine package: records, config, the lineage store, the search loop and the CLI.
Importing ``evo`` needs neither a GPU nor Ray; ``evo.tasks`` imports torch.
"""

from evo.records import (
    Candidate,
    Evaluation,
    Member,
    Operator,
    StageResult,
    Status,
    candidate_id,
    canonical_params,
)
from evo.store import (
    SCHEMA_VERSION,
    AmbiguousIdError,
    MigrationError,
    NotALineageDatabaseError,
    ReadOnlyStoreError,
    RunExistsError,
    SchemaTooNewError,
    SchemaTooOldError,
    Store,
    StoreError,
    StoreNotFoundError,
    UnknownIdError,
)

__version__ = "0.1.0"

__all__ = [
    "Candidate", "Evaluation", "Member", "Operator", "StageResult", "Status", "candidate_id",
    "canonical_params", "SCHEMA_VERSION", "AmbiguousIdError", "MigrationError",
    "NotALineageDatabaseError", "ReadOnlyStoreError", "RunExistsError", "SchemaTooNewError",
    "SchemaTooOldError", "Store", "StoreError", "StoreNotFoundError", "UnknownIdError",
]
