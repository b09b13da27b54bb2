"""The H200 acceptance of issue 32: evaluations a minute of real searches, start-up included.

Two parts, each one ``evo search`` in a fresh temporary database, bounded by ``--limit-s``
(default 530 s, under the device's 9-minute call; a search still running then is stopped
with SIGINT, which records what finished, and the row says so):

- ``demo``: ``python3 -m evo.cli search configs/demo.toml`` unchanged;
- ``gemm``: the demo config with ``[tasks] include = [--gemm-task]`` (compiles of 30-50 s):
  the long tail, where the compile pool may be the limit.

Per part, from the run's own records (``evo status --json`` and the store): evaluations and
correct ones, wall clock from the command's start to its end, evaluations a minute over
that whole wall clock, slot occupancy and GPU activity (NVML, as sampled by the GPU actor:
"not measured" where it could not be read), the mean compile, correctness and timing
seconds, and which pool limited the run: the one with the lower capacity, compile =
workers / mean compile s against GPU = evaluations / seconds the GPU stages of the run
spanned; the queues in the progress events say the same from the other side (a GPU queue
that stays full: the GPUs; an empty one: the compile pool).

    python benchmarks/throughput.py --part demo gemm [--limit-s 530] [--json OUT.json]

Writes nothing but its temporary databases and ``--json``; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import shutil
import tempfile
import time
import tomllib
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.toml"


def _with(text: str, sets: list[str]) -> str:
    """``text`` (the demo config) with each ``section.key=value`` of ``--set`` applied to the
    key's line in its section (the key must be there: the demo lists every key)."""
    lines = text.splitlines()
    for item in sets:
        dotted, _, value = item.partition("=")
        section, _, key = dotted.strip().rpartition(".")
        if not section or not value:
            raise SystemExit(f"--set {item!r}: give section.key=value, e.g. evaluator.reps=30")
        current, done = "", False
        for i, ln in enumerate(lines):
            if ln.startswith("["):
                current = ln.strip().strip("[]")
            elif current == section and ln.split("=")[0].strip() == key:
                lines[i], done = f"{key} = {value.strip()}", True
                break
        if not done:
            raise SystemExit(f"--set {item!r}: configs/demo.toml has no key {key!r} in [{section}]")
    out = "\n".join(lines) + "\n"
    tomllib.loads(out)   # still a valid config
    return out


def _config(tmp: Path, name: str, sets: list[str], task: str | None = None) -> Path:
    text = _with(DEMO.read_text(), sets)
    if task is not None:
        include = f'include = ["{task}"]'
        text = "\n".join(include if ln.startswith("include = ") else ln for ln in text.splitlines()) + "\n"
    out = tmp / f"{name}.toml"
    out.write_text(text)
    tomllib.loads(out.read_text())
    return out


def _search(config: Path, db: Path, limit_s: float) -> tuple[float, bool, int]:
    """Run the search; (wall seconds, stopped at the limit, exit code)."""
    argv = [sys.executable, "-m", "evo.cli", "search", str(config), "--db", str(db), "--no-progress"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=str(ROOT))
    try:
        rc = proc.wait(timeout=limit_s)
        stopped = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)   # graceful: in-flight work is recorded
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        stopped = True
    return time.monotonic() - t0, stopped, rc


def _status(db: Path) -> dict:
    runs = json.loads(subprocess.run([sys.executable, "-m", "evo.cli", "runs", "--db", str(db), "--json"],
                                     cwd=str(ROOT), capture_output=True, text=True, check=True).stdout)
    run_id = runs[0]["id"] if isinstance(runs, list) else runs["runs"][0]["id"]
    return json.loads(subprocess.run([sys.executable, "-m", "evo.cli", "status", run_id, "--db", str(db), "--json"],
                                     cwd=str(ROOT), capture_output=True, text=True, check=True).stdout)


def _records(db: Path) -> dict:
    """Stage seconds and progress queues from the store (plain SQL on its tables)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from evaluators.judge.phases import parse_phases

    con = sqlite3.connect(str(db))
    try:
        stages = {}
        for name in ("compile", "correctness", "timing"):
            rows = con.execute("SELECT seconds FROM stage_results WHERE stage = ? AND status != 'skipped'",
                               (name,)).fetchall()
            stages[name] = [float(r[0]) for r in rows if r[0] is not None]
        prog = [json.loads(r[0]) for r in con.execute(
            "SELECT payload FROM events WHERE kind = 'progress' ORDER BY id").fetchall()]
        # the judge's seconds per step of each evaluation it decided (evaluators.judge.phases)
        phases: dict[str, list[float]] = {}
        for (env,) in con.execute("SELECT env FROM evaluations").fetchall():
            text = (json.loads(env or "{}") or {}).get("judge_phases", "")
            for k, v in parse_phases(text).items():
                phases.setdefault(k, []).append(v)
        verdicts = _verdict_ages(con)
    finally:
        con.close()
    return {"stages": stages, "progress": prog, "judge_phases": phases, "verdicts": verdicts}


def _verdict_ages(con: sqlite3.Connection) -> tuple[float, float] | None:
    """The first and the last verdict as seconds since the search's process started: the
    process age at which the run was stored (the start event's start-up record) plus the
    verdicts' times after the run's creation. None without a start-up record."""
    from datetime import datetime

    row = con.execute("SELECT r.created, e.payload FROM runs r JOIN events e ON e.run_id = r.id "
                      "WHERE e.kind = 'start' ORDER BY e.id LIMIT 1").fetchone()
    times = [r[0] for r in con.execute("SELECT created FROM evaluations ORDER BY created").fetchall()]
    if row is None or not times:
        return None
    age_at = (json.loads(row[1]).get("startup") or {}).get("age_at") or {}
    if "store" not in age_at:
        return None
    t0 = datetime.fromisoformat(row[0]).timestamp()
    return tuple(round(float(age_at["store"]) + datetime.fromisoformat(t).timestamp() - t0, 2)
                 for t in (times[0], times[-1]))


def _limit(rec: dict, evaluations: int, workers: int) -> tuple[str, float | None, float | None]:
    st = rec["stages"]
    if not st["compile"] or not st["correctness"]:
        return "not enough records", None, None
    compile_cap = 60.0 * workers / mean(st["compile"])   # candidates a minute the pool can build
    gpu_s = sum(st["correctness"]) + sum(st["timing"])
    gpu_cap = 60.0 * evaluations / gpu_s if gpu_s > 0 else None   # if the GPU did nothing else
    if gpu_cap is None:
        return "not enough records", compile_cap, None
    return ("compile pool" if compile_cap < gpu_cap else "GPU"), compile_cap, gpu_cap


def part(name: str, config: Path, limit_s: float, workers: int, keep_db: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"evo-throughput-{name}-") as tmp:
        db = Path(tmp) / f"{name}.db"
        wall, stopped, rc = _search(config, db, limit_s)
        status = _status(db)
        rec = _records(db)
        if keep_db is not None:   # the run's records, for a timeline read afterwards
            keep_db.mkdir(parents=True, exist_ok=True)
            shutil.copy(db, keep_db / db.name)
    prog = status.get("progress") or {}
    n = int(status.get("evaluations") or 0)
    limit, compile_cap, gpu_cap = _limit(rec, n, workers)
    queues = [(p.get("compile_queue", 0), p.get("gpu_queue", 0)) for p in rec["progress"][1:]]
    act = prog.get("gpu_activity")
    return {
        "part": name, "config": str(config), "exit_code": rc, "stopped_at_limit": stopped,
        "evaluations": n, "correct": status.get("correct"), "wall_s": round(wall, 1),
        "evals_per_min": round(60.0 * n / wall, 2),
        # the same evaluations to the last verdict, start-up included (what follows it: the
        # champions' confirmation, the shutdown), and the first verdict, both in seconds
        # since the process started
        "first_verdict_s": rec["verdicts"] and rec["verdicts"][0],
        "last_verdict_s": rec["verdicts"] and rec["verdicts"][1],
        "evals_per_min_to_last_verdict": rec["verdicts"] and round(60.0 * n / rec["verdicts"][1], 2),
        "slot_occupancy": prog.get("gpu_busy"), "gpu_activity": act,
        "mean_s": {k: round(mean(v), 2) if v else None for k, v in rec["stages"].items()},
        "judge_phases_mean_s": {k: round(mean(v), 3) for k, v in rec["judge_phases"].items()},
        "judge_evaluations": max((len(v) for v in rec["judge_phases"].values()), default=0),
        "limit": limit, "compile_capacity_per_min": compile_cap and round(compile_cap, 1),
        "gpu_capacity_per_min": gpu_cap and round(gpu_cap, 1),
        "mean_gpu_queue": round(mean(q[1] for q in queues), 2) if queues else None,
        "mean_compile_queue": round(mean(q[0] for q in queues), 2) if queues else None,
    }


def _pct(x) -> str:
    return "not measured" if x is None else f"{100 * float(x):.0f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="+", choices=("demo", "gemm"), default=["demo", "gemm"])
    ap.add_argument("--gemm-task", default="gemm_bf16")
    ap.add_argument("--limit-s", type=float, default=530.0, help="wall-clock bound of each search (s)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep-db", type=Path, metavar="DIR", help="copy each part's database into DIR")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="change one key of the demo config for both parts, e.g. "
                         "--set evaluator.reps=30 --set evaluator.call_timeout_s=5 "
                         "(the table's title lists them)")
    args = ap.parse_args()
    workers = max(1, (os.cpu_count() or 2) - 1)   # Ray's CPUs minus the driver's, as the engine counts
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.part:
            if name == "demo":
                config = _config(Path(tmp), name, args.set) if args.set else DEMO
            else:
                config = _config(Path(tmp), name, args.set, args.gemm_task)
            rows.append(part(name, config, args.limit_s, workers, args.keep_db))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"configs/demo.toml{' with ' + ', '.join(args.set) if args.set else ' unchanged'}\n")
    print("| part | evaluations (correct) | wall s | evals/min | first / last verdict s | evals/min to the last "
          "verdict | slot occupancy | GPU activity | compile s "
          "| correctness s | timing s | limit (compile / GPU capacity a minute) | stopped at limit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["mean_s"]
        print(f"| {r['part']} | {r['evaluations']} ({r['correct']}) | {r['wall_s']} | {r['evals_per_min']} "
              f"| {r['first_verdict_s']} / {r['last_verdict_s']} | {r['evals_per_min_to_last_verdict']} "
              f"| {_pct(r['slot_occupancy'])} | {_pct(r['gpu_activity'])} | {m['compile']} | {m['correctness']} "
              f"| {m['timing']} | {r['limit']} ({r['compile_capacity_per_min']} / {r['gpu_capacity_per_min']}) "
              f"| {r['stopped_at_limit']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["exit_code"] in (0, 130) or r["stopped_at_limit"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
