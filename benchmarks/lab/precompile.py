"""Compile probe specs and repeat.py variants in parallel into the compile cache, ahead of a GPU run.

    python benchmarks/lab/precompile.py benchmarks/lab/probes/X.json [TASK:NAME=V,NAME=V ...] [--source S]

benchmarks/lab/probe.py compiles its own spec in parallel, but benchmarks/lab/repeat.py compiles one
variant at a time; calling this first (on the GPU machine, in the same command) puts every
build of the session into ``.evo/cache`` at once, so the later steps only load them. A
``TASK:PARAMS`` argument is one repeat.py variant (``--source``, default the strict-fp32 3xTF32
render table). Exit 1 when any build fails (its compiler message is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("items", nargs="+", help="probe spec .json files or TASK:NAME=V,NAME=V variants")
    ap.add_argument("--source", default="render:evo.tasks.gemm_seeds:F32_3XTF32_SEEDS")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args(argv)

    from benchmarks.lab.probe import _candidate, _compile_all, _load, parse_variant

    cands = []
    for item in args.items:
        if item.endswith(".json"):
            cands += [_candidate(e["task"], e["source"], e["params"]) for e in _load(Path(item))]
        else:
            task, params = parse_variant(item)
            cands.append(_candidate(task, args.source, params))
    failed = 0
    for c, out in zip(cands, _compile_all(cands, args.jobs)):
        print(f"{'ok  ' if out.ok else 'FAIL'} {c.task} {dict(c.params)}")
        if not out.ok:
            failed += 1
            print(out.result.reason[:2000])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
