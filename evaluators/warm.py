"""Warm children: harness processes started before their candidates exist.

A candidate's GPU stages still run in one fresh, sandboxed process each (shared/EVALUATION.md,
Isolation), but the process's start-up (interpreter, torch, the task, its CUDA context, the
compiled reference) no longer sits on the critical path: the GPU actor keeps, per (task,
process kind), up to ``warm_children`` processes prepared and waiting, and hands each one
job (``kernel.so`` + ``job.json``, then the gate) when a candidate arrives. A warm child is
an ordinary :class:`evaluators.child_process.ChildProcess` started with a spec instead of a job: same
environment scrub, Landlock, seccomp (installed after the job arrives, before the
candidate's binary is loaded), own process group and private directory.

Rules:

- a warm child runs exactly one job and exits; one that is never used is killed and its
  directory removed (:meth:`WarmPool.close`, or when its key falls out of use);
- one that died while waiting is replaced, never given a job; after ``MAX_DEATHS`` deaths
  in a row for one key the pool stops warming it (a task the child cannot load dies every
  time): candidates of that key start cold, so the failure surfaces as it did before
  (a :class:`~evaluators.isolation.HarnessError` from the child);
- a warm child creates its CUDA context only with a shared slot of the
  :class:`~evaluators.gpu_schedule.GpuSchedule` (never while a timing process runs), held
  until it says ``ready``;
- the timeout clock starts at job arrival (:meth:`ChildProcess.deliver`).

One keeper thread spawns replacements, watches the waiting children and grants CUDA
start-up; :meth:`WarmPool.start` is called from the actor's evaluation threads.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from evaluators.base import HarnessSettings
from evaluators.gpu_schedule import GpuSchedule
from evaluators.child_process import ChildProcess
from evaluators.harness_job import HarnessJob, HarnessReport, spec_json

__all__ = ["WarmPool", "MAX_DEATHS"]

log = logging.getLogger(__name__)

#: deaths in a row of one key's waiting children after which that key is started cold
MAX_DEATHS = 2

#: (task, mode, task files, bench shapes, reference, time_compiled_reference, device)
Key = tuple


def _key(task: str, mode: str, settings: HarnessSettings, task_files: tuple[str, ...],
         bench_shapes: tuple[int, ...] | None) -> Key:
    return (task, mode, tuple(task_files or settings.task_files), bench_shapes, settings.reference,
            settings.time_compiled_reference, settings.device)


@dataclass
class _Warm:
    child: ChildProcess
    cuda_since: float | None = None   # holding a shared slot for its CUDA start-up since
    cuda_done: bool = False


class WarmPool:
    """Warm harness children of one GPU and the :class:`GpuSchedule` they obey.

    ``warm_children``: children kept waiting per key (0: every child starts cold, the
    schedule still applies). ``keys_kept``: the most recently used keys kept warm (a key
    dropped loses its children). ``entry``, ``python``, ``workdir``, ``sandbox``,
    ``keep_dir``: as :func:`evaluators.isolation.run_isolated`. ``counts`` says how
    children started: ``warm`` (given to a job), ``cold``, ``replaced`` (died waiting),
    ``discarded`` (killed unused).
    """

    def __init__(self, schedule: GpuSchedule, *, warm_children: int = 2, keys_kept: int = 8,
                 entry: str = "evaluators.child.harness", python: str | None = None,
                 workdir: str | Path | None = None, sandbox: Any = None, keep_dir: bool = False,
                 poll_s: float = 0.01) -> None:
        self.schedule = schedule
        self.warm_children = warm_children
        self.keys_kept = keys_kept
        self._kw = dict(entry=entry, python=python, keep_dir=keep_dir, workdir=workdir, sandbox=sandbox)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._wanted: OrderedDict[Key, tuple[dict[str, Any], HarnessSettings]] = OrderedDict()
        self._warm: dict[Key, list[_Warm]] = {}
        self._deaths: Counter = Counter()
        self.counts: Counter = Counter()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the GPU
    @contextmanager
    def gpu(self, kind: str) -> Iterator[None]:
        """The schedule's slot for a process of ``kind``: ``check`` shares the GPU, anything
        that times (``time``, ``profile``) has it alone."""
        ctx = self.schedule.shared("check") if kind == "check" else self.schedule.exclusive(kind)
        with ctx:
            yield

    # ------------------------------------------------------------------ jobs
    def start(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> ChildProcess:
        """A child running ``job`` in ``mode`` now: a warm one if one is ready, else a cold one.
        Call inside :meth:`gpu` (its GPU work starts here)."""
        key = _key(job.task, mode, settings, job.task_files, job.bench_shapes)
        spec = spec_json(job.task, mode, settings, task_files=job.task_files, bench_shapes=job.bench_shapes)
        child = None
        with self._lock:
            self._want(key, spec, settings)
            ws = self._warm.get(key, [])
            for i, w in enumerate(ws):
                if w.cuda_done and w.child.alive() and w.child.ready():
                    child = ws.pop(i).child
                    break
        self._ensure_keeper()
        self._wake.set()
        if child is not None:
            child.deliver(job, settings, seed)
            if child.alive():
                self.counts["warm"] += 1
                return child
            child.abort()   # died between the check and the job: replaced, not charged
            self.counts["replaced"] += 1
        self.counts["cold"] += 1
        return ChildProcess(job, settings, mode, seed, **self._kw)

    def run(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> HarnessReport:
        """``job`` in ``mode`` in a child of its own, inside the schedule's slot for it."""
        with self.gpu("check" if mode == "check" else "time"):
            return self.start(job, settings, mode, seed).finish()

    def reserve(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> "_Later":
        """The timing process to come (:func:`evaluators.isolation.run_isolated`); its key is
        wanted from now on, so a warm one is prepared while correctness runs."""
        key = _key(job.task, mode, settings, job.task_files, job.bench_shapes)
        spec = spec_json(job.task, mode, settings, task_files=job.task_files, bench_shapes=job.bench_shapes)
        with self._lock:
            self._want(key, spec, settings)
        self._ensure_keeper()
        self._wake.set()
        return _Later(self, job, settings, mode, seed)

    # ------------------------------------------------------------------ keeping warm
    def _want(self, key: Key, spec: dict[str, Any], settings: HarnessSettings) -> None:
        self._wanted[key] = (spec, settings)
        self._wanted.move_to_end(key)
        while len(self._wanted) > self.keys_kept:
            old, _ = self._wanted.popitem(last=False)
            for w in self._warm.pop(old, []):
                self._discard(w)

    def _discard(self, w: _Warm) -> None:
        if w.cuda_since is not None and not w.cuda_done:
            self.schedule.release_shared("warm", w.cuda_since)
        w.child.abort()
        self.counts["discarded"] += 1

    def _ensure_keeper(self) -> None:
        if self.warm_children <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._keep, name="warm-children", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # noqa: BLE001 - a spawn failure must not kill the keeper
                log.exception("warm children: keeper step failed; candidates start cold meanwhile")
                time.sleep(1.0)
            self._wake.wait(self._poll_s)
            self._wake.clear()

    def _step(self) -> None:
        with self._lock:
            for key, (spec, settings) in list(self._wanted.items()):
                ws = self._warm.setdefault(key, [])
                for w in list(ws):
                    self._watch(key, w, ws, settings)
                if self._deaths[key] >= MAX_DEATHS:
                    continue
                while len(ws) < self.warm_children:
                    spec = {**spec, "seed": secrets.randbits(62)}   # the reference warm-up's inputs
                    ws.append(_Warm(ChildProcess(None, settings, spec["mode"], int(spec["seed"]), spec=spec,
                                           **self._kw)))

    def _watch(self, key: Key, w: _Warm, ws: list[_Warm], settings: HarnessSettings) -> None:
        c = w.child
        if not c.alive():
            ws.remove(w)
            if w.cuda_since is not None and not w.cuda_done:
                self.schedule.release_shared("warm", w.cuda_since)
            log.warning("a warm harness child (%s, %s) died while waiting; replacing it", key[0], key[1])
            c.abort()
            self.counts["replaced"] += 1
            self._deaths[key] += 1
            return
        if w.cuda_since is None:
            if c.imported() and self.schedule.try_shared("warm"):
                w.cuda_since = time.time()
                c.allow_cuda()
        elif not w.cuda_done:
            if c.ready():
                w.cuda_done = True
                self._deaths[key] = 0
                self.schedule.release_shared("warm", w.cuda_since)
            elif time.time() - w.cuda_since > settings.timeout_s:
                log.warning("a warm harness child (%s, %s) took over %.0f s to start CUDA; killed",
                            key[0], key[1], settings.timeout_s)
                ws.remove(w)
                self._discard(w)
                self._deaths[key] += 1

    def close(self) -> None:
        """Kill every waiting child and remove its directory; stop the keeper."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for ws in self._warm.values():
                for w in ws:
                    self._discard(w)
            self._warm.clear()


class _Later:
    """The timing process of :func:`evaluators.isolation.run_isolated` with a pool: nothing
    is started for it until :meth:`run` (a warm child waits in the pool meanwhile)."""

    def __init__(self, pool: WarmPool, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> None:
        self.pool, self.job, self.settings, self.mode, self.seed = pool, job, settings, mode, seed

    def run(self) -> HarnessReport:
        return self.pool.run(self.job, self.settings, self.mode, self.seed)

    def abort(self) -> None:
        """Nothing was started for it."""
