"""Compile probe specs and repeat.py variants in parallel into the compile cache, ahead of a GPU run.

    python benchmarks/precompile.py benchmarks/probes/X.json [TASK:NAME=V,NAME=V ...] [--source S]

benchmarks/probe.py compiles its own spec in parallel, but benchmarks/repeat.py compiles one
variant at a time; calling this first (on the GPU machine, in the same command) puts every
build of the session into ``.evo/cache`` at once, so the later steps only load them. A
``TASK:PARAMS`` argument is one repeat.py variant (``--source``, default the strict-fp32 3xTF32
render table). Exit 1 when any build fails (its compiler message is printed).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="+", help="probe spec .json files or TASK:NAME=V,NAME=V variants")
    ap.add_argument("--source", default="render:evo.tasks.gemm_seeds:F32_3XTF32_SEEDS")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args(argv)

    from benchmarks.probe import _load, _source
    from evaluators.base import CompileSettings
    from evaluators.compile import compile_candidate
    from evo.records import Candidate, Operator

    cands = []
    for item in args.items:
        if item.endswith(".json"):
            for e in _load(Path(item)):
                params = {str(k): str(v) for k, v in e["params"].items()}
                cands.append(Candidate.create(e["task"], _source(e["task"], e["source"]), params,
                                              operator=Operator.SEED))
        else:
            task, _, kv = item.partition(":")
            params = dict(x.split("=", 1) for x in kv.split(",") if x)
            cands.append(Candidate.create(task, _source(task, args.source), params, operator=Operator.SEED))
    settings = CompileSettings(cache_dir=str(ROOT / ".evo" / "cache"))
    failed = 0
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for c, out in zip(cands, pool.map(lambda c: compile_candidate(c, settings), cands)):
            print(f"{'ok  ' if out.ok else 'FAIL'} {c.task} {dict(c.params)}")
            if not out.ok:
                failed += 1
                print(out.result.reason[:2000])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
