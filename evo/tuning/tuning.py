"""Optuna studies over a survivor's declared tunables, driven by ask/tell.

A survivor (a correct candidate that entered its island's top-k, see
:func:`evo.engine.survivors.should_tune`) declares ``// @tunable`` parameters; a
:class:`TuningStudy` searches their product with Optuna's TPE sampler:

- **seeded**: ``TPESampler(seed=...)``, so a study replays exactly from its storage;
- **parent first**: the survivor's own values are enqueued as the first trial; when the
  caller knows its fitness (``parent_fitness``) that trial is told at once, without a
  compile, so every later trial is compared against a real, stored number;
- **constraint-aware sampling**: the sampler is :class:`FeasibleSampler`, which draws each
  tunable in declaration order and keeps the TPE choice only when the point stays feasible
  with the tunables not drawn yet at the parent's values, else the nearest feasible choice;
  so every point it returns satisfies the ``// @constraint`` lines and no trial is spent
  on an infeasible point. A point that still violates one (a parent that breaks its own
  constraints) is told ``PRUNED`` (reason in the trial's user attributes) and never leaves
  :meth:`ask`;
- **seeded with known points**: ``known`` (the run's evaluations of the same task and
  source, :class:`evo.engine.survivors.Survivors` passes them) are added to the study as finished
  trials before the first ask, so TPE starts from what the search already measured and a
  known configuration is never evaluated again;
- **no repeats**: a point equal to an earlier trial's (TPE may resample a categorical
  point) is told that trial's outcome again, also without a compile, and the nearest
  untried feasible point (one tunable moved) is enqueued as the next trial, so a TPE that
  has settled on its best keeps exploring around it; a point whose candidate id the caller
  already evaluated (``lookup``) is told that evaluation; such a told trial costs no
  evaluation but counts against the study's ``n_trials`` (:mod:`evo.tuning.study_counts`
  states what counts and when a study is finished);
- **failures are data**: :meth:`tell` records compile errors, incorrect results, crashes
  and timeouts as ``FAIL`` trials with ``status``, ``stage`` and ``reason`` attributes;
  correct ones complete with value = fitness (maximised);
- **ask/tell**: the engine asks for a candidate whenever it has a free slot (at a lower
  priority than mutations), sends it through the same compile pool and GPU actors, and
  tells the evaluation back; nothing here blocks or touches Ray.

Trials' candidates are children of the survivor with operator ``optuna``; the best trial
is an ordinary member of the island (it was evaluated like any child).

Storage is persisted with the run (:func:`journal_path`: ``<db dir>/<db stem>.optuna/
<run_id>.journal``, an Optuna journal file; any Optuna storage URL works too), one study
per survivor named :func:`study_name` (``"<run_id>:<parent id[:12]>"``), so ``evo tune ID
--trials N`` reopens the study (``load_if_exists``), continues its numbering and its TPE
history, and never repeats a point.

One :class:`TuningStudy` object per study at a time: a second one would see the first's
running trials as stale and fail them.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import optuna

# Optuna's records go through the process's logging (the CLI's log file), not Optuna's own
# stderr handler in the middle of the user's terminal.
optuna.logging.disable_default_handler()
optuna.logging.enable_propagation()
from optuna.distributions import CategoricalDistribution
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from evo.core.records import Candidate, Evaluation, Operator, canonical_params
from evo.core.tunables import TunableError, constraint_checker, parse_tunables, resolve_params, violated_constraints
from evo.tuning.study_counts import StudyCounts

__all__ = [
    "TuningError",
    "TrialRecord",
    "TuneSummary",
    "TuningStudy",
    "FeasibleSampler",
    "study_name",
    "journal_path",
    "open_storage",
    "tune_once",
    "make_local_evaluate",
]

log = logging.getLogger(__name__)

#: How many asks that need no evaluation (pruned, duplicate, known) one evaluated trial may
#: cost at most before a study gives up: a guard for nearly-infeasible spaces.
DEFAULT_ASK_FACTOR = 20


#: Spaces up to this many points have their feasible points counted when a study opens
#: (so a study knows when it has tried them all); larger ones stop on ``max_asks``.
COUNT_FEASIBLE_UP_TO = 20_000


def _feasible_size(source: str, tunables, space_size: int) -> int | None:
    if space_size > COUNT_FEASIBLE_UP_TO:
        return None
    import itertools

    ok = constraint_checker(source)
    names = [t.name for t in tunables]
    return sum(1 for combo in itertools.product(*(t.choices for t in tunables)) if ok(dict(zip(names, combo))))


class TuningError(ValueError):
    """The study cannot be set up or driven as asked (no tunables, unknown trial, ...)."""


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial, ready for ``Store.add_tuning_trial(run_id, parent_id, number,
    params, value, status, candidate_id)``. ``status``: ``complete`` | ``failed`` | ``pruned``."""

    number: int
    params: dict[str, str]
    status: str
    value: float | None = None
    candidate_id: str | None = None
    reason: str = ""
    evaluated: bool = False


@dataclass(frozen=True)
class TuneSummary:
    """What :func:`tune_once` did: this session's trials and the study's best so far."""

    study: str
    trials: tuple[TrialRecord, ...]
    best_id: str | None
    best_fitness: float | None
    parent_fitness: float | None
    evaluated: int

    @property
    def improved(self) -> bool:
        return (self.best_fitness is not None and self.parent_fitness is not None
                and self.best_fitness > self.parent_fitness)


def study_name(run_id: str, parent: Candidate | str) -> str:
    pid = parent.id if isinstance(parent, Candidate) else str(parent)
    return f"{run_id}:{pid[:12]}"


def journal_path(db_path: str | os.PathLike[str], run_id: str) -> Path:
    """``runs/evo.db`` + run ``r1`` -> ``runs/evo.optuna/r1.journal``."""
    db = Path(db_path)
    return db.parent / f"{db.stem}.optuna" / f"{run_id}.journal"


def open_storage(spec: str | os.PathLike[str] | BaseStorage) -> BaseStorage:
    """An Optuna storage: a storage object as is, a database URL (``sqlite:///...``) as
    :class:`~optuna.storages.RDBStorage`, anything else as a journal file path (created,
    with its folder, if missing)."""
    if isinstance(spec, BaseStorage):
        return spec
    s = str(spec)
    if "://" in s:
        return RDBStorage(s)
    p = Path(s)
    p.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(p)))


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return canonical_params(params)


class FeasibleSampler(optuna.samplers.BaseSampler):
    """A sampler (``base``, TPE by default) that only returns points satisfying ``source``'s
    constraints, given a feasible ``anchor`` point (the parent's values).

    Tunables are drawn one at a time, in the order of ``anchor`` (the declaration order);
    the invariant is that the values drawn so far, with every tunable not drawn yet at the
    anchor's value, are feasible. The base sampler's choice is kept when it keeps that
    invariant, else the nearest choice (by position in the declared set, lower first on a
    tie) that does; the anchor's own value always does, so a point is always found and
    every drawn point is feasible. Relative (multivariate) sampling is off: each parameter
    goes through :meth:`sample_independent`, where the check happens. With an infeasible
    anchor the base's choices are kept as they are.
    """

    def __init__(self, source: str, anchor: Mapping[str, str], base: optuna.samplers.BaseSampler | None = None,
                 *, seed: int = 0) -> None:
        self.base = base or optuna.samplers.TPESampler(seed=seed)
        self.anchor = dict(anchor)
        self.ok = constraint_checker(source)
        self.anchor_feasible = self.ok(self.anchor)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        value = self.base.sample_independent(study, trial, param_name, param_distribution)
        if not self.anchor_feasible or param_name not in self.anchor:
            return value
        choices = list(param_distribution.choices)
        at = choices.index(value)
        drawn = {k: str(v) for k, v in trial.params.items()}
        for i in sorted(range(len(choices)), key=lambda i: (abs(i - at), i)):
            point = {**self.anchor, **drawn, param_name: str(choices[i])}
            if self.ok(point):
                return choices[i]
        return value  # unreachable with a feasible anchor (its own value keeps the invariant)

    def before_trial(self, study, trial):
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


class TuningStudy:
    """One Optuna study over ``parent``'s tunables (see the module docstring).

    ``storage``: path of a journal file, an Optuna URL or storage. ``n_trials``: this object's
    trial budget, trials evaluated or told an earlier evaluation of their point (pruned asks
    and known points are free; :mod:`evo.tuning.study_counts`); a resumed study runs
    ``n_trials`` more. ``parent_fitness``:
    the survivor's fitness when known (its trial is then told without an evaluation).
    ``lookup(candidate_id) -> Evaluation | None``: evaluations the caller already has
    (e.g. the run's store), told without re-evaluating. ``known``: ``(params, evaluation)``
    of points already evaluated with the parent's source, added to the study as finished
    trials (``origin = known``) before the first ask; points outside the declared sets and
    points the study holds already are skipped. ``on_trial(record)``: called for every
    trial this object finishes or adds (store it). ``max_asks``: cap on asks (default
    ``DEFAULT_ASK_FACTOR * n_trials``).
    """

    def __init__(
        self,
        storage: str | os.PathLike[str] | BaseStorage,
        run_id: str,
        parent: Candidate,
        *,
        seed: int = 0,
        n_trials: int = 16,
        parent_fitness: float | None = None,
        lookup: Callable[[str], Evaluation | None] | None = None,
        known: Iterable[tuple[Mapping[str, Any], Evaluation]] = (),
        on_trial: Callable[[TrialRecord], None] | None = None,
        max_asks: int | None = None,
        quiet: bool = True,
    ) -> None:
        if n_trials < 0:
            raise TuningError(f"n_trials = {n_trials}: must be >= 0")
        self.parent = parent
        self.run_id = run_id
        self.n_trials = int(n_trials)
        self.tunables = tuple(t for t in parse_tunables(parent.source))
        if not self.tunables:
            raise TuningError(
                f"candidate {parent.short_id} declares no tunables ('// @tunable NAME = DEFAULT in "
                "{a, b}'); there is nothing to tune"
            )
        self.parent_params = resolve_params(parent.source, parent.params_dict)
        self.parent_fitness = parent_fitness
        self.distributions = {t.name: CategoricalDistribution(list(t.choices)) for t in self.tunables}
        self.space_size = math.prod(len(t.choices) for t in self.tunables)
        self.feasible_size = _feasible_size(parent.source, self.tunables, self.space_size)
        self._ok = constraint_checker(parent.source)
        self.lookup = lookup
        self.on_trial = on_trial
        self.max_asks = int(max_asks) if max_asks is not None else DEFAULT_ASK_FACTOR * max(self.n_trials, 1)
        if quiet:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name = study_name(run_id, parent)
        self.storage = open_storage(storage)
        self.study = optuna.create_study(
            storage=self.storage, study_name=self.name, direction="maximize",
            sampler=FeasibleSampler(parent.source, self.parent_params, seed=seed), load_if_exists=True,
        )
        attrs = self.study.user_attrs
        if attrs.get("parent_id") not in (None, parent.id):
            raise TuningError(
                f"study {self.name!r} belongs to candidate {attrs['parent_id'][:16]}, not "
                f"{parent.id[:16]} (a 12-character id prefix collision); use another run id"
            )
        if not attrs:
            self.study.set_user_attr("parent_id", parent.id)
            self.study.set_user_attr("run_id", run_id)
            self.study.set_user_attr("task", parent.task)
            self.study.set_user_attr("tunables", {t.name: list(t.choices) for t in self.tunables})
        self._running: dict[int, tuple[optuna.Trial, Candidate]] = {}
        self._issued = 0
        self._told = 0  # asked points answered with an earlier evaluation (they spend the budget)
        self._pruned = 0
        self._known = 0
        self._asks = 0
        self.records: list[TrialRecord] = []
        # Trials a killed session left RUNNING can never be told: fail them so the study
        # is consistent, and keep their points from being evaluated again.
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            log.warning("study %s: trial %d was left running by an earlier session; marking it failed",
                        self.name, t.number)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        # Outcome of every point already tried: params -> (state, value, number).
        self._outcome: dict[tuple, tuple[TrialState, float | None, int]] = {}
        self._asked_points: set[tuple] = set()
        self._feasible_asked = 0   # of the asked points, those the constraints allow (counted when the space is)
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED):
                self._add_asked(_key(t.params))
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and _key(t.params) not in self._outcome:
                self._outcome[_key(t.params)] = (t.state, t.value, t.number)
        self.add_known(known)
        self.study.enqueue_trial(dict(self.parent_params), user_attrs={"origin": "parent"}, skip_if_exists=True)

    def add_known(self, known: Iterable[tuple[Mapping[str, Any], Evaluation]]) -> int:
        """Tell the study points evaluated outside it (``origin = known``, completed or failed,
        never evaluated again); points it has already tried and points outside its space are
        skipped. Called at construction and whenever the run evaluates another point of the
        same source, so the sampler models everything the run knows. How many were added."""
        added = 0
        for raw, ev in known:
            try:
                params = resolve_params(self.parent.source, raw)
            except TunableError:
                continue  # another source's tunables: not a point of this space
            key = _key(params)
            if key in self._asked_points:
                continue
            good = ev.correct and ev.fitness is not None and math.isfinite(ev.fitness)
            state = TrialState.COMPLETE if good else TrialState.FAIL
            value = float(ev.fitness) if good else None
            attrs = {"origin": "known", "candidate_id": ev.candidate_id, "evaluated": False}
            self.study.add_trial(optuna.trial.create_trial(
                params=dict(params), distributions=self.distributions, value=value, state=state, user_attrs=attrs))
            number = len(self.study.get_trials(deepcopy=False)) - 1
            self._add_asked(key)
            self._outcome[key] = (state, value, number)
            self._emit(TrialRecord(number, dict(params), "complete" if good else "failed", value, ev.candidate_id,
                                   "known: evaluated outside the study", False))
            added += 1
        self._known += added
        return added

    # ------------------------------------------------------------------ state

    @property
    def issued(self) -> int:
        """Candidates this object handed out for evaluation."""
        return self._issued

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def exhausted(self) -> bool:
        """Every point of the space was tried (or pruned), or every feasible point when the
        space is small enough to count them (:data:`COUNT_FEASIBLE_UP_TO`): the sampler
        never returns an infeasible one."""
        return len(self._asked_points) >= self.space_size or (self.feasible_size is not None
                                                              and self._feasible_asked >= self.feasible_size)

    def _add_asked(self, key: tuple) -> None:
        """Record an asked point; feasible ones are counted as they come (``exhausted`` is read
        on every fill of the engine, through :meth:`counts`)."""
        if key not in self._asked_points:
            self._asked_points.add(key)
            if self.feasible_size is not None and self._ok(dict(key)):
                self._feasible_asked += 1

    def counts(self) -> StudyCounts:
        """What this object's session did (:class:`evo.tuning.study_counts.StudyCounts`): its
        budget ``n_trials``, the points it asked, evaluated, told and pruned, the known points
        it was given, and the trials in flight."""
        return StudyCounts(n_trials=self.n_trials, asked=self._issued + self._told + self._pruned,
                           issued=self._issued, told=self._told,
                           pruned=self._pruned, known=self._known, in_flight=len(self._running),
                           out_of_points=self.exhausted or self._asks >= self.max_asks)

    @property
    def done(self) -> bool:
        """No further :meth:`ask` will return a candidate: ``n_trials`` trials were evaluated
        (or handed out) or told an earlier evaluation, or no new point is left to ask
        (:attr:`StudyCounts.done <evo.tuning.study_counts.StudyCounts.done>`)."""
        return self.counts().done

    @property
    def finished(self) -> bool:
        """Done and nothing in flight: the study of this session is over (the one rule,
        :attr:`StudyCounts.finished <evo.tuning.study_counts.StudyCounts.finished>`)."""
        return self.counts().finished

    @property
    def owed(self) -> int:
        """Trials this session may still hand out for evaluation at most (0 once done)."""
        return self.counts().owed

    @property
    def evaluated_trials(self) -> int:
        """Trials of the whole study (all sessions) that were evaluated (complete or failed)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.state in (TrialState.COMPLETE, TrialState.FAIL) and t.user_attrs.get("evaluated"))

    # ------------------------------------------------------------------ ask / tell

    def _candidate(self, number: int, params: Mapping[str, str]) -> Candidate:
        if _key(params) == _key(self.parent_params):
            return self.parent
        return Candidate.create(
            self.parent.task, self.parent.source, params, parents=(self.parent.id,),
            operator=Operator.OPTUNA, island=self.parent.island, generation=self.parent.generation + 1,
            notes=f"optuna trial {number} of study {self.name}",
        )

    def _emit(self, rec: TrialRecord) -> TrialRecord:
        self.records.append(rec)
        if self.on_trial is not None:
            self.on_trial(rec)
        return rec

    def ask(self) -> tuple[int, Candidate] | None:
        """The next trial to evaluate as ``(trial number, candidate)``, or None when done.

        Points that need no evaluation are finished here and skipped: constraint violations
        and points still in flight are pruned (free), the parent with a known fitness is told
        it (a known point, free); repeats of an earlier trial and candidates ``lookup`` knows
        are told that evaluation and count against ``n_trials`` (a trial the sampler chose,
        at no evaluation's cost). Only a candidate that must be compiled comes back.
        """
        while not self.done:
            self._asks += 1
            trial = self.study.ask(self.distributions)
            params = {k: str(v) for k, v in trial.params.items()}
            key = _key(params)
            self._add_asked(key)
            violated = violated_constraints(self.parent.source, params)
            if violated:
                reason = "constraint violated: " + "; ".join(violated)
                trial.set_user_attr("reason", reason)
                self.study.tell(trial, state=TrialState.PRUNED)
                self._pruned += 1
                self._emit(TrialRecord(trial.number, params, "pruned", reason=reason))
                continue
            prior = self._outcome.get(key)
            if prior is not None or any(_key(c.params_dict) == key for _, c in self._running.values()):
                self._tell_repeat(trial, params, prior)
                step = None if self.done else self._untried_neighbour(params)
                if step is not None:  # TPE keeps returning a known point: try next to it instead
                    self.study.enqueue_trial(step, user_attrs={"origin": f"neighbour of trial {trial.number}"})
                continue
            cand = self._candidate(trial.number, params)
            if cand.id == self.parent.id and self.parent_fitness is not None:
                trial.set_user_attr("origin", "parent")
                self._known += 1  # the parent's own fitness: a known point, not one the sampler chose
                self._complete(trial, cand, float(self.parent_fitness), evaluated=False)
                continue
            known = self.lookup(cand.id) if self.lookup is not None else None
            if known is not None:
                self._told += 1
                self._finish(trial, cand, known, evaluated=False)
                continue
            self._running[trial.number] = (trial, cand)
            self._issued += 1
            return trial.number, cand
        return None

    def _untried_neighbour(self, params: Mapping[str, str]) -> dict[str, str] | None:
        """The feasible point nearest to ``params`` that no trial has tried and none is
        running: one tunable moved, the smallest move in its declared set first (tunables in
        declaration order break ties); None when every such point was tried."""
        running = {_key(c.params_dict) for _, c in self._running.values()}
        moves = []
        for order, t in enumerate(self.tunables):
            at = t.choices.index(params[t.name])
            moves += [(abs(i - at), order, c) for i, c in enumerate(t.choices) if i != at]
        for _, order, value in sorted(moves):
            point = {**params, self.tunables[order].name: value}
            key = _key(point)
            if key not in self._asked_points and key not in running and self._ok(point):
                return point
        return None

    def _tell_repeat(self, trial: optuna.Trial, params: dict[str, str], prior) -> None:
        if prior is None:
            running = next(n for n, (_, c) in self._running.items() if _key(c.params_dict) == _key(params))
            reason = f"same point as trial {running}, still running"
            trial.set_user_attr("reason", reason)
            self.study.tell(trial, state=TrialState.PRUNED)
            self._pruned += 1
            self._emit(TrialRecord(trial.number, params, "pruned", reason=reason))
            return
        state, value, number = prior
        self._told += 1
        trial.set_user_attr("duplicate_of", number)
        if state is TrialState.COMPLETE:
            self.study.tell(trial, value)
            self._emit(TrialRecord(trial.number, params, "complete", value, reason=f"same point as trial {number}"))
        else:
            trial.set_user_attr("reason", f"same point as failed trial {number}")
            self.study.tell(trial, state=TrialState.FAIL)
            self._emit(TrialRecord(trial.number, params, "failed", reason=f"same point as failed trial {number}"))

    def tell(self, number: int, evaluation: Evaluation) -> TrialRecord:
        """Finish trial ``number`` with the evaluation of the candidate :meth:`ask` gave."""
        try:
            trial, cand = self._running.pop(number)
        except KeyError:
            raise TuningError(
                f"trial {number} is not in flight in study {self.name!r} (in flight: "
                f"{sorted(self._running)}); tell each asked trial exactly once"
            ) from None
        if evaluation.candidate_id != cand.id:
            self._running[number] = (trial, cand)
            raise TuningError(
                f"trial {number} evaluated candidate {evaluation.candidate_id[:12]}, but it asked "
                f"for {cand.short_id}"
            )
        return self._finish(trial, cand, evaluation, evaluated=True)

    def _finish(self, trial: optuna.Trial, cand: Candidate, ev: Evaluation, *, evaluated: bool) -> TrialRecord:
        if ev.correct and ev.fitness is not None and math.isfinite(ev.fitness):
            return self._complete(trial, cand, float(ev.fitness), evaluated=evaluated)
        failed = ev.failed_stage
        stage = failed.stage if failed else "?"
        status = failed.status.value if failed else ev.status.value
        reason = f"{stage}: {status}: {failed.reason if failed else 'no fitness'}"[:500]
        params = {k: str(v) for k, v in trial.params.items()}
        for k, v in (("candidate_id", cand.id), ("status", status), ("stage", stage),
                     ("reason", reason), ("evaluated", evaluated)):
            trial.set_user_attr(k, v)
        self.study.tell(trial, state=TrialState.FAIL)
        self._outcome.setdefault(_key(params), (TrialState.FAIL, None, trial.number))
        return self._emit(TrialRecord(trial.number, params, "failed", None, cand.id, reason, evaluated))

    def _complete(self, trial: optuna.Trial, cand: Candidate, value: float, *, evaluated: bool) -> TrialRecord:
        params = {k: str(v) for k, v in trial.params.items()}
        trial.set_user_attr("candidate_id", cand.id)
        trial.set_user_attr("evaluated", evaluated)
        self.study.tell(trial, value)
        self._outcome.setdefault(_key(params), (TrialState.COMPLETE, value, trial.number))
        return self._emit(TrialRecord(trial.number, params, "complete", value, cand.id, "", evaluated))

    # ------------------------------------------------------------------ results

    def _complete_trials(self) -> list:
        return [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None]

    def best(self) -> tuple[Candidate, float] | None:
        """The best complete trial of the whole study as (candidate, fitness), or None."""
        done = self._complete_trials()
        if not done:
            return None
        t = max(done, key=lambda t: (t.value, -t.number))
        params = {k: str(v) for k, v in t.params.items()}
        return self._candidate(t.number, params), float(t.value)

    def parent_value(self) -> float | None:
        """The fitness the study holds for the parent's own values (trial 0), if any."""
        pk = _key(self.parent_params)
        for t in self._complete_trials():
            if _key(t.params) == pk:
                return float(t.value)
        return self.parent_fitness

    def improved(self) -> bool:
        """Did some trial beat the parent's own values?"""
        b, p = self.best(), self.parent_value()
        return b is not None and p is not None and b[1] > p and b[0].id != self.parent.id

    def summary(self) -> TuneSummary:
        b = self.best()
        return TuneSummary(study=self.name, trials=tuple(self.records), best_id=b[0].id if b else None,
                           best_fitness=b[1] if b else None, parent_fitness=self.parent_value(),
                           evaluated=sum(1 for r in self.records if r.evaluated))


def tune_once(study: TuningStudy, evaluate: Callable[[Candidate], Evaluation]) -> TuneSummary:
    """Run ``study`` to its budget synchronously: ask, ``evaluate(candidate)``, tell.

    For ``evo tune ID [--trials N]`` (with :func:`make_local_evaluate`) or any caller that
    evaluates in-process. ``evaluate`` returns an Evaluation for every candidate (failures
    included); an exception from it propagates after the trial is failed, so the study
    stays consistent and can be resumed.
    """
    while True:
        item = study.ask()
        if item is None:
            break
        number, cand = item
        try:
            ev = evaluate(cand)
        except BaseException:
            trial, _ = study._running.pop(number)
            trial.set_user_attr("reason", "the evaluation itself raised (see the log)")
            study.study.tell(trial, state=TrialState.FAIL)
            raise
        study.tell(number, ev)
        log.info("study %s trial %d: %s", study.name, number, ev.fitness if ev.correct else ev.status.value)
    return study.summary()


def make_local_evaluate(compile_settings: Any, harness_settings: Any,
                        policy: Callable[[str], Any] | None = None) -> Callable[[Candidate], Evaluation]:
    """policy -> compile -> the judge's GPU evaluation of one candidate, in this process.

    The CLI's evaluate callable for :func:`tune_once`. A failing stage stops the cascade and
    its result is the evaluation (the study records it as a failed trial).
    """
    from evaluators.pipeline import build_and_run

    def evaluate(cand: Candidate) -> Evaluation:
        return build_and_run(cand, compile_settings, harness_settings, policy=policy)

    return evaluate
