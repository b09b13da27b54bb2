"""The seams the engine drives, as documented Protocols.

The engine (:class:`evo.engine.engine.Engine`) is orchestration: every piece of real work goes
through one of four seams, each with one conformance suite that every implementation and
every fake must pass:

- the stage callables :class:`CompileFn`, :class:`EvaluateFn`, :class:`ProfileFn` (the
  fields of :class:`evo.engine.seams.Stages`): :func:`evaluators.compile.compile_candidate`,
  :func:`evaluators.pipeline.evaluate_built`, ``evaluators.actor.GpuEvaluator.profile``
  (ncu), and the fakes in ``tests/fakes/``; suites ``tests/conformance/
  test_stages_conformance.py`` and ``tests/gpu/test_stages_conformance_gpu.py``;
- :class:`ClusterRuntime` (the work it submits, :class:`SubmittedWork`, and the islands it
  hosts, :class:`IslandHost`, each behind a typed :class:`IslandProxy`):
  :class:`evo.engine.runtime.Runtime` (Ray) and
  :class:`evo.engine.local_runtime.LocalRuntime` (in-process: threads, fake GPUs, plain
  islands; the engine's tests); suite ``tests/conformance/test_runtime_conformance.py``;
- :class:`StoreWriter`: :class:`evo.store.Store`; suite
  ``tests/conformance/test_store_writer_conformance.py``;
- the mutator, :class:`mutators.base.Mutator`: :class:`mutators.knobs.KnobsMutator`,
  :class:`mutators.llm.mutator.LLMMutator`; suite ``tests/conformance/test_mutator_conformance.py``.

The mutator's Protocol lives with the mutators (``mutators/base.py``: mutators never import
the engine); the others live here, on the engine's side, so that ``evaluators/`` and
``evo/store/`` need not know who drives them. This module imports no Ray, no SQLite and no
CUDA: a Protocol is a contract, not a dependency.

Each Protocol says, for every member: who calls it, when, what it may change, and what it
raises. "The driver" is the process running the engine; it calls every seam from one
thread, so no implementation needs to be thread-safe towards the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Evaluation, Member, StageResult

__all__ = ["CompileResult", "CompileFn", "EvaluateFn", "ProfileFn", "Stages", "SubmittedWork", "IslandProxy",
           "IslandHost", "ClusterRuntime", "StoreWriter"]


# ---------------------------------------------------------------------- stage callables


@runtime_checkable
class CompileResult(Protocol):
    """What a :class:`CompileFn` returns (:class:`evaluators.compile.CompileOutcome` fits).

    ``result`` is the compile stage's verdict (``stage == "compile"``); ``so_bytes`` holds
    the shared object exactly when ``result.passed`` (None otherwise); ``cached`` is True when
    the result came from the content cache without running nvcc (its ``seconds`` are then the
    cache's read, and ``result.metrics["nvcc_seconds"]``, when present, the original build's).
    The engine reads nothing else.
    """

    result: StageResult
    so_bytes: bytes | None
    cached: bool


@runtime_checkable
class CompileFn(Protocol):
    """Builds one candidate: ``(candidate, settings) -> CompileResult``.

    Called by: a Ray compile task (``num_cpus=1``) that :meth:`ClusterRuntime.submit_compile`
    starts, once per candidate that passed the policy check (twice when the first worker
    process died; the engine retries once). Runs on any node with CPUs, in a worker process,
    so it must be a module-level function (it pickles by reference).

    Returns for every candidate: a compile error, a timeout or a violated constraint is a
    :class:`CompileResult` whose ``result`` has a non-ok status (``compile_error``,
    ``timeout``, ``rejected``), never an exception. It may write its own content-keyed cache
    (``settings.cache_dir``) and nothing else.

    Raises only for failures of ours (nvcc or CUTLASS missing, a full disk):
    :class:`evaluators.base.InfrastructureError` stops the run at once; any other exception
    counts towards the engine's circuit breaker (three in a row of one kind stop the run).
    """

    def __call__(self, candidate: Candidate, settings: CompileSettings) -> CompileResult:  # pragma: no cover
        ...


@runtime_checkable
class EvaluateFn(Protocol):
    """Checks and times one built candidate: ``(candidate, so_bytes, settings) -> Evaluation``.

    Called by: the GPU actor (:class:`evaluators.actor.GpuEvaluator`) of the GPU Ray assigned
    it (``CUDA_VISIBLE_DEVICES`` is set), once per candidate whose compile passed, one at a
    time per actor; the engine submits it through :meth:`ClusterRuntime.submit_gpu`. Also
    used for champion confirmation (a second, independent evaluation of the same binary).

    Returns an :class:`~evo.core.records.Evaluation` with ``candidate_id == candidate.id`` for
    every candidate: wrong results, crashes, hangs and timeouts are stages with a non-ok
    status, and ``fitness`` is None unless every stage passed. The returned stages are the
    GPU stages only (correctness, timing); the engine prepends policy and compile. It must
    not keep state between candidates (each runs in a fresh process in production).

    Raises only for failures of ours, with the same consequences as :class:`CompileFn`.
    """

    def __call__(self, candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:  # pragma: no cover
        ...


@runtime_checkable
class ProfileFn(Protocol):
    """Profiles one benchmark shape of a correct survivor:
    ``(candidate, so_bytes, shape_idx, settings) -> StageResult``.

    Called by: the GPU actor, when the engine submits a delayed profile
    (:meth:`ClusterRuntime.submit_profile`) for a correct candidate that entered its island's
    top-k (:func:`evo.engine.survivors.should_profile`). ``settings`` is the run's
    :class:`evaluators.profile.ProfileSettings`.

    Returns a StageResult named ``"profile"``; when it passed, ``metrics`` carries ``gpu``
    (the GPU's name) and the measured numbers, stored per (candidate, shape, GPU).

    Raises when the profiler itself cannot run (ncu missing or broken): the engine logs a
    ``profile_failed`` event and the search goes on (profiles are advice, not verdicts).
    """

    def __call__(self, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings: Any) -> StageResult:  # pragma: no cover
        ...


@dataclass(frozen=True)
class Stages:
    """The three stage callables the runtime runs remotely; module-level functions, so they
    pickle by reference. Their contracts are the Protocols :class:`evo.engine.seams.CompileFn`,
    :class:`~evo.engine.seams.EvaluateFn` and :class:`~evo.engine.seams.ProfileFn` (who calls them, when,
    what they return for a candidate's failure, what they raise for ours).

    Lives here, beside the Protocols, so that a runtime without Ray
    (:mod:`evo.engine.local_runtime`) and the tests need not import :mod:`evo.engine.runtime`
    (which imports Ray).

    Tests inject fake stages (tests/fakes/: sleep + deterministic results) here; production
    uses :func:`evo.engine.runtime.real_stages`. Each passes tests/conformance/test_stages_conformance.py (the
    real GPU stages: tests/gpu/test_stages_conformance_gpu.py).
    """

    compile_fn: CompileFn  # runs in a Ray compile task (num_cpus=1)
    evaluate_fn: EvaluateFn | None = None  # in the GPU actor; None = evaluators.pipeline.evaluate_built
    profile_fn: ProfileFn | None = None  # in the GPU actor; None = evaluators.profile (ncu)
    #: ``evaluate_fn`` may be called from several of the actor's threads at once, because it
    #: serialises its own GPU work (the pipeline's: the judge evaluates one candidate at a time
    #: and starts the next one's runner meanwhile); False: it is called one call at a time
    #: (the tests' fakes). The runtimes size the actor's threads from it.
    evaluate_concurrent: bool = True


# ---------------------------------------------------------------------- the cluster


@runtime_checkable
class SubmittedWork(Protocol):
    """The work the engine submits to the cluster: compile tasks, GPU evaluations and
    profiles; waiting for them and reading them.

    Half of :class:`ClusterRuntime` (the other half: :class:`IslandHost`). Every member is
    called by the engine in the driver, from one thread.

    *References.* ``submit_*``, :meth:`probe_gpu` and the island proxies' ``ask_*`` return
    an opaque, hashable reference to a result that is not ready yet; the engine keeps them
    as dict keys, passes them to :meth:`wait` and reads them with :meth:`get`. Nothing else may be assumed about
    them (the Ray runtime: object references; the in-process one: futures).

    *Errors.* :meth:`remote_errors` names the exception types that mean "the remote side
    failed" (a worker process died, an actor is gone, or the remote function raised and
    the error was shipped back). :meth:`get` (and :class:`IslandProxy`'s methods) raise
    those; the engine decides what they mean (evo.engine.recovery). Errors the remote function raised
    arrive wrapped, with the original exception as ``cause`` (Ray's ``RayTaskError``) so
    that an :class:`~evaluators.base.InfrastructureError` can be found behind them. The
    types whose name contains ``Actor`` mean the actor itself is dead (an island actor is
    then rebuilt from the store).
    """

    @property
    def n_gpus(self) -> int:
        """GPU actors available (>= 1 after start). Read at the start of a run."""
        ...

    @property
    def n_cpus(self) -> int:
        """CPUs of the cluster (>= 1); read on every scheduling step, so cache it."""
        ...

    @property
    def gpu_slots(self) -> int:
        """Requests the engine keeps on each GPU actor at once (>= 2: the one evaluated and the
        next, whose runner the judge starts meanwhile)."""
        ...

    def submit_compile(self, candidate: Candidate) -> Any:
        """Start :class:`CompileFn` on ``candidate`` somewhere with a free CPU; a reference to
        its :class:`CompileResult`. Called once per policy-passed candidate (again after a
        worker death). Must not block."""
        ...

    def submit_gpu(self, gpu: int, candidate: Candidate, so_bytes: bytes, mode: str | None = None,
                   baseline: Candidate | None = None, baseline_so: Any = None) -> Any:
        """Queue :class:`EvaluateFn` on GPU actor ``gpu`` (0 <= gpu < n_gpus); a reference to an
        :class:`evaluators.actor.GpuResult` (the evaluation plus its start and end times).
        The engine keeps at most :attr:`gpu_slots` requests per actor; the actor may run
        several at once (correctness shares the GPU, timing has it alone). Must not block.
        ``mode``: None (correctness, then timing), ``"time-only"`` (a re-timing of a
        candidate already judged correct) or ``"paired"`` (champion confirmation: checked
        again, then timed call by call with ``baseline``, whose binary handle is
        ``baseline_so``, as :meth:`get` gave it; the paired times in the timing stage's
        ``metrics["paired"]``); an actor whose evaluate function has no modes evaluates
        fully."""
        ...

    def submit_profile(self, gpu: int, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings: Any) -> Any:
        """Queue :class:`ProfileFn` on GPU actor ``gpu``; a reference to its StageResult. Same
        ordering as :meth:`submit_gpu` (it shares the actor's queue)."""
        ...

    def wait(self, refs: list, timeout: float) -> list:
        """The references of ``refs`` that are ready, waiting at most ``timeout`` seconds for
        the first; every other one already finished comes back too. ``[]`` for ``[]`` (at
        once) or when none finished in time. A reference that failed counts as ready."""
        ...

    def get(self, ref: Any) -> Any:
        """The result behind ``ref`` (blocking until it is ready); raises one of
        :meth:`remote_errors` when the remote side failed. For a compile reference the
        outcome's ``so_bytes`` is an opaque handle of the binary (the real runtime: its
        reference in Ray's object store; fakes may give the bytes): the engine only passes it
        back to :meth:`submit_gpu` / :meth:`submit_profile` and tests it for truth."""
        ...

    def probe_gpu(self, gpu: int) -> Any:
        """Ask GPU actor ``gpu`` a cheap question (its worker's name); a reference to the
        answer, or None when there is no actor to ask. The engine probes a GPU whose actor
        died and gives it work again once the answer comes; :meth:`get` raises one of
        :meth:`remote_errors` while it is still down. Must not block."""
        ...

    def remote_errors(self) -> tuple[type[BaseException], ...]:
        """The exception types :meth:`get` and the island proxies raise for remote failures
        (a non-empty tuple; the same on every call)."""
        ...


@runtime_checkable
class IslandProxy(Protocol):
    """One hosted island, called by typed methods (the driver's handle of a
    :class:`populations.actor.IslandActor`; the Ray runtime's proxies an actor, the
    in-process one the object itself).

    Calls from the driver to one island run in the order they were made, whatever their kind:
    a member sent with :meth:`add` is in the island before the next :meth:`parents` answers.
    A method that waits for its answer raises one of :meth:`SubmittedWork.remote_errors` when
    the island failed; a type whose name contains ``Actor`` means the island is dead (the
    engine then rebuilds it from the store). ``ask_*`` return a reference for
    :meth:`SubmittedWork.get` / :meth:`SubmittedWork.wait` and never block; :meth:`add` and
    :meth:`record_child` are fire-and-forget (an error there is lost, and the next call that
    waits reports a dead island).
    """

    def add(self, member: Member) -> None:
        """Send an evaluated member to the island (fire and forget, ordered)."""
        ...

    def add_many(self, members: Sequence[Member]) -> list[bool]:
        """Add every member (a restored island's members); which of them were new."""
        ...

    def parents(self, k: int) -> list[Member]:
        """``k`` parents chosen by the island's selector ([] while it has no member)."""
        ...

    def ask_parents(self, k: int) -> Any:
        """:meth:`parents`, started now: a reference to its answer."""
        ...

    def record_child(self, parent_id: str) -> None:
        """Tell the island that ``parent_id`` made a child (fire and forget, ordered)."""
        ...

    def emigrants(self, n: int) -> list[Member]:
        """Up to ``n`` members to send to the next island of the ring."""
        ...

    def immigrate(self, members: Sequence[Member]) -> int:
        """Take members from another island; how many joined."""
        ...

    def summary(self) -> Any:
        """The island's :class:`populations.island.IslandSummary`."""
        ...

    def ask_summary(self) -> Any:
        """:meth:`summary`, started now: a reference to its answer (the engine asks every
        island at once, then reads them)."""
        ...


@runtime_checkable
class IslandHost(Protocol):
    """The islands the cluster hosts: one :class:`IslandProxy` per island.

    Half of :class:`ClusterRuntime` (the other half: :class:`SubmittedWork`, whose
    :meth:`~SubmittedWork.wait` and :meth:`~SubmittedWork.get` read what the proxies'
    ``ask_*`` return, and whose :meth:`~SubmittedWork.remote_errors` the proxies raise). Called
    by the engine in the driver, from one thread.
    """

    def make_islands(self, specs: list) -> list[IslandProxy]:
        """One island per :class:`populations.island.IslandSpec`, in order. Called once per
        island at the start of a run and again for each island that died."""
        ...


@runtime_checkable
class ClusterRuntime(SubmittedWork, IslandHost, Protocol):
    """The cluster as the engine sees it: the work it submits (:class:`SubmittedWork`) and
    the islands it hosts (:class:`IslandHost`).

    Implemented by :class:`evo.engine.runtime.Runtime` (Ray) and
    :class:`evo.engine.local_runtime.LocalRuntime` (in-process, for tests). Started and shut
    down by its creator (``evo.engine.search.run_search``, tests), never by the engine:
    ``start``/``shutdown`` are not part of this seam.
    """


# ---------------------------------------------------------------------- the store


@runtime_checkable
class StoreWriter(Protocol):
    """The lineage store as the engine writes it: the run's single writer.

    Implemented by :class:`evo.store.Store` (SQLite). The engine and its helpers
    (evo.engine.survivors, evo.engine.resume) call these from the driver only; the driver is the one
    writer of the run (it holds the run's writer lease, taken by ``Store.create_run`` or
    ``acquire_lease`` before the engine starts). Every write method is one transaction:
    after it returns the row survives a SIGKILL; when it raises nothing of it was written.

    *Errors.* An unknown run or candidate raises :class:`evo.store.UnknownIdError` (a bug of
    the caller: the engine always adds a candidate before its evaluation, profile, trial or
    crown). A disk that cannot grow raises the database's own error (``sqlite3`` "database
    or disk is full", or ``OSError`` ENOSPC): the engine stops the run with
    :class:`evo.engine.engine.StoreFullError` at the first such write, so implementations must not
    swallow it. A store opened read-only raises :class:`evo.store.ReadOnlyStoreError`.
    """

    def add_candidate(self, run_id: str, c: Candidate) -> bool:
        """Record ``c`` in run ``run_id`` before anything is done with it (called once per new
        content id, right after proposal). True if new to the run; the same content again is
        a no-op (False): the first lineage fields are kept."""
        ...

    def add_evaluation(self, run_id: str, ev: Evaluation) -> bool:
        """Record the final evaluation of a candidate (every stage it went through, failures
        included); exactly once per candidate per run (a second one is a no-op, False)."""
        ...

    def add_profile(self, cid: str, *, shape: str, gpu: str, metrics: Mapping[str, Any]) -> None:
        """Store (or replace) a candidate's profile of one shape on one GPU (a passed
        :class:`ProfileFn` result's metrics)."""
        ...

    def add_tuning_trial(self, run_id: str, parent_id: str, trial: int, params: Mapping[str, Any],
                         value: float | None, status: str, candidate_id: str | None = None) -> None:
        """Record (or update: same run, parent and trial number) one Optuna trial of a study
        over ``parent_id``'s tunables; called for every trial a study finishes."""
        ...

    def set_champion(self, run_id: str, task: str, cid: str, fitness: float, confirmation: Mapping[str, Any]) -> None:
        """Crown ``cid`` for ``task`` at the end of a run, with the re-timing's outcome
        (``confirmed``, ``fitness_confirmed``, ``ratio``, ``gpu`` or ``error``)."""
        ...

    def set_run_status(self, run_id: str, status: str, *, reason: str = "") -> None:
        """Set the run's status at its end: ``finished``, ``interrupted`` (Ctrl-C) or
        ``failed`` (a failure of ours); every status stays resumable. An unknown status
        raises ValueError."""
        ...

    def log_event(self, run_id: str | None, kind: str, payload: Mapping[str, Any] | None = None) -> int:
        """Append an event (``new_best``, ``progress``, ``resume``, ``failed``, ...; the engine
        documents its kinds in docs/engine.md); returns its id. Events are never changed."""
        ...

    def get_evaluation(self, cid: str, run_id: str | None = None) -> Evaluation | None:
        """The stored evaluation of ``cid`` in ``run_id``, or None. Tuning studies call it
        (through ``lookup``) to tell a trial whose candidate the run already evaluated."""
        ...

    def candidates(self, run_id: str, task: str | None = None) -> list[Candidate]:
        """The run's candidates in the order they were added (resume and island restores
        replay them in that order)."""
        ...

    def evaluations(self, run_id: str, task: str | None = None) -> list[Evaluation]:
        """The run's evaluations (at most one per candidate)."""
        ...
