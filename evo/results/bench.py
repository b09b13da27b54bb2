"""Re-measure kernels against their references in one run and write a results table.

Used by ``evo bench`` (champions of a run, or the seeds of chosen tasks) and by
``benchmarks/lab/seeds.py``. Each kernel is compiled (in parallel, cached) and then checked and
decided by the judge (``evaluators.pipeline.run_built``, mode ``check+time``: the candidate in a
sandboxed runner of its own), one after another so timings never overlap; the reference is
timed by the same loop on the same GPU. The markdown table names GPU, driver, CUDA, torch, date
and the command, and is rewritten after every kernel so a run cut short keeps its rows.

When the harness also timed the reference under ``torch.compile``
(``HarnessSettings.time_compiled_reference``, which ``evo bench`` sets), the rows carry its
median and the speedup against it, the table and the family summary gain a "compile ms" /
"vs compile" column and a compiled geomean, a reference inductor could not compile reads
"compile failed" (never a number), and a line lists the shapes where the compiled reference
is already within :data:`SOL_WITHIN` of the speed-of-light time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Operator, Status

__all__ = [
    "BenchRow",
    "Targets",
    "TargetsError",
    "load_targets",
    "seed_candidates",
    "run_candidates",
    "bench",
    "results_table",
    "family_summary",
    "write_results",
    "compile_at_sol",
    "SOL_WITHIN",
]

log = logging.getLogger(__name__)

#: The compiled reference "reaches the speed of light" on a shape when its median is within
#: this fraction above the shape's speed-of-light time (no kernel can then beat it by more).
SOL_WITHIN = 0.10


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
    dims: tuple[tuple[str, int], ...] = ()   # the shape itself; ``shape`` is its printed form
    sol_ms: float | None = None              # speed-of-light time of the shape on this GPU
    compile_ms: float | None = None          # the reference under torch.compile, when timed
    compile_speedup: float | None = None     # its median / ours
    compile_error: str = ""                  # why torch.compile could not compile the reference


class TargetsError(ValueError):
    """A targets file is malformed; the message names the file, the field and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Targets:
    """Minimum speedups (torch median / ours) a benchmark is held to, from a TOML file.

    ``task``: task -> minimum for every shape; ``shape``: ``"task shape"`` (the shape as the
    table prints it, e.g. ``"gemm_bf16 M=4096 x N=4096 x K=4096"``) -> minimum, overriding
    ``task``; ``family``: family -> ``(geomean, min)`` for the family summary (either may be
    ``None``). Only read by :func:`bench` and :func:`write_results`; it never changes a
    measurement, only the table's ``target`` and ``gap`` columns and the summary.
    """

    task: dict[str, float] = dataclasses.field(default_factory=dict)
    shape: dict[str, float] = dataclasses.field(default_factory=dict)
    family: dict[str, tuple[float | None, float | None]] = dataclasses.field(default_factory=dict)
    source: str = ""

    def for_row(self, task: str, shape: str) -> float | None:
        return self.shape.get(f"{task} {shape}", self.task.get(task))


def _registry(task_registry: Any) -> Any:
    """``task_registry``, or the built-in tasks when None."""
    if task_registry is not None:
        return task_registry
    from evo.tasks.registry import BUILTIN_TASKS  # lazy: the registry builds every task

    return BUILTIN_TASKS


def load_targets(path: Path, task_registry: Any = None) -> Targets:
    """Parse a targets TOML (``[task]``, ``[shape]``, ``[family.NAME]`` with ``geomean`` /
    ``min``); unknown task or family names (of ``task_registry``, None: the built-in tasks)
    and non-positive numbers raise TargetsError."""
    import tomllib

    task_names = _registry(task_registry).names
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TargetsError(f"{path}: cannot read targets: {e}") from None
    known = set(task_names())
    extra = set(data) - {"task", "shape", "family"}
    if extra:
        raise TargetsError(f"{path}: unknown section(s) {sorted(extra)}; allowed: task, shape, family")

    def pos(field: str, v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise TargetsError(f"{path}: {field} = {v!r}: must be a positive number (a minimum speedup)")
        return float(v)

    tasks = {}
    for k, v in data.get("task", {}).items():
        if k not in known:
            raise TargetsError(f"{path}: task.{k}: no such task (see `evo tasks`)")
        tasks[k] = pos(f"task.{k}", v)
    shapes = {}
    for k, v in data.get("shape", {}).items():
        if k.split(" ", 1)[0] not in known or " " not in k:
            raise TargetsError(f"{path}: shape.{k!r}: expected \"<task> <shape as the table prints it>\"")
        shapes[k] = pos(f"shape.{k!r}", v)
    fams = {}
    for name, spec in data.get("family", {}).items():
        try:
            task_names(name)
        except KeyError as e:
            raise TargetsError(f"{path}: family.{name}: {e.args[0] if e.args else e}") from None
        bad = set(spec) - {"geomean", "min"}
        if bad:
            raise TargetsError(f"{path}: family.{name}: unknown key(s) {sorted(bad)}; allowed: geomean, min")
        fams[name] = tuple(pos(f"family.{name}.{k}", spec[k]) if k in spec else None for k in ("geomean", "min"))
    return Targets(tasks, shapes, fams, str(path))


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


def _rows_for(cand: Candidate, report: Any, task_registry: Any = None) -> list[BenchRow]:
    task = _registry(task_registry).get(cand.task)
    cerr = (report.env.get("reference_compile_error") or "").strip()
    bad = next((s for s in report.stages if s.status not in (Status.OK, Status.SKIPPED)), None)
    if bad is not None:
        return [BenchRow(cand.task, "", task.dtype, None, None, None, "-", None,
                         f"{bad.stage}: {bad.status.value}", bad.reason[:200], cand.id, compile_error=cerr)]
    rows = []
    for t in report.timings:
        flops, nbytes = task.flops(t.shape), task.bytes(t.shape)
        if flops / max(nbytes, 1.0) > 10:  # matrix work: report arithmetic rate
            rate = f"{flops / (t.median_ms * 1e-3) / 1e12:.1f} TFLOP/s"
        else:
            rate = f"{nbytes / (t.median_ms * 1e-3) / 1e9:.0f} GB/s"
        pct = 100.0 * t.sol_ms / t.median_ms if t.sol_ms else None
        rows.append(BenchRow(cand.task, _fmt_shape(t.shape), task.dtype, t.ref_median_ms, t.median_ms,
                             t.speedup, rate, pct, "ok", "", cand.id, tuple(t.shape.items()), t.sol_ms,
                             t.compile_ref_median_ms, t.compile_speedup, cerr))
    return rows or [BenchRow(cand.task, "", task.dtype, None, None, None, "-", None, "ok", "no timing", cand.id,
                             compile_error=cerr)]


def _with_compile(rows: list[BenchRow]) -> bool:
    """Whether the compiled reference was timed (or failed to compile) for any row."""
    return any(r.compile_ms is not None or r.compile_error for r in rows)


#: What a compiled-reference cell says when inductor could not compile the reference.
COMPILE_FAILED = "compile failed"


def results_table(rows: list[BenchRow], targets: Targets | None = None) -> list[str]:
    def num(x: float | None, f: str) -> str:
        return "-" if x is None else format(x, f)

    both = _with_compile(rows)
    if both:
        head = "| task | shape | dtype | torch ms | compile ms | ours ms | speedup | vs compile | rate | % of SOL |"
        rule = "|---|---|---|---|---|---|---|---|---|---|"
    else:
        head = "| task | shape | dtype | torch ms | ours ms | speedup | rate | % of SOL |"
        rule = "|---|---|---|---|---|---|---|---|"
    if targets is not None:
        head += " target | gap |"
        rule += "---|---|"
    out = [head + " status |", rule + "---|"]
    for r in rows:
        status = r.status + (f" ({r.note})" if r.note else "")
        if both:
            comp = (COMPILE_FAILED, COMPILE_FAILED) if r.compile_error else (
                num(r.compile_ms, '.4f'), num(r.compile_speedup, '.3f'))
            line = (f"| {r.task} | {r.shape} | {r.dtype} | {num(r.torch_ms, '.4f')} | {comp[0]} | "
                    f"{num(r.ours_ms, '.4f')} | {num(r.speedup, '.3f')} | {comp[1]} | {r.rate} | "
                    f"{num(r.pct_sol, '.1f')} |")
        else:
            line = (f"| {r.task} | {r.shape} | {r.dtype} | {num(r.torch_ms, '.4f')} | {num(r.ours_ms, '.4f')} | "
                    f"{num(r.speedup, '.3f')} | {r.rate} | {num(r.pct_sol, '.1f')} |")
        if targets is not None:
            t = targets.for_row(r.task, r.shape)
            line += f" {num(t, '.2f')} | {_gap(r.speedup, t, r.torch_ms, r.sol_ms)} |"
        out.append(line + f" {status.replace('|', '/')} |")
    return out


def _gap(speedup: float | None, target: float | None, torch_ms: float | None = None,
         sol_ms: float | None = None) -> str:
    """``met`` or the shortfall as a percentage of the target (``-12%``: 12% too slow).

    With the reference's time and the speed-of-light time (the task's compulsory bytes at
    datasheet bandwidth, FLOPs at peak rate): a target that would need a time under that bound
    is marked as beyond it, so a physically unreachable target is not read as unfinished work.
    """
    if target is None:
        return "-"
    if speedup is None:
        return "no timing"
    if speedup >= target:
        return "met"
    gap = f"{100.0 * (speedup / target - 1.0):.0f}%"
    if torch_ms and sol_ms and torch_ms / target < sol_ms:
        gap += f" (beyond speed of light: needs {torch_ms / target:.3f} ms, bound {sol_ms:.3f} ms)"
    return gap


def _geomean(xs: Iterable[float]) -> float:
    import math

    v = list(xs)
    return math.exp(sum(map(math.log, v)) / len(v))


def family_summary(rows: list[BenchRow], targets: Targets | None = None, task_registry: Any = None) -> list[str]:
    """Per family: geometric-mean speedup over tasks (each task: geomean of its shapes), the
    slowest task, and the family targets with their gaps. Tasks without timing are counted.

    When the compiled reference was timed, a "geomean vs compile" column follows: the same
    geomean against it, over the timed tasks whose every timed shape has a compiled time;
    tasks whose reference failed to compile are counted beside it, never averaged in.
    Families are those of ``task_registry`` (None: the built-in tasks)."""
    get_task = _registry(task_registry).get
    both = _with_compile(rows)
    per_task: dict[str, list[float]] = {}
    per_task_c: dict[str, list[float | None]] = {}
    failed: set[str] = set()
    no_compile: set[str] = set()
    for r in rows:
        if r.compile_error:
            no_compile.add(r.task)
        if r.speedup is not None and r.speedup > 0:
            per_task.setdefault(r.task, []).append(r.speedup)
            per_task_c.setdefault(r.task, []).append(r.compile_speedup)
        else:
            failed.add(r.task)
    fams: dict[str, dict[str, float]] = {}
    fams_c: dict[str, dict[str, float]] = {}
    for t, v in per_task.items():
        fam = get_task(t).family
        fams.setdefault(fam, {})[t] = _geomean(v)
        cv = per_task_c[t]
        if t not in no_compile and all(x is not None and x > 0 for x in cv):
            fams_c.setdefault(fam, {})[t] = _geomean(x for x in cv if x is not None)
    for t in failed - set(per_task):
        fams.setdefault(get_task(t).family, {})
    if both:
        out = ["| family | tasks timed | geomean speedup | geomean vs compile | slowest task | target geomean "
               "| target min | gaps |", "|---|---|---|---|---|---|---|---|"]
    else:
        out = ["| family | tasks timed | geomean speedup | slowest task | target geomean | target min | gaps |",
               "|---|---|---|---|---|---|---|"]
    for fam in sorted(fams):
        sp = fams[fam]
        n_fail = len({t for t in failed - set(per_task) if get_task(t).family == fam})
        if sp:
            geo = _geomean(sp.values())
            worst = min(sp, key=sp.get)
            g_s, w_s = f"{geo:.3f}", f"{worst} {sp[worst]:.3f}"
        else:
            geo, worst, g_s, w_s = None, None, "-", "-"
        if both:
            spc = fams_c.get(fam, {})
            n_cf = len({t for t in no_compile if get_task(t).family == fam})
            c_s = f"{_geomean(spc.values()):.3f}" if spc else "-"
            c_s += f" over {len(spc)}" if spc and len(spc) != len(sp) else ""
            c_s += f" (+{n_cf} {COMPILE_FAILED})" if n_cf else ""
            g_s += f" | {c_s}"
        tg, tm = (targets.family.get(fam, (None, None)) if targets else (None, None))
        gaps = []
        if tg is not None:
            gaps.append(f"geomean {_gap(geo, tg)}")
        if tm is not None:
            gaps.append(f"min {_gap(sp[worst] if worst else None, tm)}")
        out.append(f"| {fam} | {len(sp)}" + (f" (+{n_fail} without timing)" if n_fail else "")
                   + f" | {g_s} | {w_s} | {'-' if tg is None else f'{tg:.2f}'} | "
                   f"{'-' if tm is None else f'{tm:.2f}'} | {', '.join(gaps) or '-'} |")
    return out


def compile_at_sol(rows: list[BenchRow]) -> str:
    """One line naming the shapes where the compiled reference's median is within
    :data:`SOL_WITHIN` of the speed-of-light time (so no kernel can beat torch.compile there
    by more than ``1 + SOL_WITHIN``), grouped by task; computed from ``rows``."""
    at: dict[str, list[str]] = {}
    timed: dict[str, int] = {}
    for r in rows:
        if r.compile_ms is None or not r.sol_ms:
            continue
        timed[r.task] = timed.get(r.task, 0) + 1
        if r.compile_ms <= (1.0 + SOL_WITHIN) * r.sol_ms:
            at.setdefault(r.task, []).append(r.shape)
    pct = f"{100 * SOL_WITHIN:.0f}%"
    if not at:
        return (f"torch.compile reaches the speed of light (compiled median within {pct} of the SOL time) "
                "on no timed shape.")
    parts = [f"{t} (all {timed[t]} shapes)" if len(s) == timed[t] and timed[t] > 1 else f"{t} ({'; '.join(s)})"
             for t, s in sorted(at.items())]
    return (f"torch.compile already reaches the speed of light (compiled median within {pct} of the SOL time, "
            f"so no kernel can be more than {1 + SOL_WITHIN:.2f}x faster than it) on: {', '.join(parts)}.")


def write_results(path: Path, rows: list[BenchRow], env: dict[str, str], command: str,
                  hs: HarnessSettings, title: str, targets: Targets | None = None,
                  why: dict[tuple[str, str], str] | None = None, task_registry: Any = None) -> None:
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
    ]
    both = _with_compile(rows)
    if both:
        head.append(f"compile ms = the reference under torch.compile (mode "
                    f"`{env.get('reference_compile_mode', '?')}`, compiled before timing, warm-up untimed), "
                    f"timed in the same process by the same protocol; vs compile = compile ms / ours; "
                    f"{COMPILE_FAILED} = inductor could not compile the reference (see below).")
    if targets is not None:
        head.append(f"target = minimum speedup from `{targets.source}`; gap = shortfall relative to it.")
    body = results_table(rows, targets)
    if both:
        body += ["", compile_at_sol(rows)]
    body += ["", "## Families", ""] + family_summary(rows, targets, task_registry)
    failures = {r.task: r.compile_error for r in rows if r.compile_error}
    if failures:
        body += ["", "## References torch.compile could not compile", ""]
        body += [f"- **{task}**: {err.splitlines()[0][:300]}" for task, err in failures.items()]
    if why:
        body += ["", "## Why targets were missed (Nsight Compute, first missed shape per task)", ""]
        body += [f"- **{task}** ({shape}): {text}" for (task, shape), text in why.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head + [""] + body) + "\n")


def _why(metrics: dict[str, Any]) -> str:
    """One line from a profile summary: the bound class and the numbers behind it."""
    def f(k: str) -> str:
        v = metrics.get(k)
        return "n/a" if not isinstance(v, (int, float)) else f"{v:.0f}%"

    stalls = ", ".join(f"{r} {s:.0f}%" for r, _v, s in (metrics.get("top_stalls") or [])[:2])
    return (f"{metrics.get('bound', '?')}: SM {f('sm_throughput_pct')}, DRAM {f('dram_throughput_pct')}, "
            f"tensor pipe {f('tensor_pipe_pct')}, occupancy {f('achieved_occupancy_pct')}, "
            f"{metrics.get('registers_per_thread', '?')} regs/thread; top stalls: {stalls or 'n/a'}")


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
    targets: Targets | None = None,
    profile_settings: Any = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    task_registry: Any = None,
) -> list[BenchRow]:
    """Compile all (parallel), then check + time each in a fresh process (sequential).

    ``task_registry``: where the candidates' tasks are looked up (None: the built-in tasks;
    the children load user tasks from ``harness_settings.task_files``).

    ``on_progress(step, done, total)`` reports both phases for a progress bar: ``step`` is
    ``"compile"`` while compiles finish (``done`` of ``total`` built), then the task being
    measured (``done`` kernels measured before it), and ``"done"`` at the end.

    With ``targets`` the table gets target and gap columns; with ``profile_settings``
    (:class:`evaluators.profile.ProfileSettings`) too, every task that misses its target is
    profiled under ncu on its first missed shape after all timings (so ncu never overlaps a
    measurement) and the table explains the miss. A profiler that cannot run is reported in
    that line, not raised: the timings are the product of the run.
    """
    import json

    from evaluators.pipeline import compile_all, run_built

    total = len(candidates)

    def note(step: str, done: int) -> None:
        if on_progress is not None:
            on_progress(step, done, total)

    note("compile", 0)
    outcomes = compile_all(candidates, compile_settings, jobs=jobs, on_built=lambda n: note("compile", n))
    built = list(zip(candidates, outcomes))
    rows: list[BenchRow] = []
    env: dict[str, str] = {}
    sos: dict[str, bytes] = {}
    for i, (cand, outcome) in enumerate(built):
        note(cand.task, i)
        if not outcome.result.passed or not outcome.so_bytes:
            r = outcome.result
            new = [BenchRow(cand.task, "", "", None, None, None, "-", None, f"compile: {r.status.value}",
                            r.reason[:200], cand.id)]
        else:
            sos[cand.id] = outcome.so_bytes
            log.info("checking and timing %s (%s)", cand.task, cand.short_id)
            report = run_built(cand, outcome.so_bytes, harness_settings, mode="check+time")
            env = env or dict(report.env)
            if log_dir is not None:
                log_dir.mkdir(parents=True, exist_ok=True)
                (log_dir / f"{cand.task}.json").write_text(json.dumps(
                    {"candidate": cand.id, "fitness": report.fitness, "env": report.env,
                     "stages": [dataclasses.asdict(s) for s in report.stages]}, default=str, indent=1))
            new = _rows_for(cand, report, task_registry)
        rows.extend(new)
        for r in new:
            if on_row is not None:
                on_row(r)
        write_results(table, rows, env, command, harness_settings, title, targets, task_registry=task_registry)
    note("done", total)
    if targets is not None and profile_settings is not None:
        why = _profile_misses(rows, {c.id: c for c, _ in built}, sos, targets, profile_settings,
                              harness_settings.task_files)
        write_results(table, rows, env, command, harness_settings, title, targets, why, task_registry)
    return rows


def _profile_misses(rows: list[BenchRow], cands: dict[str, Candidate], sos: dict[str, bytes],
                    targets: Targets, settings: Any, task_files: tuple[str, ...] = ()) -> dict[tuple[str, str], str]:
    from evaluators.profile import ProfileError, profile_candidate

    why: dict[tuple[str, str], str] = {}
    done: set[str] = set()
    for r in rows:
        t = targets.for_row(r.task, r.shape)
        if t is None or r.speedup is None or r.speedup >= t or r.task in done or r.candidate not in sos \
                or not r.dims:
            continue
        done.add(r.task)
        shape = dict(r.dims)
        log.info("profiling %s on %s (missed its target %.2fx)", r.task, r.shape, t)
        try:
            res = profile_candidate(cands[r.candidate], sos[r.candidate], r.task, shape, settings=settings,
                                    task_files=task_files)
        except ProfileError as e:
            why[(r.task, r.shape)] = f"not profiled: {e}"
            log.warning("profiling %s failed: %s", r.task, e)
            continue
        why[(r.task, r.shape)] = (_why(res.metrics) if res.status is Status.OK
                                  else f"profile {res.status.value}: {res.reason[:160]}")
    return why
