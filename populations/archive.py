"""MAP-Elites archive: the best kernel per *kind* of kernel, so diversity survives selection.

A member's kind is its descriptor (``Member.descriptor``): ``(name, value)`` string pairs such
as ``("tile", "128x128")``, ``("stages", "4")``, ``("bound", "memory")``. An
:class:`Archive` is built over a fixed tuple of descriptor dimensions; the cell of a member is
the tuple of its values on those dimensions, and each cell keeps its best-fitness member
(the cell's *elite*). A 64x64 tile with 2 stages that is slower than the island's top-k is
kept anyway if it is the best 64x64/2-stage kernel seen, which is what lets a later mutation
of it find a different optimum.

Descriptors from tunables: :func:`descriptor_from_params` maps the tunable names the seed
kernels declare (``TILE_M``/``TILE_N``, ``BM``/``BN``, ``STAGES``, ``VEC``, ``BLOCK``) to
descriptor values. Profile-derived dimensions (``bound``: memory vs compute, from Nsight
Compute) arrive later and are merged with :func:`merge_descriptor`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

from evo.core.records import Member

__all__ = [
    "Archive",
    "DEFAULT_DIMS",
    "MISSING",
    "DESCRIPTOR_RULES",
    "descriptor_from_params",
    "merge_descriptor",
]

log = logging.getLogger(__name__)

#: Value used for a dimension a member's descriptor does not mention (e.g. ``stages`` for an
#: elementwise kernel, or ``bound`` before the member was profiled).
MISSING = "-"

#: Dimensions an island archive uses unless told otherwise: all derivable from tunables.
DEFAULT_DIMS: tuple[str, ...] = ("tile", "stages", "vec", "block")

Cell = tuple[str, ...]


def _pair(params: Mapping[str, str], a: str, b: str) -> str | None:
    if a in params and b in params:
        return f"{params[a]}x{params[b]}"
    return None


def _tile(params: Mapping[str, str]) -> str | None:
    return (
        _pair(params, "TILE_M", "TILE_N")
        or _pair(params, "BM", "BN")
        or _pair(params, "BLOCK_M", "BLOCK_N")
    )


def _first(*names: str) -> Callable[[Mapping[str, str]], str | None]:
    def rule(params: Mapping[str, str]) -> str | None:
        for n in names:
            if n in params:
                return params[n]
        return None

    return rule


#: descriptor dimension -> function of the (string-valued) tunables giving its value, or None
#: when the kernel does not declare the tunables behind it.
DESCRIPTOR_RULES: dict[str, Callable[[Mapping[str, str]], str | None]] = {
    "tile": _tile,
    "stages": _first("STAGES", "NUM_STAGES"),
    "vec": _first("VEC", "VEC_WIDTH"),
    "block": _first("BLOCK", "BLOCK_SIZE", "THREADS"),
}


def _as_str_mapping(params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    if params is None:
        return {}
    items = params.items() if isinstance(params, Mapping) else params
    out: dict[str, str] = {}
    for k, v in items:
        if isinstance(v, bool):
            out[str(k)] = "1" if v else "0"
        elif isinstance(v, float) and v.is_integer():
            out[str(k)] = str(int(v))
        else:
            out[str(k)] = str(v)
    return out


def descriptor_from_params(
    params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
    dims: Iterable[str] = DEFAULT_DIMS,
) -> tuple[tuple[str, str], ...]:
    """Descriptor pairs for ``dims`` that can be derived from tunable values.

    ``params`` is a mapping or ``Candidate.params`` pairs. Dimensions with no rule in
    :data:`DESCRIPTOR_RULES` (e.g. profile-derived ``bound``) or whose tunables the kernel
    does not declare are left out (the archive files them under :data:`MISSING`). The result
    is sorted by name, so equal descriptors compare equal.

    >>> descriptor_from_params({"TILE_M": 128, "TILE_N": 64, "STAGES": 3}, ("tile", "stages"))
    (('stages', '3'), ('tile', '128x64'))
    """
    p = _as_str_mapping(params)
    out = []
    for d in dims:
        rule = DESCRIPTOR_RULES.get(d)
        if rule is None:
            continue
        v = rule(p)
        if v is not None:
            out.append((d, v))
    return tuple(sorted(out))


def merge_descriptor(
    base: Iterable[tuple[str, str]], extra: Mapping[str, Any] | Iterable[tuple[str, Any]]
) -> tuple[tuple[str, str], ...]:
    """``base`` with the pairs of ``extra`` added (``extra`` wins on a shared name), sorted.

    Used to add profile-derived values, e.g. ``merge_descriptor(m.descriptor, {"bound":
    "memory"})``, before re-creating the member with ``dataclasses.replace``.
    """
    d = dict(base)
    d.update(_as_str_mapping(extra))
    return tuple(sorted(d.items()))


class Archive:
    """MAP-Elites grid over descriptor dimensions ``dims``; one elite (best fitness) per cell.

    Only correct members enter. Ties keep the incumbent (first come), so the archive is
    deterministic given the order of :meth:`add` calls. Cells are unbounded in number but
    finite in practice: tunables take values from declared sets.
    """

    def __init__(self, dims: Iterable[str] = DEFAULT_DIMS) -> None:
        dims = tuple(dims)
        if not dims:
            raise ValueError("Archive needs at least one descriptor dimension, e.g. ('tile', 'stages')")
        if len(set(dims)) != len(dims):
            raise ValueError(f"Archive dims must be distinct, got {dims}")
        for d in dims:
            if not isinstance(d, str) or not d:
                raise ValueError(f"Archive dims must be non-empty strings, got {d!r}")
        self.dims: tuple[str, ...] = dims
        self._cells: dict[Cell, Member] = {}

    def __repr__(self) -> str:
        return f"Archive(dims={self.dims}, cells={len(self._cells)})"

    def __len__(self) -> int:
        return len(self._cells)

    def __contains__(self, member_id: object) -> bool:
        return any(m.id == member_id for m in self._cells.values())

    def cell_of(self, member: Member) -> Cell:
        """The cell a member falls in: its value per dimension, :data:`MISSING` when absent."""
        d = dict(member.descriptor)
        return tuple(str(d.get(dim, MISSING)) for dim in self.dims)

    def add(self, member: Member) -> bool:
        """Offer a member; True when it became its cell's elite (new cell or strictly fitter)."""
        if not member.correct:
            return False
        cell = self.cell_of(member)
        incumbent = self._cells.get(cell)
        if incumbent is not None:
            if incumbent.id == member.id or float(member.fitness) <= float(incumbent.fitness):  # type: ignore[arg-type]
                return False
            log.debug("archive cell %s: %s replaces %s", cell, member.candidate.short_id,
                      incumbent.candidate.short_id)
        self._cells[cell] = member
        return True

    def elites(self) -> list[Member]:
        """All cell elites, best fitness first (ties by candidate id)."""
        return sorted(self._cells.values(), key=lambda m: (-float(m.fitness), m.id))  # type: ignore[arg-type]

    def cells(self) -> dict[Cell, Member]:
        """A copy of the grid: cell (values in ``dims`` order) -> elite."""
        return dict(self._cells)

    def ids(self) -> set[str]:
        return {m.id for m in self._cells.values()}

    @property
    def coverage(self) -> int:
        """Number of occupied cells."""
        return len(self._cells)

    def coverage_fraction(self, total_cells: int) -> float:
        """Occupied cells / ``total_cells`` (the size of the declared tunable grid)."""
        if total_cells <= 0:
            raise ValueError(f"total_cells must be > 0, got {total_cells}")
        return len(self._cells) / total_cells

    def to_cells(self) -> tuple[tuple[Cell, Member], ...]:
        """Picklable snapshot in insertion order (for :class:`~populations.island.IslandState`)."""
        return tuple(self._cells.items())

    @classmethod
    def from_cells(cls, dims: Iterable[str], cells: Iterable[tuple[Cell, Member]]) -> "Archive":
        """Rebuild exactly from :meth:`to_cells` output."""
        a = cls(dims)
        for cell, m in cells:
            cell = tuple(cell)
            if len(cell) != len(a.dims):
                raise ValueError(f"archive cell {cell} does not match dims {a.dims}")
            a._cells[cell] = m
        return a
