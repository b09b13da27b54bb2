"""Kernel commands of the ``evo`` CLI: ``tasks`` (the task suite), ``check`` (the cascade on one
kernel file), ``tune`` (Optuna over a kernel's tunables) and ``bench`` (re-measuring seeds or
a run's champions); each a thin layer over the Python API, registered by :mod:`evo.cli.commands`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from evo.cli.common import DbOpt, JsonOpt, ProgressOpt, console
from evo.cli.common import db_path as _db_path
from evo.cli.common import emit_json as _emit_json
from evo.cli.common import fail as _fail
from evo.cli.common import open_reader as _open_reader
from evo.cli.common import with_task_files
from evo.results.tables import fmt as _fmt
from evo.results.tables import table as _table

__all__ = ["tasks", "check", "tune", "bench"]

log = logging.getLogger(__name__)


def tasks(
    family: Optional[str] = typer.Option(None, "--family", help="Only this family (kernelbench-l1, modern, user)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU for speed-of-light times (default: detected, else H200)."),
    task_file: list[Path] = typer.Option([], "--task-file", help="Also load user tasks from this .py file."),
    as_json: bool = JsonOpt,
) -> None:
    """List the task suite with shapes, dtype and speed-of-light time.

    Example: evo tasks --family modern --gpu H200
    """
    from evo.tasks import gpus
    from evo.tasks.registry import BUILTIN_TASKS

    registry = with_task_files(BUILTIN_TASKS, task_file)
    try:
        spec = gpus.get_gpu(gpu) if gpu else (gpus.detect_gpu() or gpus.get_gpu("H200"))
    except KeyError as e:
        _fail(str(e.args[0] if e.args else e))
    rows = registry.table(spec)
    if family:
        check_family(family, registry.families(), task_file)
        rows = [r for r in rows if r["family"] == family]
    if as_json:
        _emit_json({"gpu": spec.name, "tasks": tasks_json(rows, registry)})
        return
    console.print(render_tasks(rows, spec.name))


def check(
    kernel: Path = typer.Argument(..., help="A .cu file defining evo_launch (see docs/kernels.md)."),
    task: str = typer.Option(..., "--task", help="Task the kernel implements (see `evo tasks`)."),
    params: list[str] = typer.Option([], "--params", help="Tunable values NAME=VALUE (repeatable)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Take [compile]/[evaluator] settings from a config."),
    task_file: list[Path] = typer.Option([], "--task-file", help="Load user tasks from this .py file."),
    timing: bool = typer.Option(True, "--timing/--no-timing",
                                help="--no-timing: correctness only (quicker while iterating on a kernel)."),
    shapes: Optional[str] = typer.Option(
        None, "--shapes", help="Check only these shape indices, e.g. 1,2 (`evo tasks` lists the shapes; "
        "0 is the first). Default: every shape."),
    as_json: bool = JsonOpt,
) -> None:
    """Run the evaluation cascade on one kernel file and print each stage's verdict.

    Policy and compile run anywhere (nvcc needed); correctness and timing need a CUDA GPU
    and are reported as skipped without one. `--params` are checked against the tunables
    and constraints the kernel declares before anything is built. Run this before seeding a
    search with a hand-written kernel.

    Example: evo check my_relu.cu --task kb19_relu --params BLOCK=256 --no-timing
    """
    from dataclasses import replace as _replace

    from evaluators.pipeline import check_kernel
    from evo.tasks.registry import BUILTIN_TASKS

    if not kernel.is_file():
        _fail(f"{kernel}: no such file")
    registry = with_task_files(BUILTIN_TASKS, task_file)
    cs, hs = _stage_settings(config)
    try:  # a user task of the config's [tasks] files counts too
        task_obj = with_task_files(registry, hs.task_files).get(task)
    except KeyError as e:
        _fail(str(e.args[0] if e.args else e))
    kv: dict[str, str] = {}
    for p in params:
        if "=" not in p:
            _fail(f"--params {p!r}: expected NAME=VALUE")
        k, v = p.split("=", 1)
        kv[k.strip()] = v.strip()
    source = kernel.read_text()
    problems = _param_problems(source, kv)
    if problems:
        _fail("\n".join(f"{kernel}: --params: {m}" for m in problems))
    shape_idx: tuple[int, ...] | None = None
    if shapes is not None:
        try:
            shape_idx = tuple(int(x) for x in shapes.split(",") if x.strip())
        except ValueError:
            _fail(f"--shapes {shapes!r}: expected comma-separated shape indices, e.g. 0,2")
        bad = [i for i in shape_idx if not 0 <= i < len(task_obj.shapes)]
        if bad or not shape_idx:
            _fail(f"--shapes {shapes!r}: task {task} has shapes 0..{len(task_obj.shapes) - 1}")
    if not timing:
        hs = _replace(hs, check_only=True)
    try:
        stages = check_kernel(source, task, kv, compile_settings=cs, harness_settings=hs,
                              task_files=tuple(str(f.resolve()) for f in task_file), shapes=shape_idx)
    except ValueError as e:
        _fail(str(e))
    except RuntimeError as e:  # the harness itself (evaluators.base.InfrastructureError)
        one = getattr(e, "one_line", None)
        _fail(one() if callable(one) else str(e))
    stages = tuple(_name_user_file(s, kernel) for s in stages)
    if as_json:
        _emit_json([{"stage": s.stage, "status": s.status.value, "reason": s.reason,
                     "metrics": s.metrics, "seconds": s.seconds} for s in stages])
    else:
        t = Table(title=f"{kernel} on {task}")
        for col in ("stage", "verdict", "seconds", "reason"):
            t.add_column(col)
        for s in stages:
            style = "green" if s.passed else ("yellow" if s.status.value == "skipped" else "red")
            t.add_row(s.stage, f"[{style}]{s.status.value}[/]", _fmt(s.seconds, 2), s.reason)
        console.print(t)
        for s in stages:
            if not s.passed and s.artifacts.get("errors"):
                console.rule(f"{s.stage} errors")
                console.print(s.artifacts["errors"], markup=False, highlight=False)
    failed = [s for s in stages if not s.passed and s.status.value != "skipped"]
    raise typer.Exit(1 if failed else 0)


def _param_problems(source: str, params: dict[str, str]) -> list[str]:
    """Every problem with ``--params`` for this source: unknown names, values outside their
    declared set, violated constraints (one message each; empty when all is well)."""
    from evo.core.tunables import TunableError, parse_tunables, violated_constraints

    try:
        tunables = {t.name: t for t in parse_tunables(source)}
    except TunableError as e:
        return [f"the kernel's @tunable annotations: {e}"]
    out = []
    for name, value in params.items():
        t = tunables.get(name)
        if t is None:
            known = ", ".join(sorted(tunables)) or "none"
            out.append(f"unknown tunable {name!r}; the kernel declares: {known}")
        elif value not in t.choices:
            out.append(f"{name} = {value!r} is not allowed; choose one of {{{', '.join(t.choices)}}}")
    if out:
        return out
    try:
        return [f"constraint violated at {c}" for c in violated_constraints(source, params)]
    except TunableError as e:
        return [str(e)]


def _name_user_file(stage, kernel: Path):
    """Compile messages say ``candidate.cu`` (the job's file name); show the user's file."""
    from dataclasses import replace as _replace

    def sub(text: str) -> str:
        return text.replace("candidate.cu", str(kernel)) if isinstance(text, str) else text

    return _replace(stage, reason=sub(stage.reason),
                    artifacts={k: sub(v) for k, v in stage.artifacts.items()})


def tune(
    id: str = typer.Argument(..., help="Candidate id or unique prefix (a correct kernel with tunables)."),
    trials: int = typer.Option(16, "--trials", help="Trials in this session, each evaluated or told an earlier evaluation of its point."),
    config: Optional[Path] = typer.Option(None, "--config", help="Take [compile]/[evaluator] settings from a config."),
    run: Optional[str] = typer.Option(None, "--run", help="Run (id or prefix) to record trials in (default: the candidate's latest run)."),
    db: Optional[str] = DbOpt,
    progress: bool = ProgressOpt,
) -> None:
    """Tune a kernel's declared tunables with Optuna (TPE), resuming its study if one exists.

    Trials are compiled and evaluated on this machine's GPU, recorded as children with
    operator `optuna` in the run, and the study is stored next to the database, so running
    the command again continues it without repeating a point.

    Example: evo tune 3fa9c2e1b7d0 --trials 24
    """
    from evo.cli.common import store_error_text
    from evo.engine.progress import StepProgress, progress_enabled
    from evo.store import Store, StoreError
    from evo.tuning.session import find_target, prepare
    from evo.tuning.tuning import TuningError

    if trials < 1:
        _fail(f"--trials {trials}: must be at least 1")
    path = _db_path(db)
    if not Path(path).is_file():  # Store(path) would create an empty database
        _fail(f"lineage database not found: {path} (pass --db, or run `evo search` first)")
    cs, hs = _stage_settings(config)
    try:
        store = Store(path)
    except StoreError as e:
        _fail(str(e))
    with store:
        try:
            target = find_target(store, id, run)
        except StoreError as e:
            _fail(store_error_text(e))
        except TuningError as e:
            _fail(str(e))
        try:
            session = prepare(store, path, target, trials=trials, compile_settings=cs, harness_settings=hs)
        except TuningError as e:
            _fail(str(e))
        summary = session.run(StepProgress(f"tuning {target.candidate.id[:12]}: trial", trials,
                                           enabled=progress_enabled(progress)))
    console.print(f"study {summary.study}: {summary.evaluated} trial(s) evaluated; parent "
                  f"{_fmt(summary.parent_fitness)}x, best {_fmt(summary.best_fitness)}x "
                  f"({(summary.best_id or '-')[:12]}){' - improved' if summary.improved else ''}")


def bench_task_names(tasks: list[str], families: list[str], registry: Any = None) -> list[str]:
    """The tasks ``evo bench`` measures: each ``--task``, then every task of each ``--family``,
    in that order, each once, of ``registry`` (None: the built-in tasks). Raises KeyError
    naming an unknown task or family."""
    if registry is None:
        from evo.tasks.registry import BUILTIN_TASKS

        registry = BUILTIN_TASKS
    names = [registry.get(t).name for t in tasks] + [n for f in families for n in registry.names(f)]
    return list(dict.fromkeys(names))


def bench(
    task: list[str] = typer.Option([], "--task", help="Benchmark this task's seed (repeatable)."),
    family: list[str] = typer.Option([], "--family", help="Benchmark the seeds of a whole family (repeatable)."),
    run: Optional[str] = typer.Option(None, "--run", help="Benchmark this run's champions instead of seeds (id or prefix)."),
    out: Path = typer.Option(Path("benchmarks/RESULTS.md"), "--out", help="Markdown table to write."),
    config: Optional[Path] = typer.Option(None, "--config", help="Take [compile]/[evaluator] settings from a config."),
    jobs: int = typer.Option(os.cpu_count() or 4, "--jobs", help="Parallel compiles."),
    targets: Optional[Path] = typer.Option(
        None, "--targets", help="TOML of minimum speedups (benchmarks/targets.toml): adds target and gap columns."),
    profile_misses: bool = typer.Option(
        False, "--profile-misses", help="Profile (ncu) each task that misses its --targets minimum; say why."),
    db: Optional[str] = DbOpt,
    progress: bool = ProgressOpt,
) -> None:
    """Re-measure champions (--run) or seeds (--task/--family) against their torch references,
    eager and under torch.compile, in one run, one fresh process per kernel, and write a results
    table naming GPU, driver, CUDA, torch, date and the command, with per-family geometric means
    against both.

    Example: evo bench --targets benchmarks/targets.toml --profile-misses --out benchmarks/RESULTS.md
    """
    import shlex
    from dataclasses import replace as _replace

    from evaluators.pipeline import gpu_available
    from evo.tasks.registry import BUILTIN_TASKS
    from evo.results.bench import bench as run_bench
    from evo.results.bench import run_candidates, seed_candidates
    from evo.store import StoreError

    cs, hs = _stage_settings(config)
    hs = _replace(hs, time_compiled_reference=True)  # both baselines in every table (docs/evaluator.md)
    registry = with_task_files(BUILTIN_TASKS, hs.task_files)  # the config's user tasks count too
    from evo.results.bench import TargetsError, load_targets

    if profile_misses and targets is None:
        _fail("--profile-misses needs --targets (a miss is a speedup below a target)")
    try:
        tg = load_targets(targets, registry) if targets is not None else None
    except TargetsError as e:
        _fail(str(e))
    try:
        names = bench_task_names(task, family, registry)
    except KeyError as e:
        _fail(str(e.args[0] if e.args else e))
    if run:
        from evo.cli.common import resolve_run
        from evo.tasks.user import TaskFileError, run_task_registry

        with _open_reader(db) as store:
            run = resolve_run(store, run)
            try:
                run_tasks = run_task_registry(store.get_run(run).get("config"), run)
                cands = run_candidates(store, run, set(names) or None)
            except (StoreError, TaskFileError) as e:
                _fail(str(e))
        registry = with_task_files(registry, run_tasks.files)
        hs = _replace(hs, task_files=run_tasks.files)  # every bench child imports the run's task files
        title = f"Champions of run {run} vs PyTorch references"
    else:
        cands = seed_candidates(names or registry.names())
        title = "Seed kernels vs PyTorch references"
    if not cands:
        _fail("nothing to benchmark: the run has no correct kernel for the chosen tasks")
    if not gpu_available():
        _fail("no CUDA GPU found on this machine: `evo bench` times kernels on the GPU it runs on")
    command = "evo bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    ps = None
    if profile_misses:
        from evaluators.profile import ProfileSettings
        from evo.config import load_config

        ps = load_config(config).profile_settings() if config is not None else ProfileSettings()
    from evo.engine.progress import StepProgress, progress_enabled

    with StepProgress("bench", len(cands), enabled=progress_enabled(progress)) as bar:
        rows = run_bench(cands, cs, hs, table=out, command=command, title=title, jobs=jobs, targets=tg,
                         profile_settings=ps, task_registry=registry,
                         on_row=lambda r: console.print(
                             f"{r.task:24s} {r.shape:32s} {r.status:10s} "
                             f"{'-' if r.speedup is None else f'{r.speedup:.3f}x'} {r.rate}"
                             + (" (vs compile: compile failed)" if r.compile_error else
                                f" ({r.compile_speedup:.3f}x vs compile)" if r.compile_speedup is not None else ""),
                             highlight=False),
                         on_progress=lambda step, i, n: bar.update(
                             {"compile": "compiling", "done": "done"}.get(step, f"measuring {step}"), i, n))
    console.print(f"wrote {out} ({len(rows)} rows)")
    raise typer.Exit(0 if all(r.status == "ok" for r in rows) else 1)


def _stage_settings(config: Optional[Path]):
    """``[compile]`` and ``[evaluator]`` settings from a config file, else the defaults."""
    from evaluators.base import CompileSettings, HarnessSettings

    if config is None:
        return CompileSettings(), HarnessSettings()
    from evo.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as e:
        _fail(str(e))
    return cfg.compile_settings(), cfg.harness_settings()


def check_family(family: str, families: list[str], task_files: list[Path]) -> None:
    """One error line for an unknown ``--family``; ``user`` without ``--task-file`` says how."""
    if family in families:
        return
    if family == "user" and not task_files:
        _fail("--family user: user tasks come from task files; name one with --task-file FILE.py "
              "(e.g. evo tasks --family user --task-file my_tasks.py; docs/tasks.md)")
    if family == "user":
        _fail(f"--family user: the task files given ({', '.join(map(str, task_files))}) define no task of "
              "family 'user'")
    _fail(f"unknown family {family!r}; known: {', '.join(families)}"
          + ("" if "user" in families else ", user (with --task-file)"))


def tasks_json(rows: list[dict[str, Any]], registry: Any) -> list[dict[str, Any]]:
    """``evo tasks --json`` rows: :meth:`evo.tasks.TaskRegistry.table`'s of ``registry``, with
    ``shapes`` and ``bench_shapes`` as lists of ``{dim: int}`` objects instead of printed strings."""
    out = []
    for r in rows:
        task = registry.get(r["name"])
        d = {k: v for k, v in r.items() if k not in ("shapes", "bench_shape")}
        d["shapes"] = [dict(s) for s in task.shapes]
        d["bench_shapes"] = [dict(s) for s in task.benchmark_shapes]
        out.append(d)
    return out


def render_tasks(rows: list[dict[str, Any]], gpu_name: str) -> RenderableType:
    """``evo tasks``: the task name (what --task and configs take) always whole."""
    t = _table(f"tasks (speed-of-light on {gpu_name})", [("task", "id"), "family", ("dtype", "word"),
                                                          "benchmark shape", ("shapes", "num"), ("SOL ms", "num")])
    for r in rows:
        t.add_row(r["name"], r["family"], r["dtype"], escape(str(r["bench_shape"])), str(r["n_shapes"]),
                  _fmt(r["sol_ms"], 4))
    return t
