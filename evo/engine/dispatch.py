"""The engine's work on the cluster: compile tasks, what waits for a GPU and what runs on each.

:class:`Dispatch` is owned by :class:`evo.engine.engine.Engine` and used from its thread only. It
submits compiles at once (``compiles``: ref -> candidate). It holds three GPU queues, served
whenever a GPU actor holds fewer than ``rt.gpu_slots``
requests (its correctness slots plus one queued, so no gap opens between candidates), the
least loaded GPU that is not down (:class:`evo.engine.recovery.GpuFaults`) first:

1. ``queue``: compiled mutations, oldest first (a requeued candidate goes to the front);
2. ``profiles``: delayed profiles of survivors (:class:`evo.engine.survivors.ProfileJob`);
3. ``tune``: compiled tuning trials (lowest priority).

It submits through the runtime and counts each GPU's load; the engine takes a finished
request back by its ref (:meth:`Dispatch.took_compile`, :meth:`Dispatch.took`,
:meth:`Dispatch.took_profile`) and decides what its result means.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from evo.engine.bookkeeping import Pending
from evo.engine.recovery import GpuFaults
from evo.engine.survivors import ProfileJob

__all__ = ["Dispatch"]


class Dispatch:
    """The compiles, the GPU queues and the requests on the GPUs. ``profile``: the profile settings passed
    to ``rt.submit_profile``."""

    def __init__(self, rt, faults: GpuFaults, profile) -> None:
        self.rt, self.faults, self.profile = rt, faults, profile
        self.compiles: dict[Any, Pending] = {}
        self.queue: deque[Pending] = deque()
        self.profiles: deque[ProfileJob] = deque()
        self.tune: deque[Pending] = deque()
        self.refs: dict[Any, tuple[int, Pending]] = {}
        self.profile_refs: dict[Any, tuple[int, ProfileJob]] = {}
        self.load: list[int] = []

    def start(self, n_gpus: int) -> None:
        self.load = [0] * n_gpus

    def __len__(self) -> int:
        """Candidates compiling, waiting for or on a GPU (profiles are not candidates in flight)."""
        return len(self.compiles) + len(self.refs) + len(self.queue) + len(self.tune)

    def pending(self) -> list[Pending]:
        """The candidates compiling, the mutations on a GPU, then those waiting for one."""
        return list(self.compiles.values()) + [p for _, p in self.refs.values()] + list(self.queue)

    def waiting(self) -> list[Any]:
        """The refs of every request out: compiles, GPU evaluations, profiles."""
        return list(self.compiles) + list(self.refs) + list(self.profile_refs)

    def compile(self, pending: Pending) -> None:
        pending.compile_attempts += 1
        self.compiles[self.rt.submit_compile(pending.candidate)] = pending

    def took_compile(self, ref) -> Pending:
        return self.compiles.pop(ref)

    def compiled(self, pending: Pending, trial: bool) -> None:
        (self.tune if trial else self.queue).append(pending)

    def requeue(self, pending: Pending) -> None:
        self.queue.appendleft(pending)

    def lost(self, g: int) -> None:
        self.load[g] = 2**30  # never dispatched to again

    def took(self, ref) -> tuple[int, Pending]:
        g, pending = self.refs.pop(ref)
        self.load[g] -= 1
        return g, pending

    def took_profile(self, ref) -> tuple[int, ProfileJob]:
        g, job = self.profile_refs.pop(ref)
        self.load[g] -= 1
        return g, job

    def fill_gpus(self) -> None:
        """Mutations first, then delayed profiles, then tuning trials (lowest priority)."""
        while self.queue or self.profiles or self.tune:
            slots = self.rt.gpu_slots
            free = [g for g, load in enumerate(self.load) if load < slots and not self.faults.is_down(g)]
            if not free:
                return
            g = min(free, key=lambda i: self.load[i])
            if self.queue or (self.tune and not self.profiles):
                pending = (self.queue or self.tune).popleft()
                pending.gpu_attempts += 1
                pending.gpu_seq = self.faults.next_seq()
                self.refs[self.rt.submit_gpu(g, pending.candidate, pending.so_bytes)] = (g, pending)
            else:
                job = self.profiles.popleft()
                self.profile_refs[self.rt.submit_profile(g, job.candidate, job.so_bytes, job.shape_idx,
                                                         self.profile)] = (g, job)
            self.load[g] += 1
