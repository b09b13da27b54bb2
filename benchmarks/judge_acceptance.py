"""Issue 40's GPU acceptance, the parts one script can measure (GPU machine only).

Steps (``--steps``, in this order by default):

- ``seeds``: each task's seed compiled once, then evaluated ``check+time`` by the harness
  path (``[evaluator] isolation = "harness"``) and by the judge path (``"judge"``), back to
  back on this GPU, ``--repeats`` rounds (the order alternating; the judge's first is its
  cold start for the task). Per task: both verdicts, the fitnesses, the judge/harness ratio
  with its 95% interval and whether it contains 1, and the evaluations' wall seconds.
- ``hang``: tests/fixtures/bad/hang.cu on kb19_relu through the judge with default settings:
  the seconds from the start of its evaluation to the ``timeout`` verdict.
- ``check``: ``evo check`` of the kb19_relu seed, start to verdict (the CLI in a subprocess),
  with the harness and with the judge (``--config`` of the demo with ``isolation = "judge"``).

Prints a markdown table per step (and writes them, with logs, under ``--out``).

    python3 benchmarks/judge_acceptance.py --out "$OUT" [--steps seeds hang check] [--tasks ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_TASKS = ["kb19_relu", "kb23_softmax", "rmsnorm_bf16", "gelu_bf16", "gemm_bf16", "kb01_square"]


def _settings(isolation: str, **kw):
    from evaluators.base import HarnessSettings

    return HarnessSettings(isolation=isolation, **kw)


def _eval(cand, so: bytes, isolation: str, **kw) -> tuple[object, float]:
    from evaluators.pipeline import run_built

    t0 = time.perf_counter()
    rep = run_built(cand, so, _settings(isolation, **kw))
    return rep, time.perf_counter() - t0


def _verdict(rep) -> str:
    return ", ".join(f"{s.stage} {s.status.value}" for s in rep.stages)


def fitness_interval(harness: list[float], judge: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The judge's fitness over the harness's, paired by round, as ``(ratio, low, high)``: the
    engine's speedup interval (:func:`evo.engine.champions.speedup_interval`, a t-interval on
    the per-round log ratios) with time = 1 / fitness. "Within noise" is ``low <= 1 <= high``."""
    from evo.engine.champions import PairedTimings, speedup_interval

    n = min(len(harness), len(judge))
    iv = speedup_interval(PairedTimings(("fitness",), (tuple(1.0 / f for f in harness[:n]),),
                                        (tuple(1.0 / f for f in judge[:n]),)), confidence)
    return iv.ratio, iv.low, iv.high


def seeds(tasks: list[str], out: Path, repeats: int = 2) -> list[str]:
    """Each task's seed by both paths, ``repeats`` rounds of (harness, judge) back to back,
    the order alternating (round 0: harness first), the judge's first round being its cold
    start for the task. The ratio of fitnesses with its 95% interval says whether the two
    paths agree within the noise."""
    from evaluators.base import CompileSettings
    from evaluators.pipeline import compile_all
    from evo.core.records import Candidate, Operator
    from evo.tasks.seeds import seed_params, seed_source

    cands = [Candidate.create(t, seed_source(t), seed_params(t), operator=Operator.SEED) for t in tasks]
    built = compile_all(cands, CompileSettings(), jobs=8)
    rows = [f"| task | harness | judge | harness fitness ({repeats} runs) | judge fitness ({repeats} runs, cold first) | "
            "judge / harness [95% interval] | within noise | harness s (median) | judge s (cold, median of the rest) |",
            "|---|---|---|---|---|---|---|---|---|"]
    log = []
    for cand, b in zip(cands, built):
        if not b.ok:
            rows.append(f"| {cand.task} | compile {b.result.status.value}: {b.result.reason[:80]} |")
            continue
        runs: dict[str, list] = {"harness": [], "judge": []}
        for r in range(max(int(repeats), 2)):
            for path in (("harness", "judge") if r % 2 == 0 else ("judge", "harness")):
                rep, sec = _eval(cand, b.so_bytes, path)
                runs[path].append((rep, sec))
                log.append({"task": cand.task, "path": path, "round": r, "fitness": rep.fitness, "seconds": sec,
                            "stages": [[st.stage, st.status.value, st.reason[:500]] for st in rep.stages],
                            "timings": [t.__dict__ for t in rep.timings], "env": rep.env})
        fh = [rep.fitness for rep, _ in runs["harness"] if rep.fitness]
        fj = [rep.fitness for rep, _ in runs["judge"] if rep.fitness]
        ratio, noise = "-", "-"
        if len(fh) >= 2 and len(fh) == len(fj):
            q, lo, hi = fitness_interval(fh, fj)
            ratio, noise = f"{q:.4f} [{lo:.4f}, {hi:.4f}]", ("yes" if lo <= 1.0 <= hi else "no")
        hs = sorted(sec for _, sec in runs["harness"])
        js = [sec for _, sec in runs["judge"]]
        rows.append(f"| {cand.task} | {_verdict(runs['harness'][-1][0])} | {_verdict(runs['judge'][-1][0])} | "
                    f"{', '.join(f'{f:.4f}' for f in fh) or '-'} | {', '.join(f'{f:.4f}' for f in fj) or '-'} | "
                    f"{ratio} | {noise} | {hs[len(hs) // 2]:.1f} | {js[0]:.1f}, {sorted(js[1:])[len(js[1:]) // 2]:.1f} |")
        print(f"{cand.task} judge phases (last): {runs['judge'][-1][0].env.get('judge_phases', '-')}", flush=True)
        print(rows[-1], flush=True)
    (out / "seeds.json").write_text(json.dumps(log, indent=1, default=str))
    return rows


def hang(out: Path) -> list[str]:
    from evaluators.base import CompileSettings
    from evaluators.compile import compile_candidate
    from evo.core.records import Candidate, Operator

    src = (ROOT / "tests" / "fixtures" / "bad" / "hang.cu").read_text()
    cand = Candidate.create("kb19_relu", src, {}, operator=Operator.USER)
    b = compile_candidate(cand, CompileSettings())
    if not b.ok:
        return [f"hang.cu did not compile: {b.result.reason[:200]}"]
    rep, s = _eval(cand, b.so_bytes, "judge")
    c = rep.stage("correctness")
    return ["| kernel | verdict | seconds to verdict (default settings) |", "|---|---|---|",
            f"| tests/fixtures/bad/hang.cu | correctness {c.status.value}: {c.reason[:100]} | {s:.1f} |"]


def check(out: Path) -> list[str]:
    from evo.tasks.seeds import seed_source

    kernel = out / "kb19_relu_seed.cu"
    kernel.write_text(seed_source("kb19_relu"))
    cfg = out / "judge.toml"
    cfg.write_text((ROOT / "configs" / "demo.toml").read_text().replace('isolation = "harness"', 'isolation = "judge"'))
    rows = ["| path | command | exit | seconds start to verdict |", "|---|---|---|---|"]
    for name, extra in (("harness", []), ("judge", ["--config", str(cfg)]), ("judge (again)", ["--config", str(cfg)])):
        cmd = [sys.executable, "-m", "evo.cli", "check", str(kernel), "--task", "kb19_relu", *extra]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        s = time.perf_counter() - t0
        (out / f"check_{name.split()[0]}.txt").write_text(p.stdout + p.stderr)
        rows.append(f"| {name} | evo check kb19_relu_seed.cu --task kb19_relu {' '.join(extra[:1])} | {p.returncode} | {s:.1f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", nargs="+", default=["seeds", "hang", "check"], choices=["seeds", "hang", "check"])
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    ap.add_argument("--repeats", type=int, default=2,
                    help="seeds: rounds of (harness, judge) per task (at least 2; more narrow the interval)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    tables = []
    for step in a.steps:
        t0 = time.perf_counter()
        try:
            rows = {"seeds": lambda: seeds(a.tasks, a.out, a.repeats), "hang": lambda: hang(a.out), "check": lambda: check(a.out)}[step]()
        except Exception as e:  # noqa: BLE001 - one step's failure must not hide the others'
            import traceback

            traceback.print_exc()
            rows = [f"{step} failed: {type(e).__name__}: {e}"]
        tables.append(f"### {step} ({time.perf_counter() - t0:.0f} s)\n\n" + "\n".join(rows) + "\n")
    text = "\n".join(tables)
    (a.out / "judge_acceptance.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
