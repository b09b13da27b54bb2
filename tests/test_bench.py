"""evo bench: rows from harness reports, the results table, and the CLI's errors (no GPU)."""

from __future__ import annotations

from evaluators.base import HarnessSettings
from evaluators.isolation import HarnessReport, ShapeTiming
from evo.bench import _rows_for, results_table, write_results
from evo.records import Candidate, StageResult, Status


def _cand(task="kb19_relu"):
    return Candidate.create(task, "// src", {})


def test_rows_report_rate_speedup_and_sol():
    shape = {"R": 4096, "C": 393216}
    rep = HarnessReport(stages=(StageResult("correctness", Status.OK), StageResult("timing", Status.OK)),
                        fitness=1.01, timings=(ShapeTiming(shape, 3.0, 0.01, 3.03, 0.01, 1.01, 2.8),))
    (row,) = _rows_for(_cand(), rep)
    assert row.status == "ok" and row.speedup == 1.01 and row.dtype == "float32"
    assert row.rate.endswith("GB/s") and 4200 < float(row.rate.split()[0]) < 4350  # 12.9 GB in 3 ms
    assert abs(row.pct_sol - 100 * 2.8 / 3.0) < 1e-9
    gemm = {"M": 4096, "N": 4096, "K": 4096}
    rep = HarnessReport(stages=rep.stages, fitness=0.7, timings=(ShapeTiming(gemm, 3.7, 0, 2.7, 0, 0.73),))
    (row,) = _rows_for(_cand("kb01_square"), rep)
    assert row.rate.endswith("TFLOP/s") and row.pct_sol is None


def test_failed_kernel_is_one_row_with_the_reason():
    rep = HarnessReport(stages=(StageResult("correctness", Status.INCORRECT, "shape 0 trial 2: NaN"),
                                StageResult("timing", Status.SKIPPED)))
    (row,) = _rows_for(_cand(), rep)
    assert row.status == "correctness: incorrect" and "NaN" in row.note and row.ours_ms is None


def test_results_file_names_environment_and_command(tmp_path):
    rep = HarnessReport(stages=(StageResult("timing", Status.OK),), fitness=1.0,
                        timings=(ShapeTiming({"R": 8, "C": 8}, 1.0, 0, 1.0, 0, 1.0),))
    rows = _rows_for(_cand(), rep)
    path = tmp_path / "RESULTS.md"
    write_results(path, rows, {"gpu": "NVIDIA H200", "driver": "580", "cuda": "13.0", "torch": "2.11"},
                  "evo bench --task kb19_relu", HarnessSettings(), "Seeds")
    text = path.read_text()
    for needle in ("NVIDIA H200", "driver 580", "CUDA 13.0", "torch 2.11", "Date: ", "`evo bench --task kb19_relu`"):
        assert needle in text
    assert results_table(rows)[2].startswith("| kb19_relu | R=8 x C=8 | float32 |")


def test_cli_bench_without_gpu_says_so(monkeypatch):
    from typer.testing import CliRunner

    import evaluators.pipeline as pipeline
    from evo.cli import app

    monkeypatch.setattr(pipeline, "gpu_available", lambda: False)
    res = CliRunner().invoke(app, ["bench", "--task", "kb19_relu"])
    assert res.exit_code == 2 and "no CUDA GPU" in res.output
    res = CliRunner().invoke(app, ["bench", "--task", "kb19_rleu"])
    assert res.exit_code == 2 and "kb19_relu" in res.output
