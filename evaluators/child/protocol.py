"""The job directory's protocol between the parent (:mod:`evaluators.isolation`) and the
isolated child (:mod:`evaluators.child.harness`): the version stored with every time, the
modes, the exit code of a harness bug, and a stage result as JSON.

Both sides import it; it imports nothing but :mod:`evo.core.records`, so the child does not load
the parent's side (subprocess handling, the sandbox launcher) to speak it.
"""

from __future__ import annotations

from typing import Any, Mapping

from evo.core.records import StageResult, Status

__all__ = ["HARNESS_BUG_EXIT", "MODES", "PROTOCOL_VERSION", "stage_from_json", "stage_to_json"]

#: Version of the correctness + timing protocol; stored with every time.
PROTOCOL_VERSION = "1"
#: Exit code by which the harness says "my own bug", with error.json beside it.
HARNESS_BUG_EXIT = 70
#: "check": correctness only; "check+time": correctness then timing; "time-only": champion
#: re-confirmation of an already-checked binary in a fresh process.
MODES = ("check", "check+time", "time-only")


def stage_to_json(s: StageResult) -> dict[str, Any]:
    return {
        "stage": s.stage,
        "status": s.status.value,
        "reason": s.reason,
        "metrics": s.metrics,
        "artifacts": s.artifacts,
        "seconds": s.seconds,
    }


def stage_from_json(d: Mapping[str, Any]) -> StageResult:
    return StageResult(
        stage=str(d["stage"]),
        status=Status(d["status"]),
        reason=str(d.get("reason", "")),
        metrics=dict(d.get("metrics") or {}),
        artifacts={str(k): str(v) for k, v in (d.get("artifacts") or {}).items()},
        seconds=float(d.get("seconds", 0.0)),
    )
