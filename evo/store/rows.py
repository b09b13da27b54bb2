"""Row conversion between the frozen records (:mod:`evo.core.records`) and SQLite columns.

Params, parents, metrics, artifacts, env, configs and payloads are stored as JSON text;
times as ISO-8601 UTC strings with milliseconds; NaN fitness as NULL. Everything here is
pure (no connection), so the reader and the writer convert the same way.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from datetime import datetime, timezone
from typing import Any, Sequence

from evo.core.records import Candidate, Evaluation, StageResult, Status

__all__ = ["now", "dumps", "loads", "float_or_none", "CANDIDATE_COLS", "row_to_candidate", "row_to_stage",
           "row_to_evaluation", "new_run_id", "RUN_ID_RE", "LLM_FIELDS"]

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: The columns of ``llm_calls`` a caller may set (``add_llm_call(run, **fields)``).
LLM_FIELDS = (
    "prompt",
    "response",
    "model",
    "kind",
    "tokens_in",
    "tokens_out",
    "cost",
    "latency_s",
    "error",
    "prompt_hash",
    "candidate_id",
    "cached",
    # migration 3
    "finish_reason",
    "reasoning_tokens",
    "cached_tokens",
    "retries",
    "api",
    "max_output_tokens",
    "reasoning_effort",
    "timeout_s",
    # migration 4
    "attempt_key",
)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(
        f"value of type {type(obj).__name__} is not JSON-serialisable; the lineage store keeps "
        f"metrics/params/payloads as JSON, convert it to int/float/str/list/dict first"
    )


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False)


def loads(text: str | None, default: Any = None) -> Any:
    if text is None:
        return default
    return json.loads(text)


def float_or_none(x: Any) -> float | None:
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) else f


#: The SELECT list :func:`row_to_candidate` reads (``candidates c JOIN sources s``).
CANDIDATE_COLS = (
    "c.id, c.task, s.text, c.params, c.parents, c.operator, c.island, c.generation, c.notes"
)


def row_to_candidate(row: Sequence[Any]) -> Candidate:
    cid, task, text, params, parents, operator, island, generation, notes = row[:9]
    return Candidate(
        id=cid,
        task=task,
        source=text,
        params=tuple((str(k), str(v)) for k, v in loads(params, [])),
        parents=tuple(loads(parents, [])),
        operator=operator,
        island=int(island or 0),
        generation=int(generation or 0),
        notes=notes or "",
    )


def row_to_stage(stage: str, status: str, reason: str | None, metrics: str | None, artifacts: str | None,
                 seconds: float | None) -> StageResult:
    return StageResult(
        stage=stage,
        status=Status(status),
        reason=reason or "",
        metrics=loads(metrics, {}),
        artifacts=loads(artifacts, {}),
        seconds=float(seconds or 0.0),
    )


def row_to_evaluation(cid: str, stages: Sequence[StageResult], fitness: Any, gpu: str | None,
                      env: str | None) -> Evaluation:
    return Evaluation(
        candidate_id=cid,
        stages=tuple(stages),
        fitness=float_or_none(fitness),
        gpu=gpu or "",
        env=loads(env, {}),
    )


def new_run_id(now: datetime | None = None) -> str:
    """A short, typable, practically unique run id: ``r-YYYYMMDD-HHMM-xxxx`` (UTC, 4 hex)."""
    now = now or datetime.now(timezone.utc)
    return f"r-{now:%Y%m%d-%H%M}-{secrets.token_hex(2)}"
