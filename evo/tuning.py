"""Optuna studies over a survivor's declared tunables, driven by ask/tell.

A survivor (a correct candidate that entered its island's top-k, see
:func:`evo.triggers.should_tune`) declares ``// @tunable`` parameters; a
:class:`TuningStudy` searches their product with Optuna's TPE sampler:

- **seeded**: ``TPESampler(seed=...)``, so a study replays exactly from its storage;
- **parent first**: the survivor's own values are enqueued as the first trial; when the
  caller knows its fitness (``parent_fitness``) that trial is told at once, without a
  compile, so every later trial is compared against a real, stored number;
- **constraints before compiling**: a sampled point violating an ``// @constraint`` is
  told ``PRUNED`` (reason in the trial's user attributes) and never leaves :meth:`ask`;
- **no repeats**: a point equal to an earlier trial's (TPE may resample a categorical
  point) is told that trial's outcome again, also without a compile; a point whose
  candidate id the caller already evaluated (``lookup``) is told that evaluation;
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
from typing import Any, Callable, Mapping

import optuna

# Optuna's records go through the process's logging (the CLI's log file), not Optuna's own
# stderr handler in the middle of the user's terminal.
optuna.logging.disable_default_handler()
optuna.logging.enable_propagation()
from optuna.distributions import CategoricalDistribution
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from evo.records import Candidate, Evaluation, Operator, canonical_params
from evo.tunables import parse_tunables, resolve_params, violated_constraints
from evo.tuning_settings import TuningSettings  # the [tuning] record; defined apart so evo.config need not import Optuna

__all__ = [
    "TuningSettings",
    "TuningError",
    "TrialRecord",
    "TuneSummary",
    "TuningStudy",
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


class TuningStudy:
    """One Optuna study over ``parent``'s tunables (see the module docstring).

    ``storage``: path of a journal file, an Optuna URL or storage. ``n_trials``: trials this
    object may send to evaluation (resumed studies run ``n_trials`` more). ``parent_fitness``:
    the survivor's fitness when known (its trial is then told without an evaluation).
    ``lookup(candidate_id) -> Evaluation | None``: evaluations the caller already has
    (e.g. the run's store), told without re-evaluating. ``on_trial(record)``: called for
    every trial this object finishes (store it). ``max_asks``: cap on asks (default
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
        self.lookup = lookup
        self.on_trial = on_trial
        self.max_asks = int(max_asks) if max_asks is not None else DEFAULT_ASK_FACTOR * max(self.n_trials, 1)
        if quiet:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name = study_name(run_id, parent)
        self.storage = open_storage(storage)
        self.study = optuna.create_study(
            storage=self.storage, study_name=self.name, direction="maximize",
            sampler=optuna.samplers.TPESampler(seed=seed), load_if_exists=True,
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
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED):
                self._asked_points.add(_key(t.params))
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and _key(t.params) not in self._outcome:
                self._outcome[_key(t.params)] = (t.state, t.value, t.number)
        self.study.enqueue_trial(dict(self.parent_params), user_attrs={"origin": "parent"}, skip_if_exists=True)

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
        """Every point of the space was tried (or pruned)."""
        return len(self._asked_points) >= self.space_size

    @property
    def done(self) -> bool:
        """No further :meth:`ask` will return a candidate."""
        return self._issued >= self.n_trials or self.exhausted or self._asks >= self.max_asks

    @property
    def finished(self) -> bool:
        """Done and nothing in flight: the study of this session is over."""
        return self.done and not self._running

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

        Points that need no evaluation (constraint violations, repeats, known candidates)
        are told here and skipped; only a candidate that must be compiled comes back.
        """
        while not self.done:
            self._asks += 1
            trial = self.study.ask(self.distributions)
            params = {k: str(v) for k, v in trial.params.items()}
            key = _key(params)
            self._asked_points.add(key)
            violated = violated_constraints(self.parent.source, params)
            if violated:
                reason = "constraint violated: " + "; ".join(violated)
                trial.set_user_attr("reason", reason)
                self.study.tell(trial, state=TrialState.PRUNED)
                self._emit(TrialRecord(trial.number, params, "pruned", reason=reason))
                continue
            prior = self._outcome.get(key)
            if prior is not None or any(_key(c.params_dict) == key for _, c in self._running.values()):
                self._tell_repeat(trial, params, prior)
                continue
            cand = self._candidate(trial.number, params)
            if cand.id == self.parent.id and self.parent_fitness is not None:
                trial.set_user_attr("origin", "parent")
                self._complete(trial, cand, float(self.parent_fitness), evaluated=False)
                continue
            known = self.lookup(cand.id) if self.lookup is not None else None
            if known is not None:
                self._finish(trial, cand, known, evaluated=False)
                continue
            self._running[trial.number] = (trial, cand)
            self._issued += 1
            return trial.number, cand
        return None

    def _tell_repeat(self, trial: optuna.Trial, params: dict[str, str], prior) -> None:
        if prior is None:
            running = next(n for n, (_, c) in self._running.items() if _key(c.params_dict) == _key(params))
            reason = f"same point as trial {running}, still running"
            trial.set_user_attr("reason", reason)
            self.study.tell(trial, state=TrialState.PRUNED)
            self._emit(TrialRecord(trial.number, params, "pruned", reason=reason))
            return
        state, value, number = prior
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
    """policy -> compile -> isolated GPU evaluation of one candidate, in this process.

    The CLI's evaluate callable for :func:`tune_once`. A failing stage stops the cascade and
    its result is the evaluation (the study records it as a failed trial).
    """
    from evaluators.compile import compile_candidate
    from evaluators.pipeline import evaluate_built

    if policy is None:
        from evaluators.policy import check_policy as policy

    def evaluate(cand: Candidate) -> Evaluation:
        pol = policy(cand.source)
        if not pol.passed:
            return Evaluation(cand.id, (pol,))
        out = compile_candidate(cand, compile_settings)
        if not out.result.passed or not out.so_bytes:
            return Evaluation(cand.id, (pol, out.result))
        return evaluate_built(cand, out.so_bytes, harness_settings, prior=(pol, out.result))

    return evaluate
