"""Ray start/connect, actor and pool construction, resources, shutdown.

One of the three modules that import Ray (with the two ``actor.py`` files). The engine
talks to a :class:`Runtime`, never to Ray directly, so the scheduling logic stays testable
and the topology lives in one place:

- compile: a Ray task with ``num_cpus=1`` per candidate, returning the ``.so`` bytes (GPU
  nodes need no shared disk); retried once if its worker process dies.
- GPU: one :class:`~evaluators.actor.GpuEvaluator` actor per GPU (``num_gpus=1``), restarted
  by Ray if it dies.
- islands: one :class:`~populations.actor.IslandActor` per island (``num_cpus=0``).

``Runtime.start`` starts a local Ray instance unless an address is given (``--address``,
``RAY_ADDRESS`` or ``ray.address`` in the config); only a runtime that started Ray shuts it
down.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from evaluators.actor import EvaluateFn, GpuEvaluator
from evaluators.base import CompileSettings, HarnessSettings
from evo.records import Candidate

__all__ = ["Stages", "Runtime", "RuntimeError_", "real_stages"]

log = logging.getLogger(__name__)

#: (candidate, settings) -> evaluators.compile.CompileOutcome
CompileFn = Callable[[Candidate, CompileSettings], Any]


class RuntimeError_(RuntimeError):
    """The cluster cannot do what the search needs (no GPUs, cannot connect...)."""


@dataclass(frozen=True)
class Stages:
    """The two remote stage functions; module-level callables so they pickle by reference.

    Tests inject fake stages (sleep + deterministic results) here; production uses
    :func:`real_stages`.
    """

    compile_fn: CompileFn
    evaluate_fn: EvaluateFn | None = None  # None = evaluators.pipeline.evaluate_built
    #: (candidate, so_bytes, shape_idx, ProfileSettings) -> StageResult; None = ncu
    profile_fn: Callable | None = None


def real_stages() -> Stages:
    from evaluators.compile import compile_candidate

    return Stages(compile_fn=compile_candidate, evaluate_fn=None)


def _compile_task(fn: CompileFn, candidate: Candidate, settings: CompileSettings) -> Any:
    return fn(candidate, settings)


@dataclass
class Runtime:
    """Handles to the cluster's workers. Not picklable; lives in the driver only."""

    stages: Stages
    compile_settings: CompileSettings
    harness_settings: HarnessSettings
    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    started_ray: bool = False
    gpu_actors: list = field(default_factory=list)
    _compile_remote: Any = None
    _n_cpus: int | None = None

    def start(self) -> "Runtime":
        addr = self.address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            log.info("using the Ray instance already initialised in this process")
        elif addr:
            log.info("joining Ray cluster at %s", addr)
            try:
                ray.init(address=addr, log_to_driver=False)
            except ConnectionError as e:
                raise RuntimeError_(
                    f"cannot connect to the Ray cluster at {addr!r}: {e}. Start one with "
                    "`ray start --head` or drop --address to run a local instance."
                ) from e
        else:
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.num_cpus is not None:
                kw["num_cpus"] = self.num_cpus
            if self.num_gpus is not None:
                kw["num_gpus"] = self.num_gpus
            log.info("starting a local Ray instance (%s)", kw)
            ray.init(**kw)
            self.started_ray = True
        resources = ray.cluster_resources()
        n_gpus = int(resources.get("GPU", 0))
        if n_gpus < 1:
            raise RuntimeError_(
                "the Ray cluster has no GPU resources; evaluations need at least one GPU "
                f"(cluster resources: {dict(resources)})"
            )
        gpu_cls = ray.remote(GpuEvaluator)
        self.gpu_actors = [
            gpu_cls.options(num_gpus=1, num_cpus=0, max_restarts=4, max_task_retries=0).remote(
                self.stages.evaluate_fn, self.harness_settings, self.stages.profile_fn
            )
            for _ in range(n_gpus)
        ]
        self._compile_remote = ray.remote(num_cpus=1, max_retries=1)(_compile_task)
        log.info("runtime ready: %d GPU evaluator(s), %d CPUs", n_gpus, int(resources.get("CPU", 0)))
        return self

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_actors)

    @property
    def n_cpus(self) -> int:
        """CPUs of the cluster, read once at start (the engine asks on every scheduling step)."""
        if self._n_cpus is None:
            self._n_cpus = int(ray.cluster_resources().get("CPU", 1))
        return self._n_cpus

    def submit_compile(self, candidate: Candidate):
        return self._compile_remote.remote(self.stages.compile_fn, candidate, self.compile_settings)

    def submit_gpu(self, gpu: int, candidate: Candidate, so_bytes: bytes):
        return self.gpu_actors[gpu].evaluate.remote(candidate, so_bytes)

    def submit_profile(self, gpu: int, candidate: Candidate, so_bytes: bytes, shape_idx: int, settings):
        return self.gpu_actors[gpu].profile.remote(candidate, so_bytes, shape_idx, settings)

    @staticmethod
    def wait(refs: list, timeout: float) -> list:
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # collect everything else already finished, without waiting
            more, _ = ray.wait([r for r in refs if r not in ready], num_returns=len(refs) - len(ready), timeout=0)
            ready = ready + more
        return ready

    @staticmethod
    def get(ref):
        return ray.get(ref)

    @staticmethod
    def remote_errors() -> tuple[type[BaseException], ...]:
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError

        return (RayActorError, RayTaskError, WorkerCrashedError)

    def make_islands(self, specs: list) -> list:
        """One IslandActor per ``populations.island.IslandSpec`` (CPU-free, restartable)."""
        from populations.actor import make_island_actor

        return [make_island_actor(s) for s in specs]

    @staticmethod
    def call(actor, method: str, *args, **kwargs):
        return ray.get(getattr(actor, method).remote(*args, **kwargs))

    @staticmethod
    def ask(actor, method: str, *args, **kwargs):
        """Start a call and return its reference (``get`` it later)."""
        return getattr(actor, method).remote(*args, **kwargs)

    @staticmethod
    def cast(actor, method: str, *args, **kwargs) -> None:
        """Fire and forget: calls from one caller to one actor still run in order."""
        getattr(actor, method).remote(*args, **kwargs)

    @staticmethod
    def call_many(actors: list, method: str, *args, **kwargs) -> list:
        return ray.get([getattr(a, method).remote(*args, **kwargs) for a in actors])

    def shutdown(self) -> None:
        for a in self.gpu_actors:
            ray.kill(a, no_restart=True)
        self.gpu_actors = []
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False
