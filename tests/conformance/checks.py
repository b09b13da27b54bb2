"""Checks shared by the stage conformance suites (tests/conformance/, tests/gpu/)."""

from __future__ import annotations

from evo.core.records import Candidate, Evaluation, StageResult


def check_evaluation(ev: Evaluation, cand: Candidate) -> None:
    """What evo.engine.seams.EvaluateFn promises about any evaluation it returns."""
    assert isinstance(ev, Evaluation) and ev.candidate_id == cand.id
    assert ev.stages and not {s.stage for s in ev.stages} & {"policy", "compile"}, "GPU stages only"
    assert (ev.fitness is not None) == ev.correct, "fitness is set exactly when every stage passed"


def check_profile(st: StageResult) -> None:
    """What evo.engine.seams.ProfileFn promises about any result it returns."""
    assert isinstance(st, StageResult) and st.stage == "profile"
    if st.passed:
        assert isinstance(st.metrics.get("gpu"), str) and st.metrics["gpu"]
