"""Search power: can the engine find, from a cold seed, what hand sweeps put into the seeds?

For each task (default :data:`DEFAULT_TASKS`, one per template family) this script

1. writes a user task file with the task's cold twin (``evo.tasks.seeds.cold_task``:
   ``<task>_cold``, same reference and shapes, every tunable at its neutral value) and a
   config: the offline ``knobs`` mutator, Optuna tuning and delayed profiling on, a fixed
   evaluation budget (``--budget``, default 60) and a wall-clock bound (``--wall-minutes``)
   so that one task's call stays under the device's 10-minute limit;
2. runs the real search, ``python3 -m evo.cli search CFG`` (``--dry-run``: ``evo search
   --dry-run``, which needs no GPU: config, task file, cold seed through policy and nvcc);
3. times the hand-tuned seed and the run's champion with ``evo bench`` in the same call
   (fresh processes, the same protocol), and
4. reads the run's store and writes one table row per task (``--out``, markdown; the rows
   also as JSON beside it), rewritten after every task so a call cut short keeps its rows.

The columns are described in docs/search_power.md. Run one task per GPU call::

    python3 benchmarks/search_power.py --tasks kb19_relu --out benchmarks/search_power/h200.md

Rows already in ``--out``'s JSON for other tasks are kept, so successive calls fill one table.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("search_power")

#: One task per template family: fp32 activation, fp32 softmax, bf16 GELU, the bf16 GEMM, the
#: irregular bf16 GEMM, a strict-fp32 GEMM (3xTF32 template), matvec.
DEFAULT_TASKS = ("kb19_relu", "kb23_softmax", "gelu_bf16", "gemm_bf16", "gemm_bf16_irregular", "kb01_square",
                 "kb04_matvec")
#: Fraction of the hand-tuned seed's speedup that counts as "reached".
REACH = 0.95


@dataclass
class Row:
    """One task's result (docs/search_power.md, "The table")."""

    task: str
    run_id: str = ""
    evaluations: int = 0
    budget: int = 0
    cold: float | None = None
    best: float | None = None
    best_bench: float | None = None
    hand_bench: float | None = None
    evals_to_reach: int | None = None
    improvements: list[tuple[int, str, float]] = field(default_factory=list)
    operators: dict[str, int] = field(default_factory=dict)
    verdict: str = ""
    gain: dict | None = None
    profiled: int = 0
    correct: int = 0
    profiled_outside_topk: int = 0
    optuna_trials: int = 0  # trials the studies asked for (:func:`study_counts`; known points are not asked)
    optuna_evaluated: int = 0
    optuna_told: int = 0
    optuna_sized: int | None = None  # the studies' trial budgets, as sized when they opened
    studies: int = 0
    studies_finished: int = 0
    vs_hand: dict | None = None  # the champion against the hand-tuned seed, paired rounds (:func:`versus_hand`)
    funnel: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    best_params: dict[str, str] = field(default_factory=dict)  # the best correct candidate's tunables
    #: GPU seconds by kind of work (:func:`gpu_seconds`): mutations', Optuna trials' and ncu profiles'
    gpu_s: dict[str, float] = field(default_factory=dict)
    hand_gap: str = ""  # how the best point differs from the hand-tuned one (:func:`hand_gap`)


# ---------------------------------------------------------------------- config generation


def task_file_text(task: str) -> str:
    return ("# Written by benchmarks/search_power.py: the cold twin of a built-in task.\n"
            "from evo.tasks.seeds import cold_task\n\n"
            f"TASKS = [cold_task({task!r})]\n")


def config_text(task: str, *, db: Path, budget: int, wall_minutes: float, seed: int, trials: int,
                cache_dir: str | None) -> str:
    """The search's TOML: the cold task only, knobs + tuning + delayed profiling (every verdict
    the judge's)."""
    lines = [
        "# Written by benchmarks/search_power.py (docs/search_power.md).",
        "[run]", f'name = "search-power {task}"', f"seed = {seed}", f'db = "{db}"', "",
        "[tasks]", f'files = ["{task}_cold_task.py"]', f'include = ["{task}_cold"]', "",
        "[search]", f"max_evaluations = {budget}", f"max_wall_minutes = {wall_minutes}", "",
        "[mutator]", 'kind = "knobs"', "",
        "[tuning]", "enabled = true", f"trials_per_survivor = {trials}", "top_k = 2", "",
        "[profile]", "enabled = true", "top_k = 3", "",
    ]
    if cache_dir:
        lines += ["[compile]", f'cache_dir = "{cache_dir}"', ""]
    return "\n".join(lines)


def write_inputs(task: str, work: Path, args) -> Path:
    """The task file and config of ``task`` under ``work/<task>``; returns the config path."""
    d = work / task
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{task}_cold_task.py").write_text(task_file_text(task))
    cfg = d / "search.toml"
    cfg.write_text(config_text(task, db=(d / "evo.db").resolve(), budget=args.budget,
                               wall_minutes=args.wall_minutes, seed=args.seed, trials=args.trials,
                               cache_dir=args.cache_dir))
    return cfg


# ---------------------------------------------------------------------- running


def evo(*argv: str, timeout: float, log_path: Path) -> int:
    """``python3 -m evo.cli ARGV`` with its output in ``log_path``; the exit status."""
    cmd = [sys.executable, "-m", "evo.cli", *argv]
    log.info("$ %s", " ".join(cmd))
    with log_path.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"[timed out after {timeout:.0f} s]\n")
            return 124


_SPEEDUP_RE = re.compile(r"^\s*([0-9.]+)x?\s*$")


def bench_speedup(table: Path, task: str) -> float | None:
    """Geometric mean over the benchmark shapes of ``task``'s speedups in an ``evo bench``
    markdown table (None without an ok row)."""
    if not table.is_file():
        return None
    head, xs = None, []
    for line in table.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["task", "shape"]:
            head = cells
            continue
        if head is None or len(cells) != len(head) or cells[0] != task:
            continue
        row = dict(zip(head, cells))
        m = _SPEEDUP_RE.match(row.get("speedup", ""))
        if m and row.get("status") == "ok":
            xs.append(float(m.group(1)))
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# ---------------------------------------------------------------------- reading the store


def read_row(row: Row, db: Path) -> Row:
    """Fill ``row`` from the newest run of the store at ``db`` (docs/search_power.md)."""
    from evo.store import Store

    with Store.open_reader(db) as store:
        runs = store.list_runs()
        if not runs:
            row.notes.append("no run in the store")
            return row
        rid = runs[0]["id"]  # newest first
        row.run_id = rid
        cands = {c.id: c for c in store.candidates(rid)}
        evs = store.evaluations(rid)
        row.evaluations = len(evs)
        best = None
        values: dict[str, set[str]] = {}  # tunable -> the values of every correct evaluated candidate
        for i, ev in enumerate(evs, 1):
            cand = cands.get(ev.candidate_id)
            op = cand.operator if cand is not None else "?"
            row.operators[op] = row.operators.get(op, 0) + 1
            failed = ev.failed_stage
            if failed is not None:
                key = f"{failed.stage}:{failed.status.value}"
                row.funnel[key] = row.funnel.get(key, 0) + 1
                if op == "seed":
                    row.notes.append(f"cold seed failed ({key}: {failed.reason[:120]})")
                continue
            if ev.fitness is None:
                continue
            row.correct += 1
            if op == "seed" and row.cold is None:
                row.cold = ev.fitness
            if cand is not None:
                for k, v in cand.params_dict.items():
                    values.setdefault(k, set()).add(str(v))
            if best is None or ev.fitness > best:
                if best is not None:
                    row.improvements.append((i, op, ev.fitness))
                best = ev.fitness
                row.best_params = {k: str(v) for k, v in cand.params_dict.items()} if cand is not None else {}
            if row.evals_to_reach is None and row.hand_bench and ev.fitness >= REACH * row.hand_bench:
                row.evals_to_reach = i
        row.best = best
        profiled = {cid for cid in cands if store.profiles(cid)}
        row.profiled = len(profiled)
        correct_ids = {e.candidate_id for e in evs if e.fitness is not None}
        row.profiled_outside_topk = len(profiled - correct_ids)
        events = store.events(rid)
        tuning = study_counts(events, store.tuning_trials(rid), cands)
        row.studies = tuning.studies
        row.studies_finished = tuning.finished
        row.optuna_trials, row.optuna_evaluated, row.optuna_told = tuning.asked, tuning.evaluated, tuning.told
        row.optuna_sized = tuning.sized
        if tuning.note:
            row.notes.append(tuning.note)
        row.gpu_s = gpu_seconds(evs, cands, events)
        for e in events:
            if e["kind"] == "profiling_off":
                row.notes.append(f"profiling off: {str(e['payload'].get('reason', ''))[:160]}")
        for ch in store.champions(rid):
            row.verdict = ch.get("verdict") or ("confirmed" if ch["confirmation"].get("confirmed") else "")
            row.gain = ch.get("gain")
    if row.evaluations < row.budget:
        row.notes.append(f"stopped after {row.evaluations} of {row.budget} evaluations (wall-clock bound)")
    if row.hand_bench and row.best and row.evals_to_reach is None:
        row.hand_gap = hand_gap(row.best_params, _hand_params(row.task), values)
        row.notes.append(_short_of(row))
    return row


@dataclass(frozen=True)
class TuningCounts:
    """A run's Optuna studies, summed (the table's optuna column): ``studies`` opened,
    ``finished`` by the rule of :attr:`evo.tuning.study_counts.StudyCounts.finished`, trials
    ``asked`` (known points are not asked), ``evaluated`` (compile + GPU) and ``told`` (an
    earlier evaluation of the same point, no compile), ``sized``: the studies' trial budgets
    as sized when they opened (None when the records do not say); ``note``: how the counts
    were read when not from the studies' own counts."""

    studies: int = 0
    finished: int = 0
    asked: int = 0
    evaluated: int = 0
    told: int = 0
    sized: int | None = None
    note: str = ""


def study_counts(events, trials, cands: dict) -> TuningCounts:
    """:class:`TuningCounts` of a run from its events (``tuning_start`` for each study opened,
    with its sized ``n_trials``; ``tuning_done`` when it finished, ``tuning_unfinished`` at the
    end of the run for the others, both with the study's counts). A store written before
    studies logged their counts is read from its trial records instead (``trials``: its
    ``tuning_trials`` rows; ``cands``: its candidates by id): an asked trial is one that was
    pruned, told an earlier trial's result (no candidate) or evaluated as a child of its
    study's parent; the other records are known points."""
    from evo.tuning.study_counts import StudyCounts

    starts = [e["payload"] for e in events if e["kind"] == "tuning_start"]
    ends = {e["payload"].get("parent"): e["payload"] for e in events
            if e["kind"] in ("tuning_done", "tuning_unfinished")}
    if starts and all("n_trials" in p for p in starts):
        final = [StudyCounts.from_json(ends[p["parent"]]["counts"]) for p in starts
                 if "counts" in ends.get(p["parent"], {})]
        lost = len(starts) - len(final)
        return TuningCounts(studies=len(starts), finished=sum(c.finished for c in final),
                            asked=sum(c.asked for c in final), evaluated=sum(c.evaluated for c in final),
                            told=sum(c.told for c in final), sized=sum(int(p["n_trials"]) for p in starts),
                            note=f"{lost} stud{'y' if lost == 1 else 'ies'} logged no counts (the run did not "
                                 "end normally): not counted as finished" if lost else "")
    asked = evaluated = 0
    for t in trials:
        cand = cands.get(t["candidate_id"]) if t["candidate_id"] else None
        mine = cand is not None and cand.operator == "optuna" and tuple(cand.parents) == (t["parent_id"],)
        asked += t["candidate_id"] is None or t["status"] == "pruned" or mine
        evaluated += mine
    return TuningCounts(studies=len({t["parent_id"] for t in trials} | {p.get("parent") for p in starts}),
                        finished=sum(1 for e in events if e["kind"] == "tuning_done"), asked=asked,
                        evaluated=evaluated, told=asked - evaluated - sum(t["status"] == "pruned" for t in trials),
                        note="optuna counts read from the trial records (the studies logged no counts)"
                        if trials else "")


#: The stages that run on the GPU (the rest, policy and compile, run in the compile pool).
GPU_STAGES = ("correctness", "timing")


def gpu_seconds(evs, cands: dict, events) -> dict[str, float]:
    """What held the GPU in a run, from its records: the correctness and timing stages of
    evaluations by kind (``trials``: Optuna's, ``mutations``: every other, the seed included)
    and ncu's wall time of every profile (``profiles``, the ``profile`` events'
    ``ncu_wall_s``). Answers "does tuning or profiling starve the search" with seconds."""
    out = {"mutations": 0.0, "trials": 0.0, "profiles": 0.0}
    for ev in evs:
        cand = cands.get(ev.candidate_id)
        kind = "trials" if cand is not None and cand.operator == "optuna" else "mutations"
        out[kind] += sum(float(st.seconds or 0.0) for st in ev.stages if st.stage in GPU_STAGES)
    for e in events:
        if e["kind"] == "profile":
            out["profiles"] += float((e.get("payload") or {}).get("ncu_wall_s") or 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def _hand_params(task: str) -> dict[str, str]:
    """The hand-tuned seed's tunables of built-in ``task`` ({} when it has none)."""
    from evo.tasks.seeds import seed_params
    from evo.tasks.registry import get_task

    try:
        t = get_task(task)
        return {k: str(v) for k, v in seed_params(t.seed or task).items()}
    except Exception:  # noqa: BLE001 - a diagnosis only: no hand point, no comparison
        return {}


def hand_gap(best: dict[str, str], hand: dict[str, str], values: dict[str, set[str]]) -> str:
    """How the search's best point differs from the hand-tuned one, from the run's records:
    the tunables where they differ (best vs hand) and which hand-tuned values no correct
    candidate of the run ever had (the search never stood there). Empty without a hand point."""
    if not hand or not best:
        return ""
    diff = [k for k in sorted(hand) if best.get(k) != hand[k]]
    if not diff:
        return "the best point has the hand-tuned tunables"
    out = "best vs hand-tuned: " + ", ".join(f"{k} {best.get(k, '-')} vs {hand[k]}" for k in diff)
    never = [f"{k}={hand[k]}" for k in diff if hand[k] not in values.get(k, set())]
    if never:
        out += "; never evaluated: " + ", ".join(never)
    return out


def _short_of(row: Row) -> str:
    """Why the search did not reach the hand-tuned seed, from the run's own records."""
    parts = [f"best {row.best / row.hand_bench:.0%} of hand-tuned"]
    if row.funnel:
        parts.append("failures " + ", ".join(f"{k} {v}" for k, v in sorted(row.funnel.items())))
    if not row.optuna_evaluated:
        parts.append("no optuna trial evaluated")
    elif row.studies_finished < row.studies:
        parts.append(f"optuna: {row.studies_finished} of {row.studies} studies finished ({row.optuna_evaluated} "
                     f"trials evaluated and {row.optuna_told} told of {_sized(row)})")
    if row.hand_gap:
        parts.append(row.hand_gap)
    if not row.improvements:
        parts.append("no child beat the cold seed")
    return "; ".join(parts)


# ---------------------------------------------------------------------- the table


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def table(rows: list[Row], *, command: str, budget: int) -> str:
    out = [f"# Search power: cold seed -> search ({budget} evaluations per task) vs the hand-tuned seed", "",
           f"Command: `{command}`", "",
           "| task | cold seed | best found | best (bench) | hand-tuned (bench) | evals to 95% | evaluations | "
           "improvements (eval: operator fitness) | champion vs cold seed | champion vs hand-tuned | profiled / correct | "
           "optuna trials asked / evaluated / told / sized; studies / finished | GPU s: mutations / trials / profiles | "
           "notes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        imp = ", ".join(f"{i}: {op} {f:.3f}" for i, op, f in r.improvements) or "-"
        gain = "-"
        if r.gain:
            gain = f"{r.verdict} {r.gain['ratio']:.3f} [{r.gain['low']:.3f}, {r.gain['high']:.3f}]"
        elif r.verdict:
            gain = r.verdict
        vs = "-"
        if r.vs_hand:
            g = r.vs_hand.get("gain")
            vs = (f"{r.vs_hand.get('verdict') or '?'} {g['ratio']:.3f} [{g['low']:.3f}, {g['high']:.3f}]" if g
                  else (r.vs_hand.get("verdict") or f"not measured: {r.vs_hand.get('error', '')[:80]}"))
        prof = f"{r.profiled} / {r.correct}" + (f" ({r.profiled_outside_topk} not correct!)"
                                               if r.profiled_outside_topk else "")
        out.append(f"| {r.task} | {_x(r.cold)} | {_x(r.best)} | {_x(r.best_bench)} | {_x(r.hand_bench)} | "
                   f"{r.evals_to_reach if r.evals_to_reach is not None else '-'} | {r.evaluations} / {r.budget} | "
                   f"{imp} | {gain} | {vs} | {prof} | {r.optuna_trials} / {r.optuna_evaluated} / {r.optuna_told} / "
                   f"{_sized(r)}; {r.studies} / {r.studies_finished} | "
                   f"{_gpu(r.gpu_s)} | {'; '.join(r.notes) or '-'} |")
    return "\n".join(out) + "\n"


def _sized(r: Row) -> str:
    return "-" if r.optuna_sized is None else str(r.optuna_sized)


def _gpu(g: dict[str, float]) -> str:
    if not g:
        return "-"
    return " / ".join(f"{g.get(k, 0.0):.0f}" for k in ("mutations", "trials", "profiles"))


def save(rows: list[Row], out: Path, *, command: str, budget: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table(rows, command=command, budget=budget))
    out.with_suffix(".json").write_text(json.dumps([asdict(r) for r in rows], indent=1))


def load_rows(out: Path) -> list[Row]:
    p = out.with_suffix(".json")
    if not p.is_file():
        return []
    return [Row(**{**d, "improvements": [tuple(x) for x in d["improvements"]]}) for d in json.loads(p.read_text())]


# ---------------------------------------------------------------------- main


def versus_hand(rt, task: str, champion, fitness: float) -> dict:
    """The run's champion against the hand-tuned seed, both built for the cold task, timed
    call by call in one paired evaluation (the engine's champion confirmation,
    :func:`evo.engine.champions.confirm_champion`, with the hand-tuned seed as the baseline):
    ``{"verdict", "gain", "error"}``, ``gain`` the speedup interval of the champion over the
    hand-tuned seed. "Beats the hand-tuned seed outside its confidence interval" (issue 41)
    is ``verdict == "faster"``; ``"slower"`` when the whole interval is below 1."""
    from evo.core.records import Candidate, Operator
    from evo.engine.champions import confirm_champion
    from evo.tasks.registry import get_task
    from evo.tasks.seeds import seed_params, seed_source

    seed = get_task(task).seed or task
    hand = Candidate.create(f"{task}_cold", seed_source(seed), seed_params(seed), operator=Operator.SEED,
                            island=-1, notes="hand-tuned seed (search_power.py)")
    if hand.id == champion.id:
        return {"verdict": "same kernel", "gain": None, "error": ""}
    c = confirm_champion(rt, f"{task}_cold", champion, fitness, baseline=hand)
    gain = c.record.get("gain")
    verdict = c.record.get("verdict") or ""
    if gain and gain.get("high", 1.0) < 1.0:
        verdict = "slower"
    error = c.stop or c.record.get("gain_error") or c.record.get("error") or ""
    if not gain and not error:
        error = "the champion's re-timing was not correct" if c.record.get("fitness_confirmed") is None else ""
    return {"verdict": verdict, "gain": gain, "error": error}


def run_versus_hand(task: str, cfg_path: Path, db: Path) -> dict:
    """:func:`versus_hand` for the newest run of ``db``'s champion of ``<task>_cold``, on a
    runtime made as ``evo search`` makes one from the search's config."""
    from evo.config import load_config, load_tasks
    from evo.engine.runtime import Runtime, real_stages
    from evo.store import Store

    cfg = load_config(cfg_path)
    load_tasks(cfg)  # the cold task file: an error here names it
    with Store.open_reader(db) as store:
        runs = store.list_runs()
        champs = [c for c in store.champions(runs[0]["id"]) if c["task"] == f"{task}_cold"] if runs else []
        if not champs:
            return {"verdict": "", "gain": None, "error": "no champion in the run"}
        cand = store.get_candidate(champs[0]["candidate_id"])
        fitness = float(champs[0]["fitness"])
    rt = Runtime(stages=real_stages(), compile_settings=cfg.compile_settings(),
                 harness_settings=cfg.harness_settings(), num_gpus=1)
    rt.start()
    try:
        return versus_hand(rt, task, cand, fitness)
    finally:
        rt.shutdown()


def checkpoint(db: Path) -> None:
    """Fold the store's write-ahead log into ``evo.db``, so that the file alone (what a GPU
    call brings back) holds the whole run: a copy without its ``-wal`` loses the newest rows."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def run_task(task: str, args, work: Path) -> tuple[Row, int]:
    """Search (or dry-run) ``task`` from its cold seed; the row and the search's exit status."""
    t0 = time.monotonic()
    cfg = write_inputs(task, work, args)
    logf = work / task / "commands.log"
    row = Row(task=task, budget=args.budget)
    if args.dry_run:
        rc = evo("search", str(cfg), "--dry-run", "--no-progress", timeout=args.timeout_s, log_path=logf)
        row.notes.append(f"dry run: exit {rc} (config, cold task file, cold seed through policy and nvcc)")
        row.seconds = time.monotonic() - t0
        return row, rc
    rc = evo("search", str(cfg), "--no-progress", timeout=args.timeout_s, log_path=logf)
    if rc:
        row.notes.append(f"evo search exited {rc} (see {logf})")
    bench_to = max(60.0, args.timeout_s / 4)
    hand = work / task / "hand_bench.md"
    if evo("bench", "--task", task, "--config", str(cfg), "--out", str(hand), "--no-progress",
           timeout=bench_to, log_path=logf) == 0 or hand.is_file():
        row.hand_bench = bench_speedup(hand, task)
    db = (work / task / "evo.db").resolve()
    if db.is_file():
        champ = work / task / "champion_bench.md"
        from evo.store import Store

        with Store.open_reader(db) as store:
            runs = store.list_runs()
        if runs:
            evo("bench", "--run", runs[0]["id"], "--db", str(db), "--config", str(cfg), "--out", str(champ),
                "--no-progress", timeout=bench_to, log_path=logf)
            row.best_bench = bench_speedup(champ, f"{task}_cold")
        read_row(row, db)
        if args.versus_hand:
            try:
                row.vs_hand = run_versus_hand(task, cfg, db)
            except Exception as e:  # noqa: BLE001 - one row's extra column: the table is still written
                row.vs_hand = {"verdict": "", "gain": None, "error": f"{type(e).__name__}: {e}"[:300]}
        checkpoint(db)
    row.seconds = time.monotonic() - t0
    return row, rc


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help="comma-separated built-in tasks (default: one per template family)")
    p.add_argument("--budget", type=int, default=60, help="evaluations per task (default 60)")
    p.add_argument("--wall-minutes", type=float, default=5.5,
                   help="wall-clock bound of each search, minutes (default 5.5: search, benches and the paired rounds < 10 min)")
    p.add_argument("--trials", type=int, default=12, help="tuning.trials_per_survivor (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("runs/search_power"), help="configs, stores, logs")
    p.add_argument("--out", type=Path, default=Path("benchmarks/search_power/results.md"))
    p.add_argument("--cache-dir", default=None, help="compile.cache_dir of the searches (default: the config default)")
    p.add_argument("--versus-hand", action=argparse.BooleanOptionalAction, default=True,
                   help="after the search, time the champion call by call against the hand-tuned seed "
                        "(the engine's confirmation; default on)")
    p.add_argument("--timeout-s", type=float, default=540.0, help="limit of each evo command, seconds")
    p.add_argument("--dry-run", action="store_true", help="no GPU: configs + `evo search --dry-run` per task")
    args = p.parse_args(argv)
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.budget < 1:
        p.error("--budget must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    from evo.tasks.seeds import cold_task

    for t in args.task_list:
        cold_task(t)  # an unknown task or one without a built-in seed fails here, before any run
    command = "python3 benchmarks/search_power.py " + " ".join(sys.argv[1:] if argv is None else argv)
    work = args.work.resolve()
    rows = {r.task: r for r in load_rows(args.out)} if not args.dry_run else {}
    worst = 0
    for task in args.task_list:
        row, rc = run_task(task, args, work)
        worst = max(worst, rc)
        rows[task] = row
        if not args.dry_run:
            save(list(rows.values()), args.out, command=command, budget=args.budget)
        print(f"{task}: {'; '.join(row.notes) or 'done'} ({row.seconds:.0f} s)", flush=True)
    if not args.dry_run:
        print(f"wrote {args.out}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
