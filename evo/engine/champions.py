"""Champions: a run's best per task re-timed in fresh processes before it is stored.

:func:`confirm_champion` evaluates the champion again in a fresh runner, timed call by call
against a baseline (the task's seed) in a runner of its own (the judge's ``paired`` mode),
and records the gain with its confidence interval; where the champion has ncu profiles,
ncu's kernel time corroborates the re-timing (:func:`ncu_corroboration`).

Noise-aware promotion: a speedup of a fraction of a percent between two evaluations in two
processes is inside run-to-run noise (issue 33: 0.1-0.9% "gains" were confirmed). The
decision rule is :func:`speedup_interval`: from paired, interleaved timings of a baseline
and a candidate (:class:`PairedTimings`, rounds ``r = 0..n-1``, each round timing both
back to back), a Student-t interval of the mean per-round log ratio (averaged over shapes),
exponentiated: the speedup ratio baseline / candidate with its confidence interval
(:class:`SpeedupInterval`). The candidate is significantly faster only when the whole
interval lies above 1 (``verdict == "faster"``); an interval that contains 1 is "no
significant gain" and the older member stays. Why log ratios and a t-interval: timing noise
is multiplicative, pairing cancels the drift common to both members of a round, and with
the t quantile, not the normal one, keeps the interval honest with few rounds. The rounds
of :func:`confirm_champion` are the reps of one paired timing
(:func:`evaluators.judge.timing.time_shape` with a baseline): in each, both members are
called back to back on the same fresh inputs, the order alternating, so the drift of the
card and the host between reps hits both; one evaluation instead of a fresh pair of
evaluations per round, each of which repeated every rep's input draw, poison, flush and
checks (on large shapes most of an evaluation's GPU time).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from evo.core.records import Candidate, Evaluation

__all__ = [
    "Confirmation",
    "confirm_champion",
    "PairedTimings",
    "SpeedupInterval",
    "speedup_interval",
    "paired_from_metrics",
    "NO_SIGNIFICANT_GAIN",
    "PAIRED",
    "NCU_TOLERANCE",
    "ncu_corroboration",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- noise

#: The verdict of an interval that contains 1.
NO_SIGNIFICANT_GAIN = "no significant gain"
#: The mode of a confirmation's evaluation (evaluators.protocol.Mode.PAIRED): the champion
#: checked again, then timed call by call with the baseline (judged when the run evaluated it).
PAIRED = "paired"


@dataclass(frozen=True)
class PairedTimings:
    """Times (ms) of a baseline and a candidate, per benchmark shape and round.

    ``baseline_ms[s][r]`` and ``candidate_ms[s][r]`` are shape ``shapes[s]`` in round ``r``;
    both members of a round are timed back to back on the same GPU and inputs (interleaved:
    baseline, candidate, baseline, ... or alternating the order), so drift between rounds
    hits both. This is what a paired re-timing must return: the harness's in-process one
    (rounds = repetitions, each after an L2 flush) or :func:`confirm_champion`'s (rounds =
    pairs of fresh processes, times = each process's per-shape median). At least 2 rounds;
    every time positive and finite.
    """

    shapes: tuple[str, ...]
    baseline_ms: tuple[tuple[float, ...], ...]
    candidate_ms: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.shapes or len(self.baseline_ms) != len(self.shapes) or len(self.candidate_ms) != len(self.shapes):
            raise ValueError(f"PairedTimings: one row of baseline and candidate times per shape; got "
                             f"{len(self.shapes)} shapes, {len(self.baseline_ms)} and {len(self.candidate_ms)} rows")
        n = {len(r) for r in self.baseline_ms + self.candidate_ms}
        if len(n) != 1 or n.pop() < 2:
            raise ValueError("PairedTimings: every shape needs the same number (>= 2) of rounds for both members")
        for row in self.baseline_ms + self.candidate_ms:
            if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in row):
                raise ValueError(f"PairedTimings: times must be positive and finite, got {row}")

    @property
    def rounds(self) -> int:
        return len(self.baseline_ms[0])


@dataclass(frozen=True)
class SpeedupInterval:
    """Speedup ratio baseline / candidate (> 1: the candidate is faster), geometric over
    shapes, with its two-sided ``confidence`` interval [``low``, ``high``] from ``rounds``
    paired rounds (``method``: how it was computed)."""

    ratio: float
    low: float
    high: float
    confidence: float
    rounds: int
    method: str = "paired-t-log"

    @property
    def significant(self) -> bool:
        """Faster by more than the measured noise: the whole interval lies above 1."""
        return self.low > 1.0

    @property
    def verdict(self) -> str:
        """``faster``, ``slower`` (the whole interval below 1) or :data:`NO_SIGNIFICANT_GAIN`."""
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return NO_SIGNIFICANT_GAIN

    def as_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "confidence": self.confidence,
                "rounds": self.rounds, "method": self.method, "verdict": self.verdict}


def speedup_interval(timings: PairedTimings, confidence: float = 0.95) -> SpeedupInterval:
    """The speedup of ``timings``' candidate over its baseline with a t-interval (module
    docstring, "Noise-aware promotion").

    Per round r: ``x_r = mean over shapes of log(baseline_ms / candidate_ms)``; the interval
    is ``exp(mean(x) +- t_{(1+confidence)/2, n-1} * sd(x) / sqrt(n))``. Identical rounds give
    a zero-width interval at the ratio.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence = {confidence}: must be strictly between 0 and 1")
    from scipy.stats import t as student_t

    n = timings.rounds
    xs = [sum(math.log(b[r] / c[r]) for b, c in zip(timings.baseline_ms, timings.candidate_ms)) / len(timings.shapes)
          for r in range(n)]
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(student_t.ppf((1.0 + confidence) / 2.0, n - 1)) * sd / math.sqrt(n)
    return SpeedupInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), confidence, n)


def _timed_rows(ev: Evaluation) -> list[Mapping[str, Any]]:
    """The per-shape rows of ``ev``'s timing stage that hold a shape and a positive median."""
    timing = next((st for st in ev.stages if st.stage == "timing"), None)
    rows = (timing.metrics.get("shapes") if timing is not None else None) or []
    return [r for r in rows if isinstance(r, Mapping) and "shape" in r
            and isinstance(r.get("median_ms"), (int, float)) and r["median_ms"] > 0]


def paired_from_metrics(paired: Mapping[str, Any]) -> PairedTimings:
    """A paired timing's times (the timing stage's ``metrics["paired"]``,
    :func:`evaluators.judge.timing.paired_metrics`) as :class:`PairedTimings`, its reps as the
    rounds. Raises ValueError when it holds an ``error`` or no valid times."""
    if "error" in paired:
        raise ValueError(str(paired["error"]))
    try:
        shapes = tuple(_shape_key(x) for x in paired["shapes"])
        return PairedTimings(shapes, tuple(tuple(float(t) for t in row) for row in paired["baseline_ms"]),
                             tuple(tuple(float(t) for t in row) for row in paired["candidate_ms"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"paired times without {e}") from e


# ---------------------------------------------------------------------- ncu corroboration


#: A champion whose re-timed median on a shape is below ncu's kernel time there by more than
#: this fraction is ``invalid`` (:func:`ncu_corroboration`).
NCU_TOLERANCE = 0.2


def _shape_key(shape: Any) -> str:
    if isinstance(shape, Mapping):
        return ",".join(f"{k}={shape[k]}" for k in sorted(shape))
    return str(shape)


def ncu_corroboration(ev: Evaluation, profiles: Sequence[Mapping[str, Any]],
                      tolerance: float = NCU_TOLERANCE) -> dict[str, Any] | None:
    """The re-timed evaluation ``ev`` of a champion against ncu's kernel time of the same
    candidate (``profiles``: its stored profiles, ``store.profiles(cid)``; a judge profile's
    metrics hold ``shape`` and ``ncu_kernel_ms``, the sum of its kernels' durations in one
    call): per shape both have, the timed median and ncu's time. A timed call holds at least
    its kernels (plus launch gaps), so a median below ncu's time by more than ``tolerance``
    means the reported time is not the kernels' (``agrees`` False: the timing is invalid).
    ncu's time is a lower bound when its launch cap was reached (``ncu_capped``), which
    changes nothing here. A timed median far above ncu's is not a disagreement (launch
    overhead dominates tiny kernels). None when no shape has both numbers."""
    timed = {_shape_key(r["shape"]): float(r["median_ms"]) for r in _timed_rows(ev)}
    ncu: dict[str, float] = {}
    for p in profiles:  # oldest first: a newer profile of a shape replaces an older one
        m = p.get("metrics") or {}
        ms = m.get("ncu_kernel_ms")
        if isinstance(ms, (int, float)) and ms > 0 and m.get("shape") is not None:
            ncu[_shape_key(m["shape"])] = float(ms)
    rows = [{"shape": k, "timed_ms": timed[k], "ncu_ms": ncu[k], "ratio": timed[k] / ncu[k],
             "agrees": timed[k] >= (1.0 - tolerance) * ncu[k]} for k in sorted(timed) if k in ncu]
    if not rows:
        return None
    return {"shapes": rows, "agrees": all(r["agrees"] for r in rows), "tolerance": tolerance}


# ---------------------------------------------------------------------- champions


@dataclass(frozen=True)
class Confirmation:
    """The outcome of re-timing a champion: ``record`` is what ``set_champion`` stores
    (``confirmed``, ``fitness_confirmed``, ``ratio``, ``gpu``; with a baseline also ``gain``,
    :meth:`SpeedupInterval.as_dict` over the baseline, and ``verdict``); ``crown`` is the
    candidate to store as the champion: the champion when its gain is significant (or there
    was no baseline to compare), otherwise the baseline (the older member stays). ``stop``: a
    one-line message when the confirmation failed on a failure of ours (the run stops
    instead), with ``detail`` for the log."""

    record: dict
    stop: str = ""
    detail: str = ""
    crown: Candidate | None = None
    crown_fitness: float | None = None

    def champion(self, cand: Candidate, fitness: float) -> tuple[str, float]:
        """``(candidate id, fitness)`` to store as the task's champion: ``cand`` with the
        search's ``fitness``, or the baseline that stays (no significant gain) with the
        geometric mean of its re-timed fitnesses."""
        if self.crown is None or self.crown.id == cand.id or self.crown_fitness is None:
            return cand.id, fitness
        return self.crown.id, self.crown_fitness


def confirm_champion(rt, task: str, cand: Candidate, fitness: float, *, baseline: Candidate | None = None,
                     confidence: float = 0.95, profiles: Sequence[Mapping[str, Any]] = ()) -> Confirmation:
    """Compile and evaluate ``cand`` again (a fresh runner on GPU 0); confirmed when the new
    fitness is at least 90% of ``fitness`` and, where ``profiles`` (the champion's stored ncu
    profiles) time a shape it timed, ncu's kernel time corroborates the re-timing
    (:func:`ncu_corroboration`; the record's ``ncu`` holds both numbers, and a disagreement
    is ``timing_invalid``: not confirmed, and the baseline keeps the crown when it was timed).

    When ``baseline`` (the engine passes its task's seed candidate; None: the task has no
    seed, so there is no gain to measure) is another candidate, the evaluation is
    :data:`PAIRED`: the baseline is timed call by call beside the champion, and the record
    gets the speedup interval over the baseline (:func:`paired_from_metrics`,
    :func:`speedup_interval`); ``crown`` is the baseline unless the gain is significant. A
    baseline that fails its part leaves the gain unmeasured (``gain_error``) and the champion
    crowned.
    """
    from evo.engine.recovery import infra_cause

    note = {} if baseline is not None else {"gain_error": f"no baseline: task {task!r} has no seed kernel"}
    compare = baseline is not None and baseline.id != cand.id
    try:
        built = {}
        for c in (cand, baseline) if compare else (cand,):
            outcome = rt.get(rt.submit_compile(c))
            if not outcome.result.passed:
                raise RuntimeError(f"{c.short_id}: {outcome.result.reason}")
            built[c.id] = outcome.so_bytes
        ref = (rt.submit_gpu(0, cand, built[cand.id], PAIRED, baseline, built[baseline.id]) if compare
               else rt.submit_gpu(0, cand, built[cand.id]))
        first = rt.get(ref).evaluation
    except rt.remote_errors() + (RuntimeError,) as e:
        infra = infra_cause(e)
        if infra is not None:
            return Confirmation({}, f"champion confirmation of {cand.short_id} ({task}) failed: {infra.one_line()}",
                                getattr(infra, "detail", ""))
        log.warning("champion confirmation of %s failed: %s", cand.short_id, e)
        return Confirmation({"confirmed": False, "error": str(e)[:500]}, crown=cand)
    again = first.fitness if first.correct else None
    ok = again is not None and again >= 0.9 * fitness
    corr = ncu_corroboration(first, profiles) if first.correct and profiles else None
    invalid = corr is not None and not corr["agrees"]
    record = {"confirmed": ok and not invalid, "fitness_confirmed": again,
              "ratio": (again / fitness) if again else None, "gpu": first.gpu, **note,
              **({"ncu": corr} if corr else {})}
    if invalid:
        bad = next(r for r in corr["shapes"] if not r["agrees"])
        record["timing_invalid"] = (f"shape {bad['shape']}: re-timed median {bad['timed_ms']:.4g} ms is below ncu's "
                                    f"kernel time {bad['ncu_ms']:.4g} ms by more than {corr['tolerance']:.0%}")
        log.warning("champion %s (%s): %s", cand.short_id, task, record["timing_invalid"])
    crown, crown_fitness = cand, None
    if compare and first.correct:
        record["baseline_id"] = baseline.id
        timing = next((st for st in first.stages if st.stage == "timing"), None)
        paired = timing.metrics.get("paired") if timing is not None else None
        try:
            if not isinstance(paired, Mapping):
                raise ValueError("the re-timing holds no paired times (an evaluator without the paired mode)")
            gain = speedup_interval(paired_from_metrics(paired), confidence)
            base_fitness = paired.get("baseline_fitness")
            if not isinstance(base_fitness, (int, float)) or not base_fitness > 0:
                raise ValueError("the baseline's paired times have no fitness")
        except ValueError as e:
            record["gain_error"] = f"the paired re-timing against the baseline: {e}"[:500]
        else:
            record["gain"] = gain.as_dict()
            record["verdict"] = gain.verdict
            record["pairing"] = "call by call in one evaluation; rounds are its reps"
            if not gain.significant or invalid:
                crown = baseline
                crown_fitness = float(base_fitness)
                record["baseline_fitness"] = crown_fitness
    return Confirmation(record, crown=crown, crown_fitness=crown_fitness)
