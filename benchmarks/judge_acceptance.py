"""Issue 40's GPU acceptance, the parts one script can measure (GPU machine only).

Steps (``--steps``, in this order by default):

- ``seeds``: each task's seed compiled once, then evaluated ``check+time`` by the harness
  path (``[evaluator] isolation = "harness"``) and by the judge path (``"judge"``), back to
  back on this GPU, the judge twice (cold: its first candidate of the task; warm). Per task:
  both verdicts, both fitnesses and their ratio, and each evaluation's wall seconds.
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


def seeds(tasks: list[str], out: Path) -> list[str]:
    from evaluators.base import CompileSettings
    from evaluators.pipeline import compile_all
    from evo.core.records import Candidate, Operator
    from evo.tasks.seeds import seed_params, seed_source

    cands = [Candidate.create(t, seed_source(t), seed_params(t), operator=Operator.SEED) for t in tasks]
    built = compile_all(cands, CompileSettings(), jobs=8)
    rows = ["| task | harness | judge | harness fitness (2 runs) | judge fitness (cold, warm) | judge / harness "
            "(means) | harness s | judge s (cold) | judge s (warm) |",
            "|---|---|---|---|---|---|---|---|---|"]
    log = []
    for cand, b in zip(cands, built):
        if not b.ok:
            rows.append(f"| {cand.task} | compile {b.result.status.value}: {b.result.reason[:80]} |")
            continue
        # each path twice, interleaved, so the spread within a path is the noise the ratio is read against
        h, hs = _eval(cand, b.so_bytes, "harness")
        j1, js1 = _eval(cand, b.so_bytes, "judge")
        h2, _hs2 = _eval(cand, b.so_bytes, "harness")
        j2, js2 = _eval(cand, b.so_bytes, "judge")
        fh = [f for f in (h.fitness, h2.fitness) if f]
        fj = [f for f in (j1.fitness, j2.fitness) if f]
        ratio = f"{(sum(fj) / len(fj)) / (sum(fh) / len(fh)):.3f}" if fh and fj else "-"
        rows.append(f"| {cand.task} | {_verdict(h)} | {_verdict(j2)} | {', '.join(f'{f:.4f}' for f in fh) or '-'} | "
                    f"{', '.join(f'{f:.4f}' for f in fj) or '-'} | {ratio} | {hs:.1f} | {js1:.1f} | {js2:.1f} |")
        print(f"{cand.task} judge phases (warm): {j2.env.get('judge_phases', '-')}", flush=True)
        for name, rep in (("harness", h), ("judge-cold", j1), ("harness-2", h2), ("judge-warm", j2)):
            log.append({"task": cand.task, "path": name, "fitness": rep.fitness,
                        "stages": [[s.stage, s.status.value, s.reason[:500]] for s in rep.stages],
                        "timings": [t.__dict__ for t in rep.timings], "env": rep.env})
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
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    tables = []
    for step in a.steps:
        t0 = time.perf_counter()
        try:
            rows = {"seeds": lambda: seeds(a.tasks, a.out), "hang": lambda: hang(a.out), "check": lambda: check(a.out)}[step]()
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
