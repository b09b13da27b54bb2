"""A static HTML report of one run: ``evo report RUN --out DIR``.

``DIR/index.html`` plus one PNG per plot, viewable from disk (no server, no JavaScript, no
network). Plots are drawn with matplotlib's object API on the Agg canvas (no pyplot global
state, no display needed):

``progress.png``   best speedup so far against the run's evaluation count, one panel per
                   task, one line per island (the dashed line is the task's overall best);
``funnel.png``     the failure funnel: per cascade stage, evaluations that reached it, passed,
                   and failed by verdict (:func:`evo.results.status.failure_funnel`);
``lineage.png``    the ancestry of each task's champion: generation on x, fitness on y,
                   edges to parents, colour by operator; unevaluated or failed ancestors sit
                   on the bottom line as crosses;
``roofline.png``   each champion's position under the roofline of the run's GPU: arithmetic
                   intensity = task FLOPs / compulsory bytes at the first benchmark shape,
                   achieved FLOP/s = FLOPs / the champion's measured median time there; roofs
                   from :class:`evo.tasks.gpus.GpuSpec` (measured copy bandwidth; bf16 or tf32
                   tensor-core peak by task dtype). The reference's point is drawn hollow.

The page also carries the tables of :func:`evo.results.status.run_status` (counts, failures, best
per task, spend; best per task shows "vs eager" and "vs compile" when the compiled reference
was timed, the fitness basis marked, and "gain over seed" with its interval and verdict when the
champion confirmation measured one). Anything that cannot be drawn (a task unknown to this install, a champion
without timing metrics) is listed under "Notes" rather than failing the report.

matplotlib (>= 3.8) is a runtime dependency of this command only; without it
:class:`ReportError` says how to install it.
"""

from __future__ import annotations

import html
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from evo.core.records import Candidate, Evaluation
from evo.results.status import run_status
from evo.results.tables import BASIS_NOTE, both_timed, gain_text, seed_stays, speedup_cells

if TYPE_CHECKING:  # pragma: no cover
    from evo.store import Store

__all__ = [
    "ReportError",
    "ReportResult",
    "PLOTS",
    "build_report",
    "progress_series",
    "champion_points",
]

log = logging.getLogger(__name__)

#: Plot file stems, in page order; each is an ``<img id="plot-<stem>">`` on the page.
PLOTS = ("progress", "funnel", "lineage", "roofline")
_OPERATOR_COLORS = {
    "seed": "#555555", "knobs": "#1f77b4", "crossover": "#9467bd", "optuna": "#2ca02c",
    "llm": "#d62728", "user": "#8c564b",
}
_STATUS_COLORS = {
    "rejected": "#8c564b", "compile_error": "#ff7f0e", "incorrect": "#d62728", "invalid": "#e377c2",
    "timeout": "#bcbd22", "crash": "#7f7f7f",
}


class ReportError(RuntimeError):
    """The report cannot be written (matplotlib missing, output directory unusable)."""


@dataclass(frozen=True)
class ReportResult:
    """What :func:`build_report` wrote: the page, each plot's file, and notes about what
    could not be drawn."""

    index: Path
    plots: dict[str, Path]
    notes: tuple[str, ...] = field(default_factory=tuple)


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ReportError(
            "evo report draws its plots with matplotlib, which is not installed; install it "
            "with `pip install 'matplotlib>=3.8'`"
        ) from e
    return Figure


def _op_family(op: str) -> str:
    return op.split(":", 1)[0] if op else "?"


# --------------------------------------------------------------------------- data


def progress_series(cands: dict[str, Candidate], evals: Sequence[Evaluation]) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """Best-so-far fitness steps: ``{task: {island: [(evaluation number, best), ...]}}``.

    Evaluation numbers count the run's evaluations from 1 in recorded order; a point is
    emitted each time an island's best improves.
    """
    out: dict[str, dict[int, list[tuple[int, float]]]] = {}
    best: dict[tuple[str, int], float] = {}
    for n, ev in enumerate(evals, start=1):
        c = cands.get(ev.candidate_id)
        if c is None:
            continue
        out.setdefault(c.task, {})
        if not ev.correct:
            continue
        key = (c.task, c.island)
        fit = float(ev.fitness)  # type: ignore[arg-type]
        if fit > best.get(key, -math.inf):
            best[key] = fit
            out[c.task].setdefault(c.island, []).append((n, fit))
    return out


def _bench_timing(ev: Evaluation | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    t = ev.stage("timing")
    shapes = (t.metrics.get("shapes") if t else None) or []
    if not shapes or not isinstance(shapes[0], dict) or not shapes[0].get("median_ms"):
        return None
    return shapes[0]


def champion_points(store: "Store", run_id: str, champions: dict[str, str],
                    gpu_name: str | None = None, task_registry: Any = None) -> tuple[list[dict[str, Any]], Any, list[str]]:
    """Roofline points for ``{task: candidate id}``: ``(points, GpuSpec, notes)``.

    Each point: task, id, dtype, intensity (FLOP/byte), flops_per_s (achieved), ref_flops_per_s,
    median_ms, shape, compute_peak (FLOP/s). The GPU is ``gpu_name`` if given, else the one
    the champions were measured on, else the H200 (said in a note). Tasks are looked up in
    ``task_registry`` (None: the built-in tasks).
    """
    import evo.tasks as T
    from evo.tasks.gpus import compute_peak_tflops, match_gpu

    tasks = T.BUILTIN_TASKS if task_registry is None else task_registry

    notes: list[str] = []
    points: list[dict[str, Any]] = []
    evs = {task: store.get_evaluation(cid, run_id) for task, cid in champions.items()}
    spec = None
    if gpu_name:
        spec = T.get_gpu(gpu_name)
    else:
        for ev in evs.values():
            name = (ev.env.get("gpu") if ev else None) or (ev.gpu if ev else "")
            if name and match_gpu(name):
                spec = match_gpu(name)
                break
        if spec is None:
            spec = T.get_gpu("H200")
            notes.append("roofline: the champions' GPU is not recorded or not in the spec table; "
                         "drawn against the H200")
    for task_name, cid in sorted(champions.items()):
        try:
            task = tasks.get(task_name)
        except KeyError:
            notes.append(f"roofline: task {task_name!r} is not registered in this install "
                         "(a user task? load its file); its champion is not drawn")
            continue
        timing = _bench_timing(evs.get(task_name))
        if timing is None:
            notes.append(f"roofline: the champion of {task_name} has no timing metrics; not drawn")
            continue
        shape = timing.get("shape") or dict(task.benchmark_shapes[0])
        flops, nbytes = float(task.flops(shape)), float(task.bytes(shape))
        if flops <= 0 or nbytes <= 0:
            notes.append(f"roofline: {task_name} has no FLOPs or bytes at {shape}; not drawn")
            continue
        ms = float(timing["median_ms"])
        ref_ms = timing.get("ref_median_ms")
        points.append({
            "task": task_name, "id": cid, "dtype": task.dtype, "shape": shape,
            "intensity": flops / nbytes, "flops_per_s": flops / (ms * 1e-3), "median_ms": ms,
            "ref_flops_per_s": flops / (float(ref_ms) * 1e-3) if ref_ms else None,
            "compute_peak": compute_peak_tflops(task, spec) * 1e12,
        })
    return points, spec, notes


# --------------------------------------------------------------------------- plots


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(1, n))
    return (n + cols - 1) // cols, cols


def _plot_progress(path: Path, series: dict[str, dict[int, list[tuple[int, float]]]], n_evals: int) -> None:
    Figure = _figure_class()
    tasks = sorted(series) or ["(no evaluations)"]
    rows, cols = _grid(len(tasks))
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows), layout="constrained")
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(rows, cols, i + 1)
        islands = series.get(task, {})
        overall: list[tuple[int, float]] = []
        for island, pts in sorted(islands.items()):
            xs = [p[0] for p in pts] + [max(n_evals, pts[-1][0])]
            ys = [p[1] for p in pts] + [pts[-1][1]]
            ax.step(xs, ys, where="post", label=("seed (all islands)" if island < 0 else f"island {island}"), linewidth=1.4)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", markersize=3,
                    color=ax.lines[-1].get_color())
            overall.extend(pts)
        if overall:
            overall.sort()
            bx, by, cur = [], [], -math.inf
            for x, y in overall:
                if y > cur:
                    cur = y
                    bx.append(x)
                    by.append(y)
            bx.append(max(n_evals, bx[-1]))
            by.append(by[-1])
            ax.step(bx, by, where="post", color="black", linestyle="--", linewidth=1.0, label="task best")
            ax.axhline(1.0, color="#999999", linewidth=0.8, linestyle=":")
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no correct kernel yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best speedup vs reference")
        ax.set_xlim(0, max(n_evals, 1))
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)


def _plot_funnel(path: Path, funnel: list[dict[str, Any]]) -> None:
    Figure = _figure_class()
    fig = Figure(figsize=(8.0, 0.7 * max(len(funnel), 2) + 1.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    if not funnel:
        ax.text(0.5, 0.5, "no evaluations yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        fig.savefig(path, dpi=100)
        return
    names = [r["stage"] for r in funnel][::-1]
    rows = funnel[::-1]
    ys = list(range(len(rows)))
    ax.barh(ys, [r["passed"] for r in rows], color="#2ca02c", label="passed")
    statuses = sorted({s for r in rows for s in r["failed"]})
    left = [r["passed"] for r in rows]
    for st in statuses:
        vals = [r["failed"].get(st, 0) for r in rows]
        ax.barh(ys, vals, left=left, color=_STATUS_COLORS.get(st, "#17becf"), label=st)
        left = [a + b for a, b in zip(left, vals)]
    for y, r in zip(ys, rows):
        ax.text(r["entered"], y, f"  {r['passed']}/{r['entered']}", va="center", fontsize=8)
    ax.set_yticks(ys, names)
    ax.set_xlabel("evaluations reaching the stage")
    ax.set_xlim(0, max(r["entered"] for r in rows) * 1.18 + 1)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("failure funnel by stage")
    fig.savefig(path, dpi=100)


def _plot_lineage(path: Path, trees: dict[str, list[dict[str, Any]]]) -> None:
    Figure = _figure_class()
    tasks = sorted(trees) or ["(no champions)"]
    rows, cols = _grid(len(tasks))
    fig = Figure(figsize=(5.0 * cols, 3.6 * rows), layout="constrained")
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(rows, cols, i + 1)
        nodes = trees.get(task, [])
        if not nodes:
            ax.text(0.5, 0.5, "no champion", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(task, fontsize=10)
            continue
        fits = [n["fitness"] for n in nodes if n["fitness"] is not None]
        lo = min(fits) if fits else 0.0
        hi = max(fits) if fits else 1.0
        floor = lo - 0.12 * max(hi - lo, 0.1)
        pos = {n["id"]: (n["generation"], n["fitness"] if n["fitness"] is not None else floor) for n in nodes}
        for n in nodes:
            for e in n["edges"]:
                if e["parent"] in pos:
                    (x0, y0), (x1, y1) = pos[e["parent"]], pos[n["id"]]
                    ax.plot([x0, x1], [y0, y1], color="#bbbbbb", linewidth=0.9, zorder=1,
                            linestyle="-" if e["position"] == 0 else ":")
        seen_ops: set[str] = set()
        for n in nodes:
            x, y = pos[n["id"]]
            fam = _op_family(n["operator"])
            color = _OPERATOR_COLORS.get(fam, "#17becf")
            label = fam if fam not in seen_ops else None
            seen_ops.add(fam)
            marker = "o" if n["fitness"] is not None else "x"
            ax.scatter([x], [y], color=color, marker=marker, s=28, zorder=2, label=label)
        champ = nodes[0]
        cx, cy = pos[champ["id"]]
        ax.scatter([cx], [cy], marker="*", s=220, color="gold", edgecolors="black", zorder=3, label="champion")
        ax.annotate(champ["id"][:8], (cx, cy), textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.set_title(f"{task}: champion lineage ({len(nodes)} kernels)", fontsize=10)
        ax.set_xlabel("generation")
        ax.set_ylabel("speedup (x = not correct)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.savefig(path, dpi=100)


def _plot_roofline(path: Path, points: list[dict[str, Any]], spec: Any) -> None:
    Figure = _figure_class()
    fig = Figure(figsize=(8.0, 5.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    bw = spec.bandwidth_gbs * 1e9
    ai = [p["intensity"] for p in points] or [1.0]
    x_lo = min(min(ai) / 10.0, 0.01)
    x_hi = max(max(ai) * 10.0, 1000.0)
    peaks = sorted({p["compute_peak"] for p in points}) or [spec.peak_bf16_tflops * 1e12]
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    for peak in peaks:
        ax.plot(xs, [min(bw * x, peak) for x in xs], color="black", linewidth=1.2)
        ax.text(x_hi, peak, f" {peak / 1e12:.0f} TFLOP/s", va="bottom", ha="right", fontsize=8)
    ax.text(x_lo * 1.5, bw * x_lo * 1.5, f"{spec.bandwidth_gbs:.0f} GB/s", rotation=28, fontsize=8)
    for i, p in enumerate(points):
        color = f"C{i % 10}"
        ax.scatter([p["intensity"]], [p["flops_per_s"]], color=color, s=60, zorder=3,
                   label=f"{p['task']} ({p['median_ms']:.3g} ms)")
        if p["ref_flops_per_s"]:
            ax.scatter([p["intensity"]], [p["ref_flops_per_s"]], facecolors="none", edgecolors=color,
                       s=60, zorder=3)
    if not points:
        ax.text(0.5, 0.5, "no timed champion to place", ha="center", va="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP / compulsory byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"champions on the {spec.name} roofline (hollow: reference)")
    ax.grid(alpha=0.3, which="both")
    if points:
        ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path, dpi=100)


# --------------------------------------------------------------------------- page


def _e(x: Any) -> str:
    return html.escape("-" if x is None else str(x))


def _num(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, tid: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{tid}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f4f4f4; } figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; } code { font-size: 0.9em; }
"""

_CAPTIONS = {
    "progress": "Best speedup so far against the number of evaluations, per task and island.",
    "funnel": "Failure funnel: evaluations that reached each stage, passed, and failed by verdict.",
    "lineage": "Lineage of each task's champion: generation (x), fitness (y), edges to parents.",
    "roofline": "Champions under the roofline of the GPU (filled) and the reference (hollow).",
}


def _champion(b: dict[str, Any]) -> str:
    """The "champion" cell: confirmed / yes / no, or which seed stayed champion."""
    if b["champion"]:
        return "confirmed" if b["confirmed"] else "yes"
    return f"no: seed {b['champion_id'][:12]} stays" if seed_stays(b) else "no"


def _page(status: dict[str, Any], plots: dict[str, str], notes: Sequence[str], gpu: str) -> str:
    run = status["run"]
    prog = status["progress"]
    summary = _table(
        ["run", "name", "status", "created", "updated", "evaluations", "correct", "pending", "LLM cost",
         "evals/min", "slot occupancy", "GPU activity"],
        [[run["id"], run["name"], run["status"] + (" (stale)" if status["stale"] else ""), run["created"],
          run["updated"], status["evaluations"], status["correct"], status["pending"],
          f"${status['spend']['cost']:.4f}", _num(prog.get("evals_per_min"), 2),
          f"{100 * prog['gpu_busy']:.0f}%" if prog.get("gpu_busy") is not None else "-",
          "not measured" if prog.get("gpu_activity") is None else f"{100 * prog['gpu_activity']:.0f}%"]],
        tid="summary",
    )
    both = both_timed(status["best"].values())
    gains = any(b.get("gain") for b in status["best"].values())
    best = _table(
        ["task", "candidate", *(["vs eager", "vs compile"] if both else ["speedup"]), "operator", "island",
         "generation", "champion", *(["gain over seed"] if gains else [])],
        [[t, b["id"][:12], *(speedup_cells(b) if both else [_num(b["fitness"])]), b["operator"], b["island"],
          b["generation"], _champion(b), *([gain_text(b.get("gain"), b.get("verdict"))] if gains else [])]
         for t, b in status["best"].items()],
        tid="best",
    ) + (f'<p id="best-note">{_e(BASIS_NOTE)}; vs eager: against the reference run eagerly, vs compile: '
         "against it under torch.compile, both timed in the same process by the same protocol.</p>"
         if both else "") + (
        '<p id="gain-note">gain over seed: the speedup of the best over the task\'s seed from the champion '
        "confirmation's paired re-timing, ratio [confidence interval]; without a significant gain the seed "
        "stays champion.</p>" if gains else "")
    fails = _table(
        ["stage", "reached", "passed", "failed by verdict"],
        [[r["stage"], r["entered"], r["passed"], ", ".join(f"{k} {v}" for k, v in r["failed"].items()) or "-"]
         for r in status["funnel"]],
        tid="funnel",
    )
    sp = status["spend"]
    spend = _table(["LLM calls", "errors", "tokens in", "tokens out", "cost (USD)"],
                   [[sp["n_calls"], sp["n_errors"], sp["tokens_in"], sp["tokens_out"], f"{sp['cost']:.4f}"]],
                   tid="spend")
    figs = "".join(
        f'<figure><img id="plot-{name}" src="{html.escape(fname)}" alt="{html.escape(_CAPTIONS[name])}">'
        f"<figcaption>{html.escape(_CAPTIONS[name])}</figcaption></figure>"
        for name, fname in plots.items()
    )
    note_html = "".join(f"<li>{_e(n)}</li>" for n in notes) or "<li>none</li>"
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>cute-evo report: {_e(run['id'])}</title><style>{_CSS}</style></head><body>"
        f"<h1>cute-evo run <code>{_e(run['id'])}</code> ({_e(run['name'])})</h1>"
        f"<p>Generated {made} from the lineage database; GPU for the roofline: {_e(gpu)}. "
        f"Stop reason: {_e(status['stop_reason'])}.</p>"
        f"<h2>Summary</h2>{summary}<h2>Best per task</h2>{best}"
        f"<h2>Plots</h2>{figs}<h2>Failures by stage</h2>{fails}<h2>Spend</h2>{spend}"
        f"<h2>Notes</h2><ul id=\"notes\">{note_html}</ul></body></html>\n"
    )


def build_report(store: "Store", run_id: str, out_dir: str | Path, *, gpu: str | None = None,
                 task_registry: Any = None) -> ReportResult:
    """Write ``out_dir/index.html`` and the plots of run ``run_id`` (id or unique prefix).

    ``gpu`` names the GPU whose roofline is drawn (default: the one the champions were
    measured on). Champions are the store's champion rows, or each task's best correct
    kernel where a task has none; their tasks are looked up in ``task_registry`` (None: the
    built-in tasks). Raises :class:`~evo.store.UnknownIdError` for an unknown run and
    :class:`ReportError` when matplotlib is missing or ``out_dir`` is not writable.
    """
    from evo.results.lineage import lineage_tree

    _figure_class()  # fail before doing any work
    from evo.results.status import resolve_run

    rid = resolve_run(store, run_id)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create the report directory {out}: {e}") from e
    status = run_status(store, rid)
    cands = {c.id: c for c in store.candidates(rid)}
    evals = store.evaluations(rid)
    notes: list[str] = []

    champions = {c["task"]: c["candidate_id"] for c in store.champions(rid)}
    for task, b in status["best"].items():
        if task not in champions:
            champions[task] = b["id"]
            notes.append(f"{task}: no champion row recorded; its best correct kernel stands in")
    trees = {task: lineage_tree(store, cid, run_id=rid) for task, cid in champions.items()}
    points, spec, roof_notes = champion_points(store, rid, champions, gpu, task_registry)
    notes.extend(roof_notes)

    files: dict[str, Path] = {name: out / f"{name}.png" for name in PLOTS}
    try:
        _plot_progress(files["progress"], progress_series(cands, evals), len(evals))
        _plot_funnel(files["funnel"], status["funnel"])
        _plot_lineage(files["lineage"], trees)
        _plot_roofline(files["roofline"], points, spec)
        index = out / "index.html"
        index.write_text(_page(status, {k: v.name for k, v in files.items()}, notes, spec.name), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the report into {out}: {e}") from e
    log.info("report of %s written to %s", rid, index)
    return ReportResult(index=index, plots=files, notes=tuple(notes))
