"""Champions' gain over their baseline (schema migration 2, ``champion_gain``)."""

from __future__ import annotations

from evo.core.records import Candidate
from evo.store import Store
from evo.store.schema import MIGRATIONS


class _StoreV1(Store):
    migrations = MIGRATIONS[:1]


GAIN = {"ratio": 1.04, "low": 1.01, "high": 1.07, "confidence": 0.95, "rounds": 3, "method": "paired-t-log",
        "verdict": "faster"}


def _run_with(store, n=2):
    rid = store.create_run("r", {}, seed=0, config_hash="")
    cands = [Candidate.create("kb19_relu", f"// k{i}\n", {}) for i in range(n)]
    for c in cands:
        store.add_candidate(rid, c)
    return rid, cands


def test_gain_round_trips_with_its_verdict_and_baseline(tmp_path):
    with Store(tmp_path / "a.db") as s:
        rid, (seed, child) = _run_with(s)
        s.set_champion(rid, "kb19_relu", child.id, 1.3,
                       {"confirmed": True, "gain": GAIN, "verdict": "faster", "baseline_id": seed.id})
        (ch,) = s.champions(rid)
    assert ch["verdict"] == "faster"
    assert ch["gain"] == {"ratio": 1.04, "low": 1.01, "high": 1.07, "confidence": 0.95, "rounds": 3,
                          "method": "paired-t-log", "baseline": seed.id}
    assert ch["confirmation"]["gain"]["low"] == 1.01


def test_a_champion_without_a_baseline_has_no_gain(tmp_path):
    with Store(tmp_path / "a.db") as s:
        rid, (seed, _) = _run_with(s)
        s.set_champion(rid, "kb19_relu", seed.id, 1.0, {"confirmed": True})
        (ch,) = s.champions(rid)
    assert ch["gain"] is None and ch["verdict"] is None


def test_a_schema_1_database_migrates_and_keeps_its_champions(tmp_path):
    path = tmp_path / "old.db"
    with _StoreV1(path) as s1:
        rid, (seed, _) = _run_with(s1)
        s1._conn.execute("INSERT INTO champions (run_id, task, candidate_id, fitness, confirmation, updated) "
                         "VALUES (?, 'kb19_relu', ?, 1.0, '{\"confirmed\": true}', 'now')", [rid, seed.id])
        s1._conn.commit()
        assert "gain_low" not in s1.db["champions"].columns_dict
    with Store(path) as s2:
        assert s2.schema_version >= 2 and "gain_low" in s2.db["champions"].columns_dict
        (ch,) = s2.champions(rid)
        assert ch["candidate_id"] == seed.id and ch["gain"] is None and ch["confirmation"] == {"confirmed": True}
