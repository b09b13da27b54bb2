"""The GPU's measured activity: NVML utilisation sampled by the GPU actor while it runs.

"Slot occupancy" (the time the actor spent inside evaluation calls) says nothing about
whether the GPU did anything: on the H200 demo of 2026-12-03 it read 99.98% while most of
each call was process start-up. This module reads what the driver says instead:
``nvmlDeviceGetUtilizationRates(...).gpu``, the percentage of the last sample period in
which a kernel ran, sampled every ``period_s`` by a daemon thread; :meth:`ActivitySampler.mean`
is the mean since the sampler started.

NVML is reached through ``ctypes`` on ``libnvidia-ml.so.1`` (the driver's library, as the
harness does after timing; pynvml / nvidia-ml-py and ``torch.cuda.utilization`` are
wrappers of the same call, and importing torch here would be against the actor's rule of
never touching CUDA). Where the library, the device or the call is missing (a CPU
machine), the sampler is *not measured*: ``mean()`` is ``None`` and every view shows
"not measured", never a number.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Any, Callable

__all__ = ["ActivitySampler", "nvml_reader", "nvml_device", "first_visible"]

log = logging.getLogger(__name__)


class _Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def first_visible(visible: str | None) -> str:
    """The first device of a ``CUDA_VISIBLE_DEVICES`` value (an index or a ``GPU-...`` UUID);
    ``"0"`` when unset or empty."""
    ids = [x.strip() for x in (visible or "0").split(",") if x.strip()]
    return ids[0] if ids else "0"


def nvml_device(target: str, lib: Any = None) -> tuple[Any, ctypes.c_void_p] | None:
    """``(library, device handle)`` of NVML's device ``target`` (an index, or a ``GPU-``/``MIG-``
    UUID), NVML initialised; ``None`` when the library (``lib``: default ``libnvidia-ml.so.1``
    through ctypes, or a fake with its functions), its init or the device is missing."""
    try:
        lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        dev = ctypes.c_void_p()
        if target.startswith(("GPU-", "MIG-")):
            rc = lib.nvmlDeviceGetHandleByUUID(target.encode(), ctypes.byref(dev))
        elif target.isdigit():
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(target)), ctypes.byref(dev))
        else:
            return None
    except (OSError, AttributeError):
        return None
    return (lib, dev) if rc == 0 else None


def nvml_reader(visible: str | None) -> Callable[[], float | None] | None:
    """A function returning the GPU's current utilisation (0..1) for the first device of
    ``visible`` (a ``CUDA_VISIBLE_DEVICES`` value: an index or a ``GPU-...`` UUID), or
    ``None`` when NVML cannot be read here."""
    target = first_visible(visible)
    opened = nvml_device(target)
    if opened is None:
        log.info("NVML or its device %r cannot be read: GPU activity not measured", target)
        return None
    nv, dev = opened

    def read() -> float | None:
        u = _Util()
        if nv.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)) != 0:
            return None
        return u.gpu / 100.0

    return read if read() is not None else None


class ActivitySampler:
    """Samples ``read`` every ``period_s`` on a daemon thread; ``read=None``: not measured."""

    def __init__(self, read: Callable[[], float | None] | None, period_s: float = 0.5) -> None:
        self._read = read
        self._period = period_s
        self._sum = 0.0
        self._n = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if read is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-activity", daemon=True)
            self._thread.start()

    @classmethod
    def for_visible_gpu(cls, period_s: float = 0.5) -> "ActivitySampler":
        """The sampler of this process's GPU (``CUDA_VISIBLE_DEVICES``, as Ray sets it)."""
        return cls(nvml_reader(os.environ.get("CUDA_VISIBLE_DEVICES")), period_s)

    @property
    def measured(self) -> bool:
        return self._read is not None

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self.sample()

    def sample(self) -> None:
        """Take one sample now (the thread calls it; a failed read is skipped)."""
        v = self._read() if self._read is not None else None
        if v is None:
            return
        with self._lock:
            self._sum += v
            self._n += 1

    def mean(self) -> tuple[float, int] | None:
        """(mean utilisation 0..1, samples) since the start; ``None`` when not measured or
        before the first sample."""
        with self._lock:
            return (self._sum / self._n, self._n) if self._n else None

    def stop(self) -> None:
        self._stop.set()
