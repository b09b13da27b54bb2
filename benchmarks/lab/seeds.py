"""Benchmark every task's seed kernel against its PyTorch reference -> benchmarks/lab/SEEDS.md.

    python benchmarks/lab/seeds.py                       # all tasks
    python benchmarks/lab/seeds.py --task kb19_relu --task kb23_softmax
    python benchmarks/lab/seeds.py --family modern --reps 100
    python benchmarks/lab/seeds.py --selftest [--task ...]  # evaluator self-test instead

Each seed is compiled (``evaluators.compile.compile_candidate``, in parallel across CPUs,
cached), then checked and timed through the judge (``evaluators.pipeline.run_built``, mode
``check+time``: every shape checked, benchmark shapes timed against the reference by the
same protocol; the GPU is the one ``CUDA_VISIBLE_DEVICES`` names first). The table records, per benchmark shape: seed and torch medians, speedup,
the seed's percentage of the speed-of-light bound, and the status. The header names GPU,
driver, CUDA, torch, date and the command. Per-task JSON logs go under ``--out``. The short
table is printed last.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402

log = logging.getLogger("benchmarks.lab.seeds")


def _select(tasks: list[str], family: str | None) -> list[str]:
    from evo.tasks.registry import get_task, task_names

    if tasks:
        for t in tasks:
            get_task(t)  # fails loudly, listing valid names
        return tasks
    return task_names(family)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", default=[], help="task name (repeatable); default all")
    ap.add_argument("--family", default=None, help="kernelbench-l1 | modern | user")
    ap.add_argument("--out", default="runs/seeds", help="folder for per-task JSON logs")
    ap.add_argument("--table", default=str(ROOT / "benchmarks" / "lab" / "SEEDS.md"), help="markdown table to write")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel compiles")
    ap.add_argument("--reps", type=int, default=HarnessSettings.reps)
    ap.add_argument("--warmup", type=int, default=HarnessSettings.warmup)
    ap.add_argument("--trials", type=int, default=HarnessSettings.trials)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per evaluation of one seed")
    ap.add_argument("--cache-dir", default=CompileSettings.cache_dir)
    ap.add_argument("--arch", default=CompileSettings.arch)
    ap.add_argument("--selftest", action="store_true", help="run the evaluator self-test instead")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(out / "seeds.log")])
    cs = CompileSettings(cache_dir=args.cache_dir, arch=args.arch)
    hs = HarnessSettings(trials=args.trials, warmup=args.warmup, reps=args.reps,
                         timeout_s=args.timeout)
    try:
        tasks = _select(args.task, args.family)
    except KeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python benchmarks/lab/seeds.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

    if args.selftest:
        from evaluators.selftest import run_selftest

        rows = run_selftest(tasks, cs, hs, jobs=args.jobs)
        (out / "selftest.json").write_text(json.dumps(
            [{"task": r.task, "kernel": r.kernel, "status": r.stage.status.value, "reason": r.stage.reason}
             for r in rows], indent=1))
        holes = [r for r in rows if not r.passed_selftest]
        for r in rows:
            print(f"{r.task:24s} {r.kernel:9s} {r.stage.status.value:10s} {r.stage.reason[:90]}")
        print(f"self-test: {len(rows) - len(holes)}/{len(rows)} bad kernels rejected"
              + (f"; ACCEPTED (evaluator hole): {[(r.task, r.kernel) for r in holes]}" if holes else ""))
        return 1 if holes else 0

    from evo.results.bench import bench, seed_candidates

    rows = bench(seed_candidates(tasks), cs, hs, table=Path(args.table), command=command,
                 title="Seed kernels vs PyTorch references", jobs=args.jobs, log_dir=out,
                 on_row=lambda r: print(f"{r.task:24s} {r.shape:34s} {r.status:10s} "
                                        f"{'-' if r.speedup is None else f'{r.speedup:.3f}x'} {r.rate}",
                                        flush=True))
    log.info("wrote %s and logs under %s", args.table, out)
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
