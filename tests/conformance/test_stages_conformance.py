"""Conformance of every stage callable to evo.engine.seams.CompileFn, EvaluateFn and ProfileFn.

Implementations: the real compile stage (``evaluators.compile.compile_candidate`` with the
stand-in compiler, tests/fixtures/compile/fake_nvcc.py; the same function with nvcc is
tests/test_compile.py's ``test_real_*``) and every fake the engine tests
inject (tests/fakes/); the real GPU stages (``evaluators.pipeline.evaluate_built``, the GPU
actor's ncu profile) run the same checks in tests/gpu/test_stages_conformance_gpu.py. A stage callable must: pickle by reference (it travels to Ray workers as a
module-level function), turn a candidate's failure into a non-ok result (never an
exception), give the same verdict for the same candidate twice, and raise only for failures
of ours, as an :class:`~evaluators.base.InfrastructureError` where it knows the cause.
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from evaluators.base import CompileSettings, HarnessSettings, InfrastructureError
from evo.core.records import Candidate, Operator, Status
from evo.engine.seams import CompileFn, CompileResult, EvaluateFn, ProfileFn
from conformance.checks import check_evaluation, check_profile
from fakes import faults as ff
from fakes import harness_stages
from fakes import stages as fake

TESTS = Path(__file__).resolve().parents[1]
COMPILE_FIX = TESTS / "fixtures" / "compile"
CANDIDATE_FAILURES = {Status.COMPILE_ERROR, Status.TIMEOUT, Status.REJECTED}
GOOD_PARAMS = {"TILE": "32", "STAGES": "2", "VEC": "1"}


@dataclass(frozen=True)
class CompileCase:
    """A CompileFn with settings, a candidate it must build and (if it can fail one) one it must fail."""

    fn: Callable
    settings: CompileSettings
    good: Candidate
    bad: Candidate | None


def _stand_in_settings(tmp_path: Path, monkeypatch) -> CompileSettings:
    """compile_candidate with tests/fixtures/compile/fake_nvcc.py as nvcc (as tests/test_compile.py)."""
    monkeypatch.setenv("EVO_SANDBOX_READABLE", os.pathsep.join((str(COMPILE_FIX), sys.prefix, sys.base_prefix)))
    monkeypatch.setenv("EVO_SANDBOX_WRITABLE", str(tmp_path))
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{COMPILE_FIX / "fake_nvcc.py"}" "$@"\n')
    nvcc.chmod(0o755)
    return CompileSettings(nvcc=str(nvcc), cache_dir=str(tmp_path / "cache"), timeout_s=60, memory_mb=4096)


def _compile_case(name: str, tmp_path: Path, monkeypatch) -> CompileCase:
    seedlike = lambda params, notes="": Candidate.create("synthetic_a", fake.SOURCE, params,  # noqa: E731
                                                         operator=Operator.SEED, notes=notes)
    if name == "fakes.stages.fake_compile":
        return CompileCase(fake.fake_compile, CompileSettings(), seedlike(GOOD_PARAMS),
                           seedlike({**GOOD_PARAMS, "STAGES": "5"}))  # STAGES=5: a simulated compile error
    if name == "fakes.faults.fault_compile":  # it fails no candidate: its faults are worker deaths
        return CompileCase(ff.fault_compile, CompileSettings(), seedlike(GOOD_PARAMS), None)
    from evaluators.compile import compile_candidate

    assert name == "compile_candidate[stand-in nvcc]", name
    s = _stand_in_settings(tmp_path, monkeypatch)
    return CompileCase(compile_candidate, s, Candidate.create("t", "// stand-in\nint x;\n", {"BLOCK": "128"}),
                       Candidate.create("t", "// FAKE-NVCC: fail\nint x;\n", {"BLOCK": "128"}))


COMPILE_IMPLS = [
    "fakes.stages.fake_compile",
    "fakes.faults.fault_compile",
    "compile_candidate[stand-in nvcc]",  # the same function with real nvcc: tests/test_compile.py::test_real_*
]


#: The implementations that can fail a candidate (fault_compile's faults are worker deaths,
#: which tests/test_faults.py covers through the engine).
FAILING_COMPILE_IMPLS = [p for p in COMPILE_IMPLS if p != "fakes.faults.fault_compile"]


@pytest.fixture(params=COMPILE_IMPLS)
def compile_case(request, tmp_path, monkeypatch) -> CompileCase:
    return _compile_case(request.param, tmp_path, monkeypatch)


@pytest.fixture(params=FAILING_COMPILE_IMPLS)
def failing_compile_case(request, tmp_path, monkeypatch) -> CompileCase:
    return _compile_case(request.param, tmp_path, monkeypatch)


def test_compile_fn_pickles_by_reference(compile_case):
    assert isinstance(compile_case.fn, CompileFn)
    assert pickle.loads(pickle.dumps(compile_case.fn)) is compile_case.fn


def test_compile_fn_builds_a_good_candidate(compile_case):
    out = compile_case.fn(compile_case.good, compile_case.settings)
    assert isinstance(out, CompileResult)
    assert out.result.stage == "compile" and out.result.passed, out.result.reason
    assert isinstance(out.so_bytes, bytes) and out.so_bytes[:4] == b"\x7fELF"


def test_compile_fn_returns_a_candidates_failure_as_a_result(failing_compile_case):
    case = failing_compile_case
    out = case.fn(case.bad, case.settings)
    assert out.result.stage == "compile" and out.result.status in CANDIDATE_FAILURES, out.result
    assert out.so_bytes is None and out.result.reason


def test_compile_fn_gives_the_same_verdict_twice(compile_case):
    for cand in (compile_case.good, compile_case.bad):
        if cand is None:
            continue
        a, b = (compile_case.fn(cand, compile_case.settings) for _ in range(2))
        assert a.result.status is b.result.status and a.so_bytes == b.so_bytes


# ---------------------------------------------------------------------- EvaluateFn


@dataclass(frozen=True)
class EvaluateCase:
    """An EvaluateFn, the compile stage that builds its inputs, a candidate it must find
    correct and (if it can) one it must find not correct."""

    fn: Callable
    build: Callable[[Candidate], bytes]
    good: Candidate
    bad: Candidate | None
    settings: HarnessSettings = HarnessSettings()


def _fake_build(cand: Candidate) -> bytes:
    out = fake.fake_compile(cand, CompileSettings())
    assert out.so_bytes is not None
    return out.so_bytes


def _fault_build(cand: Candidate) -> bytes:
    return ff.fault_compile(cand, CompileSettings()).so_bytes


EVALUATE_CASES = {
    "fakes.stages.fake_evaluate": lambda: EvaluateCase(
        fake.fake_evaluate, _fake_build, Candidate.create("synthetic_a", fake.SOURCE, GOOD_PARAMS),
        Candidate.create("synthetic_a", fake.SOURCE, {**GOOD_PARAMS, "TILE": "256", "VEC": "8"})),
    "fakes.faults.fault_evaluate": lambda: EvaluateCase(
        ff.fault_evaluate, _fault_build, Candidate.create("synthetic_a", fake.SOURCE, GOOD_PARAMS),
        Candidate.create("synthetic_a", fake.SOURCE, GOOD_PARAMS, notes="fault:incorrect")),
    "fakes.harness_stages.isolated_evaluate": lambda: EvaluateCase(
        harness_stages.isolated_evaluate, _fake_build, Candidate.create("kb19_relu", fake.SOURCE, GOOD_PARAMS), None,
        HarnessSettings(timeout_s=120)),
}


@pytest.fixture(params=sorted(EVALUATE_CASES))
def evaluate_case(request) -> EvaluateCase:
    return EVALUATE_CASES[request.param]()


#: isolated_evaluate's child reports every task it can load as correct: it fails no candidate.
@pytest.fixture(params=sorted(k for k in EVALUATE_CASES if k != "fakes.harness_stages.isolated_evaluate"))
def failing_evaluate_case(request) -> EvaluateCase:
    return EVALUATE_CASES[request.param]()


def test_evaluate_fn_pickles_by_reference(evaluate_case):
    assert isinstance(evaluate_case.fn, EvaluateFn)
    assert pickle.loads(pickle.dumps(evaluate_case.fn)) is evaluate_case.fn


def test_evaluate_fn_finds_a_good_candidate_correct(evaluate_case):
    cand = evaluate_case.good
    ev = evaluate_case.fn(cand, evaluate_case.build(cand), evaluate_case.settings)
    check_evaluation(ev, cand)
    assert ev.correct and ev.fitness > 0, ev.stages


def test_evaluate_fn_returns_a_candidates_failure_as_a_result(failing_evaluate_case):
    case = failing_evaluate_case
    cand = case.bad
    ev = case.fn(cand, case.build(cand), case.settings)
    check_evaluation(ev, cand)
    assert not ev.correct and ev.fitness is None and ev.failed_stage.status is not Status.OK


def test_isolated_evaluate_raises_ours_as_an_infrastructure_error():
    """A task the evaluating process cannot load is our failure: raised, never a verdict."""
    cand = Candidate.create("no_such_task_anywhere", fake.SOURCE, GOOD_PARAMS)
    with pytest.raises(InfrastructureError) as e:
        harness_stages.isolated_evaluate(cand, _fake_build(cand), HarnessSettings(timeout_s=120))
    assert "no_such_task_anywhere" in e.value.one_line()


# ---------------------------------------------------------------------- ProfileFn


def test_fake_profile_conforms():
    assert isinstance(fake.fake_profile, ProfileFn)
    assert pickle.loads(pickle.dumps(fake.fake_profile)) is fake.fake_profile
    cand = Candidate.create("synthetic_a", fake.SOURCE, GOOD_PARAMS)
    st = fake.fake_profile(cand, _fake_build(cand), 0, None)
    check_profile(st)
    assert st.passed and st.metrics["duration_us"] > 0
