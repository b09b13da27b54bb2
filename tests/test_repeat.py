"""benchmarks/lab/repeat.py's summary of where wrong elements sit (the GPU part needs a GPU).

Contract: ``_where(out, ref, TM, TN)`` prints nothing when ``out`` matches ``ref`` within 1e-3
of the reference's largest magnitude, and otherwise the number of wrong elements, how many
TM x TN tiles they touch, and how many distinct rows / columns (mod the tile) they use: the
fingerprint that told a single-row race (one thread's A fragment) from a B-column one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lab.repeat import _where  # noqa: E402


def test_where_silent_when_equal(capsys):
    ref = torch.randn(256, 256, dtype=torch.float64)
    _where(ref.clone(), ref, 128, 128)
    assert capsys.readouterr().out == ""


def test_where_reports_a_single_wrong_row(capsys):
    ref = torch.ones(256, 256, dtype=torch.float64)
    out = ref.clone()
    out[130, 128:256] += 5.0                     # row 2 of tile (1, 1), all 128 columns
    _where(out, ref, 128, 128)
    text = capsys.readouterr().out
    assert "128 wrong elements in 1 tiles" in text
    assert "rows%128 seen 1" in text and "cols%128 seen 128" in text
    assert "first tiles [3]" in text


def test_where_counts_tiles_on_a_ragged_grid(capsys):
    ref = torch.ones(100, 70, dtype=torch.float64)
    out = ref.clone()
    out[0, 0] = out[99, 69] = 9.0               # first and last (partial) tile of a 2 x 2 grid
    _where(out, ref, 64, 64)
    assert "2 wrong elements in 2 tiles" in capsys.readouterr().out
