"""Tests of evo.results.lineage over a real (temporary) SQLite store."""

from __future__ import annotations

import pytest

from evo.results.lineage import first_parent_chain, params_diff, source_diff
from evo.core.records import Candidate, Evaluation, Operator, StageResult, Status
from evo.store import Store, UnknownIdError

SEED = "// seed\n#ifndef TILE_M\n#define TILE_M 128\n#endif\nint x = 1;\n"


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "lineage.db") as s:
        yield s


def test_source_and_params_diff():
    a = Candidate.create("gemm", SEED, {"TILE_M": 128, "STAGES": 3})
    b = Candidate.create("gemm", SEED.replace("int x = 1;", "int x = 2;"), {"TILE_M": 256, "SWIZZLE": 1},
                         parents=(a.id,))
    assert params_diff(a, b) == ["STAGES: 3 -> -", "SWIZZLE: - -> 1", "TILE_M: 128 -> 256"]
    d = source_diff(a, b)
    assert d.startswith("# param STAGES: 3 -> -\n")
    assert f"--- {a.short_id}.cu" in d and f"+++ {b.short_id}.cu" in d
    assert "-int x = 1;\n+int x = 2;\n" in d
    assert source_diff(a, a) == ""
    only_params = Candidate.create("gemm", SEED, {"TILE_M": 64, "STAGES": 3})
    assert source_diff(a, only_params) == "# param TILE_M: 128 -> 64\n"
    no_nl = Candidate.create("gemm", "int y;", parents=(a.id,))
    assert "\\ No newline at end of file" in source_diff(a, no_nl)


def test_first_parent_chain_walks_root_first_with_fitness(store):
    rid = store.create_run("r", {}, seed=0, config_hash="")
    seed = Candidate.create("gemm", SEED, {"TILE_M": 128})
    other = Candidate.create("gemm", SEED + "// other\n")
    child = Candidate.create("gemm", SEED.replace("1;", "2;"), {"TILE_M": 128}, parents=(seed.id,),
                             operator=Operator.KNOBS, generation=1)
    cross = Candidate.create("gemm", SEED.replace("1;", "3;"), {"TILE_M": 256}, parents=(child.id, other.id),
                             operator=Operator.CROSSOVER, generation=2)
    for c in (seed, other, child, cross):
        store.add_candidate(rid, c)
    store.add_evaluation(rid, Evaluation(seed.id, (StageResult("timing", Status.OK),), fitness=1.0))
    store.add_evaluation(rid, Evaluation(cross.id, (StageResult("correctness", Status.INCORRECT),)))
    steps = first_parent_chain(store, cross.id, run_id=rid)
    assert [s.candidate.id for s in steps] == [seed.id, child.id, cross.id]
    assert steps[0].parent is None and steps[0].diff == "" and steps[0].fitness == 1.0
    assert steps[1].parent == seed and steps[1].fitness is None and steps[1].status is None
    assert steps[2].other_parents == (other.id,) and steps[2].status == "incorrect"
    assert "# param TILE_M: 128 -> 256" in steps[2].diff and "+int x = 3;" in steps[2].diff
    with pytest.raises(UnknownIdError):
        first_parent_chain(store, "0" * 64)


def test_chain_root_is_where_stored_lineage_stops(store):
    rid = store.create_run("r", {}, seed=0, config_hash="")
    orphan = Candidate.create("gemm", SEED, parents=("f" * 64,), operator="llm:m")
    store.add_candidate(rid, orphan)
    steps = first_parent_chain(store, orphan.id)
    assert len(steps) == 1 and steps[0].parent is None and steps[0].other_parents == ("f" * 64,)
