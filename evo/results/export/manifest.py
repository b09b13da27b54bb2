"""The facts ``manifest.json`` records beside an exported kernel: timings and compile
resources from its evaluation, tool versions of this machine, its lineage, file hashes."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evo.core.records import Evaluation

if TYPE_CHECKING:  # pragma: no cover
    from evaluators.base import CompileSettings
    from evo.store import Store

__all__ = ["MANIFEST_VERSION", "timings", "compile_resources", "sha256", "versions", "lineage_ids"]

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1


def timings(ev: Evaluation) -> dict[str, Any]:
    t = ev.stage("timing")
    if t is None:
        return {}
    keep = ("shape", "median_ms", "iqr_ms", "ref_median_ms", "ref_iqr_ms", "speedup", "sol_ms", "pct_sol",
            "input_copies")
    shapes = [{k: row.get(k) for k in keep if k in row} for row in t.metrics.get("shapes", []) if isinstance(row, dict)]
    out: dict[str, Any] = {"shapes": shapes}
    for k in ("reps", "warmup", "flush_mb", "fitness"):
        if k in t.metrics:
            out[k] = t.metrics[k]
    out["stage_seconds"] = t.seconds
    return out


def compile_resources(ev: Evaluation) -> dict[str, Any]:
    c = ev.stage("compile")
    if c is None:
        return {}
    keep = ("registers", "smem_bytes", "stack_frame", "spill_stores", "spill_loads", "wgmma_serialized",
            "nvcc_seconds", "so_size")
    return {k: c.metrics[k] for k in keep if k in c.metrics}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions(settings: "CompileSettings") -> dict[str, str | None]:
    """nvcc and CUTLASS versions of this machine (None where unavailable)."""
    out: dict[str, str | None] = {"nvcc": None, "cutlass": None}
    try:
        from evaluators.compile import cutlass_version

        out["cutlass"] = cutlass_version()
    except Exception as e:  # noqa: BLE001 - any failure means "unknown"
        log.info("CUTLASS version unknown: %s", e)
    try:
        from evaluators.compile import find_nvcc, nvcc_version

        out["nvcc"] = nvcc_version(find_nvcc(settings))
    except Exception as e:  # noqa: BLE001
        log.info("nvcc version unknown: %s", e)
    return out


def lineage_ids(store: "Store", cid: str, run_id: str) -> dict[str, Any]:
    from evo.results.lineage import first_parent_chain

    chain = first_parent_chain(store, cid, run_id=run_id)
    return {
        "first_parent_chain": [
            {"id": s.candidate.id, "operator": s.candidate.operator, "generation": s.candidate.generation,
             "fitness": s.fitness, "other_parents": list(s.other_parents)}
            for s in chain
        ],
        "ancestors": [c.id for c in store.ancestry(cid)[1:]],
    }
