"""What prompts may know, read from a store: history, inspirations, failures, and the
delayed-profile rule (profile numbers only from lineage depth `feedback_after` on)."""

from __future__ import annotations

from evo.engine.llm_context import StoreContextProvider, task_info
from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.store import Store

OK = (StageResult("policy", Status.OK), StageResult("compile", Status.OK), StageResult("correctness", Status.OK),
      StageResult("timing", Status.OK))


def _chain(store, run, n, island=0):
    out, parent = [], ()
    for g in range(n):
        c = Candidate.create("kb19_relu", f"// v{g} island {island}\n", {}, parents=parent,
                             operator="seed" if g == 0 else "knobs", island=island, generation=g)
        store.add_candidate(run, c)
        store.add_evaluation(run, Evaluation(c.id, OK, 1.0 + g / 10))
        out.append(c)
        parent = (c.id,)
    return out


def test_profile_shown_only_from_feedback_depth_on(tmp_path):
    with Store(tmp_path / "e.db") as store:
        run = store.create_run("ctx", {}, seed=0, config_hash="x")
        chain = _chain(store, run, 4)
        for c in chain:
            store.add_profile(c.id, shape="R=8 x C=8", gpu="H200", metrics={"dram_throughput_pct": 80.0})
        p = StoreContextProvider(store, run, feedback_after=2)
        assert p.profile(chain[0].id) is None and p.profile(chain[1].id) is None
        assert p.profile(chain[2].id) == {"dram_throughput_pct": 80.0}
        assert p.history(chain[3].id) == [(0, 1.0), (1, 1.1), (2, 1.2), (3, 1.3)]


def test_inspirations_come_from_other_islands_and_failures_carry_errors(tmp_path):
    with Store(tmp_path / "e.db") as store:
        run = store.create_run("ctx", {}, seed=0, config_hash="x")
        mine = _chain(store, run, 2, island=0)
        other = _chain(store, run, 2, island=1)
        bad = Candidate.create("kb19_relu", "// broken\n", {}, parents=(mine[-1].id,), operator="knobs", island=0)
        store.add_candidate(run, bad)
        store.add_evaluation(run, Evaluation(bad.id, (StageResult("compile", Status.COMPILE_ERROR, "nvcc failed",
                                                                  artifacts={"errors": "k.cu(3): error: x"}),)))
        p = StoreContextProvider(store, run)
        insp = p.inspirations("kb19_relu", 0, 2)
        assert [s for s, *_ in insp] == [other[1].source, other[0].source]
        assert p.failure(bad.id) == ("compile", "compile_error", "k.cu(3): error: x")
        assert p.failure(mine[0].id) is None


def test_task_info_has_reference_abi_shapes_and_sol():
    info = task_info("kb19_relu", "H200")
    assert "relu" in info.reference_src and "evo_launch" in info.abi_text
    assert "(benchmarked)" in info.shapes_text and " ms on H200 at R=4096 C=393216" in info.sol_text
