"""Inspection commands of the ``evo`` CLI: ``runs``, ``top``, ``show``, ``lineage``,
``status``, ``report`` and ``export``, each a thin layer over a Python function
(:func:`evo.results.status.run_status`, :func:`evo.results.report.build_report`,
:func:`evo.results.export.export`, :func:`evo.results.lineage.lineage_tree`,
:func:`evo.results.lineage.candidate_details`) that prints :mod:`evo.results.views`'s tables
for people and JSON with ``--json``, and turns the store's errors (unknown or ambiguous ids
with near matches, a database from a newer cute-evo, a missing file) into one red line and
exit code 2. :mod:`evo.cli.commands` registers them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from evo.cli.common import DbOpt, JsonOpt, ProgressOpt, console
from evo.cli.common import db_path as _db_path
from evo.cli.common import emit_json as _emit_json
from evo.cli.common import fail as _fail
from evo.cli.common import open_reader as _open_reader
from evo.cli.common import resolve_run as _resolve_run
from evo.cli.common import store_error_text as _store_error_text
from evo.cli.common import with_task_files
from evo.results.tables import fmt as _fmt
from evo.results.tables import reference_fields
from evo.results.tables import table as _table

__all__ = ["runs", "top", "show", "lineage", "status", "report", "export", "top_data", "print_lineage",
           "print_show"]

log = logging.getLogger(__name__)


def _console() -> Console:
    return Console()


def runs(db: Optional[str] = DbOpt, as_json: bool = JsonOpt) -> None:
    """List the runs in a lineage database.

    Example: evo runs --db runs/evo.db --json
    """
    from evo.results.views import render_runs

    with _open_reader(db) as store:
        rows = store.list_runs()
    if as_json:
        _emit_json(rows)
        return
    console.print(render_runs(rows, f"runs in {_db_path(db)}"))


def top(
    run: str = typer.Argument(..., help="Run id or unique prefix (see `evo runs`)."),
    task: Optional[str] = typer.Option(None, "--task", help="Only this task (one of the run's)."),
    k: int = typer.Option(10, "-k", help="How many per task (>= 1)."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show the fastest correct kernels of a run, per task.

    Example: evo top r-20261130-1342-ab12 --task kb23_softmax -k 5
    """
    from evo.results.views import render_top

    with _open_reader(db) as store:
        run_id, data = top_data(store, run, task, k)
    if as_json:
        _emit_json(data)
        return
    console.print(render_top(run_id, data))


def show(
    id: str = typer.Argument(..., help="Candidate id or unique prefix."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
    source: bool = typer.Option(True, "--source/--no-source", help="Print the kernel source."),
    full: bool = typer.Option(False, "--full", help="Print the whole prompt and answer (default: each trimmed to "
                                                    "its first and last lines)."),
) -> None:
    """Show one kernel: source, params, stage verdicts, metrics, profile, the prompt and
    answer that made it, and for a champion its confirmed gain over the seed.

    Example: evo show 3fa9c2e1b7d0 --full
    """
    _on_candidate(db, id, lambda store, cid: print_show(store, cid, as_json=as_json, source=source, full=full))


def lineage(
    id: str = typer.Argument(..., help="Candidate id or unique prefix."),
    diff: bool = typer.Option(False, "--diff", help="Show the full diff of every edge."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show the ancestry of a kernel back to its seed: each edge with operator, diff summary,
    fitness delta, stage verdicts and profile deltas.

    Example: evo lineage 3fa9c2e1b7d0 --diff
    """
    _on_candidate(db, id, lambda store, cid: print_lineage(store, cid, diff=diff, as_json=as_json))


def _on_candidate(db: Optional[str], id: str, fn) -> None:
    """Resolve ``id`` in a read-only store and call ``fn(store, full_id)``; store errors
    (unknown or ambiguous id with near matches) become one clean error line."""
    from evo.store import StoreError

    with _open_reader(db) as store:
        try:
            fn(store, store.resolve_id(id))
        except StoreError as e:
            _fail(_store_error_text(e))


def top_data(store: Any, run: str, task: Optional[str], k: int) -> tuple[str, list[dict[str, Any]]]:
    """``(full run id, rows)`` for ``evo top``: ``run`` may be a unique prefix; ``k`` must be
    >= 1 and ``task`` one of the run's tasks, else one error line (exit 2). Each row: id,
    task, fitness, operator, island, generation, params and
    :func:`evo.results.tables.reference_fields` (basis, speedups vs eager and vs compile)."""
    from evo.store import StoreError

    if k < 1:
        _fail(f"-k {k}: must be at least 1 (how many kernels to show per task)")
    rid = _resolve_run(store, run)
    try:
        if task is not None:
            run_tasks = sorted({c.task for c in store.candidates(rid)})
            if task not in run_tasks:
                _fail(f"--task {task!r}: run {rid} has no such task; its tasks: {', '.join(run_tasks) or 'none'}")
        rows = store.top_k(rid, task=task, k=k)
        refs = store.reference_fitness(rid, [c.id for c, _ in rows])
    except StoreError as e:
        _fail(_store_error_text(e))
    return rid, [
        {"id": c.id, "task": c.task, "fitness": f, "operator": c.operator, "island": c.island,
         "generation": c.generation, "params": dict(c.params), **reference_fields(refs.get(c.id))}
        for c, f in rows
    ]


def print_lineage(store: Any, cid: str, *, diff: bool = False, as_json: bool = False,
                  run_id: Optional[str] = None, console: Optional[Console] = None) -> None:
    """What ``evo lineage ID [--diff] [--json]`` prints, for a resolved full id ``cid``.

    JSON is :func:`evo.results.lineage.lineage_tree`'s list; without ``--diff`` the diff texts are
    left out of it (the ``added``/``removed`` counts remain). Store errors propagate (the caller maps
    them to its error line)."""
    from evo.results.lineage import lineage_tree
    from evo.results.views import render_lineage

    nodes = lineage_tree(store, cid, run_id=run_id)
    if as_json:
        if not diff:
            for n in nodes:
                for e in n["edges"]:
                    e.pop("diff", None)
        _emit_json(nodes)
        return
    (console or _console()).print(render_lineage(nodes, diff=diff))


def print_show(store: Any, cid: str, *, as_json: bool = False, source: bool = True, full: bool = False,
               run_id: Optional[str] = None, console: Optional[Console] = None) -> None:
    """What ``evo show ID [--json] [--no-source] [--full]`` prints, for a resolved full id
    ``cid`` (JSON always holds the whole prompt and answer)."""
    from evo.results.lineage import candidate_details
    from evo.results.views import render_show

    d = candidate_details(store, cid, run_id=run_id)
    if as_json:
        if not source:
            d.pop("source")
        _emit_json(d)
        return
    (console or _console()).print(render_show(d, source=source, full=full))


def status(
    run: str = typer.Argument(..., help="Run id or unique prefix (see `evo runs`)."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Where a run stands, live or finished: evaluations, failures by stage, best per task
    (with the champion's confirmed gain over the seed), per LLM model the calls, children,
    repairs, answers rejected before compiling by reason, spend and stopped models, the
    budget left, evaluation rate and GPU busy fraction.

    Example: evo status r-20261130-1342-ab12 --json
    """
    from evo.results.status import run_status
    from evo.results.views import render_status
    from evo.store import StoreError

    with _open_reader(db) as store:
        try:
            data = run_status(store, run)
        except StoreError as e:
            _fail(_store_error_text(e))
    if as_json:
        _emit_json(data)
    else:
        _console().print(render_status(data))


def report(
    run: str = typer.Argument(..., help="Run id or unique prefix (see `evo runs`)."),
    out: Path = typer.Option(..., "--out", help="Directory for index.html and the plots (created)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU for the roofline (default: the run's)."),
    task_file: list[Path] = typer.Option([], "--task-file", help="Load user tasks from this .py file."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Write a static HTML report of a run: progress per task and island, failure funnel,
    champion lineage graph and roofline, plus the status tables. Open DIR/index.html.

    Example: evo report r-20261130-1342-ab12 --out reports/run1
    """
    from evo.results.report import ReportError, build_report
    from evo.store import StoreError

    task_registry = _load_task_files(task_file)
    with _open_reader(db) as store:
        try:
            res = build_report(store, run, out, gpu=gpu, task_registry=task_registry)
        except (StoreError, ReportError) as e:
            _fail(_store_error_text(e))
        except KeyError as e:  # an unknown --gpu
            _fail(str(e.args[0] if e.args else e))
    if as_json:
        _emit_json({"index": str(res.index), "plots": {k: str(v) for k, v in res.plots.items()},
                    "notes": list(res.notes)})
        return
    c = _console()
    c.print(f"report written: [bold]{res.index}[/] ({len(res.plots)} plots)")
    for n in res.notes:
        c.print(f"  note: {escape(n)}", highlight=False)


def export(
    target: str = typer.Argument(..., help="Run id (its champions) or candidate id (that kernel); prefixes work."),
    out: Path = typer.Option(..., "--out", help="Output directory; one subdirectory per task."),
    task: list[str] = typer.Option([], "--task", help="Only these tasks of the run (repeatable)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Arch of the prebuilt .so (default: the run's compile.arch)."),
    build: bool = typer.Option(True, "--build/--no-build", help="Build the .so now (needs nvcc)."),
    recheck: bool = typer.Option(True, "--recheck/--no-recheck",
                                 help="On a GPU machine, evaluate each built .so again through the judge and a "
                                      "sandboxed runner on every shape before writing it (a kernel that fails is "
                                      "skipped); the manifest records that check."),
    task_file: list[Path] = typer.Option([], "--task-file", help="Load user tasks from this .py file."),
    db: Optional[str] = DbOpt,
    as_json: bool = JsonOpt,
    progress: bool = ProgressOpt,
) -> None:
    """Export champions as standalone PyTorch ops: per task the .cu with tunables baked in,
    the ABI header, a prebuilt .so, build.sh for other archs, op.py registering
    torch.ops.evo.<task>, reference.py, test_op.py and manifest.json.

    Example: evo export r-20261130-1342-ab12 --out exported/
    """
    from evo.results.export import ExportError
    from evo.results.export import export as do_export
    from evo.store import StoreError

    from evo.engine.progress import StepProgress, progress_enabled

    task_registry = _load_task_files(task_file)
    with _open_reader(db) as store:
        try:
            with StepProgress("exporting" + (" (nvcc builds)" if build else ""), 1,
                              enabled=progress_enabled(progress) and not as_json) as bar:
                res = do_export(store, target, out, tasks=task or None, arch=arch, build=build, recheck=recheck,
                                on_task=lambda t, i, n: bar.update(t, i, n), task_registry=task_registry)
        except (StoreError, ExportError, ValueError) as e:
            _fail(_store_error_text(e))
    if as_json:
        _emit_json(res.as_dict())
    else:
        c = _console()
        t = _table(f"exported from run {res.run_id} into {res.out_dir}",
                   [("task", "id"), ("candidate", "id"), ("speedup", "num"), "chosen as", ".so"])
        for e in res.exported:
            t.add_row(e.task, e.candidate_id[:12], _fmt(e.fitness), e.selection,
                      e.so_path.name if e.so_path else f"[yellow]none[/]: {escape(e.so_note)}")
        c.print(t)
        for tk, why in res.skipped.items():
            c.print(f"[yellow]skipped[/] {tk}: {escape(why)}", highlight=False)
        if res.exported:
            first = res.exported[0]
            c.print(f"try it: cd {first.directory} && python -m pytest -q test_op.py")
    if not res.exported:
        raise typer.Exit(1)


def _load_task_files(files: list[Path]) -> Any:
    """The built-in tasks plus ``--task-file`` files (None without any); a file that fails
    ends the command with its error."""
    if not files:
        return None
    from evo.tasks.registry import BUILTIN_TASKS

    return with_task_files(BUILTIN_TASKS, files)
