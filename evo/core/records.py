"""Frozen records passed between components and stored in the lineage DB.

Every record here is plain data: it pickles (Ray ships it between actors), compares by
value, and holds no client, actor or connection. Mappings inside records are plain dicts
that nobody mutates after construction (a deliberate simplification over
``MappingProxyType``, which does not pickle); the records themselves are frozen.

Identity: a candidate's id is ``sha256(source + canonical params + task)``, so the same kernel
with the same tunable values on the same task is the same candidate whoever proposes it; the engine dedupes on it
before compiling and the store inserts idempotently on it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = [
    "Status",
    "Operator",
    "Candidate",
    "StageResult",
    "Evaluation",
    "Member",
    "canonical_params",
    "candidate_id",
    "source_sha",
]


class Status(str, enum.Enum):
    """Verdict of one cascade stage.

    ``ok`` lets the candidate continue; every other value stops the cascade at that stage.
    ``invalid`` means a measurement that physics forbids (faster than the speed-of-light
    bound), kept apart from ``incorrect`` because it points at a timing exploit.
    """

    OK = "ok"
    REJECTED = "rejected"
    COMPILE_ERROR = "compile_error"
    INCORRECT = "incorrect"
    INVALID = "invalid"
    TIMEOUT = "timeout"
    CRASH = "crash"
    SKIPPED = "skipped"

    @property
    def passed(self) -> bool:
        return self is Status.OK


class Operator(str, enum.Enum):
    """How a candidate came to be. LLM children record ``llm:<model>`` as a free string."""

    SEED = "seed"
    KNOBS = "knobs"
    CROSSOVER = "crossover"
    OPTUNA = "optuna"
    LLM = "llm"
    USER = "user"


def canonical_params(params: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """Sorted ``(name, value-as-string)`` pairs: the one spelling used for hashing and -D flags."""
    if not params:
        return ()
    out = []
    for k, v in params.items():
        if isinstance(v, bool):
            s = "1" if v else "0"
        elif isinstance(v, float) and v.is_integer():
            s = str(int(v))
        else:
            s = str(v)
        out.append((str(k), s))
    return tuple(sorted(out))


def source_sha(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def candidate_id(
    source: str, params: Mapping[str, Any] | tuple[tuple[str, str], ...] | None, task: str = ""
) -> str:
    """Content hash of a candidate: same task + source + tunable values -> same id.

    The task is part of the identity (when given) because one generic source evaluated on
    two tasks is two different candidates with two different fitnesses.
    """
    pairs = params if isinstance(params, tuple) else canonical_params(params)
    h = hashlib.sha256()
    h.update(source.encode("utf-8"))
    h.update(b"\0")
    h.update(json.dumps(pairs, separators=(",", ":")).encode("utf-8"))
    if task:
        h.update(b"\0task:")
        h.update(task.encode("utf-8"))
    return h.hexdigest()


@dataclass(frozen=True)
class Candidate:
    """A kernel variant: its source, tunable values and where it came from.

    Construct with :meth:`create`, which computes the content id. ``parents`` lists parent
    ids (one for a mutation, two for a crossover, none for a seed). ``operator`` is an
    :class:`Operator` value or ``"llm:<model>"``.
    """

    id: str
    task: str
    source: str
    params: tuple[tuple[str, str], ...] = ()
    parents: tuple[str, ...] = ()
    operator: str = Operator.SEED.value
    island: int = 0
    generation: int = 0
    notes: str = ""

    @classmethod
    def create(
        cls,
        task: str,
        source: str,
        params: Mapping[str, Any] | None = None,
        *,
        parents: tuple[str, ...] | list[str] = (),
        operator: str | Operator = Operator.SEED,
        island: int = 0,
        generation: int = 0,
        notes: str = "",
    ) -> "Candidate":
        pairs = canonical_params(params)
        op = operator.value if isinstance(operator, Operator) else str(operator)
        return cls(
            id=candidate_id(source, pairs, task),
            task=task,
            source=source,
            params=pairs,
            parents=tuple(parents),
            operator=op,
            island=island,
            generation=generation,
            notes=notes,
        )

    @property
    def params_dict(self) -> dict[str, str]:
        return dict(self.params)

    @property
    def short_id(self) -> str:
        return self.id[:12]


@dataclass(frozen=True)
class StageResult:
    """The verdict of one cascade stage on one candidate.

    ``metrics`` holds numbers (times, registers, speedups); ``artifacts`` holds text kept for
    people and for the next prompt (trimmed compile errors, the failing shape and index).
    A candidate's failure is a StageResult, never an exception.
    """

    stage: str
    status: Status
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class Evaluation:
    """All stage results of one candidate on one GPU kind, and the fitness derived from them.

    ``fitness`` = geometric-mean speedup over the task's benchmark shapes versus the
    reference timed by the same protocol in the same harness; ``None`` unless every stage
    passed.
    """

    candidate_id: str
    stages: tuple[StageResult, ...]
    fitness: float | None = None
    gpu: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        for s in self.stages:
            if not s.passed and s.status is not Status.SKIPPED:
                return s.status
        return Status.OK if self.stages else Status.SKIPPED

    @property
    def correct(self) -> bool:
        return self.status is Status.OK and self.fitness is not None

    @property
    def failed_stage(self) -> StageResult | None:
        for s in self.stages:
            if not s.passed and s.status is not Status.SKIPPED:
                return s
        return None

    def stage(self, name: str) -> StageResult | None:
        for s in self.stages:
            if s.stage == name:
                return s
        return None


@dataclass(frozen=True)
class Member:
    """A candidate as an island holds it: the candidate, its fitness and its descriptor.

    ``descriptor`` places the member in the MAP-Elites archive (e.g. tile class, stages,
    memory- vs compute-bound); ``fitness`` is ``None`` for incorrect members, which islands
    keep only to drive repair.
    """

    candidate: Candidate
    fitness: float | None
    status: Status = Status.OK
    descriptor: tuple[tuple[str, str], ...] = ()
    error: str = ""

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def correct(self) -> bool:
        return self.fitness is not None and math.isfinite(self.fitness)
