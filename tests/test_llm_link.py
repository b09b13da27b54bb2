"""Every LLM call linked to the kernel it made, and what `evo show` / `evo status` make of it.

A seeded search on the in-process runtime (fake compile and GPU stages) with two models on
the project's fake endpoint (127.0.0.1): ``coder`` answers optimize with prose (rejected),
then an optimize that breaks the build, then its repair; ``dead`` answers 401 (stopped for
the run). The calls, attempts and stopped models are stored by the engine's own
:class:`evo.engine.llm_records.LLMRecorder` in a real SQLite store.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluators.base import CompileSettings, HarnessSettings
from evo.cli import app
from evo.core.records import StageResult, Status
from evo.engine.engine import Engine, EngineSettings
from evo.engine.llm_context import StoreContextProvider
from evo.engine.llm_records import LLMRecorder
from evo.engine.local_runtime import LocalRuntime
from evo.engine.seams import Stages
from evo.results.status import run_status
from evo.store import MIGRATIONS, Store
from fakes import stages as fake
from mutators.llm.answer.reasons import REASONS, reason_of
from mutators.llm.client.budget import Budget
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.health import ModelHealth
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.mutator import LLMMutator
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer
from tests.test_llm_mutator import FIXED, GOOD, PATCH, Rig
from mutators.llm.answer.patch import Block, render_blocks

FIX = Path(__file__).parent / "fixtures" / "llm"
TASK = "kb19_relu"
PROSE = "Use wider loads and more threads per block; that should help."
UNAUTHORIZED = ('{"error": {"message": "Incorrect API key provided: sk-x.", "type": "invalid_request_error", '
                '"param": null, "code": "invalid_api_key"}}')
CONFIG = {"mutator": {"kind": "llm"}, "llm": {"budget_usd": 1.0, "models": [{"name": "coder"}, {"name": "dead"}]}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run described in the module docstring: ``(db path, run id, lineage rows)``."""
    db = tmp_path_factory.mktemp("link") / "evo.db"
    store = Store(db)
    run_id = store.create_run("llm-link", CONFIG, seed=5, config_hash="x")
    entries = [{"match": "[kind:optimize]", "response": PROSE, "tokens_in": 1000, "tokens_out": 20},
               *Cassette.load(FIX / "seeded_repair.jsonl").entries]
    seed_src = (FIX / "tiny_kernel.cu").read_text()
    rec = LLMRecorder(store, run_id)
    with FakeLLMServer(Cassette(entries)) as live, \
            FakeLLMServer(Cassette([{"status": 401, "raw": UNAUTHORIZED, "repeat": True}])) as refusing:
        models = [ModelSpec("coder", live.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY",
                            price_in_per_mtok=1.0, price_out_per_mtok=2.0),
                  ModelSpec("dead", refusing.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY")]
        client = LLMClient(models, timeout_s=5, max_attempts=1, backoff_base_s=0.01, budget=Budget(1.0),
                           sink=rec.call)
        mut = LLMMutator(client, models, StoreContextProvider(store, run_id, gpu_name="H200"),
                         attempt_sink=rec.attempt, health=ModelHealth(models, on_stop=rec.model_stopped))
        rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False),
                          compile_settings=CompileSettings(),
                          harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
        try:
            Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK],
                   seeds={TASK: (seed_src, {"BLOCK": "128"})},
                   settings=EngineSettings(islands_per_task=1, max_evaluations=3, in_flight=1,
                                           confirm_champions=False),
                   rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK)).run()
        finally:
            rt.shutdown()
        assert len(refusing.requests) == 1, "the refusing model is asked once, then stopped"
    lineage = [(c, store.get_evaluation(c.id, run_id)) for c in store.candidates(run_id)]
    store.close()
    return db, run_id, lineage


def test_each_child_is_linked_to_the_call_that_made_it(run):
    db, run_id, lineage = run
    (seed, _), (broken, b_ev), (repaired, r_ev) = lineage
    assert b_ev.status is Status.COMPILE_ERROR and repaired.parents == (broken.id,) and r_ev.correct
    with Store.open_reader(db) as store:
        calls = store.llm_calls(run_id)
        assert store.llm_calls_of(seed.id) == []
        (made_broken,) = store.llm_calls_of(broken.id)
        (made_repaired,) = store.llm_calls_of(repaired.id)
    assert (made_broken["kind"], made_broken["model"]) == ("optimize", "coder")
    assert "BLOK" in made_broken["response"] and made_broken["attempt_key"].startswith("optimize:")
    assert (made_repaired["kind"], made_repaired["model"]) == ("repair", "coder")
    unlinked = [c for c in calls if c["candidate_id"] is None]
    assert sorted((c["model"], c["response"]) for c in unlinked) == [("coder", PROSE), ("dead", "")]
    assert all(c["attempt_key"] for c in calls), "every call is stored with its attempt's key"


def test_status_counts_per_model_what_the_llm_did(run):
    db, run_id, _ = run
    with Store.open_reader(db) as store:
        llm = run_status(store, run_id)["llm"]
    coder, dead = llm["models"]
    assert coder["model"] == "coder" and dead["model"] == "dead"
    assert (coder["calls"], coder["attempts"], coder["children"], coder["repairs"], coder["repair_attempts"]) == \
        (3, 3, 2, 1, 1)
    assert coder["rejected"] == {"prose": 1} and coder["no_answer"] == {} and coder["stopped"] is None
    assert coder["cost"] == pytest.approx((1000 + 1500 + 1500) * 1e-6 + (20 + 120 + 80) * 2e-6)
    assert (dead["calls"], dead["call_errors"], dead["children"]) == (1, 1, 0)
    assert dead["no_answer"] == {"call_failed": 1} and dead["rejected"] == {}
    assert "[fatal:auth]" in dead["stopped"]
    assert llm["budget_usd"] == 1.0 and llm["spent"] == pytest.approx(coder["cost"])
    assert llm["budget_left"] == pytest.approx(1.0 - coder["cost"])

    runner = CliRunner()
    res = runner.invoke(app, ["status", run_id, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["llm"] == json.loads(json.dumps(llm))
    res = runner.invoke(app, ["status", run_id, "--db", str(db)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    for text in ("LLM models", "prose 1", "call_failed 1", "1 of 1", "dead (stopped)", "model 'dead' stopped: HTTP 401 [fatal:auth]",
                 f"${1.0 - coder['cost']:.4f} left"):
        assert text in out, (text, res.output)


def test_show_prints_the_prompt_and_answer_that_made_a_kernel(run):
    db, run_id, lineage = run
    broken = lineage[1][0]
    runner = CliRunner()
    short = runner.invoke(app, ["show", broken.id[:12], "--db", str(db), "--no-source"])
    full = runner.invoke(app, ["show", broken.id[:12], "--db", str(db), "--no-source", "--full"])
    assert short.exit_code == 0 and full.exit_code == 0, short.output + full.output
    for out in (short.output, full.output):
        assert "prompt: system" in out and "prompt: user" in out and "answer" in out
        assert "__launch_bounds__(BLOCK) tiny_copy_kernel" in out, "the answer is printed"
        assert "coder (optimize)" in out
    assert "lines left out; evo show --full prints them" in short.output
    assert "lines left out" not in full.output and len(full.output) > 2 * len(short.output)
    with Store.open_reader(db) as store:
        (call,) = store.llm_calls_of(broken.id)
    user = json.loads(call["prompt"])[-1]["content"].splitlines()
    middle = next(ln for ln in user[len(user) // 2:] if len(ln) > 30 and ln.strip() not in short.output)
    assert middle.strip()[:60] in " ".join(full.output.split()) or middle.strip()[:30] in full.output
    data = json.loads(runner.invoke(app, ["show", broken.id[:12], "--db", str(db), "--json"]).output)
    assert [c["id"] for c in data["llm_calls"]] == [call["id"]] and data["llm_calls"][0]["prompt"] == call["prompt"]


class _StoreV3(Store):
    migrations = MIGRATIONS[:3]


def test_a_database_from_before_links_opens_and_reads_null(tmp_path):
    path = tmp_path / "old.db"
    with _StoreV3(path) as old:
        rid = old.create_run("r", {}, seed=0, config_hash="")
        old.add_llm_call(rid, prompt="[]", response="old answer", model="m", prompt_hash="h0")
    with Store(path) as s:
        assert s.schema_version == len(MIGRATIONS)
        (row,) = s.llm_calls(rid)
        assert row["attempt_key"] is None and row["candidate_id"] is None
        assert s.link_llm_call(rid, "optimize:p:1", "c1") is None, "no call of that key"
        s.add_llm_call(rid, prompt="[]", response="a", model="m", prompt_hash="h1", attempt_key="optimize:p:1")
        s.add_llm_call(rid, prompt="[]", response="b", model="m", prompt_hash="h2", attempt_key="optimize:p:1")
        newest = s.link_llm_call(rid, "optimize:p:1", "c1")  # a resumed run numbers attempts afresh
        assert [c["response"] for c in s.llm_calls_of("c1")] == ["b"] and newest == s.llm_calls(rid)[-1]["id"]
        st = run_status(s, rid)
    assert st["llm"]["models"][0]["calls"] == 3 and st["llm"]["budget_usd"] is None


UNMATCHED = render_blocks([Block("  if (j < n) d(j) = s(j);\n", "  if (j < n) d(j) = 2 * s(j);\n")])


@pytest.mark.parametrize("entries, reason", [
    ([{"response": PROSE}], "prose"),
    ([{"response": "<<<<<<< SEARCH\n  if (i < n) d(i) = s(i);\n=======\n  x\n"}], "broken_blocks"),
    ([{"response": UNMATCHED}], "unmatched"),
    ([{"response": render_blocks([Block("  if (i < n) d(i) = s(i);\n", "    if (i < n) d(i) = s(i);\n")])}],
     "no_op"),
    ([{"response": render_blocks([Block('#include "evo_abi.h"\n', "")])}], "abi"),
    ([{"response": "Here is a better file:\n```cuda\n" + GOOD + "// notes\n" * 45 + "```\n"}], "whole_file_rewrite"),
    ([{"response": ""}], "empty"),
    ([{"response": "x" * 100_000}], "call_failed"),  # over the client's own cap: the call fails
    ([{"status": 500, "repeat": True}], "call_failed"),
])
def test_every_failed_attempt_carries_its_reason_code(entries, reason):
    rig = Rig(entries, timeout_s=1.0, max_attempts=1)
    try:
        assert rig.propose([FIXED]) is None
    finally:
        rig.close()
    (att,) = rig.attempts
    assert att.reason == reason and reason in REASONS, (att.reason, att.problems)


def test_duplicates_and_oversized_answers_have_their_own_reasons():
    rig = Rig([{"response": PATCH, "repeat": True}], max_response_kb=64)
    try:
        first = rig.propose([FIXED])
        from evo.core.records import candidate_id, canonical_params

        seen = frozenset({candidate_id(first.source, canonical_params(first.params), "tiny_copy")})
        assert rig.propose([FIXED], seen=seen) is None
    finally:
        rig.close()
    assert rig.attempts[0].reason == "" and rig.attempts[-1].reason == "duplicate"
    big = Rig([{"response": PATCH + "\n" + "// padding\n" * 500}], max_response_kb=2, max_response_bytes=1 << 20)
    try:
        assert big.propose([FIXED]) is None
    finally:
        big.close()
    assert big.attempts[0].reason == "answer_too_large"


def test_attempts_stored_before_reason_codes_are_read_from_what_they_carry():
    assert reason_of({"ok": True}) is None
    assert reason_of({"ok": False, "reason": "unmatched"}) == "unmatched"
    assert reason_of({"ok": False, "call_error": "HTTP 500 server error"}) == "call_failed"
    assert reason_of({"ok": False, "call_error": "[too_large] window 8192 tokens"}) == "window_exceeded"
    assert reason_of({"ok": False, "problems": ["prompt too large for model 'm': ..."]}) == "prompt_too_large"
    assert reason_of({"ok": False, "form": "prose", "problems": ["no SEARCH/REPLACE blocks"]}) == "prose"
    assert reason_of({"ok": False, "form": "blocks", "unmatched": [{}], "problems": ["1 of 1"]}) == "unmatched"
    assert reason_of({"ok": False, "form": "blocks", "problems": ["no-op: the child equals the parent"]}) == "no_op"
