"""No undefined name in the product's code (pyflakes), whether or not a CPU test runs it.

Why: parts of the product run only on a GPU (the judge's CUDA timing in evaluators/judge/timing.py,
the profiled program); a name that a refactor left undefined there (a variable reused for
something else and deleted, as once happened to the timing loop's list of references)
would only show on the H200, as a crash of every timing. This test finds it on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evo", "evaluators", "mutators", "populations")
#: what would fail at run time; style findings (unused imports) are not this test's business
FATAL = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    def __init__(self) -> None:
        self.found: list[str] = []

    def flake(self, m) -> None:
        if isinstance(m, FATAL):
            self.found.append(str(m))

    def unexpectedError(self, filename, msg) -> None:
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        self.found.append(f"{filename}:{lineno}: {msg}")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_undefined_names(package):
    rep = _Collect()
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for f in files:
        pyflakes_api.check(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)), rep)
    assert not rep.found, "\n".join(rep.found)
