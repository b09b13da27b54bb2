"""Nsight Compute counters of our seed kernels next to their torch references, side by side.

    python benchmarks/lab/ncu_compare.py TASK[:NAME=VALUE,...] ... [--shape-index 0] [--out DIR]

Why: the fused bf16 GEMMs run at the H200's power limit (benchmarks/lab/power.py), so at equal
tensor work the kernel that moves fewer bytes and issues fewer instructions per flop gets
the higher clock. This script counts those bytes and instructions for each variant (a seed
with tunables, in benchmarks/lab/probe.py's ``TASK:NAME=VALUE`` syntax) and for the task's torch
reference (cuBLAS for the GEMMs) on the same inputs, so the difference is visible per flop:

- DRAM bytes read / written, L2 bytes (``lts__t_bytes``: every L2 transaction, including the
  L2 -> SM operand traffic), L2 sector hit rate;
- warp instructions executed, tensor-pipe (GMMA) warp instructions;
- duration and SM clock of the profiled call (``--clock-control none``: the GPU's own clocks);
- grid size and cluster width of the largest launch (a persistent kernel's grid is the number
  of CTAs that fit at once).

Each (variant, side) is one ncu run of this file in ``--child`` mode, capturing exactly the
kernels launched inside one NVTX range (``evo_ours`` or ``evo_ref``) of one call, after one
warm-up call of both sides outside it; all kernels of that call are summed (the reference of
bias+GELU is a GEMM and an elementwise kernel). ncu leaves out metric names it does not know:
they print as ``-``. Output: a table (printed last, and ``DIR/ncu_compare.md``) and the raw ncu
CSVs under ``DIR``. A development tool, like probe.py: it needs a GPU and ncu.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("benchmarks.lab.ncu_compare")

#: (column label, ncu metric, scale, how rows of one call combine: "sum" or "max")
COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("ms", "gpu__time_duration.sum", 1e-6, "sum"),
    ("SM MHz", "sm__cycles_elapsed.avg.per_second", 1e-6, "max"),
    ("DRAM rd GB", "dram__bytes_read.sum", 1e-9, "sum"),
    ("DRAM wr GB", "dram__bytes_write.sum", 1e-9, "sum"),
    ("L2 GB", "lts__t_bytes.sum", 1e-9, "sum"),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", 1.0, "max"),
    ("warp inst M", "smsp__inst_executed.sum", 1e-6, "sum"),
    ("GMMA inst M", "sm__inst_executed_pipe_tensor_op_gmma.sum", 1e-6, "sum"),
    ("grid", "launch__grid_size", 1.0, "max"),
    ("cluster", "launch__cluster_dim_x", 1.0, "max"),
)
RANGES = {"ours": "evo_ours", "torch": "evo_ref"}


def _child(jobdir: Path) -> int:
    """Run inside ncu: both sides once outside the ranges, then the job's side once inside."""
    import torch

    from benchmarks.lab.probe import seed_and_reference
    from evo.tasks.registry import get_task

    job = json.loads((jobdir / "job.json").read_text())
    torch.backends.cuda.matmul.allow_tf32 = False
    shape = dict(get_task(job["task"]).shapes[int(job["shape_index"])])
    ours, torch_ref = seed_and_reference(job["task"], Path(job["so"]), shape, torch.device("cuda"))
    fn = ours if job["side"] == "ours" else torch_ref
    with torch.no_grad():
        ours()
        torch_ref()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(RANGES[job["side"]])
        try:
            fn()
        finally:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    (jobdir / "done").write_text(json.dumps({"shape": shape, "gpu": torch.cuda.get_device_name(0)}))
    return 0


def combine(rows: list, metric: str, how: str) -> float | None:
    """Sum (or max) of ``metric`` over the kernel rows of one call; None when no row has it."""
    vals = [v for v in (r.number(metric) for r in rows) if v is not None]
    if not vals:
        return None
    return sum(vals) if how == "sum" else max(vals)


def table_lines(results: list[dict]) -> list[str]:
    """Markdown table: one row per (variant, side), the COLUMNS plus kernels captured."""
    head = "| variant | side | kernels | " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for r in results:
        cells = []
        for label, _, scale, _ in COLUMNS:
            v = r["values"].get(label)
            cells.append("-" if v is None else f"{v * scale:.3f}" if v * scale < 100 else f"{v * scale:.0f}")
        lines.append(f"| {r['variant']} | {r['side']} | {r['kernels']} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(Path(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="TASK or TASK:NAME=VALUE[,NAME=VALUE...] (seed tunables)")
    ap.add_argument("--shape-index", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per ncu run")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/ncu_compare")))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from benchmarks.lab.probe import _candidate, _compile_all, parse_variant
    from evaluators.profile import find_ncu, parse_ncu_csv

    variants = [parse_variant(item) for item in args.variants]
    ncu = find_ncu()
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = _compile_all([_candidate(n, "seed", p) for n, p in variants], len(variants))
    metrics = ",".join(c[1] for c in COLUMNS)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="evo-ncu-compare-") as tmp:
        for i, ((name, tunables), outcome) in enumerate(zip(variants, outcomes)):
            if not outcome.ok:
                raise SystemExit(f"{name}: seed failed to compile: {outcome.result.reason}")
            label = name + "".join(f" {k}={v}" for k, v in tunables.items())
            so = Path(tmp) / f"{i}.so"
            so.write_bytes(outcome.so_bytes)
            for side in ("ours", "torch"):
                jobdir = Path(tmp) / f"{i}_{side}"
                jobdir.mkdir()
                (jobdir / "job.json").write_text(json.dumps(
                    {"task": name, "so": str(so), "shape_index": args.shape_index, "side": side}))
                csv_path = args.out / f"{i}_{name}_{side}.csv"
                cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx",
                       "--nvtx-include", f"{RANGES[side]}/", "--csv", "--page", "raw", "--print-units", "base",
                       "--metrics", metrics, "--log-file", str(csv_path),
                       sys.executable, str(Path(__file__).resolve()), "--child", str(jobdir)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
                if not (jobdir / "done").exists():
                    raise SystemExit(f"{label} ({side}): the profiled run failed (ncu exit {proc.returncode}):\n"
                                     f"{(proc.stdout + proc.stderr)[-3000:]}")
                rows = parse_ncu_csv(csv_path.read_text())
                values = {c[0]: combine(rows, c[1], c[3]) for c in COLUMNS}
                results.append({"variant": label, "side": side, "kernels": len(rows), "values": values,
                                "names": [r.kernel[:80] for r in rows]})
                log.info("%s %s: %d kernels captured", label, side, len(rows))
    lines = table_lines(results)
    (args.out / "ncu_compare.md").write_text("\n".join(lines) + "\n")
    (args.out / "ncu_compare.json").write_text(json.dumps(results, indent=1))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
