"""Timing, decided by the judge (shared/EVALUATION.md, Timing, and the 2026-12-06 revision).

Every timed call is driven by the judge, one round trip each, and every step a timing relies
on happens in the judge's process, on the device memory the candidate reads:

1. fresh inputs written into the shape's buffers (new values every rep: no result can be
   carried from one timed call to the next; drawn on the device by
   :mod:`evaluators.judge.fill` where it applies);
2. outputs poisoned, an L2 flush (and persisting lines reset), a device synchronise: the
   candidate starts from a cold cache it cannot warm from its own process;
3. the runner calls the candidate once; the judge's clock runs around the round trip;
4. after the call, and only then, whether this call is checked is drawn (always for the
   first and the last; :data:`CHECK_SHARE` of the others once the reference pool is full):
   steps 1-3 are the same for every call, so a candidate cannot tell a checked call from
   another before it returns;
5. a checked call's inputs drawn again from their seed (first and last: compared with the
   buffers, bit for bit), each reference (eager, then compiled when timed) run on that copy
   after an L2 flush, between the judge's own events (:class:`ReferencePool`), and the
   call's output fully written and equal to the eager reference's within
   :data:`SANITY_REL_L2` (the first against the fp64 ground truth with the task's
   tolerance): a call that skipped work, or answered before its work was done, fails here.

The candidate's time is the runner's event time, believed only when the judge's clock agrees
(:func:`corroborate`): the median round trip minus the median round trip of the runner's own
empty call (measured before the candidate was loaded, ``NULLCALL``) is what the call took;
the runner may not claim much less. Medians, IQRs, speedups, the speed-of-light and
reconfirm rules are those of :func:`evaluators.judge.summary.summarize`.

The device is reached through :class:`DeviceOps` so the loop runs on the CPU in the tests
with a fake clock and a fake kernel.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from evaluators.judge.phases import Phases
from evaluators.judge.slots import ShapeSlots
from evaluators.judge.trials import Call, CallFailed, check_done
from evo.core.records import StageResult, Status

__all__ = ["DeviceOps", "CpuOps", "CudaOps", "Calibration", "Baseline", "corroborate", "low_quantile", "time_shape",
           "time_shapes", "paired_metrics",
           "ReferencePool", "check_share", "CHECK_SHARE", "SANITY_REL_L2", "CORROBORATE_REL", "CORROBORATE_ABS_MS", "CORROBORATE_NOISE_K"]

#: A timed output whose relative L2 distance to the eager reference's exceeds this was not
#: computed (an unrelated or stale answer is ~1.4; a correct one is below 1e-2 in bf16).
SANITY_REL_L2 = 0.05
#: Elements of each timed output compared with the reference's (drawn afresh every call).
SANITY_SAMPLE = 1 << 16
#: The probability that a timed call between the first and the last is checked (its output
#: compared with the reference's, the reference timed), once the judge's reference pool is full.
CHECK_SHARE = 0.25
#: Elements scanned at a time for unwritten poison (bounds the judge's temporaries).
SANITY_CHUNK = 1 << 26
#: The runner's median may fall short of the judge's implied time by this fraction...
CORROBORATE_REL = 0.25
#: ... plus this many ms (scheduling jitter of one round trip) ...
CORROBORATE_ABS_MS = 0.05
#: ... plus this many IQRs of the empty call's round trips.
CORROBORATE_NOISE_K = 3.0
#: The quantile of round trips the judge's clock is read at (delays only add to a round trip).
LOW_QUANTILE = 0.1


class DeviceOps:
    """What the loop needs of the judge's device: ``flush`` (evict the cache the candidate
    would read from), ``sync`` (wait for the judge's work), ``time_ms(fn)`` (run ``fn`` between
    the judge's own clock marks: ``(result, ms)``), ``clock()`` (the judge's wall clock, s)."""

    def flush(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def sync(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def time_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:  # pragma: no cover - interface
        raise NotImplementedError

    def clock(self) -> float:
        return time.perf_counter()


class CpuOps(DeviceOps):
    """The CPU stand-in: no cache to flush, the wall clock for everything (``clock`` may be a
    fake)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def clock(self) -> float:
        return self._clock()

    def time_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = self._clock()
        r = fn()
        return r, (self._clock() - t0) * 1e3


class CudaOps(DeviceOps):
    """The judge's GPU: an L2 flush of ``flush_mb`` written on the current stream (persisting
    lines reset first), CUDA events for the references, a device synchronise."""

    def __init__(self, flush_mb: int) -> None:
        import ctypes

        import torch

        self._torch = torch
        self._buf = torch.empty(int(flush_mb) << 20, dtype=torch.uint8, device="cuda")
        self._ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        try:
            self._reset = ctypes.CDLL("libcuda.so.1").cuCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            self._reset = None

    def flush(self) -> None:
        if self._reset is not None:
            self._reset()
        self._buf.zero_()

    def sync(self) -> None:
        self._torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        s = self._torch.cuda.current_stream()
        self._ev[0].record(s)
        r = fn()
        self._ev[1].record(s)
        self._ev[1].synchronize()
        return r, self._ev[0].elapsed_time(self._ev[1])


@dataclass(frozen=True)
class Calibration:
    """The runner's empty call before the candidate was loaded: the judge's round-trip ms
    (what a call costs beyond its own work) and the runner's event ms."""

    wall_ms: tuple[float, ...]
    event_ms: tuple[float, ...] = ()

    @property
    def overhead_ms(self) -> float:
        """A low quantile of the empty round trips: scheduling delays only ever add to a
        round trip, so the low end is the call's own cost."""
        return low_quantile(self.wall_ms) if self.wall_ms else 0.0

    @property
    def noise_ms(self) -> float:
        from evaluators.judge.summary import iqr

        return iqr(self.wall_ms) if len(self.wall_ms) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"overhead_ms": self.overhead_ms, "noise_ms": self.noise_ms, "wall_ms": list(self.wall_ms)}


def low_quantile(xs: Sequence[float], q: float = LOW_QUANTILE) -> float:
    """The ``q`` quantile of ``xs`` (linear interpolation)."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of no samples")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def corroborate(shape: dict[str, int], cand_ms: Sequence[float], wall_ms: Sequence[float],
                calib: Calibration) -> tuple[str | None, dict[str, float]]:
    """``(reason, numbers)``: the ``invalid`` reason when the runner's median event time is
    shorter than the judge's clock allows (None when it agrees), and both numbers.

    The judge's side uses a low quantile (:data:`LOW_QUANTILE`) of the round trips, of the
    timed calls and of the empty ones alike: a busy host (the compile pool, the judge's own
    threads) only ever delays a round trip, so the low end is what the call itself took,
    while a runner that reports less than its call took is caught on every rep."""
    from evaluators.judge.summary import median

    claimed = median(cand_ms)
    implied = low_quantile(wall_ms) - calib.overhead_ms
    slack = CORROBORATE_REL * max(implied, 0.0) + CORROBORATE_ABS_MS + CORROBORATE_NOISE_K * calib.noise_ms
    nums = {"runner_median_ms": claimed, "judge_implied_ms": implied, "judge_wall_median_ms": median(wall_ms),
            "judge_wall_low_ms": low_quantile(wall_ms),
            "call_overhead_ms": calib.overhead_ms, "slack_ms": slack}
    if claimed < implied - slack:
        return (f"shape {shape}: the runner reports {claimed:.4f} ms per call (median) but the judge's clock "
                f"measured {implied:.4f} ms beyond the empty call's round trip (slack {slack:.4f} ms): the "
                "reported time is not what the call took (work outside the timed events, or a forged time)"), nums
    return None, nums


def _sanity(task: Any, outs: Sequence[Any], refs: Sequence[Any], *, sample: int = SANITY_SAMPLE,
            seed: int = 0) -> str | None:
    """Why the timed output cannot be the reference's answer (None when it can).

    Every element is scanned for unwritten poison (NaN where the reference has a number: the
    outputs are poisoned before every call), in chunks, with no copy of the output; values are
    compared on ``sample`` elements drawn afresh by the judge (``seed``), in float64, by
    relative L2 distance. A call that skipped work, wrote part of the output, or answered
    from inputs other than this call's fails one or the other."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    for k, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            return f"output {k} has shape {tuple(o.shape)}, the reference {tuple(r.shape)}"
        of, rf = o.reshape(-1), r.reshape(-1)
        n = of.numel()
        if n == 0:
            continue
        if o.is_floating_point():
            # the common case in one pass with no temporary: a finite sum of the output proves
            # it holds no NaN (a NaN makes any sum NaN). Only an output whose sum is not finite
            # (a NaN, or an infinity) is scanned chunk by chunk, and only one holding NaN is
            # compared position by position with the reference's NaNs
            total = of.sum(dtype=torch.float64 if o.dtype == torch.float64 else torch.float32)
            chunks = range(0, n, SANITY_CHUNK)
            any_nan = False if bool(torch.isfinite(total)) else \
                torch.stack([of[i:i + SANITY_CHUNK].isnan().any() for i in chunks]).any()
            unwritten = 0
            if bool(any_nan):
                for i in chunks:
                    oc, rc = of[i:i + SANITY_CHUNK], rf[i:i + SANITY_CHUNK]
                    unwritten += int((oc.isnan() & ~rc.isnan()).sum())
            if unwritten:
                return f"output {k}: {unwritten} of {n} elements still hold the poison written before the call"
        idx = torch.randint(0, n, (min(sample, n),), generator=gen).to(of.device)
        os_, rs = of[idx], rf[idx]
        if not r.is_floating_point():
            if not torch.equal(os_.to(rs.dtype), rs) and getattr(task, "index_rule", None) is None:
                return f"output {k} differs from the reference's on sampled elements"
            continue
        od, rd = os_.double(), rs.double()
        fin = torch.isfinite(rd)
        num = float(torch.linalg.vector_norm((od - rd)[fin]))
        den = float(torch.linalg.vector_norm(rd[fin]))
        rel = num / den if den > 0 else num
        if not math.isfinite(rel) or rel > SANITY_REL_L2:
            return (f"output {k}: relative L2 distance {rel:.3g} to the reference's output on the same "
                    f"inputs over {len(idx)} sampled elements (at most {SANITY_REL_L2})")
    return None


class ReferencePool:
    """The judge's latest reference samples, per task, shape and reference kind.

    A candidate's timed calls are all timed, but the reference runs (and is timed) only after
    the calls whose output the judge checks (:func:`time_shape`): its median is read over this
    candidate's own samples and the latest earlier ones of the same judge, same GPU, same
    code, up to the loop's ``reps``. Until the pool holds ``reps`` samples every call is
    checked, so the first candidate of a task times the reference on every call, as a pool
    of one candidate. The judge calls :meth:`prior` before a shape's loop and :meth:`add`
    after it; nothing else changes the pool."""

    #: samples kept per key (more than any loop reads)
    KEEP = 512

    def __init__(self) -> None:
        self._s: dict[tuple, list[float]] = {}

    @staticmethod
    def key(task: str, shape: dict[str, int], kind: str) -> tuple:
        return (task, tuple(sorted(shape.items())), kind)

    def prior(self, key: tuple, n: int) -> list[float]:
        """The latest ``n`` samples (oldest first)."""
        return list(self._s.get(key, ())[-n:]) if n > 0 else []

    def add(self, key: tuple, samples: Sequence[float]) -> None:
        kept = self._s.setdefault(key, [])
        kept.extend(float(x) for x in samples)
        del kept[:-self.KEEP]


def check_share(reps: int, pooled: int, share: float) -> float:
    """The probability that a timed call between the first and the last is checked: ``share``,
    or more while the reference pool holds fewer than ``reps`` samples (1.0 with none)."""
    if reps <= 2:
        return 1.0
    need = max(0, int(reps) - int(pooled))
    return min(1.0, max(float(share), need / float(reps)))


@dataclass(frozen=True)
class Baseline:
    """The other member of a paired timing (a champion confirmation: shared/EVALUATION.md,
    "paired, interleaved re-timing"): its own runner's call and empty-call calibration. Its
    calls are interleaved with the candidate's on the same fresh inputs, the order alternating
    rep by rep, each call prepared, timed and checked as the candidate's are. The baseline
    (the task's seed) was judged before; a failure of its own ends its part of the loop and
    is reported (``extra["baseline"]["error"]``), never held against the candidate."""

    call: Call
    calib: Calibration


@dataclass
class _Member:
    call: Call
    calib: Calibration
    primary: bool
    ms: list = field(default_factory=list)
    walls: list = field(default_factory=list)
    checked: int = 0
    failed: str | None = None


def time_shape(task: Any, call: Call, slots: ShapeSlots, *, shape: dict[str, int], references: Sequence[Any],
               reps: int, warmup: int, seed: int, ops: DeviceOps, calib: Calibration,
               progress: Callable[[dict[str, Any]], None] = lambda p: None,
               phases: Phases | None = None, fused: str | None = None,
               pool: ReferencePool | None = None, share: float = CHECK_SHARE,
               draw: Callable[[], float] | None = None,
               baseline: Baseline | None = None) -> tuple[Any, StageResult | None, dict]:
    """Warm-up and ``reps`` judge-driven timed calls of one shape.

    Every call is prepared the same way (fresh inputs, outputs poisoned, L2 flushed) and
    timed. The first and the last call are always checked; each call between them is
    checked with probability :func:`check_share`, drawn by ``draw`` (default: the operating
    system's randomness, which nothing the candidate sees can predict) *after* the call
    returned, so nothing before a call differs between checked and unchecked ones. A checked
    call's inputs are drawn again from their seed (first and last: compared with the
    buffers, bit for bit), the reference runs on that copy after an L2 flush (its time
    enters ``pool``) and the output is compared with it (:func:`_sanity`; the first call
    also against the fp64 ground truth with the task's tolerance): a kernel that answers
    wrongly on a fraction ``q`` of its calls escapes with probability about
    ``(1 - share * q) ** (reps - 2)``, and moving the median takes ``q >= 1/2``.

    With a ``baseline`` (:class:`Baseline`) each rep's fresh inputs serve both members, one
    call each, the order alternating (the candidate first on even reps); each call gets its
    own poison, flush and check, and the reference runs once a rep for both.

    Returns ``(samples, failure, extra)``: the :class:`~evaluators.judge.summary.ShapeSamples`
    and ``None``, or ``None`` and the failing StageResult (``incorrect`` or ``invalid``);
    ``extra`` holds the judge's wall samples and the corroboration numbers, and with a
    baseline ``extra["baseline"]``: its times (``ms``, one per rep) and corroboration, or
    ``error``. Raises :class:`CallFailed` when a call of the candidate fails.
    """
    import secrets

    import torch

    from evaluators.judge.checks import first_wrong_output, ground_truth, poison_, same_bits, trial_seed
    from evaluators.judge.reference import warm_up
    from evaluators.judge.summary import ShapeSamples
    from evaluators.judge.fill import input_filler

    dist = task.distributions[0] if task.distributions else "normal"
    fill = input_filler(task, slots.ins, shape, dist, fused)   # one draw for the whole shape: bits repeat
    refs = list(references)
    ph = phases if phases is not None else Phases()
    pool = pool if pool is not None else ReferencePool()
    keys = [ReferencePool.key(task.name, shape, ref.kind) for ref in refs]
    prior = [pool.prior(k, int(reps)) for k in keys]
    p = check_share(int(reps), min((len(x) for x in prior), default=0), share)
    if draw is None:
        draw = secrets.SystemRandom().random
    members = [_Member(call, calib, True)] + ([_Member(baseline.call, baseline.calib, False)] if baseline else [])
    cand = members[0]
    progress({"stage": "timing", "shape": shape, "step": "warm-up"})
    with ph("timing_warmup"):
        with torch.no_grad():
            fill(slots.ins, trial_seed(seed, 2000, 0))
            warm_up(task.name, refs, [tuple(slots.ins)], warmup, ops.sync)
        for m in members:
            try:
                for i in range(max(int(warmup), 1)):
                    check_done(m.call(slots)[0], f"shape {shape}, warm-up call {i}")
            except CallFailed as e:
                if m.primary:
                    raise
                m.failed = f"the baseline's warm-up: {e.reason}"
    own_ms: list[list[float]] = [[] for _ in refs]
    progress({"stage": "timing", "shape": shape, "step": f"{reps} timed calls"})
    last = int(reps) - 1
    for r in range(int(reps)):
        where = f"shape {shape}, timed call {r}"
        rep_seed = trial_seed(seed, 1000 + r, 1)
        ends = r in (0, last)
        given = eager_out = truth = None
        with ph("timing_inputs"), torch.no_grad():   # the same for every call, checked or not
            fill(slots.ins, rep_seed)
        order = [m for m in members if m.failed is None]
        for m in order if r % 2 == 0 else order[::-1]:
            with ph("timing_inputs"):
                with torch.no_grad():
                    for o in slots.outs:
                        poison_(o)
                ops.flush()
                ops.sync()
            try:
                with ph("timing_call"):
                    done, wall = m.call(slots)
                check_done(done, where)
            except CallFailed as e:
                if m.primary:
                    raise
                m.failed = f"the baseline's {where}: {e.reason}"
                continue
            m.ms.append(done.ms)
            m.walls.append(wall)
            if not (ends or draw() < p):
                continue
            m.checked += 1
            if given is None:   # the reference once a rep, for whichever member is checked
                with ph("timing_reference"), torch.no_grad():
                    given = [torch.empty_like(x) for x in slots.ins]
                    fill(given, rep_seed)
                    for j, ref in enumerate(refs):
                        ops.flush()
                        out, ms = ops.time_ms(lambda ref=ref, args=given: ref.fn(*args))
                        own_ms[j].append(ms)
                        if j == 0:
                            eager_out = out if isinstance(out, (tuple, list)) else (out,)
            with ph("timing_check"), torch.no_grad():
                wrong = None
                if ends:
                    for k, (x, g) in enumerate(zip(slots.ins, given)):
                        if not same_bits(x, g):
                            if m.primary:
                                return None, StageResult("timing", Status.INCORRECT,
                                                         f"{where}: the kernel modified input {k}"), {}
                            wrong = f"it modified input {k}"
                            break
                if wrong is None:
                    wrong = _sanity(task, slots.outs, eager_out, seed=trial_seed(seed, 3000 + r, 0))
                if wrong is None and r == 0:
                    if truth is None:
                        truth = ground_truth(task, given, host_fallback=True)
                    wrong = first_wrong_output(task, slots.outs, truth, fused=fused)
            if wrong:
                if m.primary:
                    return None, StageResult(
                        "timing", Status.INCORRECT,
                        f"{where}, {wrong}: the output of a timed call is wrong although the correctness stage "
                        "passed: the kernel behaves differently when timed"), {}
                m.failed = f"the baseline's {where}: {wrong}"
        del given, eager_out, truth
    reason, nums = corroborate(shape, cand.ms, cand.walls, calib)
    extra = {"wall_ms": cand.walls, **nums, "checked_calls": cand.checked, "check_share": round(p, 4),
             "reference_own": len(own_ms[0]) if own_ms else 0}
    if baseline is not None:
        extra["baseline"] = _baseline_extra(shape, members[1])
    if reason:
        return None, StageResult("timing", Status.INVALID, reason, {"shape": shape, "samples_ms": cand.ms, **extra}), extra
    ref_ms = []
    for k, old, own in zip(keys, prior, own_ms):
        pool.add(k, own)
        ref_ms.append(tuple((old + own)[-max(int(reps), len(own)):]))
    extra["reference_pooled"] = len(ref_ms[0]) - len(own_ms[0]) if ref_ms else 0
    compiled = next((x for ref, x in zip(refs, ref_ms) if ref.kind == "compile"), ())
    return ShapeSamples(shape, tuple(cand.ms), ref_ms[0] if ref_ms else (), (), 1, None, (), compiled), None, extra


def _baseline_extra(shape: dict[str, int], b: _Member) -> dict[str, Any]:
    """The baseline's part of a paired loop: its times and corroboration, or why it has none."""
    if b.failed is None:
        why, nums = corroborate(shape, b.ms, b.walls, b.calib)
        if why is None:
            return {"ms": list(b.ms), "checked_calls": b.checked, **nums}
        b.failed = f"the baseline's timing: {why}"
    return {"error": b.failed}


def time_shapes(task: Any, call: Call, slots_for: Callable[[int], ShapeSlots], *, shape_indices: Sequence[int],
                references: Sequence[Any], reps: int, warmup: int, seed: int, ops: DeviceOps, calib: Calibration,
                sol_ms: Callable[[dict[str, int]], float | None], basis: str = "eager",
                progress: Callable[[dict[str, Any]], None] = lambda p: None,
                phases: Phases | None = None, fused: str | None = None, pool: ReferencePool | None = None,
                share: float = CHECK_SHARE, draw: Callable[[], float] | None = None,
                baseline: Baseline | None = None) -> StageResult:
    """The timing stage over the benchmark shapes: ``ok`` with fitness, or the first
    ``incorrect`` / ``invalid``. Raises :class:`CallFailed` when a call fails. ``phases``
    receives the judge's seconds per step of the loop; ``pool``, ``share``, ``draw`` and
    ``baseline`` are :func:`time_shape`'s. With a baseline, ``metrics["paired"]`` holds the
    paired times (:func:`paired_metrics`)."""
    from evaluators.judge.summary import summarize

    t0 = time.monotonic()
    samples, per_shape_extra, base = [], [], []
    paired_with = baseline
    for si in shape_indices:
        shape = dict(task.shapes[si])
        s, failure, extra = time_shape(task, call, slots_for(si), shape=shape, references=references, reps=reps,
                                       warmup=warmup, seed=seed, ops=ops, calib=calib, progress=progress,
                                       phases=phases, fused=fused, pool=pool, share=share, draw=draw,
                                       baseline=paired_with)
        if failure is not None and failure.status is Status.INVALID:
            # A host busy for the whole loop can still push every round trip up: one more
            # loop, and the timing stands only if it agrees (a liar fails both).
            first = failure
            s, failure, extra = time_shape(task, call, slots_for(si), shape=shape, references=references,
                                           reps=reps, warmup=warmup, seed=seed + 1, ops=ops, calib=calib,
                                           progress=progress, phases=phases, fused=fused, pool=pool,
                                           share=share, draw=draw, baseline=paired_with)
            extra = {**extra, "first_loop_refused": first.reason}
        if failure is not None:
            return StageResult(failure.stage, failure.status, failure.reason, failure.metrics,
                               seconds=time.monotonic() - t0)
        try:
            sol = sol_ms(shape)
        except Exception:  # noqa: BLE001 - a missing bound must not fail the candidate
            sol = None
        samples.append(type(s)(s.shape, s.cand_ms, s.ref_ms, s.leftover_ms, s.copies, sol, s.sync_ms,
                               s.compile_ref_ms))
        b = extra.pop("baseline", None)
        if b is not None:
            base.append(b)
            extra["baseline"] = {k: v for k, v in b.items() if k != "ms"}
            paired_with = baseline if "error" not in b else None   # a failed baseline is not called again
        per_shape_extra.append({"shape": shape, **{k: v for k, v in extra.items() if k != "wall_ms"},
                                "wall_samples_ms": extra.get("wall_ms", [])})
    res = summarize(samples, basis)
    metrics = {**res.metrics, "reps": int(reps), "warmup": int(warmup), "corroboration": per_shape_extra,
               "calibration": calib.to_json(), "timed_by": "judge"}
    if baseline is not None and res.status is Status.OK:
        metrics["paired"] = paired_metrics(samples, base, basis)
    return StageResult(res.stage, res.status, res.reason, metrics, res.artifacts, time.monotonic() - t0)


def paired_metrics(samples: Sequence[Any], base: Sequence[dict[str, Any]], basis: str) -> dict[str, Any]:
    """The paired times of a timing with a baseline: ``shapes`` (each shape's dict), and per
    shape the baseline's and the candidate's time of every rep (``baseline_ms``,
    ``candidate_ms``: rep ``r`` of both came from the same inputs, back to back), with
    ``baseline_fitness`` (the baseline's times against the same reference samples); or
    ``error`` naming what the baseline failed (its runner, a call, a check, its timing's
    corroboration)."""
    from evaluators.judge.summary import summarize

    err = next((b["error"] for b in base if "error" in b), None)
    if err is not None or len(base) != len(samples):
        return {"error": err or "the baseline was not timed on every shape"}
    bs = [type(s)(s.shape, tuple(b["ms"]), s.ref_ms, (), s.copies, None, (), s.compile_ref_ms)
          for s, b in zip(samples, base)]
    bres = summarize(bs, basis)
    return {"shapes": [dict(s.shape) for s in samples], "baseline_ms": [list(b["ms"]) for b in base],
            "candidate_ms": [list(s.cand_ms) for s in samples],
            "baseline_fitness": bres.metrics.get("fitness") if bres.status is Status.OK else None,
            "order": "alternating, the candidate first on even reps"}
