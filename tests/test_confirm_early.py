"""Champion confirmations start as soon as a task is settled (evo.engine.confirming), not after
the run's last verdict: a task whose search is over is confirmed while another task's last
candidates still compile."""

from __future__ import annotations

import random
import threading

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate
from evo.engine.champions import Confirmation
from evo.engine.confirming import Confirmations, settled_tasks
from evo.engine.engine import Engine, EngineSettings
from evo.engine.local_runtime import LocalRuntime
from evo.engine.seams import Stages
from evo.store import Store
from fakes import stages as fake

from test_engine import ok_policy


def _cand(task: str, tile: str = "32") -> Candidate:
    return Candidate.create(task=task, source=fake.SOURCE, params={"TILE": tile})


# ------------------------------------------------------------------ settled_tasks


@pytest.mark.parametrize("busy, done, expected", [
    (set(), False, []),                 # the run may still propose: nothing is final
    ({"a"}, False, []),
    (set(), True, ["a", "b"]),          # sorted
    ({"a"}, True, ["b"]),               # a candidate of a is still in flight
    ({"a", "b"}, True, []),
    ({"c"}, True, ["a", "b"]),          # a task with no best yet does not matter
])
def test_a_task_is_settled_once_proposing_is_done_and_none_of_its_candidates_is_in_flight(busy, done, expected):
    best = {"b": (1.0, _cand("b")), "a": (2.0, _cand("a"))}
    assert settled_tasks(best, busy, proposing_done=done) == expected


# ------------------------------------------------------------------ Confirmations


def _recording_confirm(calls: list):
    def confirm(task, cand, fitness, profiles):
        calls.append((task, cand.id, fitness, profiles, threading.current_thread().name))
        if task == "boom":
            raise RuntimeError("our failure in the confirmation")
        return Confirmation({"confirmed": True, "task": task, "candidate": cand.id})
    return confirm


def test_a_started_confirmation_runs_on_the_worker_and_is_taken_once():
    calls: list = []
    conf = Confirmations(_recording_confirm(calls))
    c = _cand("a")
    assert conf.start("a", c, 1.5, ("p",)) and not conf.start("a", c, 1.5, ("p",))
    assert conf.started("a")
    got = conf.take("a", c, 1.5)
    assert got.record == {"confirmed": True, "task": "a", "candidate": c.id}
    assert not conf.started("a")
    conf.close()
    assert len(calls) == 1 and calls[0][3] == ("p",) and calls[0][4].startswith("evo-confirm")


def test_taking_another_champion_than_the_one_started_confirms_it_anew_here():
    calls: list = []
    conf = Confirmations(_recording_confirm(calls))
    old, new = _cand("a", "32"), _cand("a", "64")
    conf.start("a", old, 1.0)
    got = conf.take("a", new, 2.0, ("q",))
    conf.close()
    assert got.record["candidate"] == new.id
    assert calls[-1][:4] == ("a", new.id, 2.0, ("q",))
    assert calls[-1][4] == threading.current_thread().name


def test_a_confirmation_that_raised_raises_when_taken():
    conf = Confirmations(_recording_confirm([]))
    c = _cand("boom")
    conf.start("boom", c, 1.0)
    with pytest.raises(RuntimeError, match="our failure"):
        conf.take("boom", c, 1.0)
    conf.close()


def test_closing_without_waiting_cancels_what_has_not_started():
    gate = threading.Event()
    ran: list = []

    def confirm(task, cand, fitness, profiles):
        gate.wait(10)
        ran.append(task)
        return Confirmation({})

    conf = Confirmations(confirm)
    conf.start("a", _cand("a"), 1.0)
    conf.start("b", _cand("b"), 1.0)   # queued behind a on the one worker
    conf.close(wait=False)
    gate.set()
    assert not conf.started("a") and not conf.started("b")
    assert "b" not in ran


# ------------------------------------------------------------------ through the engine


def test_a_settled_task_is_confirmed_while_another_tasks_last_candidates_compile(tmp_path):
    """Task ``fast`` finishes while every candidate of task ``slow`` waits in its compile for
    a sign that ``fast``'s champion is being confirmed (its first re-evaluation: a candidate
    evaluated a second time). Confirmations that waited for the run's last verdict would
    never give that sign, and the compiles would give up after their bound."""
    tasks = ["fast", "slow"]
    confirming = threading.Event()
    gave_up: list[str] = []
    evaluated: set[str] = set()
    lock = threading.Lock()

    def compile_fn(candidate, settings):
        if candidate.task == "slow" and not confirming.wait(20):
            gave_up.append(candidate.id)
        return fake.fake_compile(candidate, settings)

    def evaluate_fn(candidate, so_bytes, settings):
        with lock:
            if candidate.id in evaluated and candidate.task == "fast":
                confirming.set()
            evaluated.add(candidate.id)
        return fake.fake_evaluate(candidate, so_bytes, settings)

    budget = 6
    rt = LocalRuntime(stages=Stages(compile_fn, evaluate_fn, evaluate_concurrent=False),
                      compile_settings=CompileSettings(), harness_settings=HarnessSettings(),
                      num_gpus=1, num_cpus=budget + 2).start()
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("confirm-early", {}, seed=0, config_hash="x")
    from mutators.knobs import KnobsMutator

    settings = EngineSettings(islands_per_task=1, population_size=8, max_evaluations=budget,
                              max_wall_seconds=120, in_flight=budget, migration_every=100, migration_count=0)
    try:
        eng = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id,
                     tasks=tasks, seeds={t: (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"}) for t in tasks},
                     settings=settings, rng=random.Random(0), policy=ok_policy)
        summary = eng.run()
    finally:
        rt.shutdown()
    assert summary.evaluations == budget
    assert not gave_up, "the slow task's compiles waited for a confirmation that only came at the end"
    starts = [e for e in store.events(run_id) if e["kind"] == "confirm_start"]
    assert [s["payload"]["task"] for s in starts][:1] == ["fast"]
    assert starts[0]["payload"]["evaluations"] < budget
    champs = {c["task"]: c for c in store.champions(run_id)}
    assert set(champs) == set(tasks)     # both stored, the early one included
    store.close()
