"""Contract tests for populations/: selection, archive, island, migration, resume state."""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evo.core.records import Candidate, Member, Status
from populations import (
    DEFAULT_DIMS,
    MISSING,
    Archive,
    Island,
    IslandSpec,
    IslandState,
    RingMigration,
    SigmoidSelector,
    TopSelector,
    UniformSelector,
    descriptor_from_params,
    island_seed,
    make_selector,
    merge_descriptor,
    migrate,
    ring_plan,
)
from populations.selection import sample_without_replacement, sigmoid

TASK = "matmul_fp16"


def mk(tag: str, fitness: float | None, *, task: str = TASK, descriptor=(), operator="knobs",
       status: Status | None = None) -> Member:
    cand = Candidate.create(task, f"// kernel {tag}\n", {"TAG": tag}, operator=operator)
    if status is None:
        status = Status.OK if fitness is not None else Status.INCORRECT
    return Member(candidate=cand, fitness=fitness, status=status, descriptor=tuple(descriptor),
                  error="" if fitness is not None else f"mismatch in {tag}")


def island(capacity=4, *, seed=7, selector=None, archive: Archive | None = None, **kw) -> Island:
    return Island(0, TASK, capacity, selector or SigmoidSelector(1.0), random.Random(seed), archive, **kw)


# ---------------------------------------------------------------- selection


def test_sigmoid_weights_exact_numbers():
    # f = 1,2,3,4: median 2.5, |f - median| = 1.5,.5,.5,1.5 -> MAD 1.0; z = -1.5,-.5,.5,1.5
    w = SigmoidSelector(1.0).weights([1.0, 2.0, 3.0, 4.0], [0, 0, 1, 0])
    expected = [0.18242552380635635, 0.3775406687981454, 0.6224593312018546 / 2, 0.8175744761936437]
    assert w == pytest.approx(expected, rel=1e-12)
    # lam scales the z-score: lam = 2 -> z = -3,-1,1,3
    w2 = SigmoidSelector(2.0).weights([1.0, 2.0, 3.0, 4.0], [0, 0, 0, 0])
    assert w2 == pytest.approx([0.04742587317756678, 0.2689414213699951,
                                0.7310585786300049, 0.9525741268224334], rel=1e-12)


def test_sigmoid_weights_zero_mad_fallbacks():
    sel = SigmoidSelector(1.0)
    # MAD = 0 (three equal at the median) -> mean absolute deviation 0.75; z = 0,0,0,4
    assert sel.weights([1.0, 1.0, 1.0, 4.0], [0, 0, 0, 0]) == pytest.approx(
        [0.5, 0.5, 0.5, 0.9820137900379085], rel=1e-12)
    # all equal -> every z is 0
    assert sel.weights([2.0, 2.0, 2.0], [0, 1, 3]) == pytest.approx([0.5, 0.25, 0.125])
    assert sel.weights([], []) == []


def test_sigmoid_is_stable_for_extreme_z():
    assert sigmoid(1e6) == 1.0 and sigmoid(-1e6) == 0.0
    assert sigmoid(0.0) == 0.5


def test_selector_validation_and_registry():
    with pytest.raises(ValueError, match="selection_lambda"):
        SigmoidSelector(0.0)
    with pytest.raises(ValueError, match="valid selectors: sigmoid, top, uniform"):
        make_selector("tournament")
    with pytest.raises(TypeError, match="'uniform' does not accept"):
        make_selector("uniform", lam=2.0)
    s = make_selector("sigmoid", lam=1.5)
    assert isinstance(s, SigmoidSelector) and s.options == {"lam": 1.5}
    assert isinstance(make_selector("uniform"), UniformSelector)
    assert isinstance(make_selector("top"), TopSelector)


def test_more_children_lowers_probability():
    a, b = mk("a", 2.0), mk("b", 2.0)
    sel = SigmoidSelector(1.0)
    assert sel.weights([2.0, 2.0], [0, 3]) == pytest.approx([0.5, 0.125])
    rng = random.Random(1)
    picks = [sel.select([a, b], [0, 3], 1, rng)[0].id for _ in range(4000)]
    frac_a = picks.count(a.id) / len(picks)
    assert frac_a == pytest.approx(0.8, abs=0.03)  # 0.5 / (0.5 + 0.125)


def test_selection_returns_distinct_and_respects_k():
    ms = [mk(str(i), float(i + 1)) for i in range(5)]
    rng = random.Random(3)
    for sel in (SigmoidSelector(1.0), UniformSelector(), TopSelector()):
        got = sel.select(ms, [0] * 5, 3, rng)
        assert len(got) == 3 and len({m.id for m in got}) == 3
        assert len(sel.select(ms, [0] * 5, 10, rng)) == 5
        assert sel.select(ms, [0] * 5, 0, rng) == []
        assert sel.select([], [], 2, rng) == []
    assert [m.fitness for m in TopSelector().select(ms, [9] * 5, 2, rng)] == [5.0, 4.0]


def test_selector_rejects_incorrect_and_does_not_mutate():
    ms = [mk("a", 1.0), mk("b", 2.0)]
    counts = [1, 0]
    snapshot = (list(ms), list(counts))
    SigmoidSelector(1.0).select(ms, counts, 2, random.Random(0))
    assert (ms, counts) == snapshot
    with pytest.raises(ValueError, match="incorrect member"):
        SigmoidSelector(1.0).select([mk("x", None)], [0], 1, random.Random(0))
    with pytest.raises(ValueError, match="one child count per member"):
        SigmoidSelector(1.0).select(ms, [0], 1, random.Random(0))


def test_sampling_zero_weights_falls_back_to_uniform():
    ms = [mk("a", 1.0), mk("b", 2.0), mk("c", 3.0)]
    got = sample_without_replacement(ms, [0.0, 0.0, 1.0], 3, random.Random(0))
    assert got[0].id == ms[2].id and len({m.id for m in got}) == 3


def test_selection_deterministic_with_seed():
    ms = [mk(str(i), 1.0 + 0.1 * i) for i in range(8)]

    def run(seed):
        rng = random.Random(seed)
        return [tuple(m.id for m in SigmoidSelector(1.0).select(ms, [i % 3 for i in range(8)], 2, rng))
                for _ in range(20)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_island_selects_only_correct_members():
    isl = island(8)
    good = [mk(f"g{i}", 1.0 + i) for i in range(3)]
    for m in good:
        isl.add(m)
    for i in range(5):
        assert isl.add(mk(f"bad{i}", None)) is False
    assert not isl.fix_mode
    good_ids = {m.id for m in good}
    for _ in range(200):
        assert {m.id for m in isl.parents(2)} <= good_ids


# ---------------------------------------------------------------- island


def test_island_capacity_and_champion():
    isl = island(3)
    rng = random.Random(5)
    best = None
    fits = []
    for i in range(30):
        m = mk(f"m{i}", rng.uniform(0.5, 3.0))
        fits.append(m.fitness)
        isl.add(m)
        if best is None or m.fitness > best.fitness:
            best = m
        assert len(isl.elites()) <= 3
        assert isl.best() is best
        assert best.id in {e.id for e in isl.elites()}
    # the held elites are the top-3 fitnesses seen
    assert [m.fitness for m in isl.elites()] == sorted(fits, reverse=True)[:3]
    assert isl.counters()["evicted"] == 27


def test_champion_survives_capacity_one_and_worse_arrivals():
    isl = island(1)
    champ = mk("champ", 5.0)
    assert isl.add(champ) is True
    for i in range(10):
        assert isl.add(mk(f"w{i}", 1.0 + i * 0.1)) is False
    assert [m.id for m in isl.members()] == [champ.id]
    better = mk("better", 6.0)
    assert isl.add(better) is True
    assert isl.best() is better and [m.id for m in isl.members()] == [better.id]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=6))
def test_island_eviction_properties(fitnesses, capacity):
    isl = island(capacity)
    seen = []
    for i, f in enumerate(fitnesses):
        isl.add(mk(f"p{i}", f))
        seen.append(f)
        elites = isl.elites()
        assert len(elites) == min(capacity, len(seen))
        # the champion is the first member to reach the max and is always held
        first_max = seen.index(max(seen))
        assert isl.best().id == mk(f"p{first_max}", 0.0).id
        assert isl.best().id in {e.id for e in elites}
        # capacity keeps exactly the top fitness values
        assert sorted((e.fitness for e in elites), reverse=True) == sorted(seen, reverse=True)[:capacity]


def test_duplicates_and_task_mismatch():
    isl = island(4)
    m = mk("a", 1.0)
    assert isl.add(m) is True
    assert isl.add(m) is False
    assert isl.counters()["duplicates"] == 1
    with pytest.raises(ValueError, match="route members"):
        isl.add(mk("other", 1.0, task="softmax_fp32"))
    with pytest.raises(ValueError, match="capacity"):
        island(0)


def test_fix_mode_parents_are_recent_failures_then_seeds():
    isl = island(4, failure_limit=3)
    assert isl.fix_mode and isl.parents(2) == [] and isl.best() is None
    seed = mk("seed", None, operator="seed", status=Status.SKIPPED)
    isl.seed([seed])
    assert isl.parents(3) == [seed]
    fails = [mk(f"f{i}", None) for i in range(5)]
    for f in fails:
        assert isl.add(f) is False
    # bounded to the last 3, newest first
    assert [m.id for m in isl.failures()] == [f.id for f in reversed(fails[2:])]
    assert [m.id for m in isl.parents(2)] == [fails[4].id, fails[3].id]
    state_before = isl.rng.getstate()
    isl.parents(2)
    assert isl.rng.getstate() == state_before  # fix mode uses no randomness
    assert isl.record_child(fails[4].id) is True
    good = mk("good", 1.2)
    isl.add(good)
    assert not isl.fix_mode
    assert isl.parents(3) == [good]


def test_seed_members_added_are_remembered():
    isl = island(4)
    s = mk("s", None, operator="seed", status=Status.COMPILE_ERROR)
    isl.add(s)
    assert isl.seeds() == [s]
    isl.add(s)
    assert isl.seeds() == [s]


def test_record_child_steers_selection():
    isl = island(4, seed=2)
    a, b = mk("a", 1.0), mk("b", 1.0)
    isl.add(a)
    isl.add(b)
    for _ in range(9):
        assert isl.record_child(a.id)
    assert isl.children(a.id) == 9
    assert isl.record_child("0" * 64) is False
    picks = [isl.parents(1)[0].id for _ in range(2000)]
    assert picks.count(b.id) / 2000 == pytest.approx(10 / 11, abs=0.03)


def test_emigrants_and_immigrate():
    src, dst = island(4), island(4, seed=8)
    ms = [mk(f"m{i}", 1.0 + i) for i in range(4)]
    for m in ms:
        src.add(m)
    em = src.emigrants(2)
    assert [m.fitness for m in em] == [4.0, 3.0]
    dst.add(ms[3])
    assert dst.immigrate(em + [mk("bad", None)]) == 1  # ms[3] duplicate, bad ignored
    assert dst.counters()["immigrated"] == 1
    assert {m.id for m in dst.members()} == {ms[3].id, ms[2].id}
    with pytest.raises(ValueError, match="task"):
        dst.immigrate([mk("x", 1.0, task="other")])


# ---------------------------------------------------------------- archive


def test_archive_cell_replacement():
    arc = Archive(("tile", "stages"))
    d1 = (("stages", "2"), ("tile", "64x64"))
    a = mk("a", 1.0, descriptor=d1)
    assert arc.add(a) is True
    assert arc.add(mk("worse", 0.5, descriptor=d1)) is False
    assert arc.add(mk("tie", 1.0, descriptor=d1)) is False  # incumbent wins ties
    assert arc.add(a) is False
    b = mk("b", 2.0, descriptor=d1)
    assert arc.add(b) is True
    assert arc.cells() == {("64x64", "2"): b}
    c = mk("c", 0.1, descriptor=(("tile", "128x128"),))
    assert arc.add(c) is True  # new cell, stages missing
    assert arc.cell_of(c) == ("128x128", MISSING)
    assert arc.add(mk("bad", None, descriptor=d1)) is False
    assert arc.coverage == 2 and len(arc) == 2
    assert [m.id for m in arc.elites()] == [b.id, c.id]
    assert arc.coverage_fraction(8) == 0.25
    assert b.id in arc and a.id not in arc
    back = Archive.from_cells(arc.dims, pickle.loads(pickle.dumps(arc.to_cells())))
    assert back.cells() == arc.cells()
    with pytest.raises(ValueError, match="at least one"):
        Archive(())


def test_island_keeps_archive_elites_beyond_capacity():
    isl = island(2, archive=Archive(("tile",)))
    small = mk("small", 0.5, descriptor=(("tile", "32x32"),))
    isl.add(small)
    for i in range(4):
        isl.add(mk(f"big{i}", 2.0 + i, descriptor=(("tile", "128x128"),)))
    assert small.id not in {m.id for m in isl.elites()}
    held = {m.id for m in isl.members()}
    assert small.id in held and len(held) == 3  # 2 elites + the 32x32 cell elite
    assert isl.add(small) is False  # still held via the archive -> duplicate


def test_descriptor_from_params():
    assert descriptor_from_params({"TILE_M": 128, "TILE_N": 64, "STAGES": 3}, ("tile", "stages")) == (
        ("stages", "3"), ("tile", "128x64"))
    assert descriptor_from_params((("BM", "64"), ("BN", "256")), ("tile",)) == (("tile", "64x256"),)
    assert descriptor_from_params({"VEC": 4, "BLOCK": 256.0}, DEFAULT_DIMS) == (
        ("block", "256"), ("vec", "4"))
    # unknown / profile-only dims and undeclared tunables are left out
    assert descriptor_from_params({"TILE_M": 128}, ("tile", "bound")) == ()
    assert merge_descriptor((("tile", "64x64"),), {"bound": "memory"}) == (
        ("bound", "memory"), ("tile", "64x64"))


# ---------------------------------------------------------------- migration


def test_ring_plan():
    assert ring_plan(0) == [] and ring_plan(1) == []
    assert ring_plan(2) == [(0, 1), (1, 0)]
    assert RingMigration(5, 1).plan(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_migration_due_counts_evaluations():
    mig = RingMigration(every=10, count=2)
    calls = [(0, False), (5, False), (10, True), (10, False), (19, False), (20, True),
             (35, True), (39, False), (40, True), (41, False)]
    assert [(n, mig.due(n)) for n, _ in calls] == calls
    off = RingMigration(every=10, count=0)
    assert not any(off.due(n) for n in range(0, 100, 5))
    resumed = RingMigration(every=10, count=1, start_evaluations=95)
    assert not resumed.due(99) and resumed.due(100)
    with pytest.raises(ValueError, match="migration_every"):
        RingMigration(0, 1)


def test_migrate_moves_one_hop_per_round():
    isls = [Island(i, TASK, 4, SigmoidSelector(1.0), random.Random(i)) for i in range(3)]
    tops = [mk(f"top{i}", 10.0 + i) for i in range(3)]
    for isl, m in zip(isls, tops):
        isl.add(m)
    transfers = migrate(isls, 1)
    assert [(t.src, t.dst, t.accepted) for t in transfers] == [(0, 1, 1), (1, 2, 1), (2, 0, 1)]
    # island 1 got island 0's top, not island 2's (which had only reached island 0)
    assert {m.id for m in isls[1].members()} == {tops[0].id, tops[1].id}
    assert {m.id for m in isls[0].members()} == {tops[0].id, tops[2].id}
    assert RingMigration(10, 0).migrate(isls) == []
    with pytest.raises(ValueError, match="several tasks"):
        migrate([isls[0], Island(9, "other", 2, UniformSelector(), random.Random(0))])


# ---------------------------------------------------------------- resume state


def _busy_island() -> Island:
    isl = island(3, seed=42, archive=Archive(("tile", "stages")), failure_limit=4)
    rng = random.Random(9)
    for i in range(12):
        desc = descriptor_from_params({"TILE_M": rng.choice([64, 128]), "TILE_N": 64,
                                       "STAGES": rng.choice([2, 3, 4])}, ("tile", "stages"))
        isl.add(mk(f"r{i}", rng.uniform(0.5, 2.0), descriptor=desc))
        if i % 3 == 0:
            isl.add(mk(f"x{i}", None))
        for p in isl.parents(2):
            isl.record_child(p.id)
    isl.seed([mk("seed0", None, operator="seed", status=Status.SKIPPED)])
    return isl


def test_state_round_trip_through_pickle():
    isl = _busy_island()
    st_ = isl.state()
    assert dataclasses.is_dataclass(st_) and isinstance(st_, IslandState)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st_.capacity = 9  # type: ignore[misc]
    back = pickle.loads(pickle.dumps(st_))
    assert back == st_
    restored = Island.from_state(back)
    assert restored.state() == st_
    assert [m.id for m in restored.members()] == [m.id for m in isl.members()]
    assert restored.best() == isl.best() and restored.failures() == isl.failures()
    assert restored.archive.cells() == isl.archive.cells()
    assert restored.counters() == isl.counters()


def test_restored_island_makes_the_same_choices():
    isl = _busy_island()
    restored = Island.from_state(pickle.loads(pickle.dumps(isl.state())), SigmoidSelector(1.0))
    rng = random.Random(77)
    for i in range(40):
        a, b = isl.parents(2), restored.parents(2)
        assert [m.id for m in a] == [m.id for m in b]
        for p in a:
            assert isl.record_child(p.id) == restored.record_child(p.id)
        if i % 4 == 0:
            m = mk(f"new{i}", rng.uniform(0.5, 2.5), descriptor=(("tile", "64x64"), ("stages", "2")))
            assert isl.add(m) == restored.add(m)
    assert restored.state() == isl.state()


def test_from_state_rejects_bad_states():
    st_ = _busy_island().state()
    with pytest.raises(ValueError, match="version"):
        Island.from_state(dataclasses.replace(st_, version=99))
    with pytest.raises(ValueError, match="corrupted"):
        Island.from_state(dataclasses.replace(st_, champion_id="f" * 64))


def test_island_spec_builds_what_it_says():
    spec = IslandSpec(index=1, task=TASK, capacity=8, selector_options=(("lam", 2.0),),
                      seed=island_seed(3, TASK, 1), archive_dims=None)
    assert island_seed(3, TASK, 1) != island_seed(3, TASK, 0)
    isl = spec.build()
    assert isl.capacity == 8 and isl.archive is None and isl.selector.options == {"lam": 2.0}
    # two builds from one spec choose identically
    a, b = spec.build(), spec.build()
    for m in [mk(f"q{i}", 1.0 + i) for i in range(5)]:
        a.add(m)
        b.add(m)
    assert [[m.id for m in a.parents(2)] for _ in range(10)] == [[m.id for m in b.parents(2)] for _ in range(10)]
