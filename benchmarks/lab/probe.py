"""Check and time a list of kernel variants in one GPU session (kernel development sweeps).

    python benchmarks/lab/probe.py benchmarks/lab/probes/elementwise.json [--out DIR] [--reps 30]

The spec is a JSON list of objects::

    {"label": "relu ITEMS=4", "task": "kb19_relu", "source": "seed" | "path/to/kernel.cu",
     "params": {"ITEMS": "4"}, "mode": "check+time" | "time-only" | "check", "note": "..."}

(``note`` is optional and not read: e.g. how today's build of an entry differs from the one
that was measured.)

``"seed"`` is the task's seed rendered from the current template (``evo.tasks.seeds``);
``"render:MODULE:DICT"`` renders ``MODULE.DICT[task]``, a SeedSpec table that is not (yet) the
seed registry (e.g. ``render:evo.tasks.gemm_seeds:F32_3XTF32_SEEDS``), so candidate templates
are probed without committing rendered copies;
``params`` become ``-D`` tunables exactly as in a search. Every variant is compiled first (in
parallel, cached), then checked and/or timed by the judge, one after another, by the
evaluator's protocol (``evaluators.pipeline.run_built``: the candidate in a sandboxed runner;
reference timed by the same loop, L2 flushed, medians). ``time-only`` skips the correctness trials: use it only for
tunable sweeps of a kernel whose correctness a ``check+time`` entry establishes in the same
spec. A short table (label, task, shape, ours ms, torch ms, speedup, % of SOL, status) is
printed last and written to ``DIR/probe.md``, which is rewritten after every variant (a run cut
short by a device-call limit keeps the rows it finished); per-variant JSON goes to ``DIR/<n>.json``.
This is a development tool: benchmarks/RESULTS.md comes from ``evo bench``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("benchmarks.lab.probe")


def _load(spec_path: Path) -> list[dict]:
    entries = json.loads(spec_path.read_text())
    if not isinstance(entries, list):
        raise SystemExit(f"{spec_path}: expected a JSON list of variants")
    for i, e in enumerate(entries):
        for key in ("task", "source"):
            if key not in e:
                raise SystemExit(f"{spec_path}: entry {i} lacks {key!r}")
        e.setdefault("label", f"{e['task']} {e.get('params', {})}")
        e.setdefault("params", {})
        e.setdefault("mode", "check+time")
    return entries


def _source(task: str, source: str) -> str:
    import importlib

    from evo.tasks.seeds import render, seed_source

    if source == "seed":
        return seed_source(task)
    if source.startswith("render:"):
        _, module, table = source.split(":", 2)
        return render(getattr(importlib.import_module(module), table)[task])
    return (ROOT / source).read_text()


def _candidate(task: str, source: str, params: dict):
    """A seed-operator candidate of ``task`` from a spec source and tunable values."""
    from evo.core.records import Candidate, Operator

    return Candidate.create(task, _source(task, source), {str(k): str(v) for k, v in params.items()},
                            operator=Operator.SEED)


def parse_variant(item: str) -> tuple[str, dict[str, str]]:
    """``TASK`` or ``TASK:NAME=VALUE[,NAME=VALUE...]`` (the command-line form of one variant in
    the benchmark scripts) -> (task, tunables); empty pieces (a trailing comma) are ignored.
    SystemExit naming the item when the task or a name is empty or a piece lacks ``=``."""
    task, _, rest = item.partition(":")
    pieces = [x for x in rest.split(",") if x]
    if not task or any("=" not in x or x.startswith("=") for x in pieces):
        raise SystemExit(f"{item!r}: expected TASK or TASK:NAME=VALUE[,NAME=VALUE...]")
    return task, dict(x.split("=", 1) for x in pieces)


def _compile_all(cands: list, jobs: int) -> list:
    """Compile outcomes of ``cands`` (same order), built in parallel into ``.evo/cache``."""
    from evaluators.base import CompileSettings
    from evaluators.pipeline import compile_all

    return compile_all(cands, CompileSettings(cache_dir=str(ROOT / ".evo" / "cache")), jobs=jobs)


def seed_and_reference(name: str, so: Path, shape: dict, device):
    """``(ours, torch_ref)``: two no-argument calls of task ``name`` on one set of its inputs of
    ``shape`` (first distribution, generator seed 1234, built once here), ``ours`` launching the
    built seed ``so`` on the current stream with its workspace, ``torch_ref`` the task's
    reference. The tensors live as long as the calls. Used by the scripts that run a seed and
    its reference side by side outside the evaluator (power.py, ncu_compare.py). ``ours``
    raises SystemExit naming the task when evo_launch returns an error."""
    import torch

    from evaluators import abi
    from evo.tasks.registry import get_task

    task = get_task(name)
    kernel = abi.load_kernel(so)
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    with torch.no_grad():
        ins = tuple(task.make_inputs(shape, gen, task.distributions[0], device))
        ref = task.reference(*ins)
    refs = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    outs = [torch.empty_like(r, dtype=getattr(torch, task.dtype)) for r in refs]
    ws = kernel.make_workspace(ins, outs, task.scalars)
    handle = int(torch.cuda.current_stream(device).cuda_stream)

    def ours() -> None:
        rc = kernel.launch(ins, outs, task.scalars, handle, ws)
        if rc != 0:
            raise SystemExit(f"{name}: evo_launch returned {kernel.error_name(rc)}")

    def torch_ref() -> None:
        task.reference(*ins)

    return ours, torch_ref


TABLE_HEAD = ["| label | task | shape | ours ms | torch ms | speedup | % SOL | status |",
              "|---|---|---|---|---|---|---|---|"]


def _write_table(out: Path, rows: list[str], pending: int) -> list[str]:
    """Write ``out/probe.md`` atomically (rows so far, plus a line naming unfinished variants)."""
    table = TABLE_HEAD + rows
    tail = [f"\n{pending} variant(s) not finished yet"] if pending else []
    tmp = out / "probe.md.tmp"
    tmp.write_text("\n".join(table + tail) + "\n")
    os.replace(tmp, out / "probe.md")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="+", type=Path, help="JSON spec file(s)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/probe")))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=200.0)
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop starting variants after this many seconds")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from evaluators.base import HarnessSettings
    from evaluators.pipeline import run_built
    from evo.core.records import Status
    from evo.tasks import get_task

    entries = [e for p in args.spec for e in _load(p)]
    cands = [_candidate(e["task"], e["source"], e["params"]) for e in entries]
    hs = HarnessSettings(reps=args.reps, warmup=args.warmup, timeout_s=args.timeout)
    t0 = time.monotonic()
    built = _compile_all(cands, args.jobs)
    log.info("compiled %d variants in %.0f s", len(built), time.monotonic() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    for i, (e, c, b) in enumerate(zip(entries, cands, built)):
        _write_table(args.out, rows, len(entries) - i)
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            rows.append(f"| {e['label']} | {e['task']} | | | | | | skipped: budget |")
            continue
        if not b.result.passed or not b.so_bytes:
            rows.append(f"| {e['label']} | {e['task']} | | | | | | compile {b.result.status.value}: "
                        f"{b.result.reason[:160].replace('|', '/')} |")
            continue
        rep = run_built(c, b.so_bytes, hs, mode=e["mode"])
        (args.out / f"{i:03d}.json").write_text(json.dumps(
            {"entry": e, "fitness": rep.fitness, "env": rep.env,
             "stages": [dataclasses.asdict(s) for s in rep.stages]}, default=str, indent=1))
        bad = next((s for s in rep.stages if s.status not in (Status.OK, Status.SKIPPED)), None)
        if bad is not None:
            rows.append(f"| {e['label']} | {e['task']} | | | | | | {bad.stage} {bad.status.value}: "
                        f"{bad.reason[:160].replace('|', '/')} |")
            continue
        task = get_task(e["task"])
        for t in rep.timings:
            pct = f"{100 * t.sol_ms / t.median_ms:.1f}" if t.sol_ms else "-"
            shape = " ".join(f"{k}={v}" for k, v in t.shape.items())
            rows.append(f"| {e['label']} | {e['task']} | {shape} | {t.median_ms:.4f} | {t.ref_median_ms:.4f} | "
                        f"{t.speedup:.3f} | {pct} | ok |")
        if not rep.timings:
            rows.append(f"| {e['label']} | {e['task']} | | | | | | ok ({e['mode']}, {task.dtype}) |")
        log.info("%d/%d %s done (%.0f s)", i + 1, len(entries), e["label"], time.monotonic() - t0)
    table = _write_table(args.out, rows, 0)
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
