"""What a profile measures and how it runs: :class:`ProfileSettings` (the record of
``[profile]``), the ncu metric list (:data:`DEFAULT_METRICS`) and the profiler's own errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from evo.core.settings import config_key


STAGE = "profile"
#: Version of the metric summary below; part of the cache key so a change re-profiles.
SUMMARY_VERSION = "1"
#: Warp-stall reasons ncu reports per issued instruction on sm_70+; ``gmma`` (waiting on a
#: warpgroup's wgmma to arrive) is Hopper's. ``selected`` is the issuing state, not a
#: stall: collected but never ranked. (Names checked against ``ncu --query-metrics`` on an
#: H200, tests/fixtures/ncu/query_metrics.txt.)
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
    "no_instruction", "not_selected", "selected", "short_scoreboard", "sleeping",
    "tex_throttle", "wait",
)
_STALL_FMT = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
#: Friendly name -> ncu metric. On Hopper the "hmma" tensor pipe counts HMMA, HGMMA and
#: QGMMA cycles (``ncu --query-metrics``: "tensor pipe was active (HMMA/HFMA2.MMA/HGMMA/
#: QGMMA)"), so ``tensor_pipe_pct`` covers wgmma and mma.sync alike; there is no separate
#: gmma-cycles metric. ``wgmma_instructions`` tells whether the kernel issued wgmma at all.
CORE_METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers_per_thread": "launch__registers_per_thread",
    "smem_static_per_block": "launch__shared_mem_per_block_static",
    "smem_dynamic_per_block": "launch__shared_mem_per_block_dynamic",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "wgmma_instructions": "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "warp_cycles_per_issue": "smsp__average_warps_active_per_issue_active.ratio",
}
DEFAULT_METRICS: tuple[str, ...] = tuple(CORE_METRICS.values()) + tuple(
    _STALL_FMT.format(r) for r in STALL_REASONS
)


class ProfileError(RuntimeError):
    """The profiler itself cannot run (not the candidate's fault); the message names the fix."""


class NcuNotFoundError(ProfileError):
    """No ``ncu`` executable; install Nsight Compute or set ``profile.ncu`` to its path."""


@dataclass(frozen=True)
class ProfileSettings:
    """How survivors are profiled: the record of config section ``[profile]``.

    Config keys (``config_key`` fields, :mod:`evo.core.settings`; bounds checked when the config
    is loaded): ``enabled``: master switch, off by default (profiling needs Nsight Compute
    and permission to read the GPU's counters). ``top_k``: a correct candidate is profiled
    when it enters the best ``top_k`` of its island. ``feedback_after``: lineage depth from
    which prompts may quote profile numbers (``evo.engine.survivors.profile_visible``).
    ``timeout_s``: wall clock of one ncu run (its process group is killed after).

    Set by code: ``metrics``: the ncu metric list (default :data:`DEFAULT_METRICS`).
    ``launch_count``: most kernels captured from the one measured call. ``ncu``: executable
    name or path. ``cache_dir``: JSON cache of finished profiles (``""`` = no cache; a run's is
    ``profiles`` beside its compile cache). ``seed``: seed of the profiled call's inputs.
    """

    enabled: bool = config_key(False)
    top_k: int = config_key(3, ge=1)
    feedback_after: int = config_key(3, ge=0)
    timeout_s: float = config_key(240.0, gt=0)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    launch_count: int = 4
    ncu: str = "ncu"
    cache_dir: str = ".evo/profiles"
    seed: int = 1234

    def __post_init__(self) -> None:
        # Only the fields set by code: the config keys were checked where they were read.
        if self.launch_count < 1:
            raise ValueError(f"ProfileSettings.launch_count = {self.launch_count}: must be >= 1")
        if not self.metrics:
            raise ValueError("ProfileSettings.metrics is empty; leave it out to use the default list")
