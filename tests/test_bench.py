"""evo bench: rows from harness reports, the results table, and the CLI's errors (no GPU)."""

from __future__ import annotations

from evaluators.base import HarnessSettings
from evaluators.harness_job import HarnessReport, ShapeTiming
from evo.results.bench import _rows_for, results_table, write_results
from evo.core.records import Candidate, StageResult, Status


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


# ---------------------------------------------------------------- targets and family summary

def _row(task, shape, speedup, status="ok"):
    from evo.results.bench import BenchRow

    dims = tuple((k, int(v)) for k, v in (p.split("=") for p in shape.split(" x "))) if shape else ()
    return BenchRow(task, shape, "float32", 1.0, None if speedup is None else 1.0 / speedup, speedup,
                    "-", None, status, dims=dims)


def test_targets_file_parses_and_rejects_bad_fields(tmp_path):
    import pytest

    from evo.results.bench import TargetsError, load_targets

    t = load_targets("benchmarks/targets.toml")
    assert t.for_row("kb01_square", "M=4096 x N=4096 x K=4096") == 1.8
    assert t.for_row("gemm_bf16", "M=4096 x N=4096 x K=4096") == 0.90   # shape override
    assert t.for_row("gemm_bf16", "M=8192 x N=8192 x K=8192") == 0.95
    assert t.for_row("rmsnorm_bf16", "R=1 x H=1") is None
    assert t.family["kernelbench-l1"] == (1.5, 0.9)
    for text, needle in (("[task]\nkb01_sqare = 1.8\n", "kb01_sqare"),
                         ("[task]\nkb01_square = -1\n", "positive"),
                         ("[tasks]\n", "unknown section"),
                         ("[family.kb]\ngeomean = 1.5\n", "family.kb"),
                         ("[family.modern]\nmean = 1.5\n", "allowed: geomean, min"),
                         ("[shape]\n\"kb01_square\" = 1.0\n", "shape")):
        f = tmp_path / "t.toml"
        f.write_text(text)
        with pytest.raises(TargetsError, match=needle):
            load_targets(f)


def test_table_shows_target_and_gap_and_family_summary(tmp_path):
    from evo.results.bench import Targets, family_summary, results_table

    tg = Targets(task={"kb01_square": 1.8, "kb19_relu": 0.98}, family={"kernelbench-l1": (1.5, 0.9)})
    rows = [_row("kb01_square", "M=1 x N=1 x K=1", 0.9), _row("kb19_relu", "R=1 x C=1", 1.0),
            _row("kb23_softmax", "R=1 x C=1", 1.6), _row("kb22_tanh", "", None, "correctness: incorrect")]
    lines = results_table(rows, tg)
    assert "| target | gap |" in lines[0]
    assert "| 1.80 | -50% |" in lines[2] and "| 0.98 | met |" in lines[3] and "| - | - |" in lines[4]
    summ = family_summary(rows, tg)
    (fam,) = [ln for ln in summ if ln.startswith("| kernelbench-l1")]
    # geomean of 0.9, 1.0, 1.6 = 1.129; slowest kb01 0.9; the failed task is counted
    assert "| 3 (+1 without timing) | 1.129 | kb01_square 0.900 | 1.50 | 0.90 |" in fam
    assert "geomean -25%" in fam and "min met" in fam


def test_results_file_has_families_and_why_sections(tmp_path):
    from evo.results.bench import Targets

    rows = [_row("kb01_square", "M=1 x N=1 x K=1", 0.9)]
    path = tmp_path / "R.md"
    write_results(path, rows, {}, "evo bench", HarnessSettings(), "Seeds", Targets(task={"kb01_square": 1.8},
                  source="t.toml"), {("kb01_square", "M=1 x N=1 x K=1"): "compute-bound: SM 90%"})
    text = path.read_text()
    assert "## Families" in text and "`t.toml`" in text
    assert "- **kb01_square** (M=1 x N=1 x K=1): compute-bound: SM 90%" in text


def test_cli_bench_profile_misses_needs_targets_and_bad_targets_are_named(tmp_path):
    from typer.testing import CliRunner

    from evo.cli import app

    res = CliRunner().invoke(app, ["bench", "--task", "kb19_relu", "--profile-misses"])
    assert res.exit_code == 2 and "--targets" in res.output
    bad = tmp_path / "t.toml"
    bad.write_text("[task]\nkb19_relu = 0\n")
    res = CliRunner().invoke(app, ["bench", "--task", "kb19_relu", "--targets", str(bad)])
    assert res.exit_code == 2 and "kb19_relu" in res.output and "positive" in res.output


def test_profile_misses_profiles_each_missing_task_once_and_reports_profiler_errors(monkeypatch):
    import evaluators.profile as prof
    from evo.results.bench import Targets, _profile_misses

    calls = []

    def fake_profile(cand, so, task, shape, *, settings, task_files=()):
        calls.append((task, shape))
        if task == "kb19_relu":
            raise prof.ProfileError("ncu: permission denied to read counters (set NVreg_RestrictProfilingToAdminUsers=0)")
        return StageResult("profile", Status.OK, "", {"bound": "compute-bound", "sm_throughput_pct": 91.0,
                                                      "top_stalls": [["math_pipe_throttle", 1.2, 40.0]]})

    monkeypatch.setattr(prof, "profile_candidate", fake_profile)
    c1, c2 = _cand("kb01_square"), _cand("kb19_relu")
    rows = [_row("kb01_square", "M=8 x N=8 x K=8", 0.5), _row("kb01_square", "M=4 x N=4 x K=4", 0.5),
            _row("kb19_relu", "R=2 x C=2", 0.5), _row("kb23_softmax", "R=2 x C=2", 2.0)]
    rows = [r.__class__(**{**r.__dict__, "candidate": c.id}) for r, c in zip(rows, (c1, c1, c2, c2))]
    why = _profile_misses(rows, {c1.id: c1, c2.id: c2}, {c1.id: b"so", c2.id: b"so"},
                          Targets(task={"kb01_square": 1.8, "kb19_relu": 0.98, "kb23_softmax": 1.4}), object())
    assert calls == [("kb01_square", {"M": 8, "N": 8, "K": 8}), ("kb19_relu", {"R": 2, "C": 2})]
    assert why[("kb01_square", "M=8 x N=8 x K=8")].startswith("compute-bound: SM 91%")
    assert "math_pipe_throttle 40%" in why[("kb01_square", "M=8 x N=8 x K=8")]
    assert why[("kb19_relu", "R=2 x C=2")].startswith("not profiled: ncu: permission denied")


def test_gap_marks_a_target_beyond_the_speed_of_light():
    """silu_bf16 on an H200: 1.25x over torch's 1.605 ms needs 1.284 ms, under the 1.342 ms
    bound at datasheet bandwidth; a reachable miss keeps its plain percentage."""
    from evo.results.bench import BenchRow, Targets, results_table

    def row(task, torch_ms, ours_ms, sol_ms):
        return BenchRow(task, "R=1 x C=1", "bfloat16", torch_ms, ours_ms, torch_ms / ours_ms, "-",
                        100.0 * sol_ms / ours_ms, "ok", sol_ms=sol_ms)

    tg = Targets(task={"silu_bf16": 1.25, "gemm_silu_mul_bf16": 1.2})
    # 2 x 4096 x 393216 bf16 bytes at 4800 GB/s = 1.342 ms; the SwiGLU bound is far below 2.93 ms
    lines = results_table([row("silu_bf16", 1.6051, 1.5124, 1.3422), row("gemm_silu_mul_bf16", 3.3223, 2.9319, 1.9468)], tg)
    assert "| -15% (beyond speed of light: needs 1.284 ms, bound 1.342 ms) |" in lines[2]
    assert lines[3].endswith("| 1.20 | -6% | ok |")


def test_bench_family_is_repeatable_and_tasks_come_once():
    """`evo bench --family kernelbench-l1 --family modern` measures both families (a second
    --family once silently replaced the first), a --task named again by a family once."""
    from evo.cli.kernels import bench_task_names
    from evo.tasks import task_names

    both = bench_task_names(["gemm_bf16"], ["kernelbench-l1", "modern"])
    assert both[0] == "gemm_bf16" and len(both) == len(set(both))
    assert set(both) == set(task_names("kernelbench-l1")) | set(task_names("modern"))
