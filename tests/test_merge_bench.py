"""benchmarks/merge_bench.py: several ``evo bench`` tables of one GPU merged into one, with the
family geomeans (against eager and against torch.compile) over every row.

The committed H100 tables (benchmarks/results_h100/) are the main fixture: the merged file
(benchmarks/RESULTS.md) must be what the script writes from them today, hold every input row
exactly once, and its family geomeans must equal the geomeans computed here, independently, from
the inputs' printed speedups. Inputs that cannot reproduce themselves (a row dropped or edited) are refused.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from benchmarks.merge_bench import (BEGIN, END, MergeError, build, committed_block, merge_rows, parse_table,
                                    verify, write_block)
from evo.results.bench import BenchRow, load_targets

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "benchmarks" / "results_h100"
INPUTS = [H100 / "RESULTS_modern.md", H100 / "RESULTS_kernelbench_l1_partial.md",
          H100 / "RESULTS_kernelbench_l1_tail.md"]
TARGETS = ROOT / "benchmarks" / "targets.toml"
OUT = ROOT / "benchmarks" / "RESULTS.md"
FIX = ("rerun `python benchmarks/merge_bench.py --targets benchmarks/targets.toml --out "
       "benchmarks/RESULTS.md benchmarks/results_h100/RESULTS_modern.md "
       "benchmarks/results_h100/RESULTS_kernelbench_l1_partial.md benchmarks/results_h100/RESULTS_kernelbench_l1_tail.md`")


@pytest.fixture(scope="module")
def merged() -> str:
    return build(INPUTS, TARGETS, OUT)[0]


def _table_rows(text: str) -> list[str]:
    """The results-table lines of a table: those whose first cell is a task."""
    from evo.tasks.registry import BUILTIN_TASKS

    tasks = set(BUILTIN_TASKS.names())
    return [ln for ln in text.splitlines() if ln.startswith("| ") and ln[2:].split(" |")[0] in tasks]


def _family(block: str, family: str) -> list[str]:
    (line,) = [ln for ln in block.splitlines() if ln.startswith(f"| {family} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_committed_merge_is_current(merged):
    assert committed_block(OUT) == merged, f"{OUT.relative_to(ROOT)} is stale: {FIX}"


def test_every_input_row_appears_once_and_all_41_tasks_are_there(merged):
    rows = _table_rows(merged)
    inputs = [ln for p in INPUTS for ln in _table_rows(p.read_text())]
    assert len(inputs) == 42 and sorted(rows) == sorted(inputs)
    from evo.tasks.registry import BUILTIN_TASKS

    tasks = [ln.split(" | ")[0][2:] for ln in rows]
    assert list(dict.fromkeys(tasks)) == BUILTIN_TASKS.names()  # all 41, in evo bench's order


def test_family_geomeans_over_all_rows_against_eager_and_compile(merged):
    """Oracle: per task the geomean of its shapes' printed speedups, per family the geomean of
    those; computed here from the three inputs' cells, not by the code under test."""
    per_task: dict[str, list[tuple[float, float]]] = {}
    for p in INPUTS:
        for ln in _table_rows(p.read_text()):
            c = [x.strip() for x in ln.strip("|").split("|")]
            per_task.setdefault(c[0], []).append((float(c[6]), float(c[7])))
    from evo.tasks.registry import BUILTIN_TASKS

    for family, n in (("kernelbench-l1", 32), ("modern", 9)):
        tasks = BUILTIN_TASKS.names(family)
        eager = statistics.geometric_mean(statistics.geometric_mean(s for s, _ in per_task[t]) for t in tasks)
        comp = statistics.geometric_mean(statistics.geometric_mean(c for _, c in per_task[t]) for t in tasks)
        cells = _family(merged, family)
        assert cells[1:4] == [str(n), f"{eager:.3f}", f"{comp:.3f}"], cells
    # the speed-of-light line is recomputed over every row (no compiled median within 10% of SOL)
    assert ("torch.compile reaches the speed of light (compiled median within 10% of the SOL time) "
            "on no timed shape.") in merged.splitlines()


def test_a_dropped_row_is_refused(tmp_path):
    text = INPUTS[2].read_text()
    (victim,) = [ln for ln in text.splitlines() if ln.startswith("| kb27_selu |")]
    bad = tmp_path / "tail.md"
    bad.write_text(text.replace(victim + "\n", ""))
    with pytest.raises(MergeError, match="family summary does not reproduce"):
        build([INPUTS[0], INPUTS[1], bad], TARGETS, tmp_path / "out.md")


def test_an_edited_cell_is_refused():
    targets = load_targets(TARGETS)
    text = INPUTS[1].read_text()
    with pytest.raises(MergeError, match="% of SOL 25.3"):
        parse_table(text.replace("| 115.2 TFLOP/s | 23.3 |", "| 115.2 TFLOP/s | 25.3 |"), "partial")
    edited = parse_table(text.replace("| 1.1934 | 2.257 |", "| 1.1934 | 2.357 |"), "partial")
    with pytest.raises(MergeError, match="does not reproduce"):
        verify(edited, targets)


def test_the_same_task_twice_or_two_gpus_are_refused():
    t = parse_table(INPUTS[2].read_text(), "tail")
    with pytest.raises(MergeError, match="kb25_swish is measured in both tail and again"):
        merge_rows([t, dataclasses.replace(t, source="again")])
    m = parse_table(INPUTS[0].read_text(), "modern")
    with pytest.raises(MergeError, match="different GPUs"):
        merge_rows([t, dataclasses.replace(m, gpu_line="NVIDIA H200 (driver 580.159.04, SM clock 1980 MHz)")])


def test_writer_output_round_trips_with_a_compile_failure(tmp_path):
    """A table :func:`evo.results.bench.write_results` writes (a compile failure included) parses
    back into the same rows."""
    from evaluators.base import HarnessSettings
    from evo.results.bench import write_results
    from evo.tasks.gpus import H100 as SPEC, speed_of_light_ms
    from evo.tasks.registry import BUILTIN_TASKS

    shape = {"R": 4096, "C": 393216}
    sol = speed_of_light_ms(BUILTIN_TASKS.get("kb19_relu"), shape, SPEC, bandwidth_gbs=SPEC.datasheet_bandwidth_gbs)
    dims = tuple(shape.items())
    rows = [BenchRow("kb19_relu", "R=4096 x C=393216", "float32", 4.4, 4.2, 1.048, "3051 GB/s", 100 * sol / 4.2,
                     "ok", dims=dims, sol_ms=sol, compile_ms=4.6, compile_speedup=1.095),
            BenchRow("kb22_tanh", "R=4096 x C=393216", "float32", 4.5, 4.3, 1.047, "3000 GB/s", 100 * sol / 4.3,
                     "ok", dims=dims, sol_ms=sol, compile_error="BackendCompilerFailed: lowering\nmore")]
    path = tmp_path / "r.md"
    env = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "cuda": "13.0", "torch": "2.11",
           "reference_compile_mode": "max-autotune-no-cudagraphs"}
    targets = load_targets(TARGETS)
    write_results(path, rows, env, "evo bench", HarnessSettings(), "Seeds", targets)
    table = parse_table(path.read_text(), "r.md")
    verify(table, targets)
    assert [(r.task, r.speedup, r.compile_speedup, r.compile_error) for r in table.rows] == [
        ("kb19_relu", 1.048, 1.095, ""), ("kb22_tanh", 1.047, None, "BackendCompilerFailed: lowering")]
    assert table.rows[0].sol_ms == pytest.approx(sol)
    assert "| 2 | 1.047 | 1.095 over 1 (+1 compile failed) |" in table.families[2]


def test_write_block_keeps_the_hand_written_text(tmp_path):
    out = tmp_path / "R.md"
    write_block(out, f"{BEGIN}\nfirst\n{END}", "T")
    assert out.read_text() == f"# T\n\n{BEGIN}\nfirst\n{END}\n"
    out.write_text(f"# mine\n\nnotes\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    write_block(out, f"{BEGIN}\nnew\n{END}", "T")
    assert out.read_text() == f"# mine\n\nnotes\n\n{BEGIN}\nnew\n{END}\n\ntail\n"
    plain = tmp_path / "plain.md"
    plain.write_text("# someone's table\n")
    with pytest.raises(MergeError, match="not overwriting"):
        write_block(plain, f"{BEGIN}\nnew\n{END}", "T")
    assert plain.read_text() == "# someone's table\n"
