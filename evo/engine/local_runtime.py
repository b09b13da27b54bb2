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
- islands: plain :class:`~populations.actor.IslandActor` objects; a call runs at once in
  the caller's thread (so calls to one island run in the order they were made) and its
  reference is an already finished future.

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

__all__ = ["LocalRuntime", "LocalTaskError", "LocalActorError", "current_gpu"]

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


class _Actor:
    """A handle: the object, where its calls run (None: in the caller's thread), alive or not."""

    def __init__(self, obj: Any, pool: cf.ThreadPoolExecutor | None = None) -> None:
        self.obj, self.pool, self.dead = obj, pool, False

    def submit(self, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        if self.dead:
            fut: cf.Future = cf.Future()
            fut.set_exception(LocalActorError(f"the actor {type(self.obj).__name__} is dead"))
            return fut
        fn = getattr(self.obj, method)
        if self.pool is not None:
            return self.pool.submit(_run, fn, *args, **kwargs)
        fut = cf.Future()
        try:
            fut.set_result(_run(fn, *args, **kwargs))
        except LocalTaskError as e:
            fut.set_exception(e)
        return fut


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
        pooled = GpuEvaluator.takes_pool(self.stages.evaluate_fn)
        threads = GpuEvaluator.concurrency(self.harness_settings) if pooled else 1
        self._gpu_slots = self.harness_settings.check_concurrency + 1 if pooled else 2
        for g in range(self.num_gpus):
            pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"local-gpu{g}",
                                         initializer=setattr, initargs=(_here, "gpu", g))
            ev = GpuEvaluator(self.stages.evaluate_fn, self.harness_settings, self.stages.profile_fn)
            ev._worker = f"local:gpu{g}"
            self._pools.append(pool)
            self.gpu_actors.append(_Actor(ev, pool))
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

    def submit_gpu(self, gpu: int, candidate: Candidate, so_bytes: bytes) -> cf.Future:
        return self.gpu_actors[gpu].submit("evaluate", candidate, so_bytes)

    def submit_profile(self, gpu: int, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings: Any) -> cf.Future:
        return self.gpu_actors[gpu].submit("profile", candidate, so_bytes, shape_idx, settings)

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

    def make_islands(self, specs: list) -> list:
        from populations.actor import IslandActor

        return [_Actor(IslandActor(s)) for s in specs]

    @staticmethod
    def call(actor: _Actor, method: str, *args: Any, **kwargs: Any) -> Any:
        return actor.submit(method, *args, **kwargs).result()

    @staticmethod
    def ask(actor: _Actor, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        return actor.submit(method, *args, **kwargs)

    @staticmethod
    def cast(actor: _Actor, method: str, *args: Any, **kwargs: Any) -> None:
        actor.submit(method, *args, **kwargs)

    @staticmethod
    def call_many(actors: list, method: str, *args: Any, **kwargs: Any) -> list:
        futs = [a.submit(method, *args, **kwargs) for a in actors]
        return [f.result() for f in futs]

    @staticmethod
    def kill(actor: _Actor) -> None:
        """Kill ``actor`` for good (tests: Ray's ``ray.kill(actor, no_restart=True)``); its
        later calls raise :class:`LocalActorError`."""
        actor.dead = True

    def shutdown(self) -> None:
        for a in self.gpu_actors:
            try:
                a.obj.close()
            except Exception as e:  # noqa: BLE001
                log.debug("GPU evaluator close: %s", e)
        for p in self._pools:
            p.shutdown(wait=False, cancel_futures=True)
        if self._compiles is not None:
            self._compiles.shutdown(wait=False, cancel_futures=True)
            self._compiles = None
        self._pools, self.gpu_actors = [], []
