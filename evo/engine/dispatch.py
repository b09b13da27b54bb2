"""The engine's work on the cluster: compile tasks, what waits for a GPU and what runs on each.

:class:`Dispatch` is owned by :class:`evo.engine.engine.Engine` and used from its thread only. It
submits compiles at once. It holds three GPU queues, served whenever a GPU actor holds fewer
than ``rt.gpu_slots`` requests (its correctness slots plus one queued, so no gap opens between
candidates), the least loaded GPU that is not down (:class:`evo.engine.recovery.GpuFaults`)
first:

1. mutations: compiled candidates, oldest first (a requeued candidate goes to the front);
2. profiles: delayed profiles of survivors (:class:`evo.engine.survivors.ProfileJob`);
3. trials: compiled tuning trials.

Mutations come first, but neither of the other queues can starve: while trials wait, at least
one GPU request in :data:`TRIAL_EVERY` is a trial, and while profiles wait, one in
:data:`PROFILE_EVERY` is a profile (counted over the requests since that queue's last one,
so a queue that was empty for long gets no burst when it fills). Compiles outpace the GPU
in most runs, so a queue served only when no mutation waits would be served almost never:
a tuning study would ask for trials that never run, and the run would end with its studies
unfinished. When a queue is empty its turn goes to the next in the order above.

It submits through the runtime and counts each GPU's load. Its containers are its own: the
engine asks through methods (:meth:`Dispatch.waiting`, :meth:`Dispatch.pending`, the counts)
and takes a finished request back with :meth:`Dispatch.take`, which reads the result and
answers with a tagged, frozen :data:`Completion`: :class:`CompileDone`, :class:`GpuDone`,
:class:`ProfileDone`, or their failures (:class:`CompileFailed`, :class:`GpuFailed`,
:class:`ProfileFailed`: the runtime's remote error, for evo.engine.recovery to judge). What a
result means is the engine's to decide.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Union

from evo.engine.bookkeeping import Pending
from evo.engine.recovery import GpuFaults
from evo.engine.survivors import ProfileJob

__all__ = ["Dispatch", "TRIAL_EVERY", "PROFILE_EVERY", "Completion", "CompileDone", "CompileFailed", "GpuDone", "GpuFailed", "ProfileDone",
           "ProfileFailed"]


@dataclass(frozen=True)
class CompileDone:
    """A compile returned: ``outcome`` is its :class:`evo.engine.seams.CompileResult`."""

    pending: Pending
    outcome: Any


@dataclass(frozen=True)
class CompileFailed:
    """A compile raised or its worker died: ``error`` is one of the runtime's remote errors."""

    pending: Pending
    error: BaseException


@dataclass(frozen=True)
class GpuDone:
    """A GPU evaluation returned on GPU ``gpu``: ``result`` is its :class:`evaluators.actor.GpuResult`."""

    gpu: int
    pending: Pending
    result: Any


@dataclass(frozen=True)
class GpuFailed:
    """A GPU evaluation on GPU ``gpu`` raised or its actor died (``error``: a remote error)."""

    gpu: int
    pending: Pending
    error: BaseException


@dataclass(frozen=True)
class ProfileDone:
    """A delayed profile returned on GPU ``gpu``: ``stage`` is its profile StageResult."""

    gpu: int
    job: ProfileJob
    stage: Any


@dataclass(frozen=True)
class ProfileFailed:
    """A delayed profile on GPU ``gpu`` raised (ncu missing or broken; ``error``: a remote error)."""

    gpu: int
    job: ProfileJob
    error: BaseException


#: While tuning trials wait, one GPU request in this many is a trial (module docstring).
TRIAL_EVERY = 3
#: While delayed profiles wait, one GPU request in this many is a profile (module docstring).
PROFILE_EVERY = 6

#: What :meth:`Dispatch.take` answers for a finished request.
Completion = Union[CompileDone, CompileFailed, GpuDone, GpuFailed, ProfileDone, ProfileFailed]


class Dispatch:
    """The compiles, the GPU queues and the requests on the GPUs. ``profile``: the profile
    settings passed to ``rt.submit_profile``."""

    def __init__(self, rt, faults: GpuFaults, profile) -> None:
        self._rt, self._faults, self._profile = rt, faults, profile
        self._compiles: dict[Any, Pending] = {}
        self._queue: deque[Pending] = deque()
        self._profiles: deque[ProfileJob] = deque()
        self._tune: deque[Pending] = deque()
        self._refs: dict[Any, tuple[int, Pending]] = {}
        self._profile_refs: dict[Any, tuple[int, ProfileJob]] = {}
        self._load: list[int] = []
        # GPU requests since the last trial / profile (module docstring: no queue starves)
        self._since_trial = 0
        self._since_profile = 0

    def start(self, n_gpus: int) -> None:
        self._load = [0] * n_gpus

    @property
    def n_gpus(self) -> int:
        """GPUs dispatched to (lost ones included), from :meth:`start`."""
        return len(self._load)

    def __len__(self) -> int:
        """Candidates compiling, waiting for or on a GPU (profiles are not candidates in flight)."""
        return len(self._compiles) + len(self._refs) + len(self._queue) + len(self._tune)

    def compiling(self) -> int:
        """Candidates compiling."""
        return len(self._compiles)

    def queued(self) -> int:
        """Compiled mutations waiting for a GPU."""
        return len(self._queue)

    def pending(self) -> list[Pending]:
        """The candidates compiling, the mutations on a GPU, then those waiting for one."""
        return list(self._compiles.values()) + [p for _, p in self._refs.values()] + list(self._queue)

    def tasks(self) -> set[str]:
        """The tasks of every candidate compiling, waiting for or on a GPU (trials included)."""
        return {p.candidate.task for p in self.pending()} | {p.candidate.task for p in self._tune}

    def waiting(self) -> list[Any]:
        """The refs of every request out: compiles, GPU evaluations, profiles."""
        return list(self._compiles) + list(self._refs) + list(self._profile_refs)

    def on_gpus(self) -> dict[Any, tuple[int, Pending]]:
        """A copy of the GPU evaluations out: ref -> (GPU, pending)."""
        return dict(self._refs)

    def compile(self, pending: Pending) -> None:
        pending.compile_attempts += 1
        self._compiles[self._rt.submit_compile(pending.candidate)] = pending

    def compiled(self, pending: Pending, trial: bool) -> None:
        (self._tune if trial else self._queue).append(pending)

    def requeue(self, pending: Pending) -> None:
        self._queue.appendleft(pending)

    def add_profiles(self, jobs) -> None:
        """Queue delayed profiles (served in their turn, :data:`PROFILE_EVERY`)."""
        self._profiles.extend(jobs)

    def abandon_unstarted(self) -> list[Pending]:
        """Forget every candidate not on a GPU yet (compiling or queued: mutations and tuning
        trials) and the queued profiles; the candidates, in :meth:`pending` order. Their
        compiles may still finish; their results are never taken. What runs on the GPUs
        stays (:meth:`on_gpus`)."""
        dropped = list(self._compiles.values()) + list(self._queue) + list(self._tune)
        self._compiles.clear()
        self._queue.clear()
        self._tune.clear()
        self._profiles.clear()
        return dropped

    def drop_profiles(self) -> int:
        """Forget the queued profiles (not those on a GPU); how many were dropped."""
        n = len(self._profiles)
        self._profiles.clear()
        return n

    def lost(self, g: int) -> None:
        self._load[g] = 2**30  # never dispatched to again

    def take(self, ref) -> Completion:
        """Take back the finished request ``ref`` (one of :meth:`waiting`) and read its result
        (``rt.get``); a remote error becomes the matching ``*Failed`` record. Its GPU's load
        drops by one."""
        errors = self._rt.remote_errors()
        if ref in self._compiles:
            pending = self._compiles.pop(ref)
            try:
                return CompileDone(pending, self._rt.get(ref))
            except errors as e:
                return CompileFailed(pending, e)
        if ref in self._profile_refs:
            g, job = self._profile_refs.pop(ref)
            self._load[g] -= 1
            try:
                return ProfileDone(g, job, self._rt.get(ref))
            except errors as e:
                return ProfileFailed(g, job, e)
        g, pending = self._refs.pop(ref)
        self._load[g] -= 1
        try:
            return GpuDone(g, pending, self._rt.get(ref))
        except errors as e:
            return GpuFailed(g, pending, e)

    def fill_gpus(self) -> None:
        """Fill every free GPU slot: mutations first, with a turn for trials and profiles
        (module docstring: :data:`TRIAL_EVERY`, :data:`PROFILE_EVERY`)."""
        while self._queue or self._profiles or self._tune:
            slots = self._rt.gpu_slots
            free = [g for g, load in enumerate(self._load) if load < slots and not self._faults.is_down(g)]
            if not free:
                return
            g = min(free, key=lambda i: self._load[i])
            kind = self._next_kind()
            self._since_trial = 0 if kind == "trial" else self._since_trial + 1
            self._since_profile = 0 if kind == "profile" else self._since_profile + 1
            if kind == "profile":
                job = self._profiles.popleft()
                self._profile_refs[self._rt.submit_profile(g, job.candidate, job.so_bytes, job.shape_idx,
                                                           self._profile)] = (g, job)
            else:
                pending = (self._tune if kind == "trial" else self._queue).popleft()
                pending.gpu_attempts += 1
                pending.gpu_seq = self._faults.next_seq()
                self._refs[self._rt.submit_gpu(g, pending.candidate, pending.so_bytes)] = (g, pending)
            self._load[g] += 1

    def _next_kind(self) -> str:
        """Which queue the next GPU request comes from: a waiting trial or profile whose turn
        has come (trials first), else a mutation, else a profile, else a trial."""
        if self._tune and self._since_trial >= TRIAL_EVERY - 1:
            return "trial"
        if self._profiles and self._since_profile >= PROFILE_EVERY - 1:
            return "profile"
        if self._queue:
            return "mutation"
        return "profile" if self._profiles else "trial"
