"""Merge several ``evo bench`` tables of one GPU into one table with family geomeans over all rows.

A benchmark of every task sometimes takes more than one ``evo bench`` call (a device call's
time limit, a failure fixed between calls). This script reads the tables those calls wrote,
turns their rows back into :class:`evo.results.bench.BenchRow` records and renders the merged
table, the "torch.compile reaches the speed of light" line and the family summary with
:mod:`evo.results.bench`'s own functions, so the merged file is what one call over all the
rows would have written (geomeans from the printed, 3-decimal speedups).

Contract:

- Each input must reproduce itself: its rows, re-rendered, give exactly its own table, its own
  speed-of-light line and its own family summary. A row edited by hand, a table of another
  format, a changed targets file or a speed-of-light bound that no longer matches the printed
  "% of SOL" is an error naming the file and the first differing line. The speed-of-light time
  of each row is recomputed from the task and the table's GPU (datasheet bandwidth, as the
  harness computes it) and checked against the printed "% of SOL".
- Tables of different GPU models are never merged; a task measured in two inputs is an error
  (a row would count twice). Driver, clock, CUDA, torch and Python lines that differ between
  inputs are written per input; identical ones once, saying so.
- Rows are ordered as the task registry lists the tasks (``evo bench``'s order).
- The output keeps its hand-written text: only the block between ``<!-- merged-bench -->`` and
  ``<!-- end merged-bench -->`` is rewritten (a new file gets a title and the block; an
  existing file without the markers is an error, never overwritten).

::

    python benchmarks/merge_bench.py --targets benchmarks/targets.toml \\
        --out benchmarks/RESULTS.md benchmarks/results_h100/RESULTS_*.md
    python benchmarks/merge_bench.py ... --check    # exit 1 when the block is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evo.results.bench import (COMPILE_FAILED, BenchRow, Targets, compile_at_sol,  # noqa: E402
                               family_summary, load_targets, results_table)

BEGIN, END = "<!-- merged-bench -->", "<!-- end merged-bench -->"
_BLOCK_RE = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.DOTALL)
_COLUMNS = ("task", "shape", "dtype", "torch ms", "compile ms", "ours ms", "speedup", "vs compile", "rate",
            "% of SOL", "target", "gap", "status")
_FAILURES = "## References torch.compile could not compile"


class MergeError(ValueError):
    """An input cannot be merged; the message names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class BenchTable:
    """One ``evo bench`` table as written: its header lines, rows and rendered sections."""

    source: str                  # the file it was read from (as given)
    title: str
    gpu_line: str                # "NVIDIA H100 80GB HBM3 (driver ..., SM clock ... after timing)"
    cuda_line: str               # "CUDA 13.0, torch ..., Python ..."
    date: str                    # "2026-12-06 06:11 UTC"
    protocol: str                # the rest of the date line: reps, warm-up, flush, trials
    command: str
    legend: tuple[str, ...]      # the lines explaining the columns
    rows: tuple[BenchRow, ...]
    table: tuple[str, ...]       # the results table's lines, header included
    sol_line: str                # "" when the compiled reference was not timed
    families: tuple[str, ...]

    @property
    def gpu_model(self) -> str:
        return self.gpu_line.split(" (", 1)[0]

    @property
    def has_targets(self) -> bool:
        return "| target | gap |" in self.table[0]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _num(cell: str, source: str, col: str) -> float | None:
    if cell == "-":
        return None
    try:
        return float(cell)
    except ValueError:
        raise MergeError(f"{source}: column {col!r}: {cell!r} is not a number or '-'") from None


def _dims(shape: str, source: str) -> tuple[tuple[str, int], ...]:
    if not shape:
        return ()
    out = []
    for part in shape.split(" x "):
        k, _, v = part.partition("=")
        if not k or not v.isdigit():
            raise MergeError(f"{source}: shape {shape!r}: expected 'NAME=INT x NAME=INT ...'")
        out.append((k, int(v)))
    return tuple(out)


def _sol_ms(task: Any, dims: tuple[tuple[str, int], ...], gpu: Any) -> float | None:
    """The harness's speed-of-light time of a shape (datasheet bandwidth), None without a spec."""
    from evo.tasks.gpus import speed_of_light_ms

    if gpu is None or not dims:
        return None
    return speed_of_light_ms(task, dict(dims), gpu, bandwidth_gbs=gpu.datasheet_bandwidth_gbs)


def _row(header: list[str], line: str, source: str, gpu: Any, registry: Any,
         compile_errors: dict[str, str]) -> BenchRow:
    cells = _cells(line)
    if len(cells) != len(header):
        raise MergeError(f"{source}: row {line!r} has {len(cells)} cells, the header {len(header)}")
    c = dict(zip(header, cells))
    try:
        task = registry.get(c["task"])
    except KeyError as e:
        raise MergeError(f"{source}: {e.args[0] if e.args else e}") from None
    m = re.fullmatch(r"(.*?) \((.*)\)", c["status"])
    status, note = (m.group(1), m.group(2)) if m else (c["status"], "")
    dims = _dims(c["shape"], source)
    ours, pct = _num(c["ours ms"], source, "ours ms"), _num(c["% of SOL"], source, "% of SOL")
    sol = _sol_ms(task, dims, gpu) if pct is not None else None
    if pct is not None and ours:
        # the printed ours ms is rounded to 4 decimals and % of SOL to 1
        allowed = 0.05 + pct * 0.00005 / ours + 1e-9
        if sol is None or abs(100.0 * sol / ours - pct) > allowed:
            raise MergeError(f"{source}: {c['task']} {c['shape']}: printed % of SOL {pct} is not "
                             f"{'unavailable' if sol is None else f'{100.0 * sol / ours:.2f}'} (the "
                             f"speed-of-light time of {gpu.name if gpu else 'this GPU'} today); "
                             "the GPU spec or the task's bytes/FLOPs changed since the table was written")
    error = ""
    if COMPILE_FAILED in (c.get("compile ms"), c.get("vs compile")):
        error = compile_errors.get(c["task"], "")
        if not error:
            raise MergeError(f"{source}: {c['task']}: '{COMPILE_FAILED}' without a line in '{_FAILURES}'")
    return BenchRow(
        task=c["task"], shape=c["shape"], dtype=c["dtype"], torch_ms=_num(c["torch ms"], source, "torch ms"),
        ours_ms=ours, speedup=_num(c["speedup"], source, "speedup"), rate=c["rate"], pct_sol=pct,
        status=status, note=note, dims=dims, sol_ms=sol,
        compile_ms=None if error else _num(c.get("compile ms", "-"), source, "compile ms"),
        compile_speedup=None if error else _num(c.get("vs compile", "-"), source, "vs compile"),
        compile_error=error)


def parse_table(text: str, source: str, registry: Any = None) -> BenchTable:
    """Read one table ``evo bench`` wrote (:func:`evo.results.bench.write_results`'s format)."""
    from evo.tasks.gpus import match_gpu

    registry = registry if registry is not None else _builtin()
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise MergeError(f"{source}: not an evo bench table (no '# title' first line)")

    def bullet(prefix: str) -> str:
        hit = [ln[len(prefix):] for ln in lines if ln.startswith(prefix)]
        if len(hit) != 1:
            raise MergeError(f"{source}: expected one header line starting {prefix!r}, found {len(hit)}")
        return hit[0]

    gpu_line, cuda_line = bullet("- GPU: "), "CUDA " + bullet("- CUDA ")
    date, _, protocol = bullet("- Date: ").partition("; ")
    command = bullet("- Command: ").strip("`")
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("| task |"))
        fam = lines.index("## Families")
    except (StopIteration, ValueError):
        raise MergeError(f"{source}: no results table ('| task |') or no '## Families' section") from None
    legend = tuple(ln for ln in lines[lines.index(f"- Command: `{command}`") + 1:start] if ln)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = tuple(lines[start:end])
    between = [ln for ln in lines[end:fam] if ln]
    sol_line = between[0] if between else ""
    if len(between) > 1 or (sol_line and "reaches the speed of light" not in sol_line):
        raise MergeError(f"{source}: unexpected text between the table and '## Families': {between!r}")
    fam_end = next((i for i in range(fam + 2, len(lines)) if not lines[i].startswith("|")), len(lines))
    families = tuple(lines[fam + 2:fam_end])
    rest = [ln for ln in lines[fam_end:] if ln]
    compile_errors: dict[str, str] = {}
    if rest and rest[0] == _FAILURES:
        for ln in rest[1:]:
            m = re.fullmatch(r"- \*\*(\S+)\*\*: (.*)", ln)
            if not m:
                break
            compile_errors[m.group(1)] = m.group(2)
        rest = rest[1 + len(compile_errors):]
    if rest:
        raise MergeError(f"{source}: section {rest[0]!r} cannot be merged (only the table, the speed-of-light "
                         f"line, '## Families' and '{_FAILURES}' can)")
    header = _cells(table[0])
    unknown = [h for h in header if h not in _COLUMNS]
    if unknown:
        raise MergeError(f"{source}: unknown column(s) {unknown}; allowed: {', '.join(_COLUMNS)}")
    gpu = match_gpu(gpu_line)
    rows = tuple(_row(header, ln, source, gpu, registry, compile_errors) for ln in table[2:])
    return BenchTable(source, lines[0][2:], gpu_line, cuda_line, date, protocol, command, legend, rows, table,
                      sol_line, families)


def _builtin() -> Any:
    from evo.tasks.registry import BUILTIN_TASKS

    return BUILTIN_TASKS


def _first_difference(want: tuple[str, ...] | list[str], got: list[str]) -> str:
    for a, b in zip(want, got):
        if a != b:
            return f"written {a!r}, rendered from its rows {b!r}"
    return f"written {len(want)} lines, rendered {len(got)}"


def verify(table: BenchTable, targets: Targets | None, registry: Any = None) -> None:
    """Raise MergeError unless ``table``'s rows re-render to exactly its own table, speed-of-light
    line and family summary (what makes its rows safe to merge)."""
    registry = registry if registry is not None else _builtin()
    tg = targets if table.has_targets else None
    if table.has_targets and targets is None:
        raise MergeError(f"{table.source}: has target columns; pass the targets file it was made with")
    checks = (("table", table.table, results_table(list(table.rows), tg)),
              ("family summary", table.families, family_summary(list(table.rows), tg, registry)))
    for what, want, got in checks:
        if tuple(want) != tuple(got):
            raise MergeError(f"{table.source}: its {what} does not reproduce: {_first_difference(want, got)}")
    if table.sol_line and table.sol_line != compile_at_sol(list(table.rows)):
        raise MergeError(f"{table.source}: its speed-of-light line does not reproduce: written "
                         f"{table.sol_line!r}, rendered {compile_at_sol(list(table.rows))!r}")


def merge_rows(tables: list[BenchTable], registry: Any = None) -> list[BenchRow]:
    """Every row of every table, in the registry's task order; a task in two tables, or tables of
    different GPU models, raise MergeError."""
    registry = registry if registry is not None else _builtin()
    models = {t.gpu_model for t in tables}
    if len(models) != 1:
        raise MergeError("tables of different GPUs cannot be merged: "
                         + "; ".join(f"{t.source}: {t.gpu_model}" for t in tables))
    owner: dict[str, str] = {}
    for t in tables:
        for task in dict.fromkeys(r.task for r in t.rows):
            if task in owner:
                raise MergeError(f"{task} is measured in both {owner[task]} and {t.source}; keep one")
            owner[task] = t.source
    order = {name: i for i, name in enumerate(registry.names())}
    rows = [r for t in tables for r in t.rows]
    return sorted(rows, key=lambda r: order[r.task])  # stable: a task's shapes keep their order


def _same_or_each(label: str, tables: list[BenchTable], value: Any) -> list[str]:
    vals = [value(t) for t in tables]
    if len(set(vals)) == 1:
        return [f"- {label}{vals[0]}; identical in all {len(tables)} tables"]
    return [f"- {label}differs between the tables:"] + [f"  - {t.source}: {v}" for t, v in zip(tables, vals)]


def render_block(tables: list[BenchTable], targets: Targets | None, command: str, out_dir: Path,
                 registry: Any = None) -> str:
    """The merged block (markers included) for ``tables`` (each already :func:`verify`-ed)."""
    registry = registry if registry is not None else _builtin()
    rows = merge_rows(tables, registry)
    with_targets = {t.has_targets for t in tables}
    legends = {t.legend for t in tables}
    if len(with_targets) != 1 or len(legends) != 1:
        raise MergeError("the tables explain their columns differently (targets or compile mode differ): "
                         + "; ".join(t.source for t in tables))
    tg = targets if tables[0].has_targets else None
    n_tasks = len({r.task for r in rows})
    out = [BEGIN, f"Written by `{command}` from the rows of {len(tables)} `evo bench` tables, unchanged "
           f"({len(rows)} rows, {n_tasks} tasks); the speed-of-light line and the family summary are "
           "recomputed over all rows by evo.results.bench. Do not edit this block; rerun the command.", ""]
    out += _same_or_each("GPU: ", tables, lambda t: t.gpu_line)
    out += _same_or_each("", tables, lambda t: t.cuda_line)
    out += _same_or_each("Protocol: ", tables, lambda t: t.protocol)
    out.append(f"- The {len(tables)} calls (date, rows, the command `evo bench` recorded):")
    for t in tables:
        link = Path(os.path.relpath(Path(t.source).resolve(), out_dir.resolve())).as_posix()
        tasks = len({r.task for r in t.rows})
        out.append(f"  - [{Path(t.source).name}]({link}): {t.date}, {len(t.rows)} rows ({tasks} tasks): "
                   f"`{t.command}`")
    out += [""] + list(tables[0].legend) + [""] + results_table(rows, tg)
    if any(t.sol_line for t in tables):
        out += ["", compile_at_sol(rows)]
    out += ["", "## Families", ""] + family_summary(rows, tg, registry)
    failures = {r.task: r.compile_error for r in rows if r.compile_error}
    if failures:
        out += ["", _FAILURES, ""] + [f"- **{task}**: {err}" for task, err in failures.items()]
    return "\n".join(out + [END])


def write_block(out: Path, block: str, title: str) -> None:
    """Replace the block in ``out`` (keeping the text around it), or create ``out``."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# {title}\n\n{block}\n", encoding="utf-8")
        return
    text = out.read_text(encoding="utf-8")
    if not _BLOCK_RE.search(text):
        raise MergeError(f"{out}: exists without a {BEGIN} ... {END} block; not overwriting it")
    out.write_text(_BLOCK_RE.sub(lambda _m: block, text, count=1), encoding="utf-8")


def committed_block(out: Path) -> str:
    """The block currently in ``out`` ("" when there is none)."""
    m = _BLOCK_RE.search(out.read_text(encoding="utf-8")) if out.exists() else None
    return m.group(0) if m else ""


def _rel(p: Path) -> str:
    p = p.resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)


def build(inputs: list[Path], targets_path: Path | None, out: Path) -> tuple[str, str]:
    """(block, title) for ``inputs``: each parsed and verified, then merged."""
    registry = _builtin()
    targets = load_targets(targets_path, registry) if targets_path is not None else None
    tables = []
    for p in inputs:
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise MergeError(f"{p}: cannot read: {e}") from None
        t = parse_table(text, _rel(p), registry)
        verify(t, targets, registry)
        tables.append(t)
    if not tables:
        raise MergeError("no input tables given")
    command = "python benchmarks/merge_bench.py" + (f" --targets {_rel(targets_path)}" if targets_path else "") \
        + f" --out {_rel(out)} " + " ".join(_rel(p) for p in inputs)
    return render_block(tables, targets, command, out.parent, registry), f"{tables[0].title} (merged)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", type=Path, help="evo bench tables of one GPU, in the order to list them")
    ap.add_argument("--out", type=Path, required=True, help="the merged file (its block is rewritten)")
    ap.add_argument("--targets", type=Path, help="the targets file the inputs were made with, if any")
    ap.add_argument("--check", action="store_true", help="exit 1 when --out's block is not what would be written")
    args = ap.parse_args(argv)
    try:
        block, title = build(args.inputs, args.targets, args.out)
        if args.check:
            if committed_block(args.out) != block:
                print(f"{args.out}: the merged block is stale; rerun without --check", file=sys.stderr)
                return 1
            print(f"{args.out}: up to date")
            return 0
        write_block(args.out, block, title)
    except MergeError as e:
        print(f"merge_bench: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
