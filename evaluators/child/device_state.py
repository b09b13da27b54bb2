"""GPU state a candidate can leave behind for the timed calls, and its reset (harness only).

A candidate's ``evo_launch`` runs host code in the harness process with the harness's CUDA
context, so it can change context-wide state that outlives its call:

- the **persisting-L2 carve-out** (``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)``)
  and **access-policy windows** (``cudaStreamSetAttribute(..AccessPolicyWindow..)`` on the
  harness stream it is handed, or per launch): lines marked persisting survive the harness's
  L2 flush, so the next timed call finds its inputs in L2 and the flush no longer makes
  every rep cold;
- **device limits** (stack size, malloc heap, printf FIFO, device-runtime depths, L2 fetch
  granularity): raised limits cost the reference and later calls memory and time.

:class:`DeviceGuard` reads the limits through the driver API (``libcuda.so.1``, ctypes;
the one CUDA instance in the process, whichever runtime a candidate linked statically) *before*
the candidate is loaded, and the timing stage calls :meth:`DeviceGuard.restore` before each
shape's warm-up (every limit back to its value from before the candidate ran, the
persisting carve-out to 0, the harness stream's window cleared, persisting lines reset to
normal) and :meth:`DeviceGuard.between_reps` before each timed rep (persisting lines reset;
carve-out and window cleared again if the candidate set them during its call). What had to
be reset is counted in the timing stage's metrics (``device_resets``).

Only the calling thread's current context is touched: the harness's (torch's primary
context on the harness's main thread).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

__all__ = ["DeviceGuard", "DeviceStateError", "LIMITS"]

log = logging.getLogger(__name__)

#: CUlimit values (cuda.h) of the limits a candidate may raise.
LIMITS = {
    "stack_size": 0x00,
    "printf_fifo_size": 0x01,
    "malloc_heap_size": 0x02,
    "dev_runtime_sync_depth": 0x03,
    "dev_runtime_pending_launch_count": 0x04,
    "max_l2_fetch_granularity": 0x05,
    "persisting_l2_cache_size": 0x06,
}
_PERSISTING = "persisting_l2_cache_size"
#: CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW (== CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW)
_ATTR_ACCESS_POLICY_WINDOW = 1


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _StreamAttrValue(ctypes.Union):
    """CUstreamAttrValue (CUlaunchAttributeValue): a 64-byte union in CUDA 12 and 13."""

    _fields_ = [("pad", ctypes.c_char * 64), ("accessPolicyWindow", _AccessPolicyWindow)]


class DeviceStateError(RuntimeError):
    """The driver API refused a call the guard needs (named with its CUresult)."""


class DeviceGuard:
    """Snapshot of the current context's limits, and the resets of the module docstring.

    Construct it after CUDA is initialised and before the candidate's ``.so`` is loaded.
    ``stream``: the harness stream's ``CUstream`` handle (``int(torch_stream.cuda_stream)``).
    Limits the driver does not report (an older GPU, MIG without an L2 set-aside) are left
    alone. ``resets`` counts, per item, how often a reset found something to undo.
    """

    def __init__(self, stream: int, libcuda: Any = None) -> None:
        self.cu = libcuda if libcuda is not None else ctypes.CDLL("libcuda.so.1")
        self.stream = ctypes.c_void_p(int(stream))
        self.before: dict[str, int] = {}
        for name, code in LIMITS.items():
            v = ctypes.c_size_t()
            if self.cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(code)) == 0:
                self.before[name] = int(v.value)
        self.resets: dict[str, int] = {}
        self.failures: dict[str, str] = {}

    # -- reading

    def limits(self) -> dict[str, int]:
        """The limits now (those the driver reports)."""
        out = {}
        for name in self.before:
            v = ctypes.c_size_t()
            if self.cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(LIMITS[name])) == 0:
                out[name] = int(v.value)
        return out

    def window_bytes(self) -> int:
        """``num_bytes`` of the harness stream's access-policy window (0: none)."""
        val = _StreamAttrValue()
        rc = self.cu.cuStreamGetAttribute(self.stream, ctypes.c_int(_ATTR_ACCESS_POLICY_WINDOW), ctypes.byref(val))
        return int(val.accessPolicyWindow.num_bytes) if rc == 0 else 0

    # -- resetting

    def _count(self, what: str) -> None:
        self.resets[what] = self.resets.get(what, 0) + 1

    def _set_limit(self, name: str, value: int) -> None:
        rc = self.cu.cuCtxSetLimit(ctypes.c_int(LIMITS[name]), ctypes.c_size_t(value))
        if rc != 0:
            # e.g. the malloc heap cannot shrink once a kernel used malloc: recorded, and the
            # stage's metrics show it; the candidate keeps what it took
            self.failures[name] = f"cuCtxSetLimit({name}, {value}) = CUresult {rc}"

    def _clear_window(self) -> None:
        if self.window_bytes() == 0:
            return
        self._count("access_policy_window")
        val = _StreamAttrValue()   # zeroed: base 0, 0 bytes, hit ratio 0, both properties normal
        rc = self.cu.cuStreamSetAttribute(self.stream, ctypes.c_int(_ATTR_ACCESS_POLICY_WINDOW), ctypes.byref(val))
        if rc != 0:
            raise DeviceStateError(f"cuStreamSetAttribute(access policy window, 0 bytes) = CUresult {rc}")

    def _reset_persisting_lines(self) -> None:
        rc = self.cu.cuCtxResetPersistingL2Cache()
        if rc != 0:
            raise DeviceStateError(f"cuCtxResetPersistingL2Cache() = CUresult {rc}")

    def restore(self) -> dict[str, int]:
        """Every limit back to its value before the candidate ran (the persisting carve-out
        to 0), the stream's window cleared, persisting lines reset. Returns :attr:`resets`."""
        now = self.limits()
        for name, value in self.before.items():
            want = 0 if name == _PERSISTING else value
            if now.get(name, want) != want:
                self._count(name)
                self._set_limit(name, want)
        self._clear_window()
        self._reset_persisting_lines()
        return dict(self.resets)

    def between_reps(self) -> None:
        """Before a timed rep (device idle): persisting lines back to normal, the carve-out
        and the stream's window cleared if the candidate set them during its last call."""
        v = ctypes.c_size_t()
        if (_PERSISTING in self.before
                and self.cu.cuCtxGetLimit(ctypes.byref(v), ctypes.c_int(LIMITS[_PERSISTING])) == 0 and v.value):
            self._count(_PERSISTING)
            self._set_limit(_PERSISTING, 0)
        self._clear_window()
        self._reset_persisting_lines()

    def metrics(self) -> dict[str, Any]:
        """For the timing stage's metrics: what was reset (and what could not be)."""
        out: dict[str, Any] = {"device_resets": dict(self.resets)}
        if self.failures:
            out["device_reset_failures"] = dict(self.failures)
        return out
