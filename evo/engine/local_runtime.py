"""An in-process :class:`evo.engine.seams.ClusterRuntime`: threads, N fake GPUs, plain islands.

The engine's tests drive the engine through it instead of a Ray instance (the Ray runtime,
:class:`evo.engine.runtime.Runtime`, keeps a few end-to-end tests and every real run). It
imports no Ray, and passes the same suite as the Ray runtime
(tests/conformance/test_runtime_conformance.py, parametrised over both):

- compile: a thread pool of ``num_cpus`` workers running the :class:`~evo.engine.seams.CompileFn`;
  the outcome's ``so_bytes`` are the bytes themselves (no object store to hold them).
- GPU: one :class:`~evaluators.actor.GpuEvaluator` per fake GPU (the class the Ray GPU actor
  wraps, so the same evaluate and profile functions run), each with worker threads of its
  own: one for an ``evaluate_fn`` without a pool (calls run one at a time, in order), as
  many as the Ray actor's ``max_concurrency`` for one that takes the pool. A fake GPU is a
  number: :func:`current_gpu` tells a stage which one runs it (the fakes record it where
  Ray's GPU ids would be). Nothing pins a real device: for fake stages only.
- islands: plain :class:`~populations.actor.IslandActor` objects behind their typed proxy,
  :class:`LocalIsland`; a call runs at once in the caller's thread (so calls to one island
  run in the order they were made) and its reference is an already finished future.

References are :class:`concurrent.futures.Future`. Failures arrive as the Ray runtime's
do, told apart by name (evo.engine.recovery): :class:`LocalTaskError` (the stage raised;
the exception is its ``cause``) and :class:`LocalActorError` (the actor is dead, after
:meth:`LocalRuntime.kill`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate
from evo.engine.seams import Stages

__all__ = ["LocalRuntime", "LocalIsland", "LocalTaskError", "LocalActorError", "current_gpu"]

log = logging.getLogger(__name__)

_here = threading.local()


def current_gpu() -> int | None:
    """The fake GPU whose worker thread runs the caller, or None outside one."""
    return getattr(_here, "gpu", None)


class LocalTaskError(RuntimeError):
    """The remote function raised (Ray's ``RayTaskError``); the exception is ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class LocalActorError(RuntimeError):
    """The actor is dead (Ray's ``RayActorError``): :meth:`LocalRuntime.kill` killed it."""


def _run(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - shipped back as the remote error it is
        raise LocalTaskError(e) from e


def _dead(what: str) -> cf.Future:
    fut: cf.Future = cf.Future()
    fut.set_exception(LocalActorError(f"the actor {what} is dead"))
    return fut


def _at_once(fn: Callable, *args: Any) -> cf.Future:
    """``fn(*args)`` run now, in the caller's thread, as an already finished future."""
    fut: cf.Future = cf.Future()
    try:
        fut.set_result(_run(fn, *args))
    except LocalTaskError as e:
        fut.set_exception(e)
    return fut


class _Gpu:
    """A fake GPU: its :class:`~evaluators.actor.GpuEvaluator`, the threads its calls run on,
    alive or not."""

    def __init__(self, evaluator: Any, pool: cf.ThreadPoolExecutor) -> None:
        self.evaluator, self.pool, self.dead = evaluator, pool, False

    def submit(self, method: Callable, *args: Any) -> cf.Future:
        """``method`` (a method of :attr:`evaluator`) on this GPU's threads."""
        if self.dead:
            return _dead(type(self.evaluator).__name__)
        return self.pool.submit(_run, method, *args)


class LocalIsland:
    """The :class:`evo.engine.seams.IslandProxy` of a plain
    :class:`~populations.actor.IslandActor` (``island``): every call runs at once in the
    caller's thread, so calls run in the order they were made; ``ask_*`` give finished
    futures. After :meth:`LocalRuntime.kill` every call fails with :class:`LocalActorError`."""

    def __init__(self, island: Any) -> None:
        self.island, self.dead = island, False

    def _call(self, method: Callable, *args: Any) -> cf.Future:
        return _dead(type(self.island).__name__) if self.dead else _at_once(method, *args)

    def add(self, member) -> None:
        self._call(self.island.add, member)

    def add_many(self, members) -> list[bool]:
        return self._call(self.island.add_many, members).result()

    def parents(self, k: int) -> list:
        return self._call(self.island.parents, k).result()

    def ask_parents(self, k: int) -> cf.Future:
        return self._call(self.island.parents, k)

    def record_child(self, parent_id: str) -> None:
        self._call(self.island.record_child, parent_id)

    def emigrants(self, n: int) -> list:
        return self._call(self.island.emigrants, n).result()

    def immigrate(self, members) -> int:
        return self._call(self.island.immigrate, members).result()

    def summary(self):
        return self._call(self.island.summary).result()

    def ask_summary(self) -> cf.Future:
        return self._call(self.island.summary)


@dataclass
class LocalRuntime:
    """The engine's :class:`~evo.engine.seams.ClusterRuntime` in this process; constructed
    like :class:`evo.engine.runtime.Runtime` (``start``/``shutdown`` are its creator's)."""

    stages: Stages
    compile_settings: CompileSettings
    harness_settings: HarnessSettings
    num_gpus: int = 2
    num_cpus: int | None = None
    gpu_actors: list = field(default_factory=list)
    _compiles: cf.ThreadPoolExecutor | None = None
    _pools: list = field(default_factory=list)
    _gpu_slots: int = 2

    def start(self) -> "LocalRuntime":
        from evaluators.actor import GpuEvaluator

        if self.num_gpus < 1:
            raise ValueError("LocalRuntime needs at least one (fake) GPU")
        self._compiles = cf.ThreadPoolExecutor(max_workers=self.n_cpus, thread_name_prefix="local-compile")
        concurrent = self.stages.evaluate_concurrent
        threads = GpuEvaluator.concurrency(concurrent=concurrent)
        self._gpu_slots = GpuEvaluator.slots()
        for g in range(self.num_gpus):
            pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"local-gpu{g}",
                                         initializer=setattr, initargs=(_here, "gpu", g))
            ev = GpuEvaluator(self.stages.evaluate_fn, self.harness_settings, self.stages.profile_fn,
                              concurrent=concurrent)
            ev._worker = f"local:gpu{g}"
            self._pools.append(pool)
            self.gpu_actors.append(_Gpu(ev, pool))
        log.info("in-process runtime ready: %d fake GPU(s), %d compile threads", self.num_gpus, self.n_cpus)
        return self

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_actors)

    @property
    def n_cpus(self) -> int:
        return self.num_cpus or os.cpu_count() or 1

    @property
    def gpu_slots(self) -> int:
        return self._gpu_slots

    def submit_compile(self, candidate: Candidate) -> cf.Future:
        assert self._compiles is not None, "LocalRuntime.start() first"
        return self._compiles.submit(_run, self.stages.compile_fn, candidate, self.compile_settings)

    def submit_gpu(self, gpu: int, candidate: Candidate, so_bytes: bytes, mode: str | None = None,
                   baseline: Candidate | None = None, baseline_so: bytes | None = None) -> cf.Future:
        actor = self.gpu_actors[gpu]
        return actor.submit(actor.evaluator.evaluate, candidate, so_bytes, mode, baseline, baseline_so)

    def submit_profile(self, gpu: int, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings: Any) -> cf.Future:
        actor = self.gpu_actors[gpu]
        return actor.submit(actor.evaluator.profile, candidate, so_bytes, shape_idx, settings)

    def probe_gpu(self, gpu: int) -> cf.Future | None:
        if gpu >= len(self.gpu_actors):
            return None
        actor = self.gpu_actors[gpu]
        return actor.submit(actor.evaluator.worker)

    @staticmethod
    def wait(refs: list, timeout: float) -> list:
        if not refs:
            return []
        done, _ = cf.wait(refs, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return [r for r in refs if r in done or r.done()]

    @staticmethod
    def get(ref: cf.Future) -> Any:
        return ref.result()

    @staticmethod
    def remote_errors() -> tuple[type[BaseException], ...]:
        return (LocalActorError, LocalTaskError)

    def make_islands(self, specs: list) -> list[LocalIsland]:
        from populations.actor import IslandActor

        return [LocalIsland(IslandActor(s)) for s in specs]

    @staticmethod
    def kill(actor: "LocalIsland | _Gpu") -> None:
        """Kill an island (a :class:`LocalIsland`) or a fake GPU (one of ``gpu_actors``) for
        good (tests: Ray's ``ray.kill(actor, no_restart=True)``); its later calls raise
        :class:`LocalActorError`."""
        actor.dead = True

    def shutdown(self) -> None:
        for a in self.gpu_actors:
            try:
                a.evaluator.close()
            except Exception as e:  # noqa: BLE001
                log.debug("GPU evaluator close: %s", e)
        for p in self._pools:
            p.shutdown(wait=False, cancel_futures=True)
        if self._compiles is not None:
            self._compiles.shutdown(wait=False, cancel_futures=True)
            self._compiles = None
        self._pools, self.gpu_actors = [], []
