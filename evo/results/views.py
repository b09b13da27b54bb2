"""Terminal views of a run's records (rich renderables): the runs of a database, a run's
top kernels, its status, a kernel's lineage tree and its details.

Each takes the plain data of :mod:`evo.results.status` / :mod:`evo.results.lineage` (or the
store's rows) and returns something ``rich.console.Console.print`` draws; the ``evo``
commands (:mod:`evo.cli.inspect`) print them, or that same data as JSON with ``--json``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from evo.results.tables import BASIS_NOTE, both_timed, gain_cells, gain_text, seed_stays, speedup_cells
from evo.results.tables import fmt as _fmt
from evo.results.tables import short_time as _short_time
from evo.results.tables import table as _table

__all__ = ["render_runs", "render_top", "render_status", "render_lineage", "render_show"]


def _verdict(status: Optional[str]) -> str:
    if status is None:
        return "[dim]pending[/]"
    if status == "ok":
        return "[green]ok[/]"
    if status == "skipped":
        return "[yellow]skipped[/]"
    return f"[red]{escape(status)}[/]"


# --------------------------------------------------------------------------- runs / top


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


def render_top(run_id: str, data: list[dict[str, Any]]) -> RenderableType:
    """``evo top``: task and the 12-character candidate id (what ``evo show`` takes) always whole."""
    if not data:
        return Text(f"run {run_id} has no correct kernel yet (see `evo status {run_id}`)")
    both = both_timed(data)
    t = _table(f"top kernels of {run_id}", [("task", "id"), ("candidate", "id"), *_speedup_columns(both),
                                             "operator", ("island", "num"), ("gen", "num"), "params"],
               **({"caption": escape(BASIS_NOTE)} if both else {}))
    for d in data:
        t.add_row(d["task"], d["id"][:12], *_speedups(d, both), escape(str(d["operator"])), str(d["island"]),
                  str(d["generation"]), escape(" ".join(f"{k}={v}" for k, v in d["params"].items())))
    return t


def _speedup_columns(both: bool) -> list[tuple[str, str]]:
    """One "speedup" column (the fitness), or "vs eager" and "vs compile" when a row timed both."""
    return [("vs eager", "num"), ("vs compile", "num")] if both else [("speedup", "num")]


def _speedups(d: dict[str, Any], both: bool) -> tuple[str, ...]:
    return speedup_cells(d) if both else (_fmt(d["fitness"]),)


# --------------------------------------------------------------------------- status


def render_status(data: dict[str, Any]) -> RenderableType:
    """Tables of :func:`evo.results.status.run_status`'s dict."""
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
        act = prog.get("gpu_activity")   # NVML, sampled by the GPU actors; absent: not measured
        act = "not measured" if act is None else f"{100 * act:.0f}%"
        head.add_row("rate", f"{_fmt(prog.get('evals_per_min'), 2)} evals/min, slot occupancy {busy}, "
                             f"GPU activity {act}, "
                             f"in flight {_fmt(prog.get('in_flight'))}, compile queue "
                             f"{_fmt(prog.get('compile_queue'))}, GPU queue {_fmt(prog.get('gpu_queue'))}")
        head.add_row("last progress", f"{_short_time(prog.get('at'))} UTC ({_fmt(prog.get('age_s'), 0)} s ago)")
    sp = data["spend"]
    head.add_row("LLM spend", f"${sp['cost']:.4f} over {sp['n_calls']} calls ({sp['n_errors']} errors), "
                              f"{sp['tokens_in']} tokens in, {sp['tokens_out']} out")
    parts: list[RenderableType] = [head]

    if data["best"]:
        both = both_timed(data["best"].values())
        t = _table("best per task", [("task", "id"), ("candidate", "id"), *_speedup_columns(both), "operator",
                                     ("island", "num"), ("gen", "num"), ("champion", "word")],
                   **({"caption": escape(BASIS_NOTE)} if both else {}))
        for task, b in data["best"].items():
            t.add_row(task, b["id"][:12], *_speedups(b, both), escape(str(b["operator"])), _fmt(b["island"]),
                      _fmt(b["generation"]), _champion_cell(b))
        parts.append(t)
        confirmed = {task: b for task, b in data["best"].items() if b.get("gain")}
        if confirmed:
            t = _table("champion confirmation: the best re-timed against its seed", [
                ("task", "id"), ("champion", "id"), ("gain over seed", "num"), ("interval", "word"), "verdict"],
                caption="paired fresh-process rounds; without a significant gain the seed stays champion")
            for task, b in confirmed.items():
                t.add_row(task, str(b["champion_id"])[:12], *(escape(c) for c in gain_cells(b["gain"], b["verdict"])))
            parts.append(t)
    llm = data.get("llm")
    if llm:
        parts.append(_llm_table(llm))
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


def _counts(d: dict[str, int]) -> str:
    """``{reason: n}`` as one ``reason n`` line each, the most frequent first."""
    return "\n".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def _llm_table(llm: dict[str, Any]) -> RenderableType:
    """Per model: what :func:`evo.results.llm_status.llm_status` counted, the budget in the
    caption, then one line per stopped model with why."""
    if llm.get("budget_usd") is not None:
        caption = f"budget ${llm['budget_usd']:.2f}: ${llm['spent']:.4f} spent, ${llm['budget_left']:.4f} left"
    else:
        caption = f"${llm['spent']:.4f} spent (no budget recorded)"
    t = _table("LLM models", [("model", "id"), ("calls", "num"), ("children", "num"), ("repairs", "word"),
                              ("rejected", "word"), ("no answer", "word"), ("spend", "num")],
               caption=caption + "; rejected: answers refused before compiling, by reason")
    stopped: list[RenderableType] = []
    for m in llm["models"]:
        name = escape(m["model"]) + (" [red](stopped)[/]" if m["stopped"] else "")
        t.add_row(name, str(m["calls"]) + (f" +{m['retries']} resent" if m["retries"] else ""), str(m["children"]),
                  f"{m['repairs']} of {m['repair_attempts']}", escape(_counts(m["rejected"])),
                  escape(_counts(m["no_answer"])), f"${m['cost']:.4f}")
        if m["stopped"]:
            line = m["stopped"] if m["model"] in m["stopped"] else f"model {m['model']!r} stopped: {m['stopped']}"
            stopped.append(Text(line, style="red"))
    return Group(t, *stopped)


def _champion_cell(b: dict[str, Any]) -> str:
    """``confirmed`` / ``yes`` for a best that is its task's champion; ``seed stays`` where the
    confirmation kept the seed (no significant gain); ``-`` otherwise."""
    if b["champion"]:
        return "[green]confirmed[/]" if b["confirmed"] else "yes"
    return "seed stays" if seed_stays(b) else "-"


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
    """A rich tree of :func:`evo.results.lineage.lineage_tree`'s nodes: the candidate at the root,
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


# --------------------------------------------------------------------------- show


def _metrics_summary(stage: dict[str, Any]) -> str:
    m = stage.get("metrics") or {}
    if stage["stage"] == "timing" and m.get("shapes"):
        rows = []
        for r in m["shapes"]:
            if isinstance(r, dict) and "median_ms" in r:
                text = (f"{r.get('shape')}: {r['median_ms']:.4g} ms vs ref {r.get('ref_median_ms', float('nan')):.4g} ms"
                        f" (x{r.get('speedup', float('nan')):.3f})")
                if r.get("compile_ref_median_ms") is not None:
                    text += (f", vs compiled ref {r['compile_ref_median_ms']:.4g} ms"
                             f" (x{r.get('compile_speedup', float('nan')):.3f})")
                rows.append(text)
        return "; ".join(rows)
    if stage["stage"] == "compile":
        keys = ("registers", "smem_bytes", "spill_stores", "spill_loads", "wgmma_serialized", "nvcc_seconds")
        return ", ".join(f"{k} {m[k]}" for k in keys if k in m)
    flat = {k: v for k, v in m.items() if isinstance(v, (int, float, str, bool))}
    return ", ".join(f"{k} {v}" for k, v in list(flat.items())[:8])


#: Lines of each prompt message and of the answer ``evo show`` prints without ``--full``: head, tail.
PROMPT_LINES = (12, 8)
ANSWER_LINES = (40, 20)


def trim_lines(text: str, head: int, tail: int) -> str:
    """``text`` with its middle lines replaced by one line saying how many were left out,
    when it has more than ``head + tail + 1`` lines."""
    lines = text.splitlines()
    if len(lines) <= head + tail + 1:
        return text
    cut = len(lines) - head - tail
    return "\n".join([*lines[:head], f"[... {cut} lines left out; evo show --full prints them ...]",
                      *lines[len(lines) - tail:]])


def _messages(prompt: str) -> list[dict[str, str]]:
    """The stored prompt (canonical messages JSON) as messages; text that is not one is one user message."""
    try:
        msgs = json.loads(prompt)
    except (TypeError, ValueError):
        msgs = None
    if isinstance(msgs, list) and all(isinstance(m, dict) and "content" in m for m in msgs):
        return [{"role": str(m.get("role", "?")), "content": str(m["content"])} for m in msgs]
    return [{"role": "user", "content": prompt or ""}]


def _call_panels(c: dict[str, Any], *, full: bool) -> list[RenderableType]:
    """One LLM call as ``evo show`` prints it: a header line, each prompt message and the
    answer in panels, trimmed to :data:`PROMPT_LINES` / :data:`ANSWER_LINES` unless ``full``."""
    bits = [f"{c.get('tokens_in')} in / {c.get('tokens_out')} out tokens"
            + (f" ({c['reasoning_tokens']} reasoning)" if c.get("reasoning_tokens") else ""),
            f"${c.get('cost') or 0:.4f}", f"{_fmt(c.get('latency_s'), 1)} s"]
    if c.get("finish_reason"):
        bits.append(f"finish {c['finish_reason']}")
    if c.get("cached"):
        bits.append("replayed")
    head = f"LLM call {c['id']} in run {c.get('run_id')}: {c.get('model')} ({c.get('kind')}), {', '.join(bits)}"
    out: list[RenderableType] = [Text(head, style="bold")]
    for m in _messages(c.get("prompt") or ""):
        text = m["content"] if full else trim_lines(m["content"], *PROMPT_LINES)
        out.append(Panel(Text(text), title=escape(f"prompt: {m['role']}"), title_align="left"))
    answer = c.get("response") or ""
    out.append(Panel(Text(answer if full else trim_lines(answer, *ANSWER_LINES)), title="answer", title_align="left"))
    if c.get("error"):
        out.append(Text(f"error: {c['error']}", style="red"))
    return out


def render_show(d: dict[str, Any], *, source: bool = True, full: bool = False) -> RenderableType:
    """The view of :func:`evo.results.lineage.candidate_details`: identity, params, verdicts with
    metrics, profiles, the LLM prompt and answer that made it (each message trimmed to its
    first and last lines unless ``full``), and the source."""
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
    if d.get("fitness_compile") is not None:
        eager, comp = speedup_cells(d)
        speed = (f"vs eager {eager}, vs compile {comp} (torch.compile mode {escape(str(d.get('compile_mode')))}; "
                 f"{escape(BASIS_NOTE)})")
    else:
        speed = f"speedup {_fmt(d['fitness'])}"
    head.add_row("status", f"{_verdict(d['status'])}  {speed}" + (f"  on {escape(d['gpu'])}" if d.get("gpu") else ""))
    if (d.get("env") or {}).get("reference_compile_error"):
        head.add_row("vs compile", "[yellow]compile failed[/]: "
                     + escape(d["env"]["reference_compile_error"].splitlines()[0][:300]))
    head.add_row("run", f"{d['run_id'] or '-'} (in runs: {', '.join(d['runs']) or '-'})")
    for ch in d["champion_of"]:
        conf = "confirmed" if ch["confirmation"].get("confirmed") else "not confirmed"
        head.add_row("champion", f"{ch['task']} in {ch['run_id']} ({conf})")
        if ch.get("gain"):
            kept = ch["gain"].get("baseline") == d["id"]
            head.add_row("best's gain over seed" if kept else "gain over seed",
                         escape(gain_text(ch["gain"], ch.get("verdict"), long=True))
                         + ("; the seed stays champion" if kept else ""))
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
        parts += _call_panels(c, full=full)
    if not d["llm_calls"] and str(d.get("operator", "")).startswith("llm:"):
        parts.append(Text("the prompt and answer that made this kernel are not linked to it (a run recorded "
                          "before calls were linked to their candidates)", style="dim"))
    if source:
        parts.append(Panel(Syntax(d["source"], "cpp", theme="ansi_dark", line_numbers=True), title="source"))
    return Group(*parts)
