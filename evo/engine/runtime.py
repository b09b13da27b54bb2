"""Ray start/connect, actor and pool construction, resources, shutdown.

One of the three modules that import Ray (with the two ``actor.py`` files). The engine
talks to a :class:`Runtime`, never to Ray directly, so the scheduling logic stays testable
and the topology lives in one place; what the engine may rely on is the
:class:`evo.engine.seams.ClusterRuntime` Protocol, and the stage callables it runs are
:class:`evo.engine.seams.CompileFn`, :class:`~evo.engine.seams.EvaluateFn` and :class:`~evo.engine.seams.ProfileFn`
(conformance: tests/conformance/):

- compile: a Ray task with ``num_cpus=1`` per candidate, returning the ``.so`` bytes (GPU
  nodes need no shared disk); retried once if its worker process dies.
- GPU: one :class:`~evaluators.actor.GpuEvaluator` actor per GPU (``num_gpus=1``), restarted
  by Ray if it dies; a threaded actor (``max_concurrency``: the call its judge evaluates,
  the next one waiting, a profile beside them), whose judge serialises its own GPU work. The
  engine keeps :attr:`Runtime.gpu_slots` requests on each.
- islands: one :class:`~populations.actor.IslandActor` per island (``num_cpus=0``), called
  through its typed proxy, :class:`RayIsland`.

``Runtime.start`` starts a local Ray instance unless an address is given (``--address``,
``RAY_ADDRESS`` or ``ray.address`` in the config), or takes over one that ``evo search``
started early for it (:mod:`evo.engine.early_ray`, through :func:`start_local_ray`); only a
runtime that started (or took over) Ray shuts it down.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import ray

from evaluators.actor import GpuEvaluator
from evaluators.base import CompileSettings, HarnessSettings
from evaluators.sandbox import make_undumpable, secrets_withheld
from evo.core.records import Candidate
from evo.engine.local_ray import LocalRaySettings
from evo.engine.seams import CompileFn, Stages

__all__ = ["Runtime", "RayIsland", "RuntimeError_", "real_stages", "probe_cluster_address", "route_ray_logs",
           "start_local_ray", "stop_local_ray"]

log = logging.getLogger(__name__)

class RuntimeError_(RuntimeError):
    """The cluster cannot do what the search needs (no GPUs, cannot connect...)."""


#: Seconds :func:`probe_cluster_address` waits for a TCP connection and for the GCS's answer.
PROBE_TIMEOUT_S = 5.0


def probe_cluster_address(addr: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast, naming ``addr`` as typed, unless a Ray GCS (or Ray client server) answers there.

    Without this, ``ray.init(address=...)`` on a dead address retries for many minutes
    (20 rounds of ~35 s in Ray 2.x), printing C++ warnings that name the address as Ray
    rewrote it (127.0.0.1 becomes the node's IP). The probe opens a TCP connection (within
    ``timeout_s``) and sends an HTTP/2 client preface: a gRPC server, which the GCS is,
    answers with a SETTINGS frame. ``"auto"`` is resolved the way Ray does (the cluster
    recorded by ``ray start`` on this machine) and probed too; ``"local"`` starts a local
    instance and is not probed. Raises :class:`RuntimeError_` with how to check the cluster.

    A server that accepts the connection and speaks HTTP/2 but is no GCS (another gRPC
    service, a transparent proxy) passes the probe; ``ray.init`` then waits as long as Ray does.
    """
    import socket
    import time

    typed = addr
    check = (f"Check the cluster with `ray status --address {typed}`; start one with `ray start --head`, "
             "or drop --address (and RAY_ADDRESS, ray.address) to run a local instance.")
    if addr == "local":
        return
    if addr == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # pragma: no cover - a Ray without it: let ray.init decide
            return
        try:
            resolved = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            resolved = None
        if resolved is None:
            raise RuntimeError_(f"Ray cluster address 'auto': no Ray cluster was started on this machine (`ray start --head` "
                                f"records one). {check}")
        addr = resolved
    hostport = addr.split("://", 1)[1] if "://" in addr else addr
    host, sep, port_text = hostport.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit():
        raise RuntimeError_(f"Ray cluster address {typed!r}: expected HOST:PORT (e.g. 10.0.0.5:6379), "
                            f"ray://HOST:PORT, 'auto' or 'local'")
    t0 = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port_text)), timeout=timeout_s)
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise RuntimeError_(f"cannot reach the Ray cluster at {typed!r}: TCP connect to {host}:{port_text} "
                            f"failed ({why}, after {time.monotonic() - t0:.1f} s). {check}") from None
    with sock:
        data = b""
        try:
            sock.settimeout(timeout_s)
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(9))  # preface + empty SETTINGS
            while len(data) < 9:
                chunk = sock.recv(9 - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    if len(data) < 9 or data[3] != 0x4:  # frame type 0x4 = SETTINGS
        raise RuntimeError_(f"something listens at {typed!r} but it does not answer as a Ray cluster "
                            f"(gRPC) does; is it the head node's GCS port (default 6379)? {check}")


def route_ray_logs() -> None:
    """Send Ray's Python log records through the root logger instead of Ray's own stderr
    handler, so the application's logging setup decides where they go (the ``evo`` CLI
    writes third-party records such as Ray's start-up and token-authentication notices to
    its log file, not the terminal). Idempotent."""
    lg = logging.getLogger("ray")
    for h in list(lg.handlers):
        if type(h).__name__ == "PlainRayHandler":
            lg.removeHandler(h)
    lg.propagate = True


def start_local_ray(settings: LocalRaySettings) -> tuple[str, ...]:
    """Start a local Ray instance in this process with ``settings``; returns the names of the
    environment variables withheld from its processes.

    The GCS, the raylet and every worker (the GPU actor is a runner's parent) inherit
    the environment they were started with: the secrets (the LLM keys) are removed from it for
    the call (:func:`evaluators.sandbox.secrets_withheld`), so they stay with the driver
    alone, which is made undumpable so that no process of the user can read them from /proc.
    The calling thread must outlive the instance (see :meth:`Runtime.start`)."""
    kw = settings.init_kwargs()
    route_ray_logs()
    log.info("starting a local Ray instance (%s)", kw)
    make_undumpable()
    with secrets_withheld(settings.secret_env) as withheld:
        ray.init(**kw)
    if withheld:
        log.info("Ray started without the driver's secrets: %s", ", ".join(withheld))
    return tuple(withheld)


def stop_local_ray() -> None:
    """Shut down the Ray instance this process initialised, if it still is (idempotent)."""
    if ray.is_initialized():
        ray.shutdown()


def real_stages() -> Stages:
    from evaluators.compile import compile_candidate

    return Stages(compile_fn=compile_candidate, evaluate_fn=None)


def _compile_task(fn: CompileFn, candidate: Candidate, settings: CompileSettings) -> tuple[Any, Any]:
    """Runs in a compile worker; two return values, so the binary becomes an object of its
    own in Ray's object store: the driver fetches only the verdict (small) and hands the
    binary's reference to a GPU actor, which reads it from the store (never via the driver)."""
    outcome = fn(candidate, settings)
    so = getattr(outcome, "so_bytes", None)
    return _with_binary(outcome, None), so


def _with_binary(outcome: Any, binary: Any) -> Any:
    """``outcome`` with its ``so_bytes`` replaced (a dataclass, or any object with that attribute)."""
    import copy
    import dataclasses

    if dataclasses.is_dataclass(outcome):
        return dataclasses.replace(outcome, so_bytes=binary)
    out = copy.copy(outcome)
    out.so_bytes = binary
    return out


@dataclass
class Runtime:
    """Handles to the cluster's workers; the :class:`evo.engine.seams.ClusterRuntime` the engine
    drives (``start``/``shutdown`` are its creator's). Not picklable; lives in the driver only."""

    stages: Stages
    compile_settings: CompileSettings
    harness_settings: HarnessSettings
    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    #: names of environment variables that hold secrets without looking like it (the LLM
    #: models' key_env); with every secret-looking name they are kept out of a local Ray
    #: instance's processes (evaluators.sandbox.secrets_withheld)
    secret_env: tuple[str, ...] = ()
    #: whether this runtime owns the local Ray instance of this process (it shuts it down).
    #: True at construction: the instance is already running, started for this runtime by
    #: :func:`start_local_ray` on a thread that outlives it (``evo search``'s early start,
    #: :mod:`evo.engine.early_ray`); :meth:`start` then only creates the workers on it.
    started_ray: bool = False
    gpu_actors: list = field(default_factory=list)
    _compile_remote: Any = None
    _n_cpus: int | None = None
    _gpu_slots: int = 2
    #: compile verdict reference -> its binary's reference (see :func:`_compile_task`)
    _binaries: dict = field(default_factory=dict)

    def start(self) -> "Runtime":
        """Start (or join) Ray and create the GPU actors. Any thread may call it, but a local
        instance's GCS and raylet are killed when the *thread* that started them ends (Ray
        starts them with ``PR_SET_PDEATHSIG``), so that thread must outlive the instance
        (:class:`evo.engine.background.BackgroundCall` with ``hold``); off the main thread
        Ray installs no SIGTERM handler (``run_search`` installs the same one)."""
        addr = self.address or os.environ.get("RAY_ADDRESS") or None
        route_ray_logs()
        if self.started_ray:
            if not ray.is_initialized():
                raise RuntimeError_("the local Ray instance handed to the runtime is not running")
            log.info("using the local Ray instance started for this search")
        elif ray.is_initialized():
            log.info("using the Ray instance already initialised in this process")
        elif addr:
            log.info("joining Ray cluster at %s", addr)
            probe_cluster_address(addr)
            try:
                ray.init(address=addr, log_to_driver=False)
            except ConnectionError as e:
                raise RuntimeError_(
                    f"cannot connect to the Ray cluster at {addr!r}: {e}. Check it with "
                    f"`ray status --address {addr}`; start one with `ray start --head` or drop "
                    "--address to run a local instance."
                ) from e
        else:
            start_local_ray(self.local_settings)
            self.started_ray = True
        resources = ray.cluster_resources()
        n_gpus = int(resources.get("GPU", 0))
        if n_gpus < 1:
            raise RuntimeError_(
                "the Ray cluster has no GPU resources; evaluations need at least one GPU "
                f"(cluster resources: {dict(resources)})"
            )
        gpu_cls = ray.remote(GpuEvaluator)
        # A threaded actor only for an evaluate_fn that may be called concurrently (the judge's):
        # another runs one call at a time, two requests kept on it.
        concurrent = self.stages.evaluate_concurrent
        opts: dict[str, Any] = (
            {"max_concurrency": GpuEvaluator.concurrency(concurrent=True)} if concurrent else {})
        self._gpu_slots = GpuEvaluator.slots()
        self.gpu_actors = [
            gpu_cls.options(num_gpus=1, num_cpus=0, max_restarts=4, max_task_retries=0, **opts).remote(
                self.stages.evaluate_fn, self.harness_settings, self.stages.profile_fn, concurrent=concurrent
            )
            for _ in range(n_gpus)
        ]
        self._compile_remote = ray.remote(num_cpus=1, max_retries=1, num_returns=2)(_compile_task)
        log.info("runtime ready: %d GPU evaluator(s), %d CPUs", n_gpus, int(resources.get("CPU", 0)))
        return self

    @property
    def local_settings(self) -> LocalRaySettings:
        """What a local instance for this runtime is started with."""
        return LocalRaySettings(num_cpus=self.num_cpus, num_gpus=self.num_gpus, secret_env=self.secret_env)

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_actors)

    @property
    def gpu_slots(self) -> int:
        """Requests the engine keeps on one GPU actor: the one evaluated and one more queued,
        so that no gap opens when one finishes. Set by :meth:`start`."""
        return self._gpu_slots

    @property
    def n_cpus(self) -> int:
        """CPUs of the cluster, read once at start (the engine asks on every scheduling step)."""
        if self._n_cpus is None:
            self._n_cpus = int(ray.cluster_resources().get("CPU", 1))
        return self._n_cpus

    def submit_compile(self, candidate: Candidate):
        verdict, binary = self._compile_remote.remote(self.stages.compile_fn, candidate, self.compile_settings)
        self._binaries[verdict] = binary
        return verdict

    def submit_gpu(self, gpu: int, candidate: Candidate, so_bytes: bytes, mode: str | None = None,
                   baseline: Candidate | None = None, baseline_so: Any = None):
        # the binaries as top-level arguments: Ray resolves a reference to its bytes only there
        if baseline is None:
            return self.gpu_actors[gpu].evaluate.remote(candidate, so_bytes, mode)
        return self.gpu_actors[gpu].evaluate.remote(candidate, so_bytes, mode, baseline, baseline_so)

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

    def get(self, ref):
        """The value of ``ref``. For a compile verdict, the outcome's ``so_bytes`` is the
        *reference* of the binary in Ray's object store (None when the build failed): the
        engine passes it to :meth:`submit_gpu` / :meth:`submit_profile` unchanged, and Ray
        resolves it in the GPU actor, so ``.so`` bytes never pass through the driver."""
        binary = self._binaries.pop(ref, None)
        value = ray.get(ref)
        if binary is None:
            return value
        passed = bool(getattr(getattr(value, "result", None), "passed", False))
        return _with_binary(value, binary if passed else None)

    @staticmethod
    def remote_errors() -> tuple[type[BaseException], ...]:
        from ray.exceptions import RayActorError, RayTaskError, WorkerCrashedError

        return (RayActorError, RayTaskError, WorkerCrashedError)

    def probe_gpu(self, gpu: int):
        return self.gpu_actors[gpu].worker.remote() if gpu < len(self.gpu_actors) else None

    def make_islands(self, specs: list) -> list["RayIsland"]:
        """One IslandActor per ``populations.island.IslandSpec`` (CPU-free, restartable), each
        behind its :class:`RayIsland` proxy."""
        from populations.actor import make_island_actor

        return [RayIsland(make_island_actor(s)) for s in specs]

    def shutdown(self) -> None:
        for a in self.gpu_actors:
            try:  # its activity sampler stops before the kill
                ray.get(a.close.remote(), timeout=30)
            except Exception as e:  # noqa: BLE001 - a dead actor has nothing left to close
                log.debug("GPU actor close: %s", e)
            ray.kill(a, no_restart=True)
        self.gpu_actors = []
        if self.started_ray:
            stop_local_ray()
            self.started_ray = False


class RayIsland:
    """The :class:`evo.engine.seams.IslandProxy` of an island actor on Ray: each method one
    actor call (Ray runs one caller's calls to an actor in order). ``actor``: the Ray handle
    (``ray.kill`` takes it)."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def add(self, member) -> None:
        self.actor.add.remote(member)

    def add_many(self, members) -> list[bool]:
        return ray.get(self.actor.add_many.remote(members))

    def parents(self, k: int) -> list:
        return ray.get(self.actor.parents.remote(k))

    def ask_parents(self, k: int):
        return self.actor.parents.remote(k)

    def record_child(self, parent_id: str) -> None:
        self.actor.record_child.remote(parent_id)

    def emigrants(self, n: int) -> list:
        return ray.get(self.actor.emigrants.remote(n))

    def immigrate(self, members) -> int:
        return ray.get(self.actor.immigrate.remote(members))

    def summary(self):
        return ray.get(self.actor.summary.remote())

    def ask_summary(self):
        return self.actor.summary.remote()
