"""One call on a thread of its own, started at once and joined later, so that slow start-up
work (a local Ray instance, the GPU probe) runs while the caller does the rest of its own.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Callable, Generic, TypeVar

__all__ = ["BackgroundCall"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class BackgroundCall(Generic[T]):
    """``fn()`` called on a daemon thread named ``name``, started by the constructor;
    :meth:`result` waits for its value or raises what it raised.

    ``hold=True``: the thread does not end when ``fn`` returns but waits for :meth:`release`.
    Linux delivers a child's ``PR_SET_PDEATHSIG`` signal when the *thread* that started it ends,
    not the process (prctl(2)), and Ray starts its GCS and raylet that way (SIGKILL): the
    thread that starts a local Ray instance must outlive the instance, so its owner calls
    :meth:`release` only after the instance was shut down. A daemon thread never delays the
    process's exit (which ends the instance anyway).

    ``then``: called on the same thread once it is released (after ``fn``, whether ``fn``
    returned or raised), before the thread ends: the owner of a held thread can have the
    thread itself undo what ``fn`` started (:class:`evo.engine.early_ray.EarlyRay` shuts its
    instance down there). An exception of ``then`` is logged, not raised.
    """

    def __init__(self, fn: Callable[[], T], name: str, *, hold: bool = False,
                 then: Callable[[], None] | None = None) -> None:
        self._future: Future[T] = Future()
        self._released = threading.Event()
        if not hold:
            self._released.set()
        self._thread = threading.Thread(target=self._run, args=(fn, then), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T], then: Callable[[], None] | None) -> None:
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits in result()
            self._future.set_exception(e)
        else:
            self._future.set_result(value)
        self._released.wait()
        if then is not None:
            try:
                then()
            except Exception as e:  # noqa: BLE001 - nobody waits for it; the owner joins the thread
                log.warning("%s: %s", self._thread.name, e)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until ``fn`` has returned or raised (at most ``timeout`` seconds); whether it has.
        Raises nothing of ``fn``'s."""
        return futures_wait([self._future], timeout=timeout).not_done == set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the thread ended (``fn`` and, once released, ``then``); whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def done(self) -> bool:
        """Whether ``fn`` has returned or raised."""
        return self._future.done()

    def result(self) -> T:
        """``fn``'s value, waiting for it; re-raises ``fn``'s exception."""
        return self._future.result()

    def release(self) -> None:
        """Let a held thread end (idempotent; nothing for one not held)."""
        self._released.set()

    @property
    def alive(self) -> bool:
        """Whether the thread still runs (calling ``fn``, or held)."""
        return self._thread.is_alive()
