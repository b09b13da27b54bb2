"""Terminal tables and values of the after-run views and the CLI.

Tables (:func:`table`): id columns never wrap or shrink (a user types those ids next); the
other columns wrap (fold) instead of being cut with an ellipsis.

Speedups against both references (:func:`reference_fields`, :func:`both_timed`,
:func:`speedup_cells`): a timing that also timed the reference under ``torch.compile`` is
shown as a "vs eager" and a "vs compile" value, the fitness basis (``[evaluator]
reference``) marked with :data:`BASIS_MARK`; where no shown row has a compiled time, the
views keep their single "speedup" (the fitness) exactly as before.

A champion's confirmed gain (:func:`gain_fields`, :func:`gain_text`): the speedup of the
task's best over its seed from the champion confirmation's paired re-timing
(:func:`evo.engine.champions.speedup_interval`), its confidence interval and the verdict, as the
store's champion row holds them; a task without that row, or a row without a measured gain,
shows none of it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rich.table import Table

__all__ = ["table", "fmt", "short_time", "reference_fields", "both_timed", "speedup_cells", "gain_fields",
           "gain_cells", "gain_text", "seed_stays", "BASIS_MARK", "BASIS_NOTE"]

#: Appended to the speedup that is the fitness (the basis of ``[evaluator] reference``).
BASIS_MARK = "*"
#: What :data:`BASIS_MARK` means, for a table's caption.
BASIS_NOTE = "* = the fitness basis ([evaluator] reference)"


def fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


class _IdTable(Table):
    """A Table whose id columns' minimum width follows their longest value, so that even
    the last-resort even shrinking of an over-wide table leaves every id whole."""

    id_columns: tuple[int, ...] = ()

    def add_row(self, *renderables: Any, **kw: Any) -> None:
        from rich.text import Text

        for i in self.id_columns:
            if i < len(renderables) and renderables[i] is not None:
                cell = renderables[i]
                width = (Text.from_markup(cell) if isinstance(cell, str) else Text(str(cell))).cell_len
                col = self.columns[i]
                col.min_width = max(col.min_width or 0, width)
        super().add_row(*renderables, **kw)


def table(title: str, columns: Iterable[str | tuple[str, str]], **kw: Any) -> Table:
    """A rich table whose columns are ``name`` (text: wraps, folds long words, never cut)
    or ``(name, kind)`` with kind ``"id"`` (never wraps or shrinks: the value is typed next),
    ``"num"`` (right-aligned, no wrap), ``"word"`` (a short word: no wrap) or ``"text"``."""
    from rich import box

    # A header rule and single spaces between columns (no vertical borders): 80 columns fit
    # six or seven columns with every id whole.
    style: dict[str, Any] = {"box": box.SIMPLE_HEAD, "collapse_padding": True, "pad_edge": False}
    t = _IdTable(title=title, **{**style, **kw})
    ids = []
    for col in columns:
        name, kind = (col, "text") if isinstance(col, str) else col
        if kind == "id":
            ids.append(len(t.columns))
            t.add_column(name, no_wrap=True, overflow="fold", min_width=len(name))
        elif kind == "num":
            t.add_column(name, no_wrap=True, justify="right")
        elif kind == "word":
            t.add_column(name, no_wrap=True, overflow="fold")
        elif kind == "text":
            t.add_column(name, overflow="fold")
        else:  # pragma: no cover - programming error
            raise ValueError(f"column kind {kind!r}: use 'id', 'num', 'word' or 'text'")
    t.id_columns = tuple(ids)
    return t


def short_time(iso: Any) -> str:
    """``2026-12-03T07:30:12.345+00:00`` -> ``2026-12-03 07:30`` (tables; JSON keeps the full value)."""
    text = "" if iso is None else str(iso)
    return text[:16].replace("T", " ") if len(text) >= 16 and text[10:11] == "T" else text


def reference_fields(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """``reference``, ``fitness_eager`` and ``fitness_compile`` of one candidate's timing (an
    entry of :meth:`evo.store.StoreReader.reference_fitness`, or None: all three None)."""
    entry = entry or {}
    return {k: entry.get(k) for k in ("reference", "fitness_eager", "fitness_compile")}


def both_timed(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any row (a dict with :func:`reference_fields`' keys) has a speedup against the
    compiled reference, i.e. whether a view shows "vs eager" and "vs compile"."""
    return any(r.get("fitness_compile") is not None for r in rows)


def speedup_cells(row: Mapping[str, Any], nd: int = 3) -> tuple[str, str]:
    """The "vs eager" and "vs compile" cells of a row (``fitness`` plus :func:`reference_fields`'
    keys); the basis's value carries :data:`BASIS_MARK`. A timing that names no basis predates
    the compiled reference, so its ``fitness`` is against eager."""
    eager = row.get("fitness_eager")
    if eager is None and row.get("reference") is None:
        eager = row.get("fitness")
    basis = row.get("reference") or "eager"
    cells = []
    for name, value in (("eager", eager), ("compile", row.get("fitness_compile"))):
        text = fmt(None if value is None else float(value), nd)
        cells.append(text + BASIS_MARK if value is not None and name == basis else text)
    return cells[0], cells[1]


#: How the stored verdicts (:attr:`evo.engine.champions.SpeedupInterval.verdict`) read in the views;
#: "no significant gain" reads as stored.
_VERDICT_WORDS = {"faster": "significant", "slower": "significantly slower"}


def gain_fields(champion: Mapping[str, Any] | None) -> dict[str, Any]:
    """``champion_id``, ``gain`` and ``verdict`` of a task's champion row
    (:meth:`evo.store.StoreReader.champions`; None: all three None). ``gain`` is the speedup
    over the baseline (ratio, low, high, confidence, rounds, method, baseline) or None when
    the confirmation measured none."""
    champion = champion or {}
    return {"champion_id": champion.get("candidate_id"), "gain": champion.get("gain"),
            "verdict": champion.get("verdict")}


def gain_cells(gain: Mapping[str, Any] | None, verdict: str | None) -> tuple[str, str, str]:
    """``("1.052x", "[1.031, 1.074]", "significant")``: the ratio, its interval and the verdict
    as the views word it (``"-"`` each without a gain)."""
    if not gain:
        return "-", "-", "-"
    return (f"{gain['ratio']:.3f}x", f"[{gain['low']:.3f}, {gain['high']:.3f}]",
            _VERDICT_WORDS.get(str(verdict), str(verdict or "-")))


def gain_text(gain: Mapping[str, Any] | None, verdict: str | None, *, long: bool = False) -> str:
    """``1.052x [1.031, 1.074] significant`` (:func:`gain_cells` in one line, "-" without a
    gain); ``long`` adds the confidence level, the rounds and the baseline's id."""
    if not gain:
        return "-"
    text = " ".join(gain_cells(gain, verdict))
    if long:
        level = gain.get("confidence")
        ci = f"{100 * level:g}% interval" if isinstance(level, (int, float)) else "interval"
        text += (f" ({ci} from {gain.get('rounds')} paired rounds, over "
                 f"{str(gain.get('baseline') or '-')[:12]})")
    return text


def seed_stays(row: Mapping[str, Any]) -> bool:
    """Whether a task's confirmation kept the baseline (the seed) as champion: its champion
    is the baseline it was timed against, not this row's candidate (a :func:`gain_fields` row
    with ``id``)."""
    gain = row.get("gain") or {}
    return bool(gain.get("baseline")) and row.get("champion_id") == gain["baseline"] != row.get("id")
