"""Per evaluation of a demo store: seconds after the run was created, task, the judge's phases
(runner start, correctness, timing, total) and, at the end, the GPU's idle gaps between
verdicts (a gap: the time between two verdicts less the later one's judge phases).

usage: python3 benchmarks/judge_gpu/evaluation_gaps.py DB
"""
import sqlite3, json, sys
from datetime import datetime
db = sqlite3.connect(sys.argv[1])
t0 = datetime.fromisoformat(db.execute("select created from runs").fetchone()[0]).timestamp()
seen=set()
for task, created, secs, env in db.execute("select c.task, e.created, e.seconds, e.env from evaluations e join candidates c on c.id=e.candidate_id order by e.created"):
    env=json.loads(env); ph=dict(kv.split('=') for kv in env.get('judge_phases','').split())
    ph={k:float(v) for k,v in ph.items()}
    first = task not in seen; seen.add(task)
    tim=sum(v for k,v in ph.items() if k.startswith('timing'))
    print(f"{datetime.fromisoformat(created).timestamp()-t0:7.2f} {task:20s} {secs:6.2f} start={ph.get('runner_start',0):.2f} corr={ph.get('correctness',0):.2f} timing={tim:.2f} tot={sum(ph.values()):.2f} {'FIRST' if first else ''} {env.get('runner','')[:5]}")
print("---gaps")
prev=None; idle=0; busy=0
rows=list(db.execute("select c.task, e.created, e.env from evaluations e join candidates c on c.id=e.candidate_id order by e.created"))
for task, created, env in rows:
    env=json.loads(env); ph={k:float(v) for k,v in (kv.split('=') for kv in env.get('judge_phases','').split())}
    t=datetime.fromisoformat(created).timestamp()-t0; tot=sum(ph.values())
    if prev is not None:
        g=t-prev-tot; idle+=max(g,0)
        if g>0.5: print(f"gap {g:.2f} s before {task} at {t:.1f}")
    busy+=tot; prev=t
print("busy", round(busy,1), "idle", round(idle,1))
