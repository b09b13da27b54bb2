"""A local Ray instance started at the very beginning of ``evo search``, before the config is
validated, and handed to the runtime once it is.

A local instance's ``ray.init`` takes seconds, and the first evaluation waits for it; the
driver's own steps before it (the config, the tasks, the seeds' compiles, the store) need no
Ray, and none of them imports torch (:mod:`evo.tasks.lazy_torch`). So the CLI decides at
entry, from the command line, the environment and the config's raw TOML (:func:`evo.engine.local_ray.read_raw_ray`), whether
to begin the instance's start at once on a thread of its own (:func:`early_start_decision`:
only where it can pay off and cannot hurt), and :func:`evo.engine.search.run_search` later
hands the started instance to the runtime (:meth:`EarlyRay.hand_over`), which then only
creates its workers on it. Where the validated config wants something else (other counts, a
secret the instance holds) or the start failed, the instance is shut down and the search
starts Ray as it would have without it: correctness first.

Ownership: the thread that began the start owns the instance and outlives it (Ray kills a
local instance's GCS and raylet when that *thread* ends), and :meth:`EarlyRay.close` has that
thread shut down whatever is still running before it ends; every path out of the search
closes it (a config error, no GPU, a failed search, Ctrl-C, SIGTERM), and a runtime that took
the instance over shuts it down itself first.

While the start runs, the process's environment lacks the secrets being withheld from Ray's
processes (:func:`evaluators.sandbox.secrets_withheld`): code that reads a secret waits for
:meth:`EarlyRay.wait` first (``run_search`` does before checking the LLM keys).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

from evo.engine.background import BackgroundCall
from evo.engine.local_ray import LocalRaySettings, RawRay, read_raw_ray

__all__ = ["EarlyDecision", "early_start_decision", "EarlyRay", "LocalRayStarter", "serves", "begin_early_ray",
           "exit_on_sigterm", "nvidia_smi_on_path"]

log = logging.getLogger(__name__)

#: seconds :meth:`EarlyRay.close` waits for the owning thread to shut the instance down
CLOSE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class EarlyDecision:
    """Whether ``evo search`` begins a local Ray instance's start at entry, and why (logged)."""

    start: bool
    why: str


def early_start_decision(*, dry_run: bool, address: str | None, env_address: str | None,
                         raw: RawRay | None, nvidia_smi: bool) -> EarlyDecision:
    """Start early only where the search would start a local instance anyway and the start can
    overlap the config's load: not for a dry run (no Ray at all); not where ``--address``
    (``address``), ``$RAY_ADDRESS`` (``env_address``) or the raw config's ``ray.address``
    names a cluster; not without ``nvidia-smi`` on the PATH (``nvidia_smi``: a machine
    without a GPU, where the search stops before Ray with its own one-line error, and CI must
    not pay for a Ray start); not when the raw TOML was not understood (``raw`` None: the
    config's load reports why). A resumed search starts early like a new one."""
    if dry_run:
        return EarlyDecision(False, "a dry run starts no Ray")
    if address:
        return EarlyDecision(False, "--address names a cluster")
    if env_address:
        return EarlyDecision(False, "RAY_ADDRESS names a cluster")
    if not nvidia_smi:
        return EarlyDecision(False, "no nvidia-smi on the PATH (no GPU here)")
    if raw is None:
        return EarlyDecision(False, "the config's [ray]/[llm] keys were not understood before validation")
    if raw.address:
        return EarlyDecision(False, "ray.address names a cluster")
    return EarlyDecision(True, "a local instance, begun while the config loads")


def serves(started: LocalRaySettings, withheld: tuple[str, ...], wanted: LocalRaySettings,
           environ: Mapping[str, str]) -> str | None:
    """Why an instance started with ``started`` (``withheld``: the names kept from its
    processes) cannot serve a runtime that wants ``wanted``, or None when it can: the same
    counts, and no variable the validated config names as a secret that is set in
    ``environ`` (the secrets are back there) reached the instance."""
    if (started.num_cpus, started.num_gpus) != (wanted.num_cpus, wanted.num_gpus):
        return (f"started with num_cpus={started.num_cpus}, num_gpus={started.num_gpus}; the config "
                f"wants num_cpus={wanted.num_cpus}, num_gpus={wanted.num_gpus}")
    leaked = [k for k in wanted.secret_env if k in environ and k not in withheld]
    if leaked:
        return f"started with {', '.join(leaked)} in its environment, which the config names as secret"
    return None


class LocalRayStarter(Protocol):
    """Starts and stops the local Ray instance of this process (the real one is
    :func:`evo.engine.runtime.start_local_ray` / :func:`~evo.engine.runtime.stop_local_ray`)."""

    def start(self, settings: LocalRaySettings) -> tuple[str, ...]:
        """Start the instance with ``settings`` on the calling thread (which must outlive it);
        the names of the environment variables withheld from its processes."""

    def stop(self) -> None:
        """Shut the instance down if it is still running (idempotent)."""


class _RayStarter:
    """The real :class:`LocalRayStarter`; imports Ray (through evo.engine.runtime) only when
    called, on the owning thread."""

    def start(self, settings: LocalRaySettings) -> tuple[str, ...]:
        from evo.engine.runtime import start_local_ray

        return start_local_ray(settings)

    def stop(self) -> None:
        from evo.engine.runtime import stop_local_ray

        stop_local_ray()


class EarlyRay:
    """A local Ray instance's start with ``settings``, begun by the constructor on a held thread
    (``evo-ray-start``) through ``starter`` (default: the real Ray).

    :meth:`wait` waits for the start to end; :meth:`hand_over` gives the instance to a runtime
    that wants given settings, or closes it; :meth:`close` has the owning thread stop whatever
    is still running, then waits for that thread to end.
    """

    def __init__(self, settings: LocalRaySettings, starter: LocalRayStarter | None = None) -> None:
        self.settings = settings
        self._starter: LocalRayStarter = starter or _RayStarter()
        self._closed = False
        self._call: BackgroundCall[tuple[tuple[str, ...], float]] = BackgroundCall(
            self._start, "evo-ray-start", hold=True, then=self._starter.stop)

    def _start(self) -> tuple[tuple[str, ...], float]:
        t0 = time.monotonic()
        withheld = self._starter.start(self.settings)
        return tuple(withheld), round(time.monotonic() - t0, 3)

    def wait(self) -> None:
        """Wait until the start has ended, started or failed (the environment then holds the
        secrets again); raises nothing of the start's."""
        self._call.wait()

    def hand_over(self, wanted: LocalRaySettings, environ: Mapping[str, str] | None = None) -> float | None:
        """The seconds the instance's start took, once it is ready for a runtime that wants
        ``wanted`` (the runtime then owns it: it creates its workers on it and shuts it down);
        None after closing the instance, when its start failed or it cannot serve ``wanted``
        (:func:`serves`): the caller then starts Ray itself, and a start that fails again
        reports its own error. ``environ``: the process environment by default."""
        if self._closed:
            return None
        self._call.wait()
        try:
            withheld, seconds = self._call.result()
        except BaseException as e:  # noqa: BLE001 - the caller's own start meets it again and reports it
            why: str | None = f"its start failed ({type(e).__name__}: {e})"
        else:
            why = serves(self.settings, withheld, wanted, os.environ if environ is None else environ)
        if why is None:
            log.info("the runtime takes over the local Ray instance started early (%.1f s)", seconds)
            return seconds
        log.info("the local Ray instance started early is shut down and Ray started again: %s", why)
        self.close()
        return None

    def close(self) -> None:
        """Let the owning thread shut down whatever of the instance still runs (nothing after a
        runtime that took it over shut it down) and end; waits for that (a start still under
        way ends first). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._call.release()
        if not self._call.join(CLOSE_TIMEOUT_S):
            log.warning("the local Ray instance did not shut down within %.0f s; it ends with this process",
                        CLOSE_TIMEOUT_S)

    @property
    def closed(self) -> bool:
        return self._closed


def nvidia_smi_on_path() -> bool:
    """Whether ``nvidia-smi`` is on the PATH (no GPU where it is not; not run: the GPU probe runs it)."""
    return shutil.which("nvidia-smi") is not None


def begin_early_ray(config: str | Path, *, dry_run: bool, address: str | None) -> EarlyRay | None:
    """``evo search``'s first step: the :class:`EarlyRay` begun for ``config``, or None where
    :func:`early_start_decision` says no. Begun from the main thread, it also makes SIGTERM
    stop the search through its handlers, so that the instance is shut down
    (:func:`exit_on_sigterm`)."""
    raw = None if dry_run or address else read_raw_ray(config)
    decision = early_start_decision(dry_run=dry_run, address=address, env_address=os.environ.get("RAY_ADDRESS"),
                                    raw=raw, nvidia_smi=nvidia_smi_on_path())
    log.debug("early Ray start: %s (%s)", "yes" if decision.start else "no", decision.why)
    if not decision.start or raw is None:
        return None
    exit_on_sigterm()
    return EarlyRay(raw.settings)


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit in the main thread, as ``ray.init`` arranges when it runs
    there (it cannot from the thread a local instance starts on): the search then stops
    through its handlers (the run aborted, Ray shut down) instead of dying at once. Nothing
    off the main thread."""
    import signal
    import sys
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
