"""DeviceGuard's bookkeeping against a fake driver (a Python stand-in for libcuda's five
entry points, holding limits and a stream window like a context does). The real driver is
exercised by tests/gpu/test_device_state_gpu.py."""

from __future__ import annotations

import ctypes

import pytest

from evaluators.child.device_state import LIMITS, DeviceGuard, DeviceStateError


class FakeDriver:
    """Context state as the driver keeps it; the call signatures of cuda.h."""

    def __init__(self, limits: dict[str, int], unreported: tuple[str, ...] = ()) -> None:
        self.limits = {LIMITS[k]: v for k, v in limits.items()}
        self.unreported = {LIMITS[k] for k in unreported}
        self.window = 0
        self.resets = 0
        self.refuse: set[int] = set()

    def cuCtxGetLimit(self, ref, code) -> int:
        if code.value in self.unreported:
            return 1   # CUDA_ERROR_INVALID_VALUE
        ref._obj.value = self.limits[code.value]
        return 0

    def cuCtxSetLimit(self, code, value) -> int:
        if code.value in self.refuse:
            return 1
        self.limits[code.value] = value.value
        return 0

    def cuStreamGetAttribute(self, stream, attr, ref) -> int:
        ref._obj.accessPolicyWindow.num_bytes = self.window
        return 0

    def cuStreamSetAttribute(self, stream, attr, ref) -> int:
        self.window = ref._obj.accessPolicyWindow.num_bytes
        return 0

    def cuCtxResetPersistingL2Cache(self) -> int:
        self.resets += 1
        return 0


BEFORE = {"stack_size": 1024, "printf_fifo_size": 1 << 20, "malloc_heap_size": 8 << 20,
          "dev_runtime_sync_depth": 2, "dev_runtime_pending_launch_count": 2048,
          "max_l2_fetch_granularity": 64, "persisting_l2_cache_size": 0}


def _candidate_raises(drv: FakeDriver) -> None:
    drv.limits[LIMITS["persisting_l2_cache_size"]] = 30 << 20
    drv.limits[LIMITS["stack_size"]] = 65536
    drv.limits[LIMITS["malloc_heap_size"]] = 256 << 20
    drv.window = 4 << 20


def test_restore_undoes_everything_the_candidate_raised():
    drv = FakeDriver(BEFORE)
    g = DeviceGuard(0x1234, libcuda=drv)
    assert g.before == BEFORE
    _candidate_raises(drv)
    resets = g.restore()
    assert g.limits() == BEFORE and drv.window == 0 and drv.resets == 1
    assert resets == {"persisting_l2_cache_size": 1, "stack_size": 1, "malloc_heap_size": 1,
                      "access_policy_window": 1}
    g.restore()                                   # nothing left to undo: counts unchanged
    assert g.resets == resets and drv.resets == 2
    assert g.metrics() == {"device_resets": resets}


def test_between_reps_resets_lines_every_time_and_the_carveout_when_set():
    drv = FakeDriver(BEFORE)
    g = DeviceGuard(1, libcuda=drv)
    g.between_reps()
    assert drv.resets == 1 and g.resets == {}
    _candidate_raises(drv)                        # set again during a timed call
    g.between_reps()
    assert drv.limits[LIMITS["persisting_l2_cache_size"]] == 0 and drv.window == 0 and drv.resets == 2
    assert drv.limits[LIMITS["stack_size"]] == 65536, "other limits are restored per shape, not per rep"
    assert g.resets == {"persisting_l2_cache_size": 1, "access_policy_window": 1}


def test_a_carveout_set_before_the_candidate_still_goes_to_zero():
    drv = FakeDriver({**BEFORE, "persisting_l2_cache_size": 10 << 20})
    g = DeviceGuard(1, libcuda=drv)
    g.restore()
    assert drv.limits[LIMITS["persisting_l2_cache_size"]] == 0


def test_unreported_limits_are_left_alone_and_refusals_recorded():
    drv = FakeDriver(BEFORE, unreported=("persisting_l2_cache_size",))
    g = DeviceGuard(1, libcuda=drv)
    assert "persisting_l2_cache_size" not in g.before
    _candidate_raises(drv)
    drv.refuse.add(LIMITS["malloc_heap_size"])    # the heap cannot shrink once malloc ran
    g.restore()
    assert drv.limits[LIMITS["stack_size"]] == 1024
    assert drv.limits[LIMITS["malloc_heap_size"]] == 256 << 20
    assert "malloc_heap_size" in g.metrics()["device_reset_failures"]


def test_a_driver_that_refuses_the_line_reset_is_an_error():
    drv = FakeDriver(BEFORE)
    drv.cuCtxResetPersistingL2Cache = lambda: 700
    with pytest.raises(DeviceStateError, match="cuCtxResetPersistingL2Cache"):
        DeviceGuard(1, libcuda=drv).restore()


def test_stream_attribute_union_is_the_drivers_size():
    from evaluators.child.device_state import _StreamAttrValue

    assert ctypes.sizeof(_StreamAttrValue) == 64
