"""Inspection commands of the ``evo`` CLI: ``status``, ``report``, ``export``, and the
renderers behind ``lineage --diff`` and ``show``.

``evo.cli`` owns the Typer app; this module adds its commands with :func:`register` (one line
in evo/cli.py: ``from evo.cli_inspect import register as _register_inspect;
_register_inspect(app)``) and offers :func:`print_lineage` / :func:`print_show` for the
``lineage`` and ``show`` commands. Every command is a thin layer over a Python function
(:func:`evo.status.run_status`, :func:`evo.report.build_report`, :func:`evo.export.export`,
:func:`evo.lineage.lineage_tree`, :func:`evo.lineage.candidate_details`), prints tables for
people and JSON with ``--json``, and turns the store's errors (unknown or ambiguous ids with
near matches, a database from a newer cute-evo, a missing file) into one red line and exit
code 2.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

__all__ = [
    "register",
    "render_runs",
    "top_data",
    "render_top",
    "tasks_json",
    "render_tasks",
    "check_family",
    "render_status",
    "render_lineage",
    "render_show",
    "print_lineage",
    "print_show",
]

from evo.cli_common import DbOpt, JsonOpt, ProgressOpt  # noqa: E402
from evo.cli_common import db_path as _db_path  # noqa: E402,F401
from evo.cli_common import emit_json as _emit_json  # noqa: E402
from evo.cli_common import fail as _fail  # noqa: E402
from evo.cli_common import fmt as _fmt  # noqa: E402
from evo.cli_common import open_reader as _open_reader  # noqa: E402
from evo.cli_common import resolve_run as _resolve_run  # noqa: E402
from evo.cli_common import short_time as _short_time  # noqa: E402
from evo.cli_common import store_error_text as _store_error_text  # noqa: E402
from evo.cli_common import table as _table  # noqa: E402

log = logging.getLogger(__name__)

_DbOpt = DbOpt
_JsonOpt = JsonOpt
_ProgressOpt = ProgressOpt


def _console() -> Console:
    return Console()


def _verdict(status: Optional[str]) -> str:
    if status is None:
        return "[dim]pending[/]"
    if status == "ok":
        return "[green]ok[/]"
    if status == "skipped":
        return "[yellow]skipped[/]"
    return f"[red]{escape(status)}[/]"


# --------------------------------------------------------------------------- runs / top / tasks


def render_runs(rows: list[dict[str, Any]], title: str) -> RenderableType:
    """``evo runs``: one row per run, the full run id always visible."""
    if not rows:
        return Text(f"{title}: no runs yet (start one with `evo search CONFIG`)")
    t = _table(title, [("run", "id"), "name", ("created", "word"), ("status", "word"), ("evals", "num"),
                       ("correct", "num")])
    for r in rows:  # candidates proposed but not yet evaluated: `evo status RUN`, and --json
        t.add_row(str(r["id"]), escape(str(r.get("name", ""))), _short_time(r.get("created")),
                  escape(str(r.get("status", ""))), _fmt(r.get("n_evaluated")), _fmt(r.get("n_correct")))
    return t


def top_data(store: Any, run: str, task: Optional[str], k: int) -> tuple[str, list[dict[str, Any]]]:
    """``(full run id, rows)`` for ``evo top``: ``run`` may be a unique prefix; ``k`` must be
    >= 1 and ``task`` one of the run's tasks, else one error line (exit 2)."""
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
    except StoreError as e:
        _fail(_store_error_text(e))
    return rid, [
        {"id": c.id, "task": c.task, "fitness": f, "operator": c.operator, "island": c.island,
         "generation": c.generation, "params": dict(c.params)}
        for c, f in rows
    ]


def render_top(run_id: str, data: list[dict[str, Any]]) -> RenderableType:
    """``evo top``: task and the 12-character candidate id (what ``evo show`` takes) always whole."""
    if not data:
        return Text(f"run {run_id} has no correct kernel yet (see `evo status {run_id}`)")
    t = _table(f"top kernels of {run_id}", [("task", "id"), ("candidate", "id"), ("speedup", "num"),
                                             "operator", ("island", "num"), ("gen", "num"), "params"])
    for d in data:
        t.add_row(d["task"], d["id"][:12], _fmt(d["fitness"]), escape(str(d["operator"])), str(d["island"]),
                  str(d["generation"]), escape(" ".join(f"{k}={v}" for k, v in d["params"].items())))
    return t


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


def tasks_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``evo tasks --json`` rows: :func:`evo.tasks.task_table`'s, with ``shapes`` and
    ``bench_shapes`` as lists of ``{dim: int}`` objects instead of printed strings."""
    import evo.tasks as T

    out = []
    for r in rows:
        task = T.get_task(r["name"])
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


# --------------------------------------------------------------------------- status


def render_status(data: dict[str, Any]) -> RenderableType:
    """Tables of :func:`evo.status.run_status`'s dict."""
    run = data["run"]
    prog = data["progress"]
    head = Table(title=f"run {run['id']} ({escape(str(run['name']))})", show_header=False)
    head.add_column("key", style="bold")
    head.add_column("value")
    status = run["status"] + ("  [red](stale: no event for a while; did the driver die?)[/]" if data["stale"] else "")
    head.add_row("status", status)
    if data.get("stop_reason"):
        head.add_row("stop reason", escape(str(data["stop_reason"])))
    head.add_row("created / updated", f"{_short_time(run['created'])} / {_short_time(run['updated'])} UTC")
    head.add_row("evaluations", f"{data['evaluations']} ({data['correct']} correct, {data['pending']} pending, "
                                f"{data['candidates']} candidates)")
    if prog:
        busy = f"{100 * prog['gpu_busy']:.0f}%" if prog.get("gpu_busy") is not None else "-"
        head.add_row("rate", f"{_fmt(prog.get('evals_per_min'), 2)} evals/min, GPU busy {busy}, "
                             f"in flight {_fmt(prog.get('in_flight'))}, compile queue "
                             f"{_fmt(prog.get('compile_queue'))}, GPU queue {_fmt(prog.get('gpu_queue'))}")
        head.add_row("last progress", f"{_short_time(prog.get('at'))} UTC ({_fmt(prog.get('age_s'), 0)} s ago)")
    sp = data["spend"]
    head.add_row("LLM spend", f"${sp['cost']:.4f} over {sp['n_calls']} calls ({sp['n_errors']} errors), "
                              f"{sp['tokens_in']} tokens in, {sp['tokens_out']} out")
    parts: list[RenderableType] = [head]

    if data["best"]:
        t = _table("best per task", [("task", "id"), ("candidate", "id"), ("speedup", "num"), "operator",
                                     ("island", "num"), ("gen", "num"), ("champion", "word")])
        for task, b in data["best"].items():
            champ = ("[green]confirmed[/]" if b["confirmed"] else "yes") if b["champion"] else "-"
            t.add_row(task, b["id"][:12], _fmt(b["fitness"]), escape(str(b["operator"])), _fmt(b["island"]),
                      _fmt(b["generation"]), champ)
        parts.append(t)
    if data["by_task"]:
        t = _table("per task", [("task", "id"), ("evaluations", "num"), ("correct", "num"), ("pending", "num")])
        for task, r in data["by_task"].items():
            t.add_row(task, str(r["evaluations"]), str(r["correct"]), str(r["pending"]))
        parts.append(t)
    if data["funnel"]:
        t = _table("funnel: evaluations per stage", [("stage", "word"), ("reached", "num"), ("passed", "num"),
                                                     "failed by verdict"])
        for r in data["funnel"]:
            failed = ", ".join(f"{k} {v}" for k, v in r["failed"].items()) or "-"
            t.add_row(r["stage"], str(r["entered"]), str(r["passed"]), failed)
        parts.append(t)
    return Group(*parts)


# --------------------------------------------------------------------------- lineage


def _stages_line(stages: list[dict[str, Any]]) -> str:
    bits = []
    for s in stages:
        v = "ok" if s["status"] == "ok" else s["status"]
        colour = "green" if v == "ok" else ("yellow" if v == "skipped" else "red")
        bits.append(f"{s['stage']} [{colour}]{escape(v)}[/]")
    return " > ".join(bits) or "[dim]not evaluated[/]"


def _node_label(n: dict[str, Any]) -> str:
    fit = _fmt(n["fitness"])
    return (f"[bold]{n['id'][:12]}[/] [cyan]{escape(n['operator'])}[/] gen {n['generation']} "
             f"island {n['island']}  {_verdict(n['status'])} speedup {fit}")


def _edge_summary(e: dict[str, Any]) -> str:
    bits = []
    if e.get("fitness_delta") is not None:
        d = e["fitness_delta"]
        colour = "green" if d > 0 else ("red" if d < 0 else "white")
        bits.append(f"[{colour}]fitness {d:+.3f}[/] (x{e['fitness_ratio']:.3f})" if e.get("fitness_ratio")
                    else f"[{colour}]fitness {d:+.3f}[/]")
    bits.append(f"+{e['added']} -{e['removed']} lines")
    if e["params_diff"]:
        bits.append("params " + escape(", ".join(e["params_diff"])))
    return "; ".join(bits)


def _profile_line(delta: dict[str, dict[str, float]], limit: int = 8) -> str:
    items = sorted(delta.items(), key=lambda kv: -abs(kv[1]["delta"]) / (abs(kv[1]["parent"]) + 1e-12))[:limit]
    return "profile: " + ", ".join(
        f"{escape(k)} {v['parent']:.4g} -> {v['child']:.4g}" for k, v in items
    ) + (" ..." if len(delta) > limit else "")


def render_lineage(nodes: list[dict[str, Any]], *, diff: bool = False) -> RenderableType:
    """A rich tree of :func:`evo.lineage.lineage_tree`'s nodes: the candidate at the root,
    its parents below it, each edge labelled with the operator that made the child, the
    fitness delta, the diff size and changed tunables, the child's stage verdicts and
    profile deltas; ``diff=True`` adds the full unified diff (source and params) per edge."""
    if not nodes:
        return Text("(no lineage)")
    by_id = {n["id"]: n for n in nodes}
    root_node = nodes[0]
    root = Tree(_node_label(root_node))
    expanded: set[str] = set()

    def grow(tree: Tree, n: dict[str, Any]) -> None:
        expanded.add(n["id"])
        tree.add(f"[dim]stages:[/] {_stages_line(n['stages'])}")
        for e in n["edges"]:
            pid = e["parent"]
            tag = "parent" if e["position"] == 0 else f"parent {e['position'] + 1} (crossover)"
            if not e["present"]:
                tree.add(f"[dim]{tag} {pid[:12]}: not in this database (lineage stops here)[/]")
                continue
            parent = by_id[pid]
            edge = tree.add(f"[magenta]<- {escape(n['operator'])}[/] from {tag}: {_edge_summary(e)}")
            if e.get("profile_delta"):
                edge.add(_profile_line(e["profile_delta"]))
            if diff and e.get("diff"):
                edge.add(Syntax(e["diff"], "diff", theme="ansi_dark", word_wrap=False))
            sub = edge.add(_node_label(parent))
            if pid in expanded:
                sub.add("[dim](its ancestry is shown above)[/]")
            else:
                grow(sub, parent)

    grow(root, root_node)
    return root


def print_lineage(store: Any, cid: str, *, diff: bool = False, as_json: bool = False,
                  run_id: Optional[str] = None, console: Optional[Console] = None) -> None:
    """What ``evo lineage ID [--diff] [--json]`` prints, for a resolved full id ``cid``.

    JSON is :func:`evo.lineage.lineage_tree`'s list; without ``--diff`` the diff texts are
    left out of it (the ``added``/``removed`` counts remain). Store errors propagate (the caller maps
    them to its error line)."""
    from evo.lineage import lineage_tree

    nodes = lineage_tree(store, cid, run_id=run_id)
    if as_json:
        if not diff:
            for n in nodes:
                for e in n["edges"]:
                    e.pop("diff", None)
        _emit_json(nodes)
        return
    (console or _console()).print(render_lineage(nodes, diff=diff))


# --------------------------------------------------------------------------- show


def _metrics_summary(stage: dict[str, Any]) -> str:
    m = stage.get("metrics") or {}
    if stage["stage"] == "timing" and m.get("shapes"):
        rows = []
        for r in m["shapes"]:
            if isinstance(r, dict) and "median_ms" in r:
                rows.append(f"{r.get('shape')}: {r['median_ms']:.4g} ms vs ref {r.get('ref_median_ms', float('nan')):.4g} ms"
                            f" (x{r.get('speedup', float('nan')):.3f})")
        return "; ".join(rows)
    if stage["stage"] == "compile":
        keys = ("registers", "smem_bytes", "spill_stores", "spill_loads", "wgmma_serialized", "nvcc_seconds")
        return ", ".join(f"{k} {m[k]}" for k in keys if k in m)
    flat = {k: v for k, v in m.items() if isinstance(v, (int, float, str, bool))}
    return ", ".join(f"{k} {v}" for k, v in list(flat.items())[:8])


def render_show(d: dict[str, Any], *, source: bool = True) -> RenderableType:
    """The view of :func:`evo.lineage.candidate_details`: identity, params, verdicts with
    metrics, profiles, the LLM prompt/response that made it, and the source."""
    parts: list[RenderableType] = []
    head = Table(show_header=False, title=f"candidate {d['id']}")
    head.add_column("key", style="bold")
    head.add_column("value")
    head.add_row("task", d["task"])
    head.add_row("operator", escape(d["operator"]))
    head.add_row("generation / island", f"{d['generation']} / {d['island']}")
    head.add_row("parents", ", ".join(p[:12] for p in d["parents"]) or "-")
    head.add_row("children", ", ".join(c[:12] for c in d["children"]) or "-")
    head.add_row("params", escape(" ".join(f"{k}={v}" for k, v in d["params"].items())) or "-")
    head.add_row("status", f"{_verdict(d['status'])}  speedup {_fmt(d['fitness'])}"
                           + (f"  on {escape(d['gpu'])}" if d.get("gpu") else ""))
    head.add_row("run", f"{d['run_id'] or '-'} (in runs: {', '.join(d['runs']) or '-'})")
    for ch in d["champion_of"]:
        conf = "confirmed" if ch["confirmation"].get("confirmed") else "not confirmed"
        head.add_row("champion", f"{ch['task']} in {ch['run_id']} ({conf})")
    if d.get("notes"):
        head.add_row("notes", escape(d["notes"]))
    parts.append(head)
    if d["stages"]:
        t = Table(title="stages")
        for col in ("stage", "verdict", "seconds", "reason / metrics"):
            t.add_column(col)
        for s in d["stages"]:
            detail = s["reason"] or _metrics_summary(s)
            t.add_row(s["stage"], _verdict(s["status"]), _fmt(s["seconds"], 2), escape(detail))
        parts.append(t)
        for s in d["stages"]:
            errs = (s.get("artifacts") or {}).get("errors")
            if s["status"] not in ("ok", "skipped") and errs:
                parts.append(Panel(Text(errs), title=f"{s['stage']} errors"))
    for p in d["profiles"]:
        t = Table(title=f"profile on {p['shape']} ({p['gpu']})")
        t.add_column("metric")
        t.add_column("value")
        for k, v in sorted((p.get("metrics") or {}).items()):
            t.add_row(escape(str(k)), escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
        parts.append(t)
    for c in d["llm_calls"]:
        title = (f"LLM call {c['id']}: {c.get('model')} ({c.get('kind')}), {c.get('tokens_in')} in / "
                 f"{c.get('tokens_out')} out tokens, ${c.get('cost') or 0:.4f}, {_fmt(c.get('latency_s'), 1)} s"
                 + (" (cached)" if c.get("cached") else ""))
        parts.append(Panel(Text(c.get("prompt") or ""), title=escape(title) + " - prompt"))
        parts.append(Panel(Text(c.get("response") or ""), title="response"))
        if c.get("error"):
            parts.append(Text(f"error: {c['error']}", style="red"))
    if source:
        parts.append(Panel(Syntax(d["source"], "cpp", theme="ansi_dark", line_numbers=True), title="source"))
    return Group(*parts)


def print_show(store: Any, cid: str, *, as_json: bool = False, source: bool = True,
               run_id: Optional[str] = None, console: Optional[Console] = None) -> None:
    """What ``evo show ID [--json] [--no-source]`` prints, for a resolved full id ``cid``."""
    from evo.lineage import candidate_details

    d = candidate_details(store, cid, run_id=run_id)
    if as_json:
        if not source:
            d.pop("source")
        _emit_json(d)
        return
    (console or _console()).print(render_show(d, source=source))


# --------------------------------------------------------------------------- commands


def register(app: typer.Typer) -> None:
    """Add ``status``, ``report`` and ``export`` to the ``evo`` Typer app."""

    @app.command()
    def status(
        run: str = typer.Argument(..., help="Run id or unique prefix (see `evo runs`)."),
        db: Optional[str] = _DbOpt,
        as_json: bool = _JsonOpt,
    ) -> None:
        """Where a run stands, live or finished: evaluations, failures by stage, best per task,
        LLM spend, evaluation rate and GPU busy fraction.

        Example: evo status r-20261130-1342-ab12 --json
        """
        from evo.status import run_status
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

    @app.command()
    def report(
        run: str = typer.Argument(..., help="Run id or unique prefix (see `evo runs`)."),
        out: Path = typer.Option(..., "--out", help="Directory for index.html and the plots (created)."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU for the roofline (default: the run's)."),
        task_file: list[Path] = typer.Option([], "--task-file", help="Load user tasks from this .py file."),
        db: Optional[str] = _DbOpt,
        as_json: bool = _JsonOpt,
    ) -> None:
        """Write a static HTML report of a run: progress per task and island, failure funnel,
        champion lineage graph and roofline, plus the status tables. Open DIR/index.html.

        Example: evo report r-20261130-1342-ab12 --out reports/run1
        """
        from evo.report import ReportError, build_report
        from evo.store import StoreError

        _load_task_files(task_file)
        with _open_reader(db) as store:
            try:
                res = build_report(store, run, out, gpu=gpu)
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

    @app.command()
    def export(
        target: str = typer.Argument(..., help="Run id (its champions) or candidate id (that kernel); prefixes work."),
        out: Path = typer.Option(..., "--out", help="Output directory; one subdirectory per task."),
        task: list[str] = typer.Option([], "--task", help="Only these tasks of the run (repeatable)."),
        arch: Optional[str] = typer.Option(None, "--arch", help="Arch of the prebuilt .so (default: the run's compile.arch)."),
        build: bool = typer.Option(True, "--build/--no-build", help="Build the .so now (needs nvcc)."),
        task_file: list[Path] = typer.Option([], "--task-file", help="Load user tasks from this .py file."),
        db: Optional[str] = _DbOpt,
        as_json: bool = _JsonOpt,
        progress: bool = _ProgressOpt,
    ) -> None:
        """Export champions as standalone PyTorch ops: per task the .cu with tunables baked in,
        the ABI header, a prebuilt .so, build.sh for other archs, op.py registering
        torch.ops.evo.<task>, reference.py, test_op.py and manifest.json.

        Example: evo export r-20261130-1342-ab12 --out exported/
        """
        from evo.export import ExportError
        from evo.export import export as do_export
        from evo.store import StoreError

        from evo.progress import StepProgress, progress_enabled

        _load_task_files(task_file)
        with _open_reader(db) as store:
            try:
                with StepProgress("exporting" + (" (nvcc builds)" if build else ""), 1,
                                  enabled=progress_enabled(progress) and not as_json) as bar:
                    res = do_export(store, target, out, tasks=task or None, arch=arch, build=build,
                                    on_task=lambda t, i, n: bar.update(t, i, n))
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


def _load_task_files(files: list[Path]) -> None:
    if not files:
        return
    import evo.tasks as T

    for f in files:
        try:
            T.load_task_file(f)
        except (OSError, ValueError, TypeError) as e:
            _fail(str(e))
