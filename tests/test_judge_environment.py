"""The driver's state stored with every time (evaluators/judge/environment.py): read through
NVML in the judge's process, in nvidia-smi's formats, and nothing where NVML gives nothing."""

from __future__ import annotations

import ctypes

from evaluators.judge import environment
from evaluators.judge.environment import NvmlEnv


class FakeNvml:
    """libnvidia-ml.so.1 as ctypes calls it: each function returns an nvmlReturn_t (0 =
    success) and writes its result through the pointer it is given. ``fail`` names functions
    that return NVML_ERROR_NOT_SUPPORTED (3)."""

    def __init__(self, fail: tuple[str, ...] = (), handle_rc: int = 0) -> None:
        self.fail = fail
        self.handle_rc = handle_rc
        self.asked: list[tuple[str, object]] = []

    @staticmethod
    def _put(ref, value) -> None:
        ref._obj.value = value

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid, ref):
        self.asked.append(("uuid", uuid))
        self._put(ref, 0x1234)
        return self.handle_rc

    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        self.asked.append(("index", index.value))
        self._put(ref, 0x1234)
        return self.handle_rc

    def nvmlSystemGetDriverVersion(self, buf, length):
        if "driver" in self.fail:
            return 3
        ctypes.memmove(buf, b"580.159.04\0", 11)
        return 0

    def _answer(self, name, value, ref):
        if name in self.fail:
            return 3
        self._put(ref, value)
        return 0

    def nvmlDeviceGetClockInfo(self, dev, kind, ref):
        assert dev.value == 0x1234
        return self._answer(f"clock{kind.value}", {1: 1980, 2: 2619}[kind.value], ref)

    def nvmlDeviceGetMaxClockInfo(self, dev, kind, ref):
        return self._answer("maxclock", 1980, ref)

    def nvmlDeviceGetPowerUsage(self, dev, ref):
        return self._answer("power", 77890, ref)   # milliwatts

    def nvmlDeviceGetTemperature(self, dev, sensor, ref):
        assert sensor.value == 0   # NVML_TEMPERATURE_GPU
        return self._answer("temp", 36, ref)


def test_nvml_gives_what_nvidia_smi_gave_in_its_formats():
    lib = FakeNvml()
    nv = NvmlEnv.open("GPU-bc7bfa56-f489", lib=lib)
    assert nv is not None and lib.asked == [("uuid", b"GPU-bc7bfa56-f489")]
    assert nv.read() == {"driver": "580.159.04", "sm_clock_mhz": "1980", "mem_clock_mhz": "2619",
                         "max_sm_clock_mhz": "1980", "power_w": "77.89", "temp_c": "36"}


def test_a_value_nvml_does_not_give_is_left_out_not_invented():
    nv = NvmlEnv.open("0", lib=FakeNvml(fail=("power", "driver")))
    got = nv.read()
    assert "power_w" not in got and "driver" not in got and got["temp_c"] == "36"


def test_no_device_or_an_unknown_target_is_no_reader():
    assert NvmlEnv.open("0", lib=FakeNvml(handle_rc=13)) is None   # NVML_ERROR_NOT_FOUND
    assert NvmlEnv.open("bogus", lib=FakeNvml()) is None


def test_without_nvml_the_driver_state_comes_from_nvidia_smi(monkeypatch):
    monkeypatch.setattr(environment, "_nvml", {})
    monkeypatch.setattr(NvmlEnv, "open", classmethod(lambda cls, target, lib=None: None))
    asked = []
    monkeypatch.setattr(environment, "_nvidia_smi", lambda uuid, index: asked.append((uuid, index)) or {"temp_c": "40"})
    assert environment._driver_state("GPU-x", "0") == {"temp_c": "40"}
    assert asked == [("GPU-x", "0")]


def test_nvml_is_opened_once_per_device(monkeypatch):
    opened = []
    monkeypatch.setattr(environment, "_nvml", {})

    def fake_open(cls, target, lib=None):
        opened.append(target)
        return NvmlEnv(FakeNvml(), ctypes.c_void_p(0x1234))

    monkeypatch.setattr(NvmlEnv, "open", classmethod(fake_open))
    monkeypatch.setattr(environment, "_nvidia_smi", lambda uuid, index: {"never": "asked"})
    for _ in range(3):
        assert environment._driver_state("GPU-x", "0")["sm_clock_mhz"] == "1980"
    assert opened == ["GPU-x"]
