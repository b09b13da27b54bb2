"""GPU specs and the speed-of-light (roofline) bound.

``speed_of_light_ms(task, shape, gpu) = max(flops / peak, bytes / bandwidth)``: no correct
kernel can be faster, so the harness rejects faster measurements as ``invalid``
(EVALUATION.md, Timing). The compute peak is the bf16 tensor-core peak for bf16/fp16 tasks
and the **tf32** tensor-core peak for fp32 tasks: the fastest fp32-accurate path is an
error-compensated tensor-core scheme (3xTF32 does three tf32 products, so one tf32 product's
time is a safe lower bound). Peaks are dense (no sparsity). The bandwidth is the *measured*
device copy bandwidth (read + write), as in TASKS.md; a pure-read kernel (e.g. a matvec) can
slightly exceed a copy, so callers that reject on this bound should allow a margin or pass
``bandwidth_gbs=gpu.datasheet_bandwidth_gbs``.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Mapping

from evo.tasks.base import Task

__all__ = [
    "GpuSpec",
    "UnknownGpuError",
    "H200",
    "H100",
    "GPUS",
    "gpu_names",
    "get_gpu",
    "match_gpu",
    "detect_gpu",
    "compute_peak_tflops",
    "speed_of_light_ms",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSpec:
    """Peak rates of one GPU model (dense tensor-core peaks, no sparsity).

    ``bandwidth_gbs`` is the measured device copy bandwidth (read + write bytes / s), the
    roof used for the speed-of-light bound; ``datasheet_bandwidth_gbs`` the vendor figure.
    ``arch`` is the nvcc target for this GPU.
    """

    name: str
    peak_bf16_tflops: float
    peak_tf32_tflops: float
    peak_fp32_tflops: float
    bandwidth_gbs: float
    datasheet_bandwidth_gbs: float
    arch: str = "sm_90a"


#: H200 SXM (141 GB HBM3e). Copy bandwidth 4274 GB/s measured (TASKS.md, 2026-11-30).
H200 = GpuSpec(
    name="H200",
    peak_bf16_tflops=989.4,
    peak_tf32_tflops=494.7,
    peak_fp32_tflops=66.9,
    bandwidth_gbs=4274.0,
    datasheet_bandwidth_gbs=4800.0,
)

#: H100 SXM (80 GB HBM3). Copy bandwidth is datasheet-derived, not measured here: about
#: 90% of the 3350 GB/s datasheet figure, the same ratio the H200 measurement shows.
H100 = GpuSpec(
    name="H100",
    peak_bf16_tflops=989.4,
    peak_tf32_tflops=494.7,
    peak_fp32_tflops=66.9,
    bandwidth_gbs=3000.0,
    datasheet_bandwidth_gbs=3350.0,
)

GPUS: dict[str, GpuSpec] = {g.name: g for g in (H100, H200)}


class UnknownGpuError(KeyError):
    """An unknown GPU name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def gpu_names() -> list[str]:
    """Names accepted by :func:`get_gpu` (``["H100", "H200"]``)."""
    return sorted(GPUS)


def get_gpu(name: str) -> GpuSpec:
    """The spec of ``name`` (case-insensitive: ``"h200"``, or a CUDA device name such as
    ``"NVIDIA H200"``); unknown names raise :class:`UnknownGpuError` listing the known ones."""
    for key, spec in GPUS.items():
        if key.lower() == str(name).strip().lower():
            return spec
    spec = match_gpu(str(name))
    if spec is not None:
        return spec
    close = difflib.get_close_matches(str(name).upper(), list(GPUS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownGpuError(
        f"unknown GPU {name!r}{hint}; known GPUs: {', '.join(gpu_names())}"
    )


def match_gpu(device_name: str) -> GpuSpec | None:
    """Map a CUDA device name (``torch.cuda.get_device_name()``) to a spec, or None.

    ``"NVIDIA H200"`` / ``"NVIDIA H200 NVL"`` -> H200, ``"NVIDIA H100 80GB HBM3"`` -> H100.
    PCIe/NVL variants get the SXM spec, whose higher peaks make the bound *lower* (looser),
    which keeps it a safe lower bound; a warning says so.
    """
    up = device_name.upper()
    for key in ("H200", "H100"):
        if key in up:
            if "PCIE" in up or "NVL" in up:
                logger.warning(
                    "%s: using the %s SXM spec; its peaks overstate this variant, so the "
                    "speed-of-light bound is looser than it could be", device_name, key,
                )
            return GPUS[key]
    return None


def detect_gpu(device: int = 0) -> GpuSpec | None:
    """The spec of CUDA device ``device``; None without CUDA or for an unknown model."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(device)
    except Exception as exc:  # a broken driver is "no GPU" for this purpose
        logger.info("no usable CUDA device: %s", exc)
        return None
    spec = match_gpu(name)
    if spec is None:
        logger.warning(
            "GPU %r is not in the task suite's spec table (known: %s); no speed-of-light bound",
            name, ", ".join(gpu_names()),
        )
    return spec


def compute_peak_tflops(task: Task, gpu: GpuSpec) -> float:
    """The compute roof for ``task``: bf16 peak for 16-bit tasks, tf32 peak for fp32 tasks."""
    if task.dtype in ("bfloat16", "float16"):
        return gpu.peak_bf16_tflops
    if task.dtype == "float32":
        return gpu.peak_tf32_tflops
    return gpu.peak_fp32_tflops


def speed_of_light_ms(
    task: Task,
    shape: Mapping[str, int],
    gpu: GpuSpec,
    *,
    bandwidth_gbs: float | None = None,
) -> float:
    """``max(flops / compute peak, bytes / bandwidth)`` in milliseconds (see module doc)."""
    bw = gpu.bandwidth_gbs if bandwidth_gbs is None else float(bandwidth_gbs)
    t_compute = task.flops(shape) / (compute_peak_tflops(task, gpu) * 1e12)
    t_memory = task.bytes(shape) / (bw * 1e9)
    return max(t_compute, t_memory) * 1e3
