"""Merge the rows of one device call's search-power table into the kept table (one call per
task, so each call's ``--out`` holds the rows it measured): a task's newer row replaces its
older one, the others stay.

    python benchmarks/search_power/merge.py NEW.json [--into benchmarks/search_power/h100.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_power import load_rows, save  # noqa: E402

COMMAND = ("python3 benchmarks/search_power.py --tasks TASK --wall-minutes W --timeout-s T "
           "--out $OUT/sp/h100.md (one call per task; W, T and the date of each row in its "
           "commands log under h100_logs/)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new", type=Path, help="the call's table (.md or .json)")
    ap.add_argument("--into", type=Path, default=Path(__file__).with_name("h100.md"))
    args = ap.parse_args(argv)
    rows = {r.task: r for r in load_rows(args.into)}
    new = load_rows(args.new)
    if not new:
        ap.error(f"{args.new.with_suffix('.json')}: no rows")
    for r in new:
        rows[r.task] = r
    save(list(rows.values()), args.into, command=COMMAND, budget=max(r.budget for r in rows.values()))
    print(f"{args.into}: {', '.join(rows)} ({', '.join(r.task for r in new)} new)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
