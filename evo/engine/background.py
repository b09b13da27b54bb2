"""One call on a thread of its own, started at once and joined later, so that slow start-up
work (a local Ray instance, the GPU probe) runs while the caller does the rest of its own.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Generic, TypeVar

__all__ = ["BackgroundCall"]

T = TypeVar("T")


class BackgroundCall(Generic[T]):
    """``fn()`` called on a daemon thread named ``name``, started by the constructor;
    :meth:`result` waits for its value or raises what it raised.

    ``hold=True``: the thread does not end when ``fn`` returns but waits for :meth:`release`.
    Linux delivers a child's ``PR_SET_PDEATHSIG`` signal when the *thread* that started it ends,
    not the process (prctl(2)), and Ray starts its GCS and raylet that way (SIGKILL): the
    thread that starts a local Ray instance must outlive the instance, so its owner calls
    :meth:`release` only after the instance was shut down. A daemon thread never delays the
    process's exit (which ends the instance anyway).
    """

    def __init__(self, fn: Callable[[], T], name: str, *, hold: bool = False) -> None:
        self._future: Future[T] = Future()
        self._released = threading.Event()
        if not hold:
            self._released.set()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits in result()
            self._future.set_exception(e)
        else:
            self._future.set_result(value)
        self._released.wait()

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
