"""An instant stand-in for ``evaluators.compile.compile_candidate`` in dry-run tests: the
seeds "compile" at once, so a test reaches the LLM checks without nvcc."""

from __future__ import annotations

from typing import Any

from evo.core.records import StageResult, Status


class InstantBuild:
    """The two fields a dry run reads of a CompileOutcome: a passed compile, not cached."""

    cached = False

    def __init__(self) -> None:
        self.result = StageResult("compile", Status.OK, seconds=0.01)


def patch_compiles(monkeypatch: Any) -> list:
    """Replace ``compile_candidate`` by an instant build; returns the list of candidates it
    was asked to compile (a test can assert that nothing was compiled)."""
    import evaluators.compile as comp

    done: list = []
    monkeypatch.setattr(comp, "compile_candidate", lambda cand, settings: done.append(cand) or InstantBuild())
    return done
