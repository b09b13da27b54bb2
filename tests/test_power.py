"""benchmarks/lab/power.py's CPU side: nvidia-smi row parsing, per-loop summaries, variant syntax.
(The GPU loop itself runs on the device machine; benchmarks/results_h200/RESULTS.md shows its table.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lab import power, probe  # noqa: E402


def _stamp(t: float) -> str:
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(round((t % 1) * 1000)):03d}"


def test_rows_parse_and_summaries_use_only_their_window():
    t0 = 1_800_000_000.0
    text = "\n".join([
        f"{_stamp(t0 + 0.25)}, 1980, 120.50, 0x0000000000000000",
        f"{_stamp(t0 + 1.5)}, 1455, 693.10, 0x0000000000000004",
        f"{_stamp(t0 + 1.75)}, 1440, 691.00, 0x0000000000000004",
        f"{_stamp(t0 + 2.0)}, 1470, 694.00, 0x0000000000000004",
        f"{_stamp(t0 + 2.1)}, [N/A], [N/A], [N/A]",      # skipped, not a crash
        "2026/12/01 21:39",                             # partial last line
    ])
    rows = power.parse_rows(text)
    assert len(rows) == 4
    assert rows[0][0] == pytest.approx(t0 + 0.25, abs=1e-3)
    s = power.summary(rows, t0 + 1.0, t0 + 2.05)
    assert s["samples"] == 3
    assert s["clock_mhz"] == 1455 and s["power_w"] == 693.1
    assert s["event_reasons"] == ["0x0000000000000004"]
    assert power.summary(rows, t0 + 5, t0 + 6) == {"samples": 0}


def test_variants_take_tunables_and_reject_malformed_items():
    """The variant syntax power.py and precompile.py share (benchmarks/lab/probe.py)."""
    assert probe.parse_variant("gemm_bf16") == ("gemm_bf16", {})
    assert probe.parse_variant("gemm_silu_mul_bf16:DUAL_MMA=1,CLUSTER_M=1,") == (
        "gemm_silu_mul_bf16", {"DUAL_MMA": "1", "CLUSTER_M": "1"})
    assert probe.parse_variant("kb19_relu:X=a=b") == ("kb19_relu", {"X": "a=b"})
    for bad in ["gemm_bf16:DUAL_MMA", ":X=1", "gemm_bf16:=1"]:
        with pytest.raises(SystemExit, match="expected TASK or TASK:NAME=VALUE"):
            probe.parse_variant(bad)
