"""Scheduling benchmark: the real engine on a local Ray instance with simulated stages.

Compile and GPU latencies are drawn from lognormal distributions whose medians and spreads
come from measured runs (defaults: the H200 demo of 2026-12-03, benchmarks/ENGINE.md: compile
16.2 s, correctness 1.79 s, timing 0.96 s), scaled by ``--time-scale`` so a sweep finishes in
minutes. Everything else is real: Ray scheduling, the threaded GPU actors, island actors, the
store, back-pressure, the rate-following in-flight bound and dedupe.

The judge is modelled, not run: one evaluation at a time per GPU (the judge's lock), the next
candidate's runner started meanwhile (``--runner-start`` s, off the critical path unless the
previous evaluation was shorter). Reports, per simulated GPU count, slot occupancy (time inside GPU actor calls
/ (wall x GPUs)), GPU stage share (simulated correctness + timing seconds / (wall x GPUs)),
evaluations/hour in simulated time, the scaling relative to one GPU and the per-candidate
overhead (a GPU call's wall clock beyond its correctness and timing).

    python benchmarks/engine.py --gpus 1 2 4 8 --evals-per-gpu 30
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402
import ray.cloudpickle as cloudpickle  # noqa: E402

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evaluators.compile import CompileOutcome  # noqa: E402
from evo.engine.engine import Engine, EngineSettings  # noqa: E402
from evo.core.records import Candidate, Evaluation, StageResult, Status  # noqa: E402
from evo.engine.runtime import Runtime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from evo.store import Store  # noqa: E402
from mutators.knobs import KnobsMutator  # noqa: E402

TUNABLES = {"A": range(8), "B": range(8), "C": range(8), "D": range(8), "E": range(8)}
SOURCE = "// simulated kernel\n" + "".join(
    f"// @tunable {k} = 0 in {{{', '.join(map(str, v))}}}\n#ifndef {k}\n#define {k} 0\n#endif\n"
    for k, v in TUNABLES.items()
) + 'extern "C" int evo_launch(const void*, int, void*, int, const double*, int, void*) { return 0; }\n'

# Filled from the command line before Ray starts (workers read them from the environment).
ENV = "EVO_SIM"


def _draw(kind: str, cid: str) -> float:
    cfg = json.loads(os.environ[ENV])
    rng = random.Random(f"{kind}:{cid}")
    median, sigma = cfg[f"{kind}_median"], cfg[f"{kind}_sigma"]
    return cfg["scale"] * median * math.exp(rng.gauss(0.0, sigma))


def sim_compile(candidate: Candidate, settings: CompileSettings) -> CompileOutcome:
    dt = _draw("compile", candidate.id)
    time.sleep(dt)
    res = StageResult("compile", Status.OK, seconds=dt)
    return CompileOutcome(result=res, so_bytes=b"sim", key=candidate.id, cached=False)


_JUDGE = threading.Lock()   # one GPU actor per Ray worker process: its judge's lock
_SPARE_READY = [0.0]        # when the next runner is up (time.time())


def sim_evaluate(candidate: Candidate, so: bytes, settings: HarnessSettings) -> Evaluation:
    cfg = json.loads(os.environ[ENV])
    check, timing = _draw("check", candidate.id), _draw("time", candidate.id)
    with _JUDGE:
        time.sleep(max(0.0, _SPARE_READY[0] - time.time()))   # the spare runner still starting
        _SPARE_READY[0] = time.time() + cfg["scale"] * cfg["runner_start"]
        time.sleep(check + timing)
    f = 1.0 + sum(int(v) for _, v in candidate.params) / 40.0
    return Evaluation(candidate.id, (StageResult("correctness", Status.OK, seconds=check),
                                     StageResult("timing", Status.OK, seconds=timing)), f)


cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run_once(n_gpus: int, compile_workers: int, evals: int, seed: int, harness: HarnessSettings) -> dict:
    ray.init(num_cpus=compile_workers, num_gpus=n_gpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {ENV: os.environ[ENV]}})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "bench.db")
            run_id = store.create_run(f"bench-{n_gpus}", {}, seed=seed, config_hash="bench")
            rt = Runtime(stages=Stages(sim_compile, sim_evaluate, evaluate_concurrent=True),
                         compile_settings=CompileSettings(),
                         harness_settings=harness).start()
            tasks = [f"sim{i}" for i in range(max(2, n_gpus))]
            eng = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id, tasks=tasks,
                         seeds={t: (SOURCE, {}) for t in tasks},
                         settings=EngineSettings(islands_per_task=2, max_evaluations=evals,
                                                 max_wall_seconds=3600, in_flight=0,
                                                 confirm_champions=False, progress_every=10**9),
                         rng=random.Random(seed), policy=lambda s: StageResult("policy", Status.OK))
            t0 = time.time()
            s = eng.run()
            wall = time.time() - t0
            rt.shutdown()
            store.close()
    finally:
        ray.shutdown()
    scale = json.loads(os.environ[ENV])["scale"]
    p = eng.progress
    stage_share = p.gpu_stage_s / (wall * n_gpus)
    overhead = (p.gpu_busy_s - p.gpu_stage_s) / max(s.evaluations, 1) / scale
    return {"gpus": n_gpus, "compile_workers": compile_workers, "evaluations": s.evaluations,
            "wall_s": wall, "gpu_busy": s.gpu_busy, "gpu_busy_steady": s.gpu_busy_steady,
            "gpu_stage_share": stage_share, "overhead_s": overhead,
            "evals_per_hour": 3600 * s.evaluations / (wall / scale)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--evals-per-gpu", type=int, default=60)
    ap.add_argument("--compile-median", type=float, default=16.2, help="seconds (measured mean nvcc time)")
    ap.add_argument("--compile-sigma", type=float, default=0.3)
    ap.add_argument("--check-median", type=float, default=1.79, help="seconds (measured mean correctness stage)")
    ap.add_argument("--time-median", type=float, default=0.96, help="seconds (measured mean timing stage)")
    ap.add_argument("--gpu-sigma", type=float, default=0.3)
    ap.add_argument("--runner-start", type=float, default=0.5,
                    help="seconds from a runner's start to its READY (an assumption: measure it on the GPU)")
    ap.add_argument("--time-scale", type=float, default=0.05, help="simulated seconds -> real seconds")
    ap.add_argument("--compile-workers-per-gpu", type=int, default=0,
                    help="0 = enough to keep GPUs fed: ceil(1.3 x compile/GPU time ratio)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    os.environ[ENV] = json.dumps({"compile_median": args.compile_median, "compile_sigma": args.compile_sigma,
                                  "check_median": args.check_median, "check_sigma": args.gpu_sigma,
                                  "time_median": args.time_median, "time_sigma": args.gpu_sigma,
                                  "runner_start": args.runner_start, "scale": args.time_scale})
    harness = HarnessSettings()
    gpu_s = args.check_median + args.time_median
    per_gpu = args.compile_workers_per_gpu or math.ceil(1.3 * args.compile_median / gpu_s)
    rows = []
    for g in args.gpus:
        rows.append(run_once(g, per_gpu * g, args.evals_per_gpu * g, seed=g, harness=harness))
        print(f"  {g} GPU(s): {rows[-1]}", file=sys.stderr, flush=True)
    base = rows[0]["evals_per_hour"] / rows[0]["gpus"]
    print(f"{'GPUs':>4} {'compile workers':>15} {'evals':>6} {'slot occupancy':>14} {'steady':>7} "
          f"{'GPU stage share':>15} {'evals/hour':>11} {'scaling':>8} {'efficiency':>10} {'overhead/cand':>13}")
    for r in rows:
        eff = r["evals_per_hour"] / (base * r["gpus"])
        r["efficiency"] = eff
        print(f"{r['gpus']:>4} {r['compile_workers']:>15} {r['evaluations']:>6} {100 * r['gpu_busy']:>13.1f}% "
              f"{100 * r['gpu_busy_steady']:>6.1f}% {100 * r['gpu_stage_share']:>14.1f}% {r['evals_per_hour']:>11.0f} "
              f"{r['evals_per_hour'] / rows[0]['evals_per_hour']:>7.2f}x {100 * eff:>9.1f}% {r['overhead_s']:>12.2f}s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
