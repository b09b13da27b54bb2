"""benchmarks/lab/ncu_compare.py's CPU side: how the kernel rows of one profiled call combine into
one table row (several torch kernels per call, metrics ncu left out), and the table's cells.
(The ncu runs themselves need a GPU; benchmarks/results_h200/RESULTS.md shows the table of one.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lab import ncu_compare  # noqa: E402
from evaluators.profile import parse_ncu_csv  # noqa: E402

# ncu --csv --page raw --print-units base: header, units, one row per kernel launch. Two
# kernels (a GEMM and an elementwise kernel, as torch's bias+GELU), one metric missing.
CSV = "\n".join([
    '==PROF== Connected to process 1',
    '"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum","launch__grid_size",'
    '"sm__cycles_elapsed.avg.per_second"',
    '"","","byte","ns","","hz"',
    '"0","nvjet_sm90_gemm","1200000000","1400000","132","1570000000"',
    '"1","vectorized_elementwise_kernel","140000000","67000","65536","1920000000"',
])


def test_rows_of_one_call_sum_or_take_the_largest():
    rows = parse_ncu_csv(CSV)
    assert [r.kernel for r in rows] == ["nvjet_sm90_gemm", "vectorized_elementwise_kernel"]
    assert ncu_compare.combine(rows, "dram__bytes_read.sum", "sum") == 1.34e9
    assert ncu_compare.combine(rows, "gpu__time_duration.sum", "sum") == 1467000.0
    assert ncu_compare.combine(rows, "sm__cycles_elapsed.avg.per_second", "max") == 1.92e9
    # a metric ncu left out (unknown name) is None, not 0
    assert ncu_compare.combine(rows, "lts__t_bytes.sum", "sum") is None


def test_table_scales_columns_and_marks_missing_values():
    rows = parse_ncu_csv(CSV)
    values = {label: ncu_compare.combine(rows, metric, how) for label, metric, _, how in ncu_compare.COLUMNS}
    lines = ncu_compare.table_lines([{"variant": "gemm_bias_gelu_bf16", "side": "torch", "kernels": 2,
                                      "values": values}])
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = dict(zip(head, [c.strip() for c in lines[2].strip("|").split("|")]))
    assert len(head) == 3 + len(ncu_compare.COLUMNS)
    assert cells["kernels"] == "2"
    assert cells["ms"] == "1.467"            # ns -> ms
    assert cells["DRAM rd GB"] == "1.340"    # bytes -> GB
    assert cells["SM MHz"] == "1920"         # Hz -> MHz, the largest of the call's kernels
    assert cells["L2 GB"] == "-"             # not in the CSV
    assert cells["grid"] == "65536"
