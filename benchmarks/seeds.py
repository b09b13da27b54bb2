"""Benchmark every task's seed kernel against its PyTorch reference -> benchmarks/SEEDS.md.

    python benchmarks/seeds.py                       # all tasks
    python benchmarks/seeds.py --task kb19_relu --task kb23_softmax
    python benchmarks/seeds.py --family modern --reps 100
    python benchmarks/seeds.py --selftest [--task ...]  # evaluator self-test instead

Each seed is compiled (``evaluators.compile.compile_candidate``, in parallel across CPUs,
cached), then checked and timed in its own isolated process (``run_isolated``, mode
``check+time``: every shape checked, benchmark shapes timed against the reference by the
same protocol). The table records, per benchmark shape: seed and torch medians, speedup,
the seed's percentage of the speed-of-light bound, and the status. The header names GPU,
driver, CUDA, torch, date and the command. Per-task JSON logs go under ``--out``. The short
table is printed last.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime as dt
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evaluators.isolation import PROTOCOL_VERSION, HarnessJob, run_isolated  # noqa: E402
from evo.records import Candidate, Operator, Status  # noqa: E402

log = logging.getLogger("benchmarks.seeds")


@dataclasses.dataclass(frozen=True)
class Row:
    task: str
    shape: str
    seed_ms: float | None
    torch_ms: float | None
    speedup: float | None
    pct_sol: float | None
    status: str
    note: str = ""


def _select(tasks: list[str], family: str | None) -> list[str]:
    from evo.tasks.registry import get_task, task_names

    if tasks:
        for t in tasks:
            get_task(t)  # fails loudly, listing valid names
        return tasks
    return task_names(family)


def _build(task: str, settings: CompileSettings) -> tuple[str, Any, Any]:
    from evaluators.compile import compile_candidate
    from evo.tasks.seeds import UnknownSeedError, seed_params, seed_source

    try:
        cand = Candidate.create(task, seed_source(task), seed_params(task), operator=Operator.SEED)
    except UnknownSeedError as e:
        return task, None, str(e)
    return task, cand, compile_candidate(cand, settings)


def _fmt_shape(shape: dict[str, int]) -> str:
    return " x ".join(f"{k}={v}" for k, v in shape.items())


def _rows_for(task: str, report: Any) -> list[Row]:
    bad = next((s for s in report.stages if s.status not in (Status.OK, Status.SKIPPED)), None)
    if bad is not None:
        return [Row(task, "", None, None, None, None, f"{bad.stage}: {bad.status.value}", bad.reason[:160])]
    timing = report.stage("timing")
    rows = []
    for r in (timing.metrics.get("shapes", []) if timing else []):
        rows.append(Row(task, _fmt_shape(r["shape"]), r["median_ms"], r["ref_median_ms"], r["speedup"],
                        r.get("pct_sol"), "ok"))
    return rows or [Row(task, "", None, None, None, None, "ok", "no timing")]


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _table(rows: list[Row]) -> list[str]:
    out = ["| task | shape | seed ms | torch ms | speedup | % of SOL | status |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r.status + (f" ({r.note})" if r.note else "")
        out.append(f"| {r.task} | {r.shape} | {_num(r.seed_ms, '.4f')} | {_num(r.torch_ms, '.4f')} | "
                   f"{_num(r.speedup, '.3f')} | {_num(r.pct_sol, '.1f')} | {status.replace('|', '/')} |")
    return out


def _write_md(path: Path, rows: list[Row], env: dict[str, str], command: str, hs: HarnessSettings) -> None:
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# Seed kernels vs PyTorch references",
        "",
        f"- GPU: {env.get('gpu', '?')} (driver {env.get('driver', '?')}, SM clock "
        f"{env.get('sm_clock_mhz_after_timing', env.get('sm_clock_mhz', '?'))} MHz after timing)",
        f"- CUDA {env.get('cuda', '?')}, torch {env.get('torch', '?')}, Python {env.get('python', '?')}",
        f"- Date: {date}; evaluation protocol {PROTOCOL_VERSION}; {hs.reps} timed reps after "
        f"{hs.warmup} warm-up, L2 flush {hs.flush_mb} MB, medians; every shape checked "
        f"({hs.trials}+ trials)",
        f"- Command: `{command}`",
        "",
        "speedup = torch median / seed median (same process, same protocol, TF32 off); "
        "% of SOL = speed-of-light time / seed median.",
        "",
    ]
    path.write_text("\n".join(head + _table(rows)) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", default=[], help="task name (repeatable); default all")
    ap.add_argument("--family", default=None, help="kernelbench-l1 | modern | user")
    ap.add_argument("--out", default="runs/seeds", help="folder for per-task JSON logs")
    ap.add_argument("--table", default=str(ROOT / "benchmarks" / "SEEDS.md"), help="markdown table to write")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel compiles")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--reps", type=int, default=HarnessSettings.reps)
    ap.add_argument("--warmup", type=int, default=HarnessSettings.warmup)
    ap.add_argument("--trials", type=int, default=HarnessSettings.trials)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per isolated run")
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
                         timeout_s=args.timeout, device=args.device)
    try:
        tasks = _select(args.task, args.family)
    except KeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python benchmarks/seeds.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))

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

    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        built = list(pool.map(lambda t: _build(t, cs), tasks))
    rows: list[Row] = []
    env: dict[str, str] = {}
    for task, cand, outcome in built:
        if cand is None:
            rows.append(Row(task, "", None, None, None, None, "no seed", str(outcome)[:120]))
            continue
        if not outcome.ok or not outcome.so_bytes:
            r = outcome.result
            rows.append(Row(task, "", None, None, None, None, f"compile: {r.status.value}", r.reason[:160]))
            (out / f"{task}.json").write_text(json.dumps({"compile": dataclasses.asdict(r)}, default=str, indent=1))
            continue
        log.info("checking and timing %s", task)
        report = run_isolated(HarnessJob(task=task, candidate_id=cand.id, so_bytes=outcome.so_bytes,
                                         params=cand.params, mode="check+time"), hs)
        env = env or dict(report.env)
        if report.env.get("sm_clock_mhz_after_timing"):
            env.update(report.env)
        (out / f"{task}.json").write_text(json.dumps(
            {"candidate": cand.id, "fitness": report.fitness, "env": report.env,
             "stages": [dataclasses.asdict(s) for s in report.stages]}, default=str, indent=1))
        rows.extend(_rows_for(task, report))
        # Rewritten after every task, so a run cut short still leaves the rows it measured.
        _write_md(Path(args.table), rows, env, command, hs)
        print("\n".join(_table(rows[-len(_rows_for(task, report)):])[2:]), flush=True)
    table = Path(args.table)
    _write_md(table, rows, env, command, hs)
    log.info("wrote %s and logs under %s", table, out)
    print("\n".join(_table(rows)))
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
