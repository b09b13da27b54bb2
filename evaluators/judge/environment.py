"""What the judge records about its GPU with every evaluation, and the speed-of-light bound
of a task on it.

:func:`env_info`: GPU name, UUID, capability, SMs, L2 and memory size, CUDA, torch, Python,
the protocol's repetition counts, and the driver, clocks, power and temperature as
``nvidia-smi`` reads them (shared/EVALUATION.md: every stored time records them).
:func:`sol_fn`: shape -> the fastest time the GPU's datasheet allows for the task's FLOPs and
compulsory bytes; a median under it is ``invalid`` (:func:`evaluators.judge.summary.summarize`).
Runs in the judge, never in a runner.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any, Callable

from evaluators.protocol import PROTOCOL_VERSION

__all__ = ["env_info", "sol_fn"]

log = logging.getLogger(__name__)


def _nvidia_smi(uuid: str | None, index: str) -> dict[str, str]:
    q = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
    target = uuid or index
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={target}", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    keys = ["driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "power_w", "temp_c"]
    return {k: v for k, v in zip(keys, vals) if v and "N/A" not in v and "Not Supported" not in v}


def env_info(torch: Any, settings: dict[str, Any]) -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    uuid_s = None
    if uuid is not None:
        uuid_s = str(uuid)
        if not uuid_s.startswith("GPU-"):
            uuid_s = "GPU-" + uuid_s
    env = {
        "gpu": torch.cuda.get_device_name(0),
        "uuid": uuid_s or "",
        "capability": "%d.%d" % torch.cuda.get_device_capability(0),
        "sms": str(props.multi_processor_count),
        "l2_bytes": str(getattr(props, "L2_cache_size", "")),
        "memory_bytes": str(props.total_memory),
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "protocol": PROTOCOL_VERSION,
        "reps": str(settings.get("reps")),
        "warmup": str(settings.get("warmup")),
        "flush_mb": str(settings.get("flush_mb")),
        "trials": str(settings.get("trials")),
    }
    env.update(_nvidia_smi(uuid_s, os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    return env


def sol_fn(task: Any) -> Callable[[dict[str, int]], float | None]:
    """shape -> speed-of-light ms for this GPU, or a function returning None (with a warning)."""
    try:
        from evo.tasks.gpus import detect_gpu, speed_of_light_ms
    except ImportError as e:
        log.warning("speed-of-light bound unavailable (%s); SOL check skipped", e)
        return lambda shape: None
    gpu = detect_gpu()
    if gpu is None:
        log.warning("no datasheet spec for this GPU; speed-of-light check skipped")
        return lambda shape: None
    # Rejection needs a bound no legitimate kernel can beat: the vendor's peak bandwidth, not
    # the measured copy roof (good streaming kernels reach or pass a copy's bandwidth; on the
    # H200, nine seeds at 3.00-3.01 ms were wrongly rejected against the 4274 GB/s copy roof).
    return lambda shape: speed_of_light_ms(task, shape, gpu, bandwidth_gbs=gpu.datasheet_bandwidth_gbs)
