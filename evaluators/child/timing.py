"""Timing stage (runs inside the isolated harness process): shared/EVALUATION.md, Timing.

Per benchmark shape, candidate and reference are timed by the same loop, interleaved rep by
rep so clock and thermal drift hit both alike:

- inputs made once by the harness, rotated among several identical copies when inputs plus
  outputs would fit in ~3x the L2 (each copy has its own outputs);
- warm-up calls of both, then ``reps`` timed calls each: L2 flush (``flush_mb`` written on
  the harness stream) -> start event -> call -> end event, all on the harness stream, then a
  device-wide ``synchronize`` so nothing of one rep spills into the next;
- GPU state the candidate could carry into timed calls is reset (``device_guard``,
  :mod:`evaluators.child.device_state`): limits restored and the persisting-L2 carve-out and the
  stream's access-policy window cleared before each shape, persisting lines reset before
  every rep (they would survive the flush);
- a side-stream probe: a few untimed calls from an idle device, each followed by waiting for
  the harness stream's end event and timing a device-wide ``synchronize``; time beyond the
  bare synchronize cost ("leftover") is work on a stream the events did not see: ``invalid``;
- median and IQR of each; every sample is stored in the metrics;
- after the timed calls the candidate's output is poisoned, recomputed and compared with its
  first output: a kernel that changes behaviour after many calls (a call counter, a cache
  keyed by pointer) is ``incorrect``; so is a first timed output that fails the task's
  tolerance against the fp64 ground truth (a kernel that computes only when it is checked);
- speed-of-light: a candidate median under ``evo.tasks.gpus.speed_of_light_ms`` is physically
  impossible and ``invalid``; a speedup > 10x over the reference sets
  ``metrics["needs_reconfirm"]`` (the engine re-times it in a fresh process first).

fitness = geometric mean over shapes of ``ref_median / candidate_median``.
The reference is the task's own reference on the original-dtype inputs with TF32 off, run
eagerly; with ``[evaluator] reference = "compile"`` (or ``time_compiled_reference``) the same
function under ``torch.compile`` is timed too, in the same loop after its own flush
(:mod:`evaluators.child.reference`), and fitness is against the basis the config names.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from evaluators.child.reference import COMPILE_MODE, TimedReference, warm_up
from evo.core.records import StageResult, Status

__all__ = [
    "ShapeSamples",
    "median",
    "iqr",
    "geomean",
    "summarize",
    "side_stream_verdict",
    "input_copies",
    "time_shapes",
    "RECONFIRM_SPEEDUP",
    "LEFTOVER_MIN_MS",
]

log = logging.getLogger(__name__)

#: Speedups above this are re-measured in a fresh process before becoming champion.
RECONFIRM_SPEEDUP = 10.0
#: Median device work left after the end event (beyond the bare synchronize cost) above this,
#: and above half the kernel's own median, means work on an untimed stream.
LEFTOVER_MIN_MS = 0.05
#: Side-stream probe calls per shape (untimed).
PROBES = 5
#: Inputs + outputs smaller than this many L2s get rotated copies.
ROTATE_L2_MULTIPLE = 3
MAX_COPIES = 16


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of no samples")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _quantile(s: list[float], q: float) -> float:
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def iqr(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("IQR of no samples")
    return _quantile(s, 0.75) - _quantile(s, 0.25)


def geomean(xs: Sequence[float]) -> float:
    if not xs or any(x <= 0 or not math.isfinite(x) for x in xs):
        raise ValueError(f"geometric mean needs positive finite values, got {list(xs)}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def input_copies(total_bytes: int, l2_bytes: int) -> int:
    """How many identical input sets to rotate so one rep never hits another's L2 lines."""
    budget = ROTATE_L2_MULTIPLE * max(l2_bytes, 1)
    if total_bytes <= 0:
        return MAX_COPIES
    if total_bytes >= budget:
        return 1
    return max(2, min(MAX_COPIES, math.ceil(budget / total_bytes)))


@dataclass(frozen=True)
class ShapeSamples:
    """Raw samples of one shape (ms) and what the checks need."""

    shape: dict[str, int]
    cand_ms: tuple[float, ...]
    ref_ms: tuple[float, ...]
    leftover_ms: tuple[float, ...]
    copies: int
    sol_ms: float | None
    sync_ms: tuple[float, ...] = ()
    #: the compiled reference's samples (:mod:`evaluators.child.reference`); empty when not timed
    compile_ref_ms: tuple[float, ...] = ()


def side_stream_verdict(shape: dict[str, int], cand_median_ms: float, leftover_ms: float) -> str | None:
    """The ``invalid`` reason when device work outlasts the harness stream's end event."""
    if leftover_ms > LEFTOVER_MIN_MS and leftover_ms > 0.5 * cand_median_ms:
        return (
            f"shape {shape}: device work continued {leftover_ms:.3f} ms (median) after the "
            f"harness stream's end event while the timed call took {cand_median_ms:.3f} ms: the "
            "kernel launches on another stream; launch every kernel on the `stream` argument"
        )
    return None


def summarize(samples: Sequence[ShapeSamples], basis: str = "eager") -> StageResult:
    """Turn raw samples into the timing StageResult (medians, IQRs, SOL and side-stream checks).

    ``speedup`` / ``ref_*`` are against the eager reference, ``compile_*`` against the
    compiled one when it was timed (every shape or none). ``metrics["fitness"]`` is against
    ``basis`` (``eager`` or ``compile``); ``fitness_eager`` and, when timed,
    ``fitness_compile`` are both kept, with ``reference`` naming the basis.
    """
    rows: list[dict[str, Any]] = []
    speedups: list[float] = []
    compile_speedups: list[float] = []
    if basis == "compile" and any(not s.compile_ref_ms for s in samples):
        raise ValueError("fitness against the compiled reference needs its samples on every shape")
    for s in samples:
        cm, rm = median(s.cand_ms), median(s.ref_ms)
        lo = median(s.leftover_ms) if s.leftover_ms else 0.0
        lo -= median(s.sync_ms) if s.sync_ms else 0.0
        row = {
            "shape": s.shape,
            "median_ms": cm,
            "iqr_ms": iqr(s.cand_ms),
            "ref_median_ms": rm,
            "ref_iqr_ms": iqr(s.ref_ms),
            "speedup": rm / cm if cm > 0 else float("inf"),
            "sol_ms": s.sol_ms,
            "pct_sol": (100.0 * s.sol_ms / cm) if (s.sol_ms and cm > 0) else None,
            "leftover_median_ms": lo,
            "input_copies": s.copies,
            "samples_ms": list(s.cand_ms),
            "ref_samples_ms": list(s.ref_ms),
        }
        if s.compile_ref_ms:
            km = median(s.compile_ref_ms)
            row.update({
                "compile_ref_median_ms": km,
                "compile_ref_iqr_ms": iqr(s.compile_ref_ms),
                "compile_speedup": km / cm if cm > 0 else float("inf"),
                "compile_ref_samples_ms": list(s.compile_ref_ms),
            })
        rows.append(row)
        side = side_stream_verdict(s.shape, cm, lo)
        if side:
            return StageResult("timing", Status.INVALID, side, {"shapes": rows})
        if cm <= 0:
            return StageResult("timing", Status.INVALID,
                               f"shape {s.shape}: non-positive median time {cm}", {"shapes": rows})
        if s.sol_ms is not None and cm < s.sol_ms:
            return StageResult(
                "timing", Status.INVALID,
                f"shape {s.shape}: median {cm:.4f} ms beats the speed-of-light bound "
                f"{s.sol_ms:.4f} ms (compulsory bytes / peak bandwidth, FLOPs / peak rate); "
                "the measurement cannot be real (skipped work, another stream, cached results)",
                {"shapes": rows},
            )
        speedups.append(row["speedup"])
        if "compile_speedup" in row:
            compile_speedups.append(row["compile_speedup"])
    fitness_eager = geomean(speedups) if speedups else None
    timed_compile = bool(compile_speedups) and len(compile_speedups) == len(speedups)
    fitness_compile = geomean(compile_speedups) if timed_compile else None
    basis_speedups = compile_speedups if basis == "compile" else speedups
    metrics: dict[str, Any] = {
        "shapes": rows,
        "fitness": fitness_compile if basis == "compile" else fitness_eager,
        "reference": basis,
        "fitness_eager": fitness_eager,
        "needs_reconfirm": bool(basis_speedups) and max(basis_speedups) > RECONFIRM_SPEEDUP,
    }
    if timed_compile:
        metrics["fitness_compile"] = fitness_compile
        metrics["compile_mode"] = COMPILE_MODE
    return StageResult("timing", Status.OK, "", metrics)


def _verify_timed_output(task: Any, shape: dict[str, int], outputs: Sequence[Any], *, gen_seed: int,
                         dist: str, device: Any) -> str | None:
    """The ``incorrect`` reason when ``outputs`` (from the timed inputs, regenerated here from
    their seed) fail the task's tolerance against the ground truth."""
    import torch

    from evaluators.child.correctness import first_wrong_output, ground_truth

    gen = torch.Generator(device=device)
    gen.manual_seed(gen_seed)
    with torch.no_grad():
        truth = ground_truth(task, task.make_inputs(shape, gen, dist, device))
    wrong = first_wrong_output(task, outputs, truth)
    return None if wrong is None else (
        f"shape {shape}, {wrong}: the output of the timed calls is wrong although the correctness "
        "stage passed: the kernel behaves differently when timed")


def time_shapes(
    task: Any,
    kernel: Any,
    *,
    shape_indices: Sequence[int],
    scalars: Sequence[float],
    warmup: int,
    reps: int,
    flush_mb: int,
    seed: int,
    stream: Any,
    sol_ms: Callable[[dict[str, int]], float | None],
    progress: Callable[[dict[str, Any]], None] = lambda p: None,
    device_guard: Any = None,
    references: Sequence[Any] | None = None,
    basis: str = "eager",
) -> StageResult:
    """Time candidate and reference on the task's benchmark shapes (CUDA only).

    ``kernel`` is an :class:`evaluators.child.abi.KernelLibrary`; ``stream`` a ``torch.cuda.Stream``
    that is current. Raises :class:`evaluators.child.correctness.CandidateFault` or CUDA errors on
    a fault (the harness maps them to ``crash``). ``device_guard``: an
    :class:`evaluators.child.device_state.DeviceGuard` made before the candidate was loaded; its
    ``restore`` runs before each shape's warm-up and ``between_reps`` before every timed rep,
    so no persisting-L2 line, access-policy window or raised limit of the candidate's carries
    into a timed call (what it reset is in ``metrics["device_resets"]``).
    ``references``: the :class:`evaluators.child.reference.TimedReference` list to time
    (default: the eager reference only); the compiled one must have been compiled for these
    shapes already (the harness does so before the candidate is loaded), its warm-up here
    is untimed like the candidate's. ``basis`` is what ``fitness`` is against.
    """
    import torch

    from evaluators.child import abi
    from evaluators.child.correctness import CandidateFault, poison_, trial_seed
    timed = list(references) if references else [TimedReference("eager", task.reference)]
    if timed[0].kind != "eager":
        raise ValueError("the eager reference must be timed first")

    t_start = time.monotonic()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    task_dtype = getattr(torch, task.dtype)
    flush = torch.empty(int(flush_mb) * 2**20, dtype=torch.uint8, device=dev)
    handle = int(stream.cuda_stream)
    all_samples: list[ShapeSamples] = []

    def call(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor], workspace: Any = abi.AUTO) -> None:
        rc = kernel.launch(ins, outs, scalars, handle, workspace)
        if rc != 0:
            raise CandidateFault(Status.CRASH, f"evo_launch returned {kernel.error_name(rc)} ({rc})")

    def check_last_error(where: str) -> None:
        err = kernel.last_error()
        if err:
            raise CandidateFault(Status.CRASH, f"{where}: cudaGetLastError = {kernel.error_name(err)} ({err})")

    for si in shape_indices:
        shape = dict(task.shapes[si])
        dist = task.distributions[0] if task.distributions else "normal"
        gen = torch.Generator(device=dev)
        gen.manual_seed(trial_seed(seed, 1000 + si, 0))
        with torch.no_grad():
            base = tuple(task.make_inputs(shape, gen, dist, dev))
            refs = task.reference(*base)
            refs = tuple(refs) if isinstance(refs, (tuple, list)) else (refs,)
        out_specs = [(r.shape, task_dtype if r.is_floating_point() else r.dtype) for r in refs]
        total = sum(x.numel() * x.element_size() for x in base) + sum(
            r.numel() * r.element_size() for r in refs)
        del refs
        n = input_copies(total, l2)
        copies = [base] + [tuple(x.clone() for x in base) for _ in range(n - 1)]
        outs = [[torch.empty(s, dtype=d, device=dev) for s, d in out_specs] for _ in range(n)]
        torch.cuda.synchronize()
        if device_guard is not None:
            device_guard.restore()
        progress({"stage": "timing", "shape": shape, "step": "warm-up"})
        with torch.no_grad():
            warm_up(task.name, timed, copies, warmup, torch.cuda.synchronize)
            for i in range(max(int(warmup), 1)):
                call(copies[i % n], outs[i % n])
            torch.cuda.synchronize()
            check_last_error(f"shape {shape} warm-up")
            first = [o.clone() for o in outs[0]]

            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            ref_ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in timed[1:]]
            cand_ms: list[float] = []
            ref_ms: list[float] = []
            extra_ms: list[list[float]] = [[] for _ in timed[1:]]
            left_ms: list[float] = []
            base_ms: list[float] = []
            progress({"stage": "timing", "shape": shape, "step": f"{reps} timed calls"})
            for r in range(int(reps)):
                c = r % n
                if device_guard is not None:  # the device is idle here (synchronize below)
                    device_guard.between_reps()
                # references: eager, then compiled (when timed), each after its own flush
                flush.zero_()
                ev[0].record(stream)
                timed[0].fn(*copies[c])
                ev[1].record(stream)
                for ref, (e0, e1) in zip(timed[1:], ref_ev):
                    flush.zero_()
                    e0.record(stream)
                    ref.fn(*copies[c])
                    e1.record(stream)
                # candidate (its workspace, if any, is made and poisoned before the clock starts)
                ws = kernel.make_workspace(copies[c], outs[c], scalars)
                flush.zero_()
                ev[2].record(stream)
                call(copies[c], outs[c], ws)
                ev[3].record(stream)
                torch.cuda.synchronize()  # device-wide: nothing of this rep spills into the next
                ref_ms.append(ev[0].elapsed_time(ev[1]))
                for samples, (e0, e1) in zip(extra_ms, ref_ev):
                    samples.append(e0.elapsed_time(e1))
                cand_ms.append(ev[2].elapsed_time(ev[3]))
                del ws
            check_last_error(f"shape {shape} timed calls")

            # Side-stream probe: from an idle device, call, wait for the harness stream's end
            # event, then time a device-wide synchronize. Work on another stream shows up as
            # time beyond the bare synchronize cost (measured the same way with no call).
            progress({"stage": "timing", "shape": shape, "step": "side-stream probe"})
            for _ in range(PROBES):
                torch.cuda.synchronize()
                ev[0].record(stream)
                ev[0].synchronize()
                t0 = time.perf_counter()
                torch.cuda.synchronize()
                base_ms.append((time.perf_counter() - t0) * 1e3)
            for _ in range(PROBES):
                torch.cuda.synchronize()
                call(copies[0], outs[0])
                ev[3].record(stream)
                ev[3].synchronize()
                t0 = time.perf_counter()
                torch.cuda.synchronize()
                left_ms.append((time.perf_counter() - t0) * 1e3)

            side = side_stream_verdict(shape, median(cand_ms), median(left_ms) - median(base_ms))
            if side:
                return StageResult("timing", Status.INVALID, side,
                                   {"shape": shape, "samples_ms": cand_ms, "leftover_ms": left_ms,
                                    "sync_ms": base_ms},
                                   seconds=time.monotonic() - t_start)

            # Behaviour must not change after many calls.
            for o in outs[0]:
                poison_(o)
            progress({"stage": "timing", "shape": shape, "step": "post-timing re-check"})
            call(copies[0], outs[0])
            torch.cuda.synchronize()
        for k, (a, b) in enumerate(zip(first, outs[0])):
            d = (a.double() - b.double()).abs()
            diff = float(d.max()) if d.numel() else 0.0
            if not (math.isfinite(diff) and diff <= task.tolerance.nondeterminism):
                return StageResult(
                    "timing", Status.INCORRECT,
                    f"shape {shape}, output {k}: after {int(reps) + int(warmup)} calls the kernel's "
                    f"output changed (max |diff| = {diff:.3g} vs its first output, NaN = unwritten); "
                    "it keeps state between calls (call counter, pointer-keyed cache)",
                    {"shapes": [s.shape for s in all_samples]},
                    seconds=time.monotonic() - t_start,
                )
        # The timed output must also be right, not only stable: timing may run in a process of
        # its own (HarnessSettings.fresh_timing_process), and a kernel that can tell it from the
        # correctness process (its first call is a benchmark shape) could otherwise time a
        # cheap wrong answer. Ground truth as in the correctness stage, from inputs regenerated
        # from the seed (the kernel had write access to the timed ones).
        del copies, outs
        wrong = _verify_timed_output(task, shape, first, gen_seed=trial_seed(seed, 1000 + si, 0), dist=dist,
                                     device=dev)
        if wrong:
            return StageResult("timing", Status.INCORRECT, wrong, {"shapes": [s.shape for s in all_samples]},
                               seconds=time.monotonic() - t_start)
        sol: float | None = None
        try:
            sol = sol_ms(shape)
        except Exception as e:  # a missing bound must not fail the candidate
            log.warning("no speed-of-light bound for %s %s: %s", task.name, shape, e)
        compiled = next((tuple(x) for r, x in zip(timed[1:], extra_ms) if r.kind == "compile"), ())
        all_samples.append(ShapeSamples(shape, tuple(cand_ms), tuple(ref_ms), tuple(left_ms), n, sol,
                                        tuple(base_ms), compiled))
        del first, base
        torch.cuda.empty_cache()
    res = summarize(all_samples, basis)
    metrics = dict(res.metrics)
    metrics.update({"reps": int(reps), "warmup": int(warmup), "flush_mb": int(flush_mb)})
    compile_s = sum(r.compile_s for r in timed if r.kind == "compile")
    if compile_s:
        metrics["reference_compile_s"] = compile_s
    if device_guard is not None:
        metrics.update(device_guard.metrics())
    return StageResult(res.stage, res.status, res.reason, metrics, res.artifacts,
                       seconds=time.monotonic() - t_start)
