"""rowreduce.cu's STREAM = 1 path (persistent clusters streaming rows through shared memory by
bulk copies; the kb23 / kb24 seeds) computes correctly where its chunks, warp slices and
bulk-copy groups do not divide evenly and where there are fewer rows than co-resident clusters
(tests/fixtures/tasks/row_tails.py), for fp32 softmax / log-softmax as seeded and for the bf16
softmax and RMSNorm paths the search may draw (STREAM 1 at BLOCK 512), checked by the isolated
harness against the fp64 reference like any candidate. The tasks' own shapes are checked by
tests/gpu/test_selftest.py and benchmarks/lab/probes/row_stream*.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Operator, Status

pytestmark = pytest.mark.gpu

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "row_tails.py"
STREAM_512 = {"STREAM": "1", "BLOCK": "512"}
CASES = [("kb23_softmax", {}), ("kb24_log_softmax", {}), ("softmax_bf16", STREAM_512), ("rmsnorm_bf16", STREAM_512)]


@pytest.mark.parametrize("name,override", CASES, ids=[n for n, _ in CASES])
def test_row_stream_on_uneven_rows(name, override, tmp_path):
    from evaluators.compile import compile_candidate
    from evaluators.harness_job import HarnessJob
    from evaluators.pipeline import judge_job
    from evo.tasks.seeds import seed_params, seed_source

    params = {**seed_params(name), **override}
    assert params["STREAM"] == "1"
    cand = Candidate.create(name, seed_source(name), params, operator=Operator.USER)
    outcome = compile_candidate(cand, CompileSettings(cache_dir=str(tmp_path / "cc")))
    assert outcome.ok, outcome.result.reason
    rep = judge_job(
        HarnessJob(task=f"{name}_tails", candidate_id=cand.id, so_bytes=outcome.so_bytes, mode="check",
                   task_files=(str(TAILS),)),
        HarnessSettings(trials=5, timeout_s=180),
    )
    stage = rep.stage("correctness")
    assert stage is not None, [(s.stage, s.status.value, s.reason[:300]) for s in rep.stages]
    assert stage.status is Status.OK, stage.reason
