"""``evo tune ID``: one tuning session of a stored kernel, run in this process.

The CLI (:func:`evo.cli.kernels.tune`) parses the arguments, opens the store and prints the
outcome; this module does the rest, in two steps:

1. :func:`find_target`: resolve the candidate and the run its trials are recorded in (the
   candidate's latest run unless one is named), take the run's writer lease (one writer per
   run: not while a search of it is live) and check that the candidate is correct in it;
2. :func:`prepare`: check for a GPU, let every trial's child import the run's task files and
   open (or resume) the study stored next to the database
   (:func:`evo.tuning.tuning.journal_path`); then :meth:`TuneSession.run` compiles and
   evaluates trials here (:func:`evo.tuning.tuning.make_local_evaluate`), recording each
   candidate, evaluation and trial in the run, until ``trials`` were evaluated.

Store failures leave as :class:`evo.store.StoreError` (the CLI prints them); everything the
user must fix is a :class:`evo.tuning.tuning.TuningError` with one line saying what and how.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from evo.core.records import Candidate, Evaluation
from evo.tuning.tuning import TuneSummary, TuningError, TuningStudy, journal_path, make_local_evaluate, tune_once

__all__ = ["TuneTarget", "TrialProgress", "TuneSession", "find_target", "latest_run_of", "prepare"]


@dataclass(frozen=True)
class TuneTarget:
    """The kernel to tune (``candidate``), the run its trials go to (``run_id``; the store
    holds its writer lease) and its evaluation there (``parent``, correct)."""

    candidate: Candidate
    run_id: str
    parent: Evaluation


class TrialProgress(Protocol):
    """What shows the session's progress (:class:`evo.engine.progress.StepProgress` fits):
    entered around the trials; ``update(label, done)`` before and after each trial."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...

    def update(self, label: str, done: int) -> None: ...


def find_target(store, id_or_prefix: str, run: str | None = None) -> TuneTarget:
    """The candidate ``id_or_prefix`` names, in run ``run`` (an id or prefix; None: the
    candidate's latest run), with the run's writer lease taken by ``store``. Raises the
    store's errors (unknown or ambiguous ids, a run leased by a live search) and
    :class:`TuningError` when the candidate is not correct in that run."""
    from evo.results.status import resolve_run

    cid = store.resolve_id(id_or_prefix)
    cand = store.get_candidate(cid)
    run_id = resolve_run(store, run) if run else latest_run_of(store, cid)
    ev = store.get_evaluation(cid, run_id)
    store.acquire_lease(run_id)
    if ev is None or not ev.correct:
        raise TuningError(f"{cid[:12]} has no correct evaluation in run {run_id}; tune a correct kernel "
                          f"(see `evo top {run_id}`)")
    return TuneTarget(cand, run_id, ev)


def latest_run_of(store, cid: str) -> str:
    """The newest run of ``store`` that evaluated ``cid`` (:class:`evo.store.UnknownIdError` when none did)."""
    runs = [r["id"] for r in store.list_runs() if cid in store.evaluated_ids(r["id"])]
    if not runs:
        from evo.store import UnknownIdError

        raise UnknownIdError(f"{cid[:12]} was never evaluated in any run of this database")
    return runs[0]  # list_runs is newest first


def prepare(store, db_path: str, target: TuneTarget, *, trials: int, compile_settings: Any,
            harness_settings: Any) -> "TuneSession":
    """The session of ``trials`` evaluated trials of ``target``'s study (resumed when stored),
    ready to :meth:`~TuneSession.run` on this machine's GPU. Raises :class:`TuningError`
    without a GPU, for task files that no longer load, or for a candidate without tunables."""
    from evaluators.pipeline import gpu_available
    from evo.tasks.user import TaskFileError, run_task_registry

    if not gpu_available():
        raise TuningError("no CUDA GPU found on this machine: tuning trials are evaluated on the GPU. Run "
                          "`evo tune` on a GPU machine, or enable [tuning] in a search config.")
    run_id, cand = target.run_id, target.candidate
    try:  # trials of a user task: every trial's child imports the run's task files
        harness_settings = replace(harness_settings,
                                   task_files=run_task_registry(store.get_run(run_id).get("config"), run_id).files)
    except TaskFileError as e:
        raise TuningError(str(e)) from e
    evaluate = make_local_evaluate(compile_settings, harness_settings)
    study = TuningStudy(journal_path(db_path, run_id), run_id, cand, seed=0, n_trials=trials,
                        parent_fitness=target.parent.fitness, lookup=lambda x: store.get_evaluation(x, run_id),
                        on_trial=lambda r: store.add_tuning_trial(run_id, cand.id, r.number, r.params,
                                                                  r.value, r.status, r.candidate_id))
    return TuneSession(store, run_id, study, evaluate)


class TuneSession:
    """A prepared session (:func:`prepare`): ``study`` over the target, ``evaluate`` (compile
    and GPU evaluation here), every trial recorded in ``run_id`` of ``store``."""

    def __init__(self, store, run_id: str, study: TuningStudy, evaluate: Callable[[Candidate], Evaluation]) -> None:
        self.store, self.run_id, self.study, self._evaluate = store, run_id, study, evaluate

    def run(self, progress: TrialProgress) -> TuneSummary:
        """Evaluate trials until the study's budget is spent, showing them on ``progress``;
        the study's summary. An exception from an evaluation fails its trial and propagates."""
        done = [0]

        def evaluate_and_record(c: Candidate) -> Evaluation:
            progress.update(c.short_id, done[0])
            self.store.add_candidate(self.run_id, c)
            ev = self._evaluate(c)
            self.store.add_evaluation(self.run_id, ev)
            done[0] += 1
            progress.update(c.short_id, done[0])
            return ev

        with progress:
            return tune_once(self.study, evaluate_and_record)
