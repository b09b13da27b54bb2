"""Re-measure kernels against their references in one run and write a results table.

Used by ``evo bench`` (champions of a run, or the seeds of chosen tasks) and by
``benchmarks/seeds.py``. Each kernel is compiled (in parallel, cached) and then checked and
timed in its own isolated process (``evaluators.isolation.run_isolated``, mode
``check+time``), one after another so timings never overlap; the reference is timed by the
same protocol in the same process. The markdown table names GPU, driver, CUDA, torch, date
and the command, and is rewritten after every kernel so a run cut short keeps its rows.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as dt
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from evaluators.base import CompileSettings, HarnessSettings
from evo.records import Candidate, Operator, Status

__all__ = ["BenchRow", "seed_candidates", "run_candidates", "bench", "results_table", "write_results"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One benchmark shape of one kernel (or one line saying why it has no timing)."""

    task: str
    shape: str
    dtype: str
    torch_ms: float | None
    ours_ms: float | None
    speedup: float | None
    rate: str
    pct_sol: float | None
    status: str
    note: str = ""
    candidate: str = ""


def seed_candidates(tasks: Iterable[str]) -> list[Candidate]:
    """The seed kernel of each task, with its default tunables."""
    from evo.tasks.seeds import seed_params, seed_source

    return [Candidate.create(t, seed_source(t), seed_params(t), operator=Operator.SEED) for t in tasks]


def run_candidates(store, run_id: str, tasks: Iterable[str] | None = None) -> list[Candidate]:
    """Each task's champion of a run: the confirmed champion if any, else its best correct."""
    champs = {c["task"]: c for c in store.champions(run_id)}
    best = store.best_per_task(run_id)
    out = []
    for task in sorted(set(best) | set(champs)):
        if tasks is not None and task not in tasks:
            continue
        cid = champs[task]["candidate_id"] if task in champs else best[task][0].id
        out.append(store.get_candidate(cid))
    return out


def _fmt_shape(shape: dict[str, int]) -> str:
    return " x ".join(f"{k}={v}" for k, v in shape.items())


def _rows_for(cand: Candidate, report: Any) -> list[BenchRow]:
    from evo.tasks import get_task

    task = get_task(cand.task)
    bad = next((s for s in report.stages if s.status not in (Status.OK, Status.SKIPPED)), None)
    if bad is not None:
        return [BenchRow(cand.task, "", task.dtype, None, None, None, "-", None,
                         f"{bad.stage}: {bad.status.value}", bad.reason[:200], cand.id)]
    rows = []
    for t in report.timings:
        flops, nbytes = task.flops(t.shape), task.bytes(t.shape)
        if flops / max(nbytes, 1.0) > 10:  # matrix work: report arithmetic rate
            rate = f"{flops / (t.median_ms * 1e-3) / 1e12:.1f} TFLOP/s"
        else:
            rate = f"{nbytes / (t.median_ms * 1e-3) / 1e9:.0f} GB/s"
        pct = 100.0 * t.sol_ms / t.median_ms if t.sol_ms else None
        rows.append(BenchRow(cand.task, _fmt_shape(t.shape), task.dtype, t.ref_median_ms, t.median_ms,
                             t.speedup, rate, pct, "ok", "", cand.id))
    return rows or [BenchRow(cand.task, "", task.dtype, None, None, None, "-", None, "ok", "no timing", cand.id)]


def results_table(rows: list[BenchRow]) -> list[str]:
    def num(x: float | None, f: str) -> str:
        return "-" if x is None else format(x, f)

    out = ["| task | shape | dtype | torch ms | ours ms | speedup | rate | % of SOL | status |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r.status + (f" ({r.note})" if r.note else "")
        out.append(f"| {r.task} | {r.shape} | {r.dtype} | {num(r.torch_ms, '.4f')} | {num(r.ours_ms, '.4f')} | "
                   f"{num(r.speedup, '.3f')} | {r.rate} | {num(r.pct_sol, '.1f')} | {status.replace('|', '/')} |")
    return out


def write_results(path: Path, rows: list[BenchRow], env: dict[str, str], command: str,
                  hs: HarnessSettings, title: str) -> None:
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"# {title}",
        "",
        f"- GPU: {env.get('gpu', '?')} (driver {env.get('driver', '?')}, SM clock "
        f"{env.get('sm_clock_mhz_after_timing', env.get('sm_clock_mhz', '?'))} MHz after timing)",
        f"- CUDA {env.get('cuda', '?')}, torch {env.get('torch', '?')}, Python {env.get('python', '?')}",
        f"- Date: {date}; {hs.reps} timed reps after {hs.warmup} warm-up, L2 flush {hs.flush_mb} MB, "
        f"medians; every shape checked ({hs.trials}+ trials)",
        f"- Command: `{command}`",
        "",
        "speedup = torch median / ours (same process, same protocol, TF32 off); "
        "% of SOL = speed-of-light time / ours.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head + results_table(rows)) + "\n")


def bench(
    candidates: list[Candidate],
    compile_settings: CompileSettings,
    harness_settings: HarnessSettings,
    *,
    table: Path,
    command: str,
    title: str,
    jobs: int = 4,
    on_row: Callable[[BenchRow], None] | None = None,
    log_dir: Path | None = None,
) -> list[BenchRow]:
    """Compile all (parallel), then check + time each in a fresh process (sequential)."""
    import json

    from evaluators.compile import compile_candidate
    from evaluators.isolation import HarnessJob, run_isolated

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = list(pool.map(lambda c: (c, compile_candidate(c, compile_settings)), candidates))
    rows: list[BenchRow] = []
    env: dict[str, str] = {}
    for cand, outcome in built:
        if not outcome.result.passed or not outcome.so_bytes:
            r = outcome.result
            new = [BenchRow(cand.task, "", "", None, None, None, "-", None, f"compile: {r.status.value}",
                            r.reason[:200], cand.id)]
        else:
            log.info("checking and timing %s (%s)", cand.task, cand.short_id)
            report = run_isolated(HarnessJob(task=cand.task, candidate_id=cand.id, so_bytes=outcome.so_bytes,
                                             params=cand.params, mode="check+time"), harness_settings)
            env = env or dict(report.env)
            if log_dir is not None:
                log_dir.mkdir(parents=True, exist_ok=True)
                (log_dir / f"{cand.task}.json").write_text(json.dumps(
                    {"candidate": cand.id, "fitness": report.fitness, "env": report.env,
                     "stages": [dataclasses.asdict(s) for s in report.stages]}, default=str, indent=1))
            new = _rows_for(cand, report)
        rows.extend(new)
        for r in new:
            if on_row is not None:
                on_row(r)
        write_results(table, rows, env, command, harness_settings, title)
    return rows
