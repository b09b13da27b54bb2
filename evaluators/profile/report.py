"""What ncu's output says: its ``--csv --page raw`` rows parsed (:func:`parse_ncu_csv`), the
summary of one profiled call (:func:`summarize`), the roofline class
(:func:`classify_roofline`) and the readable profile a prompt quotes (:func:`format_profile`).
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from evaluators.profile.settings import CORE_METRICS, DEFAULT_METRICS, STALL_REASONS, SUMMARY_VERSION, _STALL_FMT


_TIME_UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9}
_BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
               "Kibyte": 1024.0, "Mibyte": 1024.0**2}
_NUM_RE = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d*)(\.\d+)?([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class KernelRow:
    """One profiled kernel launch of a ``--page raw`` CSV: its name and metric values.

    ``values`` maps metric name -> float (numbers, converted to base units: ns for times,
    bytes for sizes) or str (``n/a`` becomes ``None``); ``units`` the unit row as printed.
    """

    id: int
    kernel: str
    values: dict[str, float | str | None]
    units: dict[str, str] = field(default_factory=dict)

    def number(self, metric: str) -> float | None:
        v = self.values.get(metric)
        return v if isinstance(v, float) and math.isfinite(v) else None


def _to_number(text: str, unit: str) -> float | str | None:
    t = text.strip()
    if t == "" or t.lower() in ("n/a", "nan", "-"):
        return None
    if not _NUM_RE.match(t) or t in (".", "+", "-"):
        return t
    try:
        x = float(t.replace(",", ""))
    except ValueError:
        return t
    u = unit.strip().split("/")[0]  # "byte/block" scales as "byte"
    if u in _TIME_UNITS:
        x *= _TIME_UNITS[u]
    elif u in _BYTE_UNITS:
        x *= _BYTE_UNITS[u]
    return x


def parse_ncu_csv(text: str) -> list[KernelRow]:
    """Kernel rows of ncu's ``--csv --page raw`` output (:mod:`evaluators.profile`).

    Lines before the header (``==PROF==`` messages, the program's own output when ncu
    shares its stdout) are skipped: the header is the first CSV row whose first cell is
    ``ID``. Raises :class:`ValueError` when no header is found (the text is not ncu CSV).
    Returns an empty list for a header with no kernel rows (nothing was captured).
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    start = None
    for i, ln in enumerate(lines):
        if ln.startswith('"ID"') or ln.startswith("ID,"):
            start = i
            break
    if start is None:
        raise ValueError(
            "no ncu CSV header (a row starting with \"ID\") in the output; was ncu run with "
            "--csv --page raw?"
        )
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    if len(rows) < 2:
        return []
    # The second row holds units: its ID cell is empty, real kernel rows have an integer ID.
    units_row = rows[1] if rows[1] and not rows[1][0].strip().isdigit() else [""] * len(header)
    body = rows[2:] if units_row is rows[1] else rows[1:]
    units = {h: (units_row[j] if j < len(units_row) else "") for j, h in enumerate(header)}
    out = []
    name_col = "Kernel Name" if "Kernel Name" in header else None
    for r in body:
        if not r or not r[0].strip().isdigit():
            continue
        vals: dict[str, float | str | None] = {}
        for j, h in enumerate(header):
            cell = r[j] if j < len(r) else ""
            vals[h] = _to_number(cell, units.get(h, "")) if "__" in h else (cell or None)
        out.append(KernelRow(id=int(r[0]), kernel=str(vals.get(name_col) or "") if name_col else "",
                             values=vals, units={h: u for h, u in units.items() if u}))
    return out


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def summarize(rows: Sequence[KernelRow], metrics: Iterable[str] = DEFAULT_METRICS) -> dict[str, Any]:
    """The profile as the engine stores it and prompts quote it (flat, JSON-ready).

    ``duration_ns`` sums every captured kernel; all other numbers come from the longest one
    (``kernel``). ``smem_per_block_bytes`` = static + dynamic. ``top_stalls``: the three largest
    stall reasons (cycles per issued instruction) as ``[reason, value, share_pct]``, share
    relative to the sum of all stall reasons. Metrics ncu did not report are ``None``;
    ``missing`` lists the requested metrics absent from every row.
    """
    if not rows:
        raise ValueError("no kernel rows to summarize (ncu captured nothing)")
    wanted = list(dict.fromkeys(metrics))
    main = max(rows, key=lambda r: r.number(CORE_METRICS["duration_ns"]) or 0.0)
    durs = [r.number(CORE_METRICS["duration_ns"]) for r in rows]
    out: dict[str, Any] = {
        "summary_version": SUMMARY_VERSION,
        "kernel": main.kernel,
        "kernels": len(rows),
        "kernel_names": sorted({r.kernel for r in rows}),
        "duration_ns": _round(sum(d for d in durs if d is not None)) if any(d is not None for d in durs) else None,
        "main_kernel_duration_ns": _round(main.number(CORE_METRICS["duration_ns"])),
    }
    for name, metric in CORE_METRICS.items():
        if name == "duration_ns":
            continue
        out[name] = _round(main.number(metric))
    st, dy = out.get("smem_static_per_block"), out.get("smem_dynamic_per_block")
    out["smem_per_block_bytes"] = None if st is None and dy is None else (st or 0) + (dy or 0)
    stalls = {}
    for r in STALL_REASONS:
        v = main.number(_STALL_FMT.format(r))
        if v is not None and r != "selected":
            stalls[r] = v
    total = sum(stalls.values())
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
    out["stalls"] = {k: round(v, 3) for k, v in stalls.items()}
    out["top_stalls"] = [[k, round(v, 3), round(100.0 * v / total, 1) if total > 0 else 0.0]
                         for k, v in top if v > 0]
    present = set().union(*(r.values.keys() for r in rows))
    out["missing"] = [m for m in wanted if m not in present]
    try:
        out["bound"] = classify_roofline(out)
    except ValueError:
        out["bound"] = "unknown"
    return out


#: Above this % of peak a unit counts as the limiter (ncu's own "SOL" guidance: > 60%
#: is high utilisation; both units below it means neither is saturated: latency-bound).
BOUND_THRESHOLD_PCT = 60.0


def classify_roofline(
    metrics: Mapping[str, Any], task: Any = None, shape: Mapping[str, int] | None = None, gpu: Any = None
) -> str:
    """``"memory-bound"``, ``"compute-bound"`` or ``"latency-bound"`` from a profile.

    Memory side = max(DRAM %, memory-pipeline %); compute side = max(SM %, tensor pipe %).
    If either side reaches :data:`BOUND_THRESHOLD_PCT`, the larger side names the class;
    if both are below it, the kernel saturates neither unit: ``latency-bound`` (stalls,
    too few warps, launch overhead). When the profile lacks throughput numbers and
    ``task``/``shape``/``gpu`` are given (a :class:`~evo.tasks.base.Task`, a shape dict, a
    :class:`~evo.tasks.gpus.GpuSpec`), the task's arithmetic intensity is compared with the
    GPU's ridge point instead.
    """
    def num(k: str) -> float | None:
        v = metrics.get(k)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    mem = [v for v in (num("dram_throughput_pct"), num("memory_throughput_pct")) if v is not None]
    comp = [v for v in (num("sm_throughput_pct"), num("tensor_pipe_pct")) if v is not None]
    if mem or comp:
        m, c = max(mem, default=0.0), max(comp, default=0.0)
        if max(m, c) < BOUND_THRESHOLD_PCT:
            return "latency-bound"
        return "memory-bound" if m >= c else "compute-bound"
    if task is not None and shape is not None and gpu is not None:
        from evo.tasks.gpus import compute_peak_tflops

        flops, nbytes = float(task.flops(shape)), float(task.bytes(shape))
        ridge = compute_peak_tflops(task, gpu) * 1e12 / (gpu.bandwidth_gbs * 1e9)
        return "compute-bound" if nbytes > 0 and flops / nbytes > ridge else "memory-bound"
    raise ValueError(
        "cannot classify: the profile has no throughput metrics and no task/shape/gpu was given"
    )


def profile_descriptor(metrics: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """MAP-Elites descriptor pairs from a profile: ``(("bound", b), ("occupancy", o))``.

    ``b`` is ``memory`` / ``compute`` / ``latency``; ``o`` is the achieved occupancy class
    ``low`` (< 25 %), ``mid`` (< 50 %) or ``high``. Pairs whose numbers are missing are left
    out. Merge into a member with ``populations.archive.merge_descriptor``.
    """
    out = []
    try:
        out.append(("bound", classify_roofline(metrics).split("-")[0]))
    except ValueError:
        pass
    occ = metrics.get("achieved_occupancy_pct")
    if isinstance(occ, (int, float)) and math.isfinite(occ):
        out.append(("occupancy", "low" if occ < 25 else "mid" if occ < 50 else "high"))
    return tuple(out)


def format_profile(metrics: Mapping[str, Any]) -> str:
    """A few lines for an optimize prompt (or ``evo show``): the numbers that guide a rewrite."""
    def f(k: str, unit: str = "%", nd: int = 1) -> str:
        v = metrics.get(k)
        return "n/a" if not isinstance(v, (int, float)) else f"{v:.{nd}f}{unit}"

    dur = metrics.get("duration_ns")
    lines = [
        f"Nsight Compute profile ({metrics.get('bound', '?')}; kernel {metrics.get('kernel', '?')}"
        + (f", {metrics['kernels']} kernels" if (metrics.get("kernels") or 1) > 1 else "") + "):",
        f"- duration {dur / 1e3:.2f} us" if isinstance(dur, (int, float)) else "- duration n/a",
        f"- SM throughput {f('sm_throughput_pct')} of peak, DRAM {f('dram_throughput_pct')}, "
        f"memory pipes {f('memory_throughput_pct')}, tensor pipe {f('tensor_pipe_pct')}",
        f"- occupancy achieved {f('achieved_occupancy_pct')} vs theoretical "
        f"{f('theoretical_occupancy_pct')}; {f('registers_per_thread', '', 0)} registers/thread, "
        f"{f('smem_per_block_bytes', ' B', 0)} shared memory/block, block {f('block_size', '', 0)}, "
        f"grid {f('grid_size', '', 0)}",
        f"- L2 hit rate {f('l2_hit_rate_pct')}",
    ]
    top = metrics.get("top_stalls") or []
    if top:
        lines.append("- top warp stalls (cycles per issued instruction): "
                     + ", ".join(f"{r} {v:.2f} ({s:.0f}%)" for r, v, s in top))
    return "\n".join(lines)
