"""Soak benchmark: many simulated evaluations through the real engine, with injected faults.

Everything but the work is real: a local Ray instance, island actors, GPU evaluator actors,
compile tasks, the lineage store, back-pressure and dedupe. Compile and GPU stages are the
fault-injecting fakes of tests/fakes/faults.py (sleeps of a few ms) on a synthetic source
with 8 tunables of 8 values, so the space (16.7 M points per task) never runs out. At
``--fault-rate`` (default 5%) a candidate's compile worker dies once, or its GPU evaluator
actor dies once mid-evaluation, or it comes back ``incorrect`` or ``crash``; the first candidate
compiled and the first evaluated die once as well, so that every run meets both deaths.

Reports throughput (evaluations/s), faults injected and survived, rows lost (proposed
candidates without an evaluation: must be 0) and the driver's memory (RSS sampled every
``--sample-every`` evaluations, plus the sizes of the engine's per-candidate structures),
as a Markdown table and (``--json``) a JSON line.

    python benchmarks/soak.py --evals 10000            # ~2-4 minutes on 2 cores
    python benchmarks/soak.py --evals 500 --json       # what tests/test_faults.py runs

Its working folder (fault markers, the default DB) is a temporary folder removed at the end,
also after an error or Ctrl-C (``--keep`` keeps it and prints where it is).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evals", type=int, default=10_000)
    ap.add_argument("--fault-rate", type=float, default=0.05)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--islands-per-task", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=2, help="simulated GPUs (GPU evaluator actors)")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--compile-s", type=float, default=0.002)
    ap.add_argument("--gpu-s", type=float, default=0.003)
    ap.add_argument("--gpu-deaths-per-actor", type=int, default=3,
                    help="cap on injected GPU actor deaths per actor (the runtime allows 4 restarts)")
    ap.add_argument("--sample-every", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="", help="lineage DB path (default: a temporary file)")
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    ap.add_argument("--keep", action="store_true", help="keep the temporary working folder (printed at the end)")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="evo-soak-"))
    try:
        return _soak(args, argv, work)
    finally:
        if args.keep:
            print(f"kept the working folder {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _soak(args: argparse.Namespace, argv: list[str] | None, work: Path) -> int:
    fault_dir = work / "faults"
    fault_dir.mkdir()
    os.environ.update(EVO_FAULT_DIR=str(fault_dir), EVO_FAULT_RATE=str(args.fault_rate), EVO_FAULT_ENSURE="1",
                      EVO_FAULT_COMPILE_S=str(args.compile_s), EVO_FAULT_GPU_S=str(args.gpu_s),
                      EVO_FAULT_GPU_DEATHS=str(args.gpu_deaths_per_actor))

    import logging

    import ray
    import ray.cloudpickle as cloudpickle

    from evaluators.base import CompileSettings, HarnessSettings
    from evo.engine.engine import Engine, EngineSettings
    from evo.core.records import StageResult, Status
    from evo.engine.runtime import Runtime
    from evo.engine.seams import Stages
    from evo.store import Store
    from fakes import faults as ff
    from mutators.knobs import KnobsMutator

    logging.basicConfig(level=logging.ERROR)
    cloudpickle.register_pickle_by_value(ff)
    ray.init(num_cpus=args.cpus, num_gpus=args.gpus, include_dashboard=False, log_to_driver=False)
    db = Path(args.db) if args.db else work / "soak.db"
    store = Store(db)
    run_id = store.create_run("soak", {"evals": args.evals, "fault_rate": args.fault_rate}, seed=args.seed,
                              config_hash="soak")
    tasks = [f"soak_{i}" for i in range(args.tasks)]
    rt = Runtime(stages=Stages(ff.fault_compile, ff.fault_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                 harness_settings=HarnessSettings()).start()
    settings = EngineSettings(islands_per_task=args.islands_per_task, population_size=16,
                              max_evaluations=args.evals, max_wall_seconds=6 * 3600.0, in_flight=args.in_flight,
                              migration_every=200, migration_count=2, confirm_champions=False,
                              progress_every=100)
    samples: list[dict] = []
    t0 = time.time()
    eng: Engine

    def on_progress(p) -> None:
        n = p.evaluations
        if n and n // args.sample_every > len(samples) - 1:
            gc.collect()
            samples.append({"evaluations": n, "rss_mb": round(rss_mb(), 1), "t_s": round(time.time() - t0, 1),
                            "seen": len(eng.seen), "policy_cache": len(eng._policy_cache),
                            "ranking": eng.survivors.ranked,
                            "bystanders": len(eng.gpu_faults.bystanders)})

    eng = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id, tasks=tasks,
                 seeds={t: (ff.SOAK_SOURCE, dict(ff.SOAK_SEED)) for t in tasks}, settings=settings,
                 rng=random.Random(args.seed), policy=lambda src: StageResult("policy", Status.OK),
                 on_progress=on_progress)
    gc.collect()
    samples.append({"evaluations": 0, "rss_mb": round(rss_mb(), 1), "t_s": 0.0, "seen": 0, "policy_cache": 0,
                    "ranking": 0, "bystanders": 0})
    summary = eng.run()
    wall = time.time() - t0
    rt.shutdown()
    ray.shutdown()

    cands = store.candidates(run_id)
    evaluated = store.evaluated_ids(run_id)
    lost = [c.id for c in cands if c.id not in evaluated]
    statuses = Counter(ev.status.value for ev in store.evaluations(run_id))
    reasons = Counter()
    for ev in store.evaluations(run_id):
        f = ev.failed_stage
        if f is not None and "died twice" in f.reason:
            reasons[f"{f.stage} died twice"] += 1
    injected = Counter(ff.rate_fault(c.id) for c in cands if ff.rate_fault(c.id))
    markers = {p.name.split("-", 1)[0] for p in fault_dir.iterdir()}
    compile_deaths = sum(1 for p in fault_dir.iterdir() if p.name.startswith("compile-"))
    gpu_deaths = sum(int(p.read_text()) for p in fault_dir.iterdir() if p.name.startswith("gpu-deaths-"))
    integrity = store.integrity_check()
    store.close()
    rss = [s["rss_mb"] for s in samples]
    first_k = next((s for s in samples if s["evaluations"] >= args.sample_every), samples[0])
    growth_after_warmup = rss[-1] - first_k["rss_mb"]
    out = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
                   f"ray {ray.__version__})",
        "command": "python benchmarks/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "evaluations": summary.evaluations, "candidates": len(cands), "rows_lost": len(lost),
        "wall_s": round(wall, 1), "evals_per_s": round(summary.evaluations / wall, 1),
        "stop_reason": summary.stop_reason, "statuses": dict(statuses),
        "faults_injected": dict(injected), "compile_worker_deaths": compile_deaths,
        "gpu_actor_deaths": gpu_deaths, "recorded_as_died_twice": dict(reasons),
        "integrity": integrity, "rss_samples": samples,
        "rss_growth_after_first_sample_mb": round(growth_after_warmup, 1),
        "marker_kinds": sorted(markers),
        "work_dir": str(work),  # removed when main() returns, unless --keep
    }
    print("| metric | value |\n|---|---|")
    for k in ("date", "machine", "command", "evaluations", "candidates", "rows_lost", "wall_s", "evals_per_s",
              "stop_reason", "statuses", "faults_injected", "compile_worker_deaths", "gpu_actor_deaths",
              "recorded_as_died_twice", "integrity", "rss_growth_after_first_sample_mb"):
        print(f"| {k} | {out[k]} |")
    print("\n| evaluations | RSS MB | t s | seen | policy cache | ranking |\n|---|---|---|---|---|---|")
    for s in samples:
        print(f"| {s['evaluations']} | {s['rss_mb']} | {s['t_s']} | {s['seen']} | {s['policy_cache']} | {s['ranking']} |")
    if args.json:
        print(json.dumps(out))
    return 0 if not lost and summary.evaluations == args.evals and integrity == ["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
