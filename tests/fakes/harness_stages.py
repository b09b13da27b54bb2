"""GPU stages that run the real isolation path (run_isolated: fresh process, sandbox, job
directory) with a fake child (tests/fixtures/isolation/load_task.py) that loads the job's task
the way the real harness does. What a test learns: whatever the engine, the runtime and the
GPU actor hand to an isolated child really arrives there (task files above all)."""

from __future__ import annotations

from pathlib import Path

from evaluators.base import HarnessSettings
from evaluators.isolation import HarnessJob, run_isolated
from evo.core.records import Candidate, Evaluation, Status

CHILD = str(Path(__file__).resolve().parents[1] / "fixtures" / "isolation" / "load_task.py")


def isolated_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    """Like ``evaluators.pipeline.evaluate_built``, with the fake child as the harness."""
    rep = run_isolated(HarnessJob(task=candidate.task, candidate_id=candidate.id, so_bytes=so_bytes,
                                  params=candidate.params), settings, entry=CHILD)
    ok = all(s.status in (Status.OK, Status.SKIPPED) for s in rep.stages)
    return Evaluation(candidate.id, rep.stages, rep.fitness if ok else None, gpu="fake", env=dict(rep.env))


def raising_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    """A GPU stage whose own code is broken (not a harness child failure): raises every time."""
    raise ValueError("simulated bug in the GPU stage")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "isolation"


def fixture_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    """The real isolation path with the fixture child named by the candidate's notes
    (``ok``, ``hang``, ...: tests/fixtures/isolation/<notes>.py)."""
    rep = run_isolated(HarnessJob(task=candidate.task, candidate_id=candidate.id, so_bytes=so_bytes,
                                  params=candidate.params), settings, entry=str(FIXTURES / f"{candidate.notes}.py"))
    ok = all(s.status in (Status.OK, Status.SKIPPED) for s in rep.stages)
    return Evaluation(candidate.id, rep.stages, rep.fitness if ok else None, gpu="fake", env=dict(rep.env))
