"""Merge the rows of one device call's search-power table into the kept table (one call per
task, so each call's ``--out`` holds the rows it measured): a task's newer row replaces its
older one, the others stay.

    python benchmarks/search_power/merge.py NEW.json [--into benchmarks/search_power/h100.md]
    python benchmarks/search_power/merge.py --reread [--into ...]

``--reread``: every row whose run's store is kept (``h100_logs/<task>.evo.db.gz``) is read
again from it (search_power.read_row), keeping what the store does not hold (the benches, the
paired rounds against the hand-tuned seed, the time): for notes derived from the records by
a newer search_power.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses  # noqa: E402
import gzip  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from search_power import Row, load_rows, read_row, save  # noqa: E402

#: Row fields that come from outside the store (benches, paired rounds, the call's clock).
KEPT = ("task", "budget", "best_bench", "hand_bench", "vs_hand", "seconds")

COMMAND = ("python3 benchmarks/search_power.py --tasks TASK --wall-minutes W --timeout-s T "
           "--out $OUT/sp/h100.md (one call per task on one NVIDIA H100 80GB HBM3, driver 580.159.04, "
           "CUDA 13.0, torch 2.11.0+cu130; each row's date, tree, W and T in README.md, by session; "
           "the commands each ran in h100_logs/)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new", type=Path, nargs="?", help="the call's table (.md or .json)")
    ap.add_argument("--into", type=Path, default=Path(__file__).with_name("h100.md"))
    ap.add_argument("--reread", action="store_true", help="read every row again from its kept store")
    args = ap.parse_args(argv)
    rows = {r.task: r for r in load_rows(args.into)}
    if args.reread:
        logs = args.into.parent / f"{args.into.stem}_logs"
        for task, old in list(rows.items()):
            gz = logs / f"{task}.evo.db.gz"
            if not gz.is_file():
                print(f"{task}: no kept store ({gz}); row unchanged")
                continue
            with tempfile.TemporaryDirectory() as d:
                db = Path(d) / "evo.db"
                with gzip.open(gz, "rb") as f, db.open("wb") as g:
                    shutil.copyfileobj(f, g)
                fresh = read_row(Row(**{k: getattr(old, k) for k in KEPT}), db)
            if fresh.run_id != old.run_id:
                ap.error(f"{gz}: holds run {fresh.run_id}, the table's row is of run {old.run_id}")
            rows[task] = dataclasses.replace(fresh, notes=[n for n in old.notes if n.startswith("evo search exited")]
                                             + fresh.notes)
        save(list(rows.values()), args.into, command=COMMAND, budget=max(r.budget for r in rows.values()))
        print(f"{args.into}: reread {', '.join(rows)}")
        return 0
    if args.new is None:
        ap.error("give the call's table, or --reread")
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
