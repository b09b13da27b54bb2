"""evo.results.lineage.lineage_tree / candidate_details and their renderers (evo lineage --diff, evo show)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from _inspect_run import TASK, build_run
from evo.cli.inspect import print_lineage, print_show
from evo.results.lineage import candidate_details, diff_stat, lineage_tree, profile_delta
from evo.results.views import render_lineage
from evo.store import Store


@pytest.fixture()
def built(tmp_path):
    return build_run(tmp_path / "evo.db", tmp_path / "cache")


def _text(renderable) -> str:
    c = Console(width=200, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_lineage_tree_edges_carry_operator_diff_delta_verdicts_and_profile(built):
    with Store.open_reader(built.db) as store:
        nodes = lineage_tree(store, built.llm.id, run_id=built.run_id)
    assert [n["id"] for n in nodes] == [built.llm.id, built.knobs.id, built.seed.id]
    llm, knobs, seed = nodes
    assert llm["operator"] == "llm:test-model" and llm["status"] == "ok" and llm["fitness"] == pytest.approx(1.5)
    assert [s["stage"] for s in llm["stages"]] == ["policy", "compile", "correctness", "timing"]
    (e,) = llm["edges"]
    assert e["parent"] == built.knobs.id and e["present"] and e["operator"] == "llm:test-model"
    assert e["fitness_delta"] == pytest.approx(0.3) and e["fitness_ratio"] == pytest.approx(1.25)
    assert "+// evolved: comment-only change for the test" in e["diff"] and (e["added"], e["removed"]) == (1, 0)
    assert e["params_diff"] == []
    assert e["profile_delta"]["dram_throughput_pct"] == {"parent": 80.0, "child": 91.5, "delta": 11.5}
    assert e["profile_delta"]["stalls.long_scoreboard"]["delta"] == -15.0
    assert "registers" not in e["profile_delta"]  # unchanged metrics are left out
    (k,) = knobs["edges"]
    change = f"BLOCK: {built.seed.params_dict['BLOCK']} -> 512"
    assert k["params_diff"] == [change] and k["diff"].startswith(f"# param {change}")
    assert k["profile_delta"] == {}  # the seed has no profile
    assert seed["edges"] == [] and seed["operator"] == "seed"
    json.dumps(nodes)


def test_crossover_has_two_edges_and_failed_verdicts(built):
    with Store.open_reader(built.db) as store:
        nodes = lineage_tree(store, built.cross.id)
    first = nodes[0]
    assert first["status"] == "incorrect" and first["fitness"] is None
    assert [e["parent"] for e in first["edges"]] == [built.knobs.id, built.seed.id]
    assert [e["position"] for e in first["edges"]] == [0, 1]
    assert all(e["fitness_delta"] is None for e in first["edges"])
    text = _text(render_lineage(nodes, diff=False))
    assert "parent 2 (crossover)" in text and "correctness incorrect" in text
    assert "(its ancestry is shown above)" in text  # the seed is reached twice, expanded once


def test_render_with_and_without_diff(built):
    with Store.open_reader(built.db) as store:
        nodes = lineage_tree(store, built.llm.id)
    brief = _text(render_lineage(nodes, diff=False))
    full = _text(render_lineage(nodes, diff=True))
    change = f"BLOCK: {built.seed.params_dict['BLOCK']} -> 512"
    for t in (brief, full):
        assert "llm:test-model" in t and "fitness +0.300" in t and f"params {change}" in t
        assert "profile: " in t and "dram_throughput_pct 80 -> 91.5" in t
    assert "+// evolved: comment-only change" not in brief
    assert "+// evolved: comment-only change" in full and f"# param {change}" in full


def test_print_lineage_json_drops_diffs_unless_asked(built, capsys):
    with Store.open_reader(built.db) as store:
        print_lineage(store, built.llm.id, as_json=True)
        brief = json.loads(capsys.readouterr().out)
        print_lineage(store, built.llm.id, as_json=True, diff=True)
        full = json.loads(capsys.readouterr().out)
    assert "diff" not in brief[0]["edges"][0] and brief[0]["edges"][0]["added"] == 1
    assert "evolved" in full[0]["edges"][0]["diff"]


def test_candidate_details_has_prompt_response_profile_and_champion(built, capsys):
    with Store.open_reader(built.db) as store:
        d = candidate_details(store, built.llm.id)
        assert d["run_id"] == built.run_id and d["status"] == "ok" and d["gpu"] == "NVIDIA H200"
        assert [c["prompt"] for c in d["llm_calls"]] == ["PROMPT-FOR-LLM-CHILD"]
        assert d["llm_calls"][0]["cost"] == 0.5 and d["llm_calls"][0]["response"] == "RESPONSE-FOR-LLM-CHILD"
        assert d["profiles"][0]["metrics"]["dram_throughput_pct"] == 91.5
        assert d["champion_of"] == [{"run_id": built.run_id, "task": TASK, "fitness": 1.5,
                                     "confirmation": {"confirmed": True, "fitness_confirmed": 1.48, "ratio": 0.987},
                                     "gain": None, "verdict": None}]
        assert d["children"] == [] and d["parents"] == [built.knobs.id]
        assert d["stages"][3]["metrics"]["shapes"][0]["median_ms"] == 2.2
        assert candidate_details(store, built.knobs.id)["children"] == [built.llm.id, built.cross.id]
        print_show(store, built.llm.id, console=Console(width=200, record=True, color_system=None))
        out = capsys.readouterr().out
    for text in ("PROMPT-FOR-LLM-CHILD", "RESPONSE-FOR-LLM-CHILD", "dram_throughput_pct", "x1.500",
                 "champion", "evolved: comment-only", "tighter tail"):
        assert text in out, text


def test_show_of_a_compile_failure_prints_the_errors(built, capsys):
    with Store.open_reader(built.db) as store:
        print_show(store, built.broken.id, source=False, console=Console(width=200, color_system=None))
    out = capsys.readouterr().out
    assert "compile_error" in out and "expected a ')'" in out and "compile errors" in out


def test_helpers():
    assert diff_stat("--- a\n+++ b\n@@\n-x\n+y\n+z\n") == (2, 1)
    assert profile_delta(None, {"a": 1}) == {}
    assert profile_delta({"a": 1, "b": True, "c": "s"}, {"a": 3, "b": False, "c": "t"}) == {
        "a": {"parent": 1.0, "child": 3.0, "delta": 2.0}}
