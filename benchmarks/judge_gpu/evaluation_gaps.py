"""Per evaluation of a demo store: seconds after the run was created, task, the judge's phases
(runner start, correctness, timing, total), how long an evaluation waited for the judge's
lock behind its set-up or another evaluation (with the set-up's steps), and, at the end, the GPU's idle gaps between
verdicts (a gap: the time between two verdicts less the later one's judge phases).

usage: python3 benchmarks/judge_gpu/evaluation_gaps.py DB
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluators.judge.phases import parse_phases  # noqa: E402
from startup_events import _t  # noqa: E402

#: a gap shorter than this is the round trip between two verdicts, not the GPU waiting
SHOWN_GAP_S = 0.5


def _setup(steps: str, t0: float) -> str:
    """The judge's set-up steps (``step=start-end`` in epoch seconds) in seconds after the run
    was created."""
    out = []
    for item in steps.split():
        name, _, span = item.partition("=")
        a, _, b = span.partition("-")
        out.append(f"{name} +{float(a) - t0:.2f}..+{float(b) - t0:.2f}")
    return "; set-up: " + ", ".join(out) if out else ""


def main(argv: list[str]) -> int:
    db = sqlite3.connect(argv[0])
    t0 = _t(db.execute("SELECT created FROM runs").fetchone()[0])
    rows = []
    seen: set[str] = set()
    for task, created, secs, env in db.execute(
            "SELECT c.task, e.created, e.seconds, e.env FROM evaluations e JOIN candidates c ON c.id = e.candidate_id "
            "ORDER BY e.created"):
        env = json.loads(env)
        ph = parse_phases(env.get("judge_phases", ""))
        t, tot = _t(created) - t0, sum(ph.values())
        timing = sum(v for k, v in ph.items() if k.startswith("timing"))
        print(f"{t:7.2f} {task:20s} {secs:6.2f} start={ph.get('runner_start', 0):.2f} "
              f"corr={ph.get('correctness', 0):.2f} timing={timing:.2f} env={ph.get('env', 0):.3f} tot={tot:.2f} "
              f"{'FIRST' if task not in seen else ''} {env.get('runner', '')[:5]}")
        seen.add(task)
        rows.append((task, t, tot))
        if env.get("judge_wait"):   # it waited for the judge's lock: behind what, and its set-up
            print(f"        waited {env['judge_wait']}{_setup(env.get('judge_setup', ''), t0)}")
    print("---gaps")
    busy = idle = 0.0
    for i, (task, t, tot) in enumerate(rows):
        if i:
            gap = t - rows[i - 1][1] - tot
            idle += max(gap, 0.0)
            if gap > SHOWN_GAP_S:
                print(f"gap {gap:.2f} s before {task} at {t:.1f}")
        busy += tot
    print("busy", round(busy, 1), "idle", round(idle, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
