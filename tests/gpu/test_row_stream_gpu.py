"""rowreduce.cu's EVO_ROW_STREAM candidate (evo.tasks.seeds.ROWREDUCE_CANDIDATES: persistent
clusters streaming rows through shared memory by bulk copies) computes kb23 / kb24 correctly
where its chunks, warp slices and bulk-copy groups do not divide evenly and where there are
fewer rows than co-resident clusters (tests/fixtures/tasks/row_tails.py), checked by the
isolated harness against the fp64 reference like any candidate. The tasks' own shapes are
checked by benchmarks/probes/row_stream.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evo.records import Candidate, Operator, Status

pytestmark = pytest.mark.gpu

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "row_tails.py"


@pytest.mark.parametrize("name", ["kb23_softmax", "kb24_log_softmax"])
def test_row_stream_candidate_on_uneven_rows(name, tmp_path):
    from evaluators.compile import compile_candidate
    from evaluators.isolation import HarnessJob, run_isolated
    from evo.tasks.seeds import ROWREDUCE_CANDIDATES, seed_params
    from evo.tasks.seedspec import render

    cand = Candidate.create(name, render(ROWREDUCE_CANDIDATES[name]), seed_params(name), operator=Operator.USER)
    outcome = compile_candidate(cand, CompileSettings(cache_dir=str(tmp_path / "cc")))
    assert outcome.ok, outcome.result.reason
    rep = run_isolated(
        HarnessJob(task=f"{name}_tails", candidate_id=cand.id, so_bytes=outcome.so_bytes, mode="check",
                   task_files=(str(TAILS),)),
        HarnessSettings(trials=5, timeout_s=180),
    )
    stage = rep.stage("correctness")
    assert stage is not None, [(s.stage, s.status.value, s.reason[:300]) for s in rep.stages]
    assert stage.status is Status.OK, stage.reason
