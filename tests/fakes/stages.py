"""Fake compile and GPU stages for engine tests: real Ray scheduling, simulated work.

The fitness landscape is synthetic but deterministic in the tunables, so a search must
find better children than the seed; some tunable values simulate compile errors and
incorrect kernels so failure paths are exercised. Latencies are short sleeps. Every
evaluation appends the candidate id to ``$EVO_FAKE_LOG`` (if set) so tests can prove that
nothing was evaluated twice.
"""

from __future__ import annotations

import math
import os
import time

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Evaluation, StageResult, Status

SOURCE = """// synthetic kernel for engine tests
#include "evo_abi.h"
// @tunable TILE = 32 in {16, 32, 64, 128, 256}
// @tunable STAGES = 2 in {1, 2, 3, 4, 5}
// @tunable VEC = 1 in {1, 2, 4, 8}
// @constraint TILE * STAGES <= 768
#ifndef TILE
#define TILE 32
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef VEC
#define VEC 1
#endif
extern "C" int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) { return 0; }
"""

COMPILE_S = float(os.environ.get("EVO_FAKE_COMPILE_S", "0.05"))
GPU_S = float(os.environ.get("EVO_FAKE_GPU_S", "0.05"))


class FakeCompileOutcome:
    def __init__(self, result, so_bytes, key="", cached=False):
        self.result, self.so_bytes, self.key, self.cached = result, so_bytes, key, cached


def _outcome_cls():
    try:
        from evaluators.compile import CompileOutcome
    except ImportError:  # pragma: no cover
        return FakeCompileOutcome
    return CompileOutcome


def fitness_of(params: dict[str, str], source: str = "") -> float:
    tile, stages, vec = int(params.get("TILE", 16)), int(params.get("STAGES", 1)), int(params.get("VEC", 1))
    bonus = 0.3 if "__launch_bounds__" in source else 0.0  # what the scripted LLM optimize adds
    return 1.0 + 0.15 * math.log2(tile / 16) + 0.1 * min(stages, 4) + 0.05 * math.log2(vec) + bonus


def fake_compile(candidate: Candidate, settings: CompileSettings):
    time.sleep(COMPILE_S)
    p = candidate.params_dict
    node = _node()
    if "* BLOK +" in candidate.source:  # the scripted LLM genesis answer's typo
        res = StageResult("compile", Status.COMPILE_ERROR, reason="nvcc failed",
                          artifacts={"errors": 'kernel.cu(16): error: identifier "BLOK" is undefined'},
                          seconds=COMPILE_S, metrics={"node": node})
        return _outcome_cls()(result=res, so_bytes=None, key=candidate.id, cached=False)
    if p.get("STAGES") == "5":
        res = StageResult("compile", Status.COMPILE_ERROR, reason="error: too many stages (simulated)",
                          artifacts={"errors": "kernel.cu(12): error: simulated"}, seconds=COMPILE_S,
                          metrics={"node": node})
        return _outcome_cls()(result=res, so_bytes=None, key=candidate.id, cached=False)
    res = StageResult("compile", Status.OK, seconds=COMPILE_S, metrics={"node": node})
    return _outcome_cls()(result=res, so_bytes=b"\x7fELF-fake-" + candidate.id.encode(), key=candidate.id, cached=False)


def _node() -> str:
    """The Ray node running the caller ("" outside Ray; Ray is imported only when it already is)."""
    import sys

    ray = sys.modules.get("ray")
    return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""


def _where() -> dict[str, str]:
    """Where a GPU stage runs: the in-process runtime's fake GPU, else Ray's node and GPU ids."""
    from evo.engine.local_runtime import current_gpu

    if current_gpu() is not None:
        return {"node": "local", "gpu_ids": str(current_gpu())}
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {"node": "", "gpu_ids": ""}
    return {"node": ray.get_runtime_context().get_node_id(), "gpu_ids": ",".join(str(g) for g in ray.get_gpu_ids())}


#: reps of a fake paired timing (evaluators.judge.timing.paired_metrics)
PAIRED_REPS = 8


def fake_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings, *, mode: str | None = None,
                  baseline: tuple[Candidate, bytes] | None = None) -> Evaluation:
    """Stands in for the judge: fitness from the tunables; mode ``paired`` adds the paired
    times the judge gives (``metrics["paired"]``: every rep at 1/fitness ms, the baseline's
    alike), as strict as the judge about its arguments."""
    if (mode == "paired") != (baseline is not None):
        raise ValueError(f"mode {mode!r} with baseline {baseline!r}: a baseline goes with mode 'paired' only")
    time.sleep(GPU_S)
    log = os.environ.get("EVO_FAKE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(candidate.id + "\n")
    if so_bytes.startswith(b"\x7fELF-fake-"):  # from fake_compile: it names its candidate
        assert so_bytes.endswith(candidate.id.encode()), "GPU stage got another candidate's binary"
    else:
        assert so_bytes[:4] == b"\x7fELF", "GPU stage got something that is not a shared object"
    env = _where()
    p = candidate.params_dict
    if p.get("VEC") == "8" and p.get("TILE") == "256":
        st = StageResult("correctness", Status.INCORRECT, reason="shape 0 trial 1: max abs err 3.2 (simulated)")
        return Evaluation(candidate.id, (st,), None, gpu="fake", env=env)
    f = fitness_of(p, candidate.source)
    metrics: dict = {"speedup": f}
    if baseline is not None:
        b, b_so = baseline
        assert b_so[:4] == b"\x7fELF", "the baseline's binary is not a shared object"
        fb = fitness_of(b.params_dict, b.source)
        metrics["paired"] = {"shapes": [{"n": 0}], "baseline_ms": [[1.0 / fb] * PAIRED_REPS],
                             "candidate_ms": [[1.0 / f] * PAIRED_REPS], "baseline_fitness": fb}
    stages = (StageResult("correctness", Status.OK), StageResult("timing", Status.OK, metrics=metrics))
    return Evaluation(candidate.id, stages, f, gpu="fake", env=env)


def fake_profile(candidate: Candidate, so_bytes: bytes, shape_idx: int, settings) -> StageResult:
    """Stands in for ncu: plausible metrics derived from the tunables, never a real counter."""
    p = candidate.params_dict
    dram = min(95.0, 40.0 + 10.0 * int(p.get("STAGES", 1)))
    return StageResult("profile", Status.OK, metrics={
        "gpu": "fake", "shape": shape_idx, "duration_us": 100.0 / fitness_of(p, candidate.source),
        "dram_throughput_pct": dram, "sm_throughput_pct": 30.0, "bound": "memory-bound", "ncu_wall_s": 0.0})
