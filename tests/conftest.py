"""Shared test setup: make tests/fakes importable from every test folder (tests/gpu too),
whichever file pytest is asked to run first."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
