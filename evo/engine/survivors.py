"""Survivor work: what happens to a correct candidate beyond its own evaluation.

Three kinds, all off the search's critical path:

- **delayed profiling** (docs/profiling.md): a correct candidate that enters its island's
  top-k (``profile.top_k``) gets one ncu profile per benchmark shape, at the lowest GPU
  priority after mutations; the numbers feed later prompts (:func:`profile_visible`);
- **tuning** (docs/tuning.md): a correct candidate in its island's top-k (``tuning.top_k``)
  that declares tunables opens an Optuna study (:class:`evo.tuning.tuning.TuningStudy`), seeded
  with every point of the same source the run has evaluated (:meth:`Survivors.known_points`),
  whose trials the engine sends through the same compile pool and GPU actors. A study is
  sized when it opens to what the run's evaluation budget can still pay for
  (:func:`sized_trials`), and the engine keeps what the open studies are owed
  (:meth:`Survivors.owed`) out of the mutations' share of the budget, so every study it
  opens can finish before the budget is spent;
- **champion confirmation**: at the end of a run each task's best is evaluated again in a
  fresh process, in pairs with its task's seed, and the gain over the seed gets a confidence
  interval (:mod:`evo.engine.champions`).

The rules (:func:`should_profile`, :func:`should_tune`, :func:`profile_visible`) are pure
functions of the member, the island's ranking and what was already done: no I/O, no Ray, no
clock, tested exhaustively. :class:`Survivors` holds the run's rankings and studies; it
answers the engine with decisions (:class:`ProfileJob` to queue, trial candidates to submit)
and writes its own records (profiles, tuning trials and their events) through the store
writer (:class:`evo.engine.seams.StoreWriter`). Settings are duck-typed
(``evaluators.profile.ProfileSettings`` and ``evo.tuning.tuning_settings.TuningSettings`` fit), so the rules
import neither ncu nor Optuna code.

Why delayed profiling: ncu costs seconds to tens of seconds per candidate (the kernel is
replayed once per metric pass), while most children never matter. Profiling only correct
candidates that enter their island's top-k spends that cost where the next prompts come
from. Why late feedback (``profile.feedback_after``, default 3): the CuTeGen study found
that profile numbers shown from the first generation pull the model into micro-tuning a
structure that is still wrong (tile shapes and launch parameters of a kernel whose data
flow will change anyway), while the same numbers after the structure has stabilised (a few
generations of correct descendants) guide real improvements. The default of 3 lets the
seed's first children and grandchildren change structure first.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Sequence

from evo.core.records import Candidate, Evaluation, Member, Operator, StageResult

__all__ = [
    "DEFAULT_FEEDBACK_AFTER",
    "profile_key_of",
    "should_profile",
    "profile_visible",
    "has_tunables",
    "should_tune",
    "sized_trials",
    "ProfileJob",
    "Survivors",
]

log = logging.getLogger(__name__)

#: Lineage depth from which prompts may quote profile numbers (see the module docstring).
DEFAULT_FEEDBACK_AFTER = 3

#: Profiles in a row that saw no kernel (or whose profiler failed), before any profile of the
#: run worked, after which profiling is off for the run ("profiler blind" in
#: :class:`Survivors`): two distinct candidates, not one, since a single candidate may
#: legitimately launch no kernel (copies only).
PROFILER_BLIND_AFTER = 2


# ---------------------------------------------------------------------- the rules


def profile_key_of(member: Member, shape: str, gpu: str) -> str:
    """Identity of one profile for :func:`should_profile`'s ``done`` set.

    The candidate id stands for the binary: same source + tunables + task with the same
    compile flags gives the same .so (the compile cache is keyed the same way); the
    profiler's own cache additionally keys on the binary's sha256.
    """
    return f"{member.id}|{shape}|{gpu}"


def should_profile(
    member: Member,
    island_topk_ids: Sequence[str],
    settings: Any,
    *,
    done: Collection[str] = (),
    shape: str = "",
    gpu: str = "",
) -> bool:
    """Profile ``member`` now?

    True when profiling is enabled, the member is correct, it is among the first
    ``settings.top_k`` ids of ``island_topk_ids`` (its island's ranking, best first, as it
    stands after the member was added), and :func:`profile_key_of` (member, shape, gpu) is
    not in ``done`` (never twice for the same binary, shape and GPU).
    """
    if not getattr(settings, "enabled", True) or not member.correct:
        return False
    k = int(getattr(settings, "top_k", 3))
    if member.id not in list(island_topk_ids)[:k]:
        return False
    return profile_key_of(member, shape, gpu) not in done


def profile_visible(depth: int, feedback_after: int = DEFAULT_FEEDBACK_AFTER) -> bool:
    """May a prompt for a parent at lineage ``depth`` quote profile numbers?

    ``depth`` is the parent's generation (seed = 0, each mutation + 1: ``Candidate.generation``).
    True from ``depth >= feedback_after`` on; a negative ``feedback_after`` never shows them.
    """
    if feedback_after < 0:
        return False
    return depth >= feedback_after


def has_tunables(source: str) -> bool:
    """Does ``source`` declare a tunable with more than one choice? (False if it cannot parse.)"""
    from evo.core.tunables import TunableError, parse_tunables

    try:
        return any(len(t.choices) > 1 for t in parse_tunables(source))
    except TunableError:
        return False


def should_tune(member: Member, topk: Sequence[str], tuned_ids: Collection[str], settings: Any) -> bool:
    """Open a tuning study for ``member`` now?

    True when tuning is enabled with a positive ``settings.trials_per_survivor``, the member
    is correct, among the first ``settings.top_k`` of ``topk`` (its island's ranking, best
    first), declares tunables with a choice to make, was not tuned already (``tuned_ids``:
    parent ids of existing studies), and is not itself an Optuna trial (its tunables were
    just searched; its parent's study covers it).
    """
    if not getattr(settings, "enabled", True) or int(getattr(settings, "trials_per_survivor", 0)) <= 0:
        return False
    if not member.correct or member.id in tuned_ids:
        return False
    if member.candidate.operator == Operator.OPTUNA.value:
        return False
    k = int(getattr(settings, "top_k", 2))
    if member.id not in list(topk)[:k]:
        return False
    return has_tunables(member.candidate.source)


def sized_trials(configured: int, budget_left: int | None, trial_every: int) -> int:
    """The trial budget of a study opened now: ``configured`` (``tuning.trials_per_survivor``),
    or fewer when the evaluations the run can still propose and has not promised to other
    studies (``budget_left``; None: no bound) pay for fewer at one evaluation in
    ``trial_every`` (trials' share of the GPU while they wait,
    :data:`evo.engine.dispatch.TRIAL_EVERY`). A study so sized can finish within the budget
    and leaves the rest to the mutations; 0: there is no room for a study."""
    if trial_every < 1:
        raise ValueError(f"trial_every = {trial_every}: must be >= 1")
    if budget_left is None:
        return configured
    return max(0, min(configured, budget_left // trial_every))


# ---------------------------------------------------------------------- the run's survivors


@dataclass(frozen=True)
class ProfileJob:
    """Profile benchmark shape ``shape_idx`` of ``candidate`` (built: ``so_bytes``)."""

    candidate: Candidate
    so_bytes: bytes
    shape_idx: int


def _enabled(settings: Any) -> bool:
    return settings is not None and getattr(settings, "enabled", False)


class Survivors:
    """The survivor work of one run (see the module docstring).

    ``profile`` / ``tuning``: the run's ProfileSettings / TuningSettings (None or
    ``enabled=False``: off). ``tuning_storage``: the Optuna storage of the studies.
    ``rng``: the engine's generator (each study draws its sampler seed from it when it
    opens, so a seeded run opens the same studies with the same seeds). ``task_registry``:
    where a candidate's task is looked up (its benchmark shapes; None: the built-in tasks).
    ``budget_left()``: evaluations the run can still propose (None: unbounded), with
    ``trial_every`` the share trials get of them (:func:`sized_trials`).
    """

    def __init__(self, *, store, run_id: str, profile: Any, tuning: Any, tuning_storage: str,
                 rng: random.Random, task_registry: Any = None, profile_survivors: bool = True,
                 budget_left: Callable[[], int] | None = None, trial_every: int = 1) -> None:
        self.store, self.run_id, self.task_registry = store, run_id, task_registry
        self.budget_left, self.trial_every = budget_left, trial_every
        #: whether survivors are profiled while the run searches (False: the mutator reads no
        #: profile, :func:`mutators.base.reads_profiles`; champions are still, :meth:`champion_profiles`)
        self.profile_survivors = profile_survivors
        self.profile, self.tuning, self.tuning_storage = profile, tuning, tuning_storage
        self.rng = rng
        self._ranking: dict[int, list[tuple[float, str]]] = {}
        self._profiled: set[str] = set()
        self.studies: dict[str, Any] = {}  # parent id -> open TuningStudy
        self._trial_of: dict[str, list[tuple[Any, int]]] = {}
        self._tuned_ids: set[str] = set()  # parents whose study was opened in this session
        self.max_concurrent = int(getattr(tuning, "max_concurrent", 2))
        self._profiles_ok = 0
        self._blind: list[str] = []  # candidates whose profile saw nothing, none having worked
        #: Why profiling is off for the rest of the run (None: on); see :meth:`profiled`.
        self.profiling_off: str | None = None

    def _task(self, name: str) -> Any:
        if self.task_registry is None:
            from evo.tasks.registry import BUILTIN_TASKS  # lazy: the registry builds every task

            return BUILTIN_TASKS.get(name)
        return self.task_registry.get(name)

    # ---- triggers

    def triggered(self, member: Member, so_bytes: bytes, islands: list[int]) -> list[ProfileJob]:
        """A correct member (built: ``so_bytes``) landed in ``islands``: rank it there, open a
        tuning study if it qualifies, and return the profiles to queue for it."""
        prof, tun = self.profile, self.tuning
        ks = [int(x.top_k) for x in (prof, tun) if _enabled(x)]
        jobs: list[ProfileJob] = []
        if not ks:
            return jobs
        cand = member.candidate
        for idx in islands:
            rank = self._ranking.setdefault(idx, [])
            rank.append((member.fitness, cand.id))
            rank.sort(key=lambda x: (-x[0], x[1]))
            del rank[max(ks):]  # only the top-k matter to the triggers
            topk = [i for _, i in rank]
            if _enabled(prof) and self.profiling_off is None and self.profile_survivors:
                for shape_idx in range(self._task(cand.task).bench_shapes):
                    key = f"{cand.id}|{shape_idx}"
                    if should_profile(member, topk, prof, done=self._profiled, shape=str(shape_idx)) \
                            and key not in self._profiled:
                        self._profiled.add(key)
                        jobs.append(ProfileJob(cand, so_bytes, shape_idx))
            if _enabled(tun) and cand.id not in self.studies:
                if should_tune(member, topk, set(self.studies) | self._tuned_ids, tun):
                    self._tune(member)
        if _enabled(tun):
            self._tell_open_study(member)
        return jobs

    def champion_profiles(self, cand: Candidate) -> list[ProfileJob]:
        """The profiles a task's champion still lacks before its confirmation: one per
        benchmark shape not profiled in this session (``so_bytes`` left empty: the engine
        builds the champion again), none when profiling is disabled or switched off."""
        if not _enabled(self.profile) or self.profiling_off is not None:
            return []
        task = self._task(cand.task)
        shapes = range(task.bench_shapes) if task is not None else range(1)
        return [ProfileJob(cand, b"", i) for i in shapes if f"{cand.id}|{i}" not in self._profiled]

    @property
    def ranked(self) -> int:
        """Entries held in the islands' rankings (at most the largest top-k per island)."""
        return sum(len(r) for r in self._ranking.values())

    # ---- profiles

    def profiled(self, job: ProfileJob, st: StageResult) -> None:
        """Store a profile result (passed: its metrics) and log a ``profile`` event.

        Profiler blind: when the first profiles of a run, of :data:`PROFILER_BLIND_AFTER`
        distinct candidates in a row, saw no kernel (``metrics["ncu_kernels"] == 0``) or failed
        in the profiler itself (:meth:`profile_failed`), the profiler cannot see the kernels
        here (ncu in front of a sandboxed runner on some machines): each further profile would
        only spend GPU time the search needs. :attr:`profiling_off` then says why, one warning
        and a ``profiling_off`` event record it, :meth:`triggered` queues no more profiles, and
        the engine drops the queued ones. One profile that worked keeps profiling on."""
        from evo.tasks.registry import format_shape

        cand = job.candidate
        shape = format_shape(self._task(cand.task).shapes[job.shape_idx])
        if st.passed:
            self.store.add_profile(cand.id, shape=shape, gpu=str(st.metrics.get("gpu", "")), metrics=st.metrics)
        self.store.log_event(self.run_id, "profile", {"id": cand.id, "shape": shape, "status": st.status.value,
                                                      "reason": st.reason[:500],
                                                      "bound": st.metrics.get("bound"),
                                                      "ncu_wall_s": st.metrics.get("ncu_wall_s")})
        if st.passed:
            self._profiles_ok += 1
        elif st.metrics.get("ncu_kernels") == 0:
            self._saw_nothing(job.candidate.id, "ncu captured no kernel from the candidates' calls (their outputs "
                                                "were right)")

    def profile_failed(self, job: ProfileJob, err: BaseException) -> None:
        """The profiler itself failed (ncu missing or broken): ours, but not the search's."""
        log.warning("profiling %s failed: %s", job.candidate.short_id, err)
        self.store.log_event(self.run_id, "profile_failed", {"id": job.candidate.id, "error": str(err)[:2000]})
        self._saw_nothing(job.candidate.id, f"the profiler failed: {str(err).splitlines()[0][:300] if str(err) else err!r}")

    def _saw_nothing(self, cid: str, why: str) -> None:
        if self._profiles_ok or self.profiling_off is not None:
            return
        if cid not in self._blind:
            self._blind.append(cid)
        if len(self._blind) < PROFILER_BLIND_AFTER:
            return
        self.profiling_off = (f"{why}, for the first {len(self._blind)} candidates profiled and none profiled "
                              "yet: the profiler cannot see the kernels on this machine")
        log.warning("profiling is off for the rest of this run: %s (to tell why: "
                    "python3 benchmarks/judge_gpu/ncu_matrix.py; to skip profiling: [profile] enabled = false)",
                    self.profiling_off)
        self.store.log_event(self.run_id, "profiling_off", {"reason": self.profiling_off, "candidates": self._blind})

    # ---- tuning

    def _same_space(self, cand: Candidate) -> Any:
        """The open study over ``cand``'s space (same task and source), or None."""
        return next((s for s in self.studies.values()
                     if s.parent.task == cand.task and s.parent.source == cand.source and not s.done), None)

    def _tune(self, member: Member) -> None:
        """One open study per space (task and source): a survivor of a space that is being
        tuned joins that study as a known point instead of opening a second one. Parallel
        studies of one space each modelled a stale subset of its points and split the few
        trial slots between them (19 studies, 5 trials evaluated in a 60-evaluation run)."""
        study = self._same_space(member.candidate)
        if study is None:
            self._open_study(member)
            return
        self._tuned_ids.add(member.candidate.id)
        self.store.log_event(self.run_id, "tuning_join", {"parent": member.candidate.id, "study": study.name,
                                                          "fitness": member.fitness})

    def _tell_open_study(self, member: Member) -> None:
        """A correct member of a space under study (a mutation, or another study's trial): the
        study learns its point (a no-op for its own trials and points it has)."""
        study = self._same_space(member.candidate)
        if study is None:
            return
        ev = self.store.get_evaluation(member.candidate.id, self.run_id)
        if ev is not None:
            study.add_known([(member.candidate.params_dict, ev)])

    def _open_study(self, member: Member) -> None:
        from evo.tuning.tuning import TuningStudy

        cand = member.candidate
        self._tuned_ids.add(cand.id)
        configured = int(self.tuning.trials_per_survivor)
        left = None if self.budget_left is None else self.budget_left() - self.owed()
        n_trials = sized_trials(configured, left, self.trial_every)
        if n_trials < 1:
            self.store.log_event(self.run_id, "tuning_skipped", {
                "parent": cand.id, "fitness": member.fitness, "budget_left": left,
                "reason": f"{left} evaluation(s) of the budget left for new work: none for a study's trials "
                          f"(one in {self.trial_every})"})
            return

        def on_trial(rec) -> None:
            self.store.add_tuning_trial(self.run_id, cand.id, rec.number, rec.params, rec.value, rec.status,
                                        rec.candidate_id)

        study = TuningStudy(self.tuning_storage, self.run_id, cand, seed=self.rng.randrange(2**31),
                            n_trials=n_trials, parent_fitness=member.fitness,
                            lookup=lambda cid: self.store.get_evaluation(cid, self.run_id),
                            known=self.known_points(cand), on_trial=on_trial)
        self.studies[cand.id] = study
        self.store.log_event(self.run_id, "tuning_start", {"parent": cand.id, "study": study.name,
                                                           "fitness": member.fitness, "n_trials": n_trials,
                                                           "configured": configured, "budget_left": left})

    def known_points(self, cand: Candidate) -> list[tuple[dict[str, str], Evaluation]]:
        """``(params, evaluation)`` of every candidate of the run with ``cand``'s task and
        source that was evaluated (any island: the same source and tunables build the same
        kernel), for seeding its study; ``cand`` itself included."""
        evs = {e.candidate_id: e for e in self.store.evaluations(self.run_id, cand.task)}
        return [(c.params_dict, evs[c.id]) for c in self.store.candidates(self.run_id, cand.task)
                if c.source == cand.source and c.id in evs]

    def is_trial(self, cid: str) -> bool:
        """Whether candidate ``cid`` is an open study's trial (it queues with the trials, served in their turn)."""
        return cid in self._trial_of

    @property
    def in_flight(self) -> int:
        """Trials handed out and not told yet, over every open study."""
        return sum(s.in_flight for s in self.studies.values())

    def owed(self) -> int:
        """Trials the open studies may still hand out (their budgets not spent yet): the
        evaluations the engine keeps for them, out of the mutations' share of the budget."""
        return sum(s.owed for s in self.studies.values())

    def reserve(self, max_inflight: int) -> int:
        """Slots kept for tuning trials: at most a third of all, only while studies want them."""
        if not self.studies:
            return 0
        want = sum(max(0, self.max_concurrent - s.in_flight) for s in self.studies.values() if not s.done)
        cap = max(1, max_inflight // 3) - self.in_flight
        return max(0, min(want, cap))

    def trials(self, max_inflight: int, room: Callable[[], bool], seen: Collection[str]) -> Iterator[Candidate]:
        """Trial candidates to submit, while ``room()`` says a slot is free and tuning holds
        less than a third of ``max_inflight``. A trial whose candidate is in ``seen`` (a
        mutation proposed it) is not yielded: it is told when that evaluation lands."""
        cap = max(1, max_inflight // 3)
        for study in list(self.studies.values()):
            while not study.done and study.in_flight < self.max_concurrent and self.in_flight < cap and room():
                got = study.ask()
                if got is None:
                    break
                number, cand = got
                self._trial_of.setdefault(cand.id, []).append((study, number))
                if cand.id in seen:
                    continue  # in flight already (a mutation proposed it): told when it lands
                yield cand
            if study.finished:
                self._finish_study(study)

    def told(self, cid: str, ev: Evaluation) -> None:
        """Candidate ``cid`` was evaluated: tell every study that asked for it."""
        for study, number in self._trial_of.pop(cid, []):
            study.tell(number, ev)
            if study.finished:
                self._finish_study(study)

    def close(self) -> None:
        """The run ends: a ``tuning_unfinished`` event with the counts of every study still
        open (its budget not spent, or trials of it never told back), so the run's records
        say what each study did whether or not it finished."""
        for study in list(self.studies.values()):
            self._log_study("tuning_unfinished", study)

    def _finish_study(self, study) -> None:
        """Log ``tuning_done`` once, when ``study`` finished (the rule:
        :attr:`evo.tuning.study_counts.StudyCounts.finished`), and forget it."""
        key = study.parent.id
        if key not in self.studies:
            return
        del self.studies[key]
        self._log_study("tuning_done", study)

    def _log_study(self, kind: str, study) -> None:
        summ = study.summary()
        self.store.log_event(self.run_id, kind, {
            "study": summ.study, "parent": study.parent.id, "best": summ.best_id,
            "best_fitness": summ.best_fitness, "parent_fitness": summ.parent_fitness,
            "improved": summ.improved, "evaluated": summ.evaluated, "counts": study.counts().to_json()})
