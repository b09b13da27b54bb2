"""Delayed Nsight Compute profiling of survivors (cascade stage ``profile``).

Only correct candidates that enter their island's top-k are profiled (the rule lives in
:mod:`evo.triggers`); everything else never pays for ncu. One profile is one isolated run:

    ncu --clock-control none --target-processes all --nvtx --nvtx-include evo_candidate/
        --launch-count N --csv --page raw --print-units base --metrics <list>
        --log-file <jobdir>/ncu.csv  python -m evaluators.child.profile <jobdir>

The child (:mod:`evaluators.child.profile`) builds the task's inputs for one benchmark
shape, calls the candidate once outside the range (warm-up: module load, caches), then
once inside the NVTX push/pop range ``evo_candidate``. The NVTX filter is exact: the
harness's own torch kernels (input generation, the reference that sizes the outputs) run
outside the range and are never captured, whatever their names. ``--launch-count`` caps the
captured kernels of that one call (a split-K candidate launches two); the profile then
sums their durations and takes every other number from the longest kernel.

``--clock-control none`` keeps the GPU's own clocks, as the timing stage measures them, so
the numbers describe the kernel the fitness describes (ncu's default locks base clocks).

The run has its own process group and wall-clock timeout (``ProfileSettings.timeout_s``);
on timeout the whole group, ncu and its target, is killed and the stage reports
``timeout``. Results are cached by (sha256 of the .so, shape, GPU name) in small JSON files
under ``ProfileSettings.cache_dir``; the engine also stores them (``Store.add_profile``).

Failure mapping (the cascade's rule): a candidate problem (it crashed under ncu, it launched
no kernel inside the range, it hung) is a :class:`~evo.records.StageResult` with a non-ok
status; a broken profiler (ncu missing, no permission to read the counters, an ``==ERROR==``
from ncu while the candidate ran fine) raises :class:`ProfileError` naming the fix. ncu
2025.3 silently leaves out metric names it does not know (seen on the H200): they show up
in the profile's ``missing`` list, not as an error. Nothing here imports torch or touches
CUDA: the child does.

Parsing (:func:`parse_ncu_csv`) follows ncu's documented ``--csv --page raw`` layout: a
header row of metric names, a row of units, then one row per profiled kernel launch;
``==PROF==`` / ``==WARNING==`` lines around it are skipped. A recording of real ncu output
on an H200 lives in ``tests/fixtures/ncu/``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from evo.records import Candidate, StageResult, Status
from evo.settings import config_key

__all__ = [
    "STAGE",
    "NVTX_RANGE",
    "STALL_REASONS",
    "DEFAULT_METRICS",
    "ProfileSettings",
    "ProfileError",
    "NcuNotFoundError",
    "KernelRow",
    "parse_ncu_csv",
    "summarize",
    "classify_roofline",
    "profile_descriptor",
    "format_profile",
    "profile_key",
    "ProfileCache",
    "build_ncu_command",
    "find_ncu",
    "gpu_name",
    "profile_candidate",
]

log = logging.getLogger(__name__)

STAGE = "profile"
#: Name of the NVTX push/pop range the profile child wraps the measured call in.
NVTX_RANGE = "evo_candidate"
#: Version of the metric summary below; part of the cache key so a change re-profiles.
SUMMARY_VERSION = "1"

#: Warp-stall reasons ncu reports per issued instruction on sm_70+; ``gmma`` (waiting on a
#: warpgroup's wgmma to arrive) is Hopper's. ``selected`` is the issuing state, not a
#: stall: collected but never ranked. (Names checked against ``ncu --query-metrics`` on an
#: H200, tests/fixtures/ncu/query_metrics.txt.)
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
    "no_instruction", "not_selected", "selected", "short_scoreboard", "sleeping",
    "tex_throttle", "wait",
)
_STALL_FMT = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

#: Friendly name -> ncu metric. On Hopper the "hmma" tensor pipe counts HMMA, HGMMA and
#: QGMMA cycles (``ncu --query-metrics``: "tensor pipe was active (HMMA/HFMA2.MMA/HGMMA/
#: QGMMA)"), so ``tensor_pipe_pct`` covers wgmma and mma.sync alike; there is no separate
#: gmma-cycles metric. ``wgmma_instructions`` tells whether the kernel issued wgmma at all.
CORE_METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers_per_thread": "launch__registers_per_thread",
    "smem_static_per_block": "launch__shared_mem_per_block_static",
    "smem_dynamic_per_block": "launch__shared_mem_per_block_dynamic",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "wgmma_instructions": "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "warp_cycles_per_issue": "smsp__average_warps_active_per_issue_active.ratio",
}

DEFAULT_METRICS: tuple[str, ...] = tuple(CORE_METRICS.values()) + tuple(
    _STALL_FMT.format(r) for r in STALL_REASONS
)

_TIME_UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9}
_BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
               "Kibyte": 1024.0, "Mibyte": 1024.0**2}
_NUM_RE = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d*)(\.\d+)?([eE][-+]?\d+)?$")


class ProfileError(RuntimeError):
    """The profiler itself cannot run (not the candidate's fault); the message names the fix."""


class NcuNotFoundError(ProfileError):
    """No ``ncu`` executable; install Nsight Compute or set ``profile.ncu`` to its path."""


@dataclass(frozen=True)
class ProfileSettings:
    """How survivors are profiled: the record of config section ``[profile]``.

    Config keys (``config_key`` fields, :mod:`evo.settings`; bounds checked when the config
    is loaded): ``enabled``: master switch, off by default (profiling needs Nsight Compute
    and permission to read the GPU's counters). ``top_k``: a correct candidate is profiled
    when it enters the best ``top_k`` of its island. ``feedback_after``: lineage depth from
    which prompts may quote profile numbers (``evo.triggers.profile_visible``).
    ``timeout_s``: wall clock of one ncu run (its process group is killed after).

    Set by code: ``metrics``: the ncu metric list (default :data:`DEFAULT_METRICS`).
    ``launch_count``: most kernels captured from the one measured call. ``warmup``:
    candidate calls before the measured one. ``ncu``: executable name or path.
    ``cache_dir``: JSON cache of finished profiles (``""`` = no cache; a run's is
    ``profiles`` beside its compile cache). ``device``: GPU index among the caller's visible
    devices. ``seed``: seed of the profiled call's inputs.
    """

    enabled: bool = config_key(False)
    top_k: int = config_key(3, ge=1)
    feedback_after: int = config_key(3, ge=0)
    timeout_s: float = config_key(240.0, gt=0)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    launch_count: int = 4
    warmup: int = 1
    ncu: str = "ncu"
    cache_dir: str = ".evo/profiles"
    device: int = 0
    seed: int = 1234

    def __post_init__(self) -> None:
        # Only the fields set by code: the config keys were checked where they were read.
        if self.launch_count < 1:
            raise ValueError(f"ProfileSettings.launch_count = {self.launch_count}: must be >= 1")
        if not self.metrics:
            raise ValueError("ProfileSettings.metrics is empty; leave it out to use the default list")


# ----------------------------------------------------------------------------- parsing


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
    """Kernel rows of ncu's ``--csv --page raw`` output (see the module docstring).

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


# ----------------------------------------------------------------------------- roofline

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


# ----------------------------------------------------------------------------- cache


def profile_key(so_sha256: str, shape: Mapping[str, int], gpu: str, metrics: Sequence[str] = DEFAULT_METRICS) -> str:
    """Cache key: binary hash, shape, GPU name, and the metric list + summary version."""
    h = hashlib.sha256()
    h.update(json.dumps([so_sha256, sorted((str(k), int(v)) for k, v in shape.items()), gpu,
                         sorted(metrics), SUMMARY_VERSION]).encode())
    return h.hexdigest()


class ProfileCache:
    """Finished profiles as ``<dir>/<key[:2]>/<key>.json``; writes are atomic (tmp + rename).

    A corrupt file counts as a miss (and is overwritten by the next profile); the cache is
    an optimisation, the store is the record.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        p = self._path(key)
        try:
            return json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable profile cache entry %s: %s", p, e)
            return None

    def put(self, key: str, metrics: Mapping[str, Any]) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(metrics), sort_keys=True))
        os.replace(tmp, p)


# ----------------------------------------------------------------------------- running


def find_ncu(ncu: str = "ncu") -> str:
    """Path of the ncu executable: ``ncu`` as given (path or PATH name), else the CUDA
    toolkit's ``/usr/local/cuda/bin/ncu``; :class:`NcuNotFoundError` if none exists."""
    if os.sep in ncu and os.access(ncu, os.X_OK):
        return ncu
    found = shutil.which(ncu)
    if found:
        return found
    for cand in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ncu"),
                 "/usr/local/cuda/bin/ncu"):
        if os.access(cand, os.X_OK):
            return cand
    raise NcuNotFoundError(
        f"Nsight Compute (ncu) not found as {ncu!r}, on PATH, or in $CUDA_HOME/bin; install it "
        "(it ships with the CUDA toolkit) or set profile.ncu to its path, or disable profiling "
        "with profile.enabled = false"
    )


def gpu_name(device: int = 0) -> str:
    """The name nvidia-smi gives GPU ``device`` (among visible devices), without touching
    CUDA here; ``""`` when unknown (then nothing is cached)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    target = ids[device] if device < len(ids) else str(device)
    try:
        out = subprocess.run(["nvidia-smi", f"--id={target}", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""


def build_ncu_command(ncu: str, settings: ProfileSettings, jobdir: Path, log_file: Path,
                      metrics: Sequence[str], python: str | None = None) -> list[str]:
    """The ncu command line (see the module docstring)."""
    return [
        ncu, "--clock-control", "none", "--target-processes", "all",
        "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
        "--launch-count", str(settings.launch_count),
        "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics),
        "--log-file", str(log_file),
        python or sys.executable, "-m", "evaluators.child.profile", str(jobdir),
    ]


_PERM_MARKERS = ("ERR_NVGPUCTRPERM", "permission to access NVIDIA GPU Performance Counters")


def _shape_dict(task: Any, shape: int | Mapping[str, int]) -> dict[str, int]:
    if isinstance(shape, int):
        shapes = task.shapes
        if not 0 <= shape < len(shapes):
            raise ValueError(f"shape index {shape} out of range: task {task.name} has {len(shapes)} shapes")
        return {str(k): int(v) for k, v in shapes[shape].items()}
    return {str(k): int(v) for k, v in shape.items()}


def _run_group(argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
               stdout: Path, stderr: Path) -> tuple[int | None, float]:
    """Run ``argv`` in its own session; kill the whole group on timeout. (rc or None, wall s)."""
    t0 = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, close_fds=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return rc, time.monotonic() - t0


def _tail(path: Path, n: int = 3000) -> str:
    try:
        t = path.read_text(errors="replace")
    except OSError:
        return ""
    return t[-n:].strip()


def profile_candidate(
    candidate: Candidate,
    so_bytes: bytes,
    task: Any,
    shape: int | Mapping[str, int],
    *,
    settings: ProfileSettings,
    gpu: str | None = None,
    task_files: Sequence[str] = (),
    python: str | None = None,
    keep_dir: bool = False,
) -> StageResult:
    """Profile one built candidate on one shape under ncu; a StageResult named ``profile``.

    ``task``: a :class:`~evo.tasks.base.Task` (or its registry name); ``shape``: an index
    into ``task.shapes`` or the shape dict. ``gpu``: the GPU's name for the cache key
    (default: asked of nvidia-smi). Metrics: :func:`summarize`'s dict plus ``shape``,
    ``gpu``, ``cached``, ``ncu_wall_s``. Raises :class:`ProfileError` when the profiler
    itself cannot run (see the module docstring).
    """
    if not isinstance(task, str) and not hasattr(task, "shapes"):
        raise TypeError(f"task must be a Task or a task name, not {type(task).__name__}")
    if isinstance(task, str):
        from evo.tasks.registry import get_task

        task = get_task(task)
    shp = _shape_dict(task, shape)
    sha = hashlib.sha256(bytes(so_bytes)).hexdigest()
    gpu = gpu if gpu is not None else gpu_name(settings.device)
    metrics = list(dict.fromkeys(settings.metrics))
    cache = ProfileCache(settings.cache_dir) if settings.cache_dir and gpu else None
    key = profile_key(sha, shp, gpu, metrics)
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            log.debug("profile cache hit for %s on %s", candidate.short_id, shp)
            return StageResult(STAGE, Status.OK, metrics={**hit, "cached": True})
    ncu = find_ncu(settings.ncu)
    from evaluators.isolation import child_env

    jobdir = Path(tempfile.mkdtemp(prefix="evo-profile-"))
    t0 = time.monotonic()
    try:
        (jobdir / "kernel.so").write_bytes(bytes(so_bytes))
        os.chmod(jobdir / "kernel.so", 0o700)
        (jobdir / "job.json").write_text(json.dumps({
            "task": task.name, "task_files": [str(Path(f).resolve()) for f in task_files],
            "candidate_id": candidate.id, "shape": shp, "seed": settings.seed,
            "warmup": settings.warmup, "nvtx_range": NVTX_RANGE, "so": "kernel.so",
        }))
        env = child_env(settings.device, jobdir)
        # ncu keeps its own temp / lock files; give it the job's private tmp.
        env.setdefault("HOME", str(jobdir))
        log_file = jobdir / "ncu.csv"
        argv = build_ncu_command(ncu, settings, jobdir, log_file, metrics, python)
        rc, wall = _run_group(argv, env, jobdir, settings.timeout_s, jobdir / "stdout.log",
                              jobdir / "stderr.log")
        out_text = _tail(log_file, 400_000) if log_file.exists() else ""
        err_text = _tail(jobdir / "stderr.log") + "\n" + _tail(jobdir / "stdout.log")
        if rc is None:
            return StageResult(STAGE, Status.TIMEOUT,
                               f"ncu run timed out after {settings.timeout_s:g}s (process group killed)",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:]}, seconds=time.monotonic() - t0)
        both = out_text + "\n" + err_text
        if any(m in both for m in _PERM_MARKERS):
            raise ProfileError(
                "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM); "
                "run as root or set the driver option NVreg_RestrictProfilingToAdminUsers=0, or "
                "disable profiling with profile.enabled = false"
            )
        result = _read_child_result(jobdir)
        if result is not None and not result.get("ok", False):
            return StageResult(STAGE, Status.CRASH,
                               f"candidate failed under ncu: {result.get('error', 'unknown error')}",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:]}, seconds=time.monotonic() - t0)
        try:
            rows = [] if "No kernels were profiled" in both else parse_ncu_csv(out_text)
        except ValueError as e:
            why = "the profiled program died" if result is None else "ncu printed no CSV"
            if "==ERROR==" in both and result is not None:
                raise ProfileError(f"ncu failed (exit {rc}): {_first_error(both)}") from e
            return StageResult(STAGE, Status.CRASH, f"{why} (ncu exit {rc}): {_first_error(both)}",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"stderr": err_text[-2000:], "ncu": out_text[-2000:]},
                               seconds=time.monotonic() - t0)
        if not rows:
            return StageResult(STAGE, Status.CRASH,
                               f"ncu captured no kernel inside the '{NVTX_RANGE}' NVTX range: the "
                               "candidate launched nothing on this shape (or launched it from another thread)",
                               metrics={"shape": shp, "gpu": gpu},
                               artifacts={"ncu": out_text[-2000:]}, seconds=time.monotonic() - t0)
        summary = summarize(rows, metrics)
        summary.update({"shape": shp, "gpu": gpu or (result or {}).get("gpu", ""), "so_sha256": sha,
                        "ncu_wall_s": round(wall, 3),
                        "child_wall_s": (result or {}).get("seconds")})
        try:
            summary["bound"] = classify_roofline(summary, task, shp, _gpu_spec(summary["gpu"]))
        except ValueError:
            summary["bound"] = "unknown"
        if cache is not None:
            cache.put(key, summary)
        return StageResult(STAGE, Status.OK, metrics={**summary, "cached": False},
                           seconds=time.monotonic() - t0)
    finally:
        if keep_dir:
            log.info("kept profile job dir %s", jobdir)
        else:
            shutil.rmtree(jobdir, ignore_errors=True)


def _gpu_spec(name: str) -> Any:
    try:
        from evo.tasks.gpus import match_gpu

        return match_gpu(name) if name else None
    except ImportError:  # pragma: no cover - evo.tasks imports torch
        return None


def _first_error(text: str) -> str:
    for ln in text.splitlines():
        if "==ERROR==" in ln or "Error" in ln:
            return ln.strip()[:500]
    return text.strip().splitlines()[-1][:500] if text.strip() else "no output"


def _read_child_result(jobdir: Path) -> dict[str, Any] | None:
    p = jobdir / "result.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
