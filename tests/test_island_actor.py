"""IslandActor on a local, single-CPU Ray instance (the one Ray test module of populations/)."""

from __future__ import annotations

import os
import pickle

import pytest

ray = pytest.importorskip("ray")

from evo.core.records import Candidate, Member, Status  # noqa: E402
from populations.actor import IslandActor, make_island_actor  # noqa: E402
from populations.island import Island, IslandSpec, IslandState  # noqa: E402

TASK = "matmul_fp16"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mk(tag: str, fitness: float | None, descriptor=()) -> Member:
    cand = Candidate.create(TASK, f"// kernel {tag}\n", {"TAG": tag})
    return Member(cand, fitness, Status.OK if fitness is not None else Status.INCORRECT,
                  tuple(descriptor))


SPEC = IslandSpec(index=0, task=TASK, capacity=3, selector="sigmoid",
                  selector_options=(("lam", 1.0),), seed=123, archive_dims=("tile",))


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():  # another module left one running: do not hijack it
        pytest.skip("Ray already initialised by another test")
    # Workers must import evo/ and populations/ from this checkout even when not installed.
    path = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def test_make_island_actor_needs_ray(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="not initialised"):
        make_island_actor(SPEC)


def test_plain_class_without_ray():
    with pytest.raises(ValueError, match="IslandSpec"):
        IslandActor()
    a = IslandActor(SPEC)
    assert a.fix_mode() and a.add(mk("a", 1.0)) and not a.fix_mode()


def test_island_actor_add_parents_state_resume(local_ray):
    actor = make_island_actor(SPEC)
    assert ray.get(actor.ready.remote())
    assert ray.get(actor.fix_mode.remote()) is True
    assert ray.get(actor.add.remote(mk("bad", None))) is False
    assert [m.id for m in ray.get(actor.parents.remote(1))] == [mk("bad", None).id]

    members = [mk(f"m{i}", 1.0 + 0.25 * i, (("tile", f"{32 * (i % 2 + 1)}x64"),)) for i in range(6)]
    assert ray.get(actor.add_many.remote(members[:5])) == [True, True, True, True, True]
    assert ray.get(actor.add.remote(members[5])) is True
    assert ray.get(actor.fix_mode.remote()) is False
    assert ray.get(actor.best.remote()).id == members[5].id

    parents = ray.get(actor.parents.remote(2))
    assert len(parents) == 2 and all(p.correct for p in parents)
    assert ray.get(actor.record_child.remote(parents[0].id)) is True
    assert [m.fitness for m in ray.get(actor.emigrants.remote(2))] == [2.25, 2.0]
    assert ray.get(actor.immigrate.remote([mk("imm", 3.0)])) == 1

    state = ray.get(actor.state.remote())
    assert isinstance(state, IslandState)
    assert len(state.elites) == 3 and state.champion_id == mk("imm", 3.0).id
    assert dict(state.children)[parents[0].id] == 1
    summary = ray.get(actor.summary.remote())
    assert summary.best_fitness == 3.0 and summary.archive_cells == 3  # 32x64, 64x64, "-"

    # resume: a new actor from the state chooses like an in-process island from the same state
    local = Island.from_state(pickle.loads(pickle.dumps(state)))
    resumed = make_island_actor(state=state)
    for _ in range(5):
        assert [m.id for m in ray.get(resumed.parents.remote(2))] == [m.id for m in local.parents(2)]
    ray.kill(actor)
    ray.kill(resumed)
