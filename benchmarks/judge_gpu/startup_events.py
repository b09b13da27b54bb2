"""Print a run's start-up and end from its own events: seconds after the run was created for each
event before the first evaluation landed, the first and last evaluation times, each champion
confirmation's start (``confirm_start``: once its task is settled) and the run's finish.

usage: python3 benchmarks/judge_gpu/startup_events.py DB [RUN_ID]
"""
from __future__ import annotations

import json
import sqlite3
import sys
from datetime import datetime

KINDS = ("start", "first_compiled", "first_gpu_result", "confirm_start", "finish")


def _t(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def _ray_line(startup: dict) -> str:
    """When the local Ray instance's start began and when the runtime was ready, and whether
    the start began at the command's entry (``ray_early``) or after the config and store."""
    ages = startup.get("age_at") or {}
    when = "early, at the command's entry" if startup.get("ray_early") else "after the config and store"
    return (f"ray: start began at {ages.get('ray_start')} s ({when}), ready at {ages.get('ray_ready')} s; "
            f"config loaded at {ages.get('config')} s")


def main(argv: list[str]) -> int:
    db = sqlite3.connect(argv[0])
    run_id, created = (db.execute("SELECT id, created FROM runs WHERE id=?", (argv[1],)).fetchone()
                       if len(argv) > 1 else
                       db.execute("SELECT id, created FROM runs ORDER BY created DESC LIMIT 1").fetchone())
    t0 = _t(created)
    print(f"run {run_id} created {created}")
    for created_e, kind, payload in db.execute(
            "SELECT created, kind, payload FROM events WHERE run_id=? ORDER BY id", (run_id,)):
        if kind in KINDS:
            data = json.loads(payload)
            startup = data.pop("startup", None) if isinstance(data, dict) else None
            if isinstance(data, dict):
                for noisy in ("sandbox", "rates", "islands", "best"):
                    data.pop(noisy, None)
            print(f"  +{_t(created_e) - t0:7.2f} s  {kind:17s} {json.dumps(data)[:300]}")
            if startup:
                print(f"             startup (process ages, s): {json.dumps(startup)}")
                print(f"             {_ray_line(startup)}")
    rows = [r[0] for r in db.execute("SELECT created FROM evaluations WHERE run_id=? ORDER BY created", (run_id,))]
    if rows:
        first, last = _t(rows[0]) - t0, _t(rows[-1]) - t0
        rate = 60 * (len(rows) - 1) / (last - first) if last > first else float("nan")
        print(f"  evaluations: {len(rows)}; first +{first:.2f} s, last +{last:.2f} s; "
              f"{rate:.2f} a minute after the first")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
