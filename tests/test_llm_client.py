"""LLMClient, cassettes, replay and the fake endpoint, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import openai
import pytest

from mutators.cassette import Cassette, CassetteError, CassetteRecorder, ReplayClient, ReplayMiss
from mutators.client import (
    Budget,
    BudgetExhausted,
    LLMCall,
    LLMClient,
    LLMConfigError,
    ModelSpec,
    prompt_hash,
)
from mutators.fake_server import FakeLLMServer
from mutators.fake_server import main as fake_main

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def _spec(server: FakeLLMServer, **kw) -> ModelSpec:
    base = dict(name="fake", base_url=server.base_url, model="fake-1", key_env="EVO_TEST_UNSET_KEY",
                price_in_per_mtok=2.0, price_out_per_mtok=8.0, max_output_tokens=256)
    base.update(kw)
    return ModelSpec(**base)


def _client(**kw) -> LLMClient:
    base = dict(timeout_s=1.0, max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05, rng=random.Random(7))
    base.update(kw)
    return LLMClient(**base)


def test_success_accounts_tokens_cost_and_sink():
    got: list[LLMCall] = []
    cas = Cassette([{"response": "hi there", "tokens_in": 1000, "tokens_out": 500, "finish_reason": "stop"}])
    with FakeLLMServer(cas) as srv:
        client = _client(sink=got.append)
        call = client.complete(MSGS, model=_spec(srv), kind="genesis")
        req = srv.requests[0]
    assert call.ok and call.response == "hi there" and call.attempts == 1
    assert (call.tokens_in, call.tokens_out) == (1000, 500)
    assert call.cost == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)
    assert call.finish_reason == "stop" and call.kind == "genesis" and call.latency_s > 0
    assert call.prompt_hash == prompt_hash(MSGS, "fake-1")
    assert got == [call]
    assert req["model"] == "fake-1" and req["messages"] == MSGS
    assert client.totals()["cost"] == pytest.approx(call.cost)
    client.close()
    row = call.to_row(candidate_id="abc")
    assert json.loads(row["prompt"]) == MSGS and row["candidate_id"] == "abc" and row["error"] is None


def test_prompt_hash_depends_on_messages_and_model():
    h = prompt_hash(MSGS, "m")
    assert h == prompt_hash([dict(m) for m in MSGS], "m")
    assert h != prompt_hash(MSGS, "m2")
    assert h != prompt_hash(MSGS[:1], "m")


def test_500s_are_retried_then_succeed():
    waits: list[float] = []
    cas = Cassette([{"status": 500}, {"status": 503}, {"response": "ok"}])
    with FakeLLMServer(cas) as srv:
        call = _client(sleep=lambda s: waits.append(s) or time.sleep(s)).complete(MSGS, model=_spec(srv))
    assert call.ok and call.response == "ok" and call.attempts == 3
    # exponential backoff with jitter in [1, 1.5)
    assert 0.01 <= waits[0] < 0.015 and 0.02 <= waits[1] < 0.03


def test_500s_give_up_into_a_failed_call():
    with FakeLLMServer(Cassette([{"status": 500, "repeat": True}])) as srv:
        call = _client().complete(MSGS, model=_spec(srv))
        n = len(srv.requests)
    assert not call.ok and "HTTP 500" in call.error and "gave up after 3 attempts" in call.error
    assert call.attempts == 3 and n == 3 and call.cost == 0


def test_429_waits_retry_after():
    cas = Cassette([{"status": 429, "retry_after": 0.4}, {"response": "ok"}])
    with FakeLLMServer(cas) as srv:
        call = _client().complete(MSGS, model=_spec(srv))
        t0, t1 = srv.requests[0]["time"], srv.requests[1]["time"]
    assert call.ok and call.attempts == 2
    assert 0.35 <= t1 - t0 < 1.5


def test_timeout_and_invalid_json_are_retried():
    cas = Cassette([{"delay_s": 5}, {"raw": "{not json"}, {"response": "finally"}])
    with FakeLLMServer(cas) as srv:
        t = time.monotonic()
        call = _client(timeout_s=0.3).complete(MSGS, model=_spec(srv))
        assert time.monotonic() - t < 3
    assert call.ok and call.response == "finally" and call.attempts == 3


def test_hang_gives_up_as_failed_call():
    with FakeLLMServer(Cassette([{"delay_s": 10, "repeat": True}])) as srv:
        call = _client(timeout_s=0.2, max_attempts=2).complete(MSGS, model=_spec(srv))
    assert not call.ok and "timeout" in call.error and call.attempts == 2


def test_4xx_is_not_retried():
    with FakeLLMServer(Cassette([{"status": 401, "response": "bad key"}, {"response": "never"}])) as srv:
        call = _client().complete(MSGS, model=_spec(srv))
        assert len(srv.requests) == 1
    assert not call.ok and "HTTP 401" in call.error and call.attempts == 1


def test_connection_refused_is_a_failed_call():
    with FakeLLMServer(Cassette([])) as srv:
        spec = _spec(srv)
    call = _client(max_attempts=2).complete(MSGS, model=spec)  # server is gone
    assert not call.ok and "connection error" in call.error


def test_oversize_answer_is_a_failed_call_with_truncated_text():
    with FakeLLMServer(Cassette([{"response": "x" * 5000}])) as srv:
        call = _client(max_response_bytes=1024).complete(MSGS, model=_spec(srv))
    assert not call.ok and "too large" in call.error and len(call.response) == 1024 and call.attempts == 1


def test_exhausted_cassette_answers_500():
    with FakeLLMServer(Cassette([])) as srv:
        call = _client(max_attempts=1).complete(MSGS, model=_spec(srv))
    assert "exhausted" in call.error


def test_budget_stops_before_sending():
    budget = Budget(max_usd=0.01)
    cas = Cassette([{"response": "a", "tokens_in": 10_000, "tokens_out": 0, "repeat": True}])
    with FakeLLMServer(cas) as srv:
        client = _client(budget=budget)
        spec = _spec(srv, price_in_per_mtok=1.0)  # 10k tokens at $1/Mtok = $0.01 per call
        assert client.complete(MSGS, model=spec).ok
        assert budget.exhausted and budget.spent == pytest.approx(0.01)
        with pytest.raises(BudgetExhausted, match="budget_usd"):
            client.complete(MSGS, model=spec)
        assert len(srv.requests) == 1


def test_concurrency_cap():
    cas = Cassette([{"response": "a", "delay_s": 0.3, "repeat": True}])
    with FakeLLMServer(cas) as srv:
        client = _client(concurrency=2, timeout_s=3)
        spec = _spec(srv)
        threads = [threading.Thread(target=client.complete, args=(MSGS,), kwargs={"model": spec}) for _ in range(4)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t
        starts = sorted(r["time"] for r in srv.requests)
    # two waves of two: the 3rd request starts only after a first one finished
    assert elapsed >= 0.55 and starts[2] - starts[0] >= 0.25
    assert client.totals()["n_calls"] == 4


def test_missing_key_env_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("EVO_TEST_REMOTE_KEY", raising=False)
    remote = ModelSpec("remote", "https://api.example.com/v1", "m", key_env="EVO_TEST_REMOTE_KEY")
    with pytest.raises(LLMConfigError, match="EVO_TEST_REMOTE_KEY"):
        LLMClient([remote])
    monkeypatch.setenv("EVO_TEST_REMOTE_KEY", "sk-test")
    assert remote.api_key() == "sk-test"
    local = ModelSpec("local", "http://localhost:8000/v1", "m", key_env="EVO_TEST_REMOTE_KEY_UNSET")
    assert local.api_key()  # dummy key allowed on localhost


def test_model_spec_validation():
    with pytest.raises(LLMConfigError, match="base_url"):
        ModelSpec("x", "api.openai.com", "m")
    with pytest.raises(LLMConfigError, match="price_in_per_mtok"):
        ModelSpec("x", "http://127.0.0.1:1/v1", "m", price_in_per_mtok=-1)


def test_real_openai_sdk_sees_models_endpoint():
    with FakeLLMServer(Cassette([{"response": "x", "model": "coder-7b"}])) as srv:
        models = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0).models.list()
    assert [m.id for m in models.data] == ["coder-7b"]


# ---- cassettes ---------------------------------------------------------------------------


def test_cassette_selection_rules():
    h = prompt_hash(MSGS, "fake-1")
    cas = Cassette([
        {"response": "plain-1"},
        {"response": "by-match", "match": "hel"},
        {"response": "by-hash", "prompt_hash": h},
        {"response": "plain-2"},
        {"response": "sticky", "match": "zzz", "repeat": True},
    ])
    assert cas.next_for(MSGS, "fake-1").response == "by-hash"
    assert cas.next_for(MSGS, "fake-1").response == "by-match"
    assert cas.next_for(MSGS, "fake-1").response == "plain-1"
    assert cas.next_for(MSGS, "fake-1").response == "plain-2"
    assert cas.next_for(MSGS, "fake-1") is None
    zz = [{"role": "user", "content": "zzz"}]
    assert cas.next_for(zz, "m").response == "sticky" and cas.next_for(zz, "m").response == "sticky"


def test_cassette_load_errors(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"response": "a"}\n{"respnse": "b"}\n')
    with pytest.raises(CassetteError, match=r"line 2: unknown field\(s\) \['respnse'\]"):
        Cassette.load(p)
    p.write_text('{"response": "a"}\nnot json\n')
    with pytest.raises(CassetteError, match="line 2: not JSON"):
        Cassette.load(p)
    with pytest.raises(CassetteError, match="no such file"):
        Cassette.load(tmp_path / "missing.jsonl")


def test_fixture_cassettes_load():
    assert len(Cassette.load(FIXTURES / "lineage.jsonl").entries) == 3
    assert len(Cassette.load(FIXTURES / "faults.jsonl").entries) == 6


def test_record_then_replay_without_endpoint(tmp_path):
    rec_path = tmp_path / "rec.jsonl"
    rows: list[dict] = []
    sink = CassetteRecorder(rec_path, then=lambda c: rows.append(c.to_row()))
    cas = Cassette([{"response": "one", "tokens_in": 100, "tokens_out": 10},
                    {"response": "two", "tokens_in": 100, "tokens_out": 20}])
    other = [{"role": "user", "content": "other"}]
    with FakeLLMServer(cas) as srv:
        spec = _spec(srv)
        client = _client(sink=sink)
        live = [client.complete(MSGS, model=spec), client.complete(other, model=spec)]
    # from store rows: same answers, same costs, marked cached, no endpoint (server is stopped)
    replay = ReplayClient(rows)
    again = [replay.complete(MSGS, model=spec), replay.complete(other, model=spec)]
    assert [c.response for c in again] == [c.response for c in live]
    assert [c.cost for c in again] == pytest.approx([c.cost for c in live])
    assert all(c.cached for c in again)
    with pytest.raises(ReplayMiss, match="no recorded answer"):
        replay.complete(MSGS, model=spec)
    # from the recorded cassette file
    replay2 = ReplayClient.from_cassette(rec_path)
    assert replay2.complete(other, model=spec).response == "two"
    # the recorded cassette also drives the fake server by prompt hash, in any order
    with FakeLLMServer(rec_path) as srv2:
        spec2 = _spec(srv2)
        assert _client().complete(other, model=spec2).response == "two"
        assert _client().complete(MSGS, model=spec2).response == "one"


def test_replay_charges_budget():
    rows = [{"prompt_hash": prompt_hash(MSGS, "m"), "response": "r", "cost": 0.5}]
    budget = Budget(0.5)
    rc = ReplayClient(rows + rows, budget=budget)
    spec = ModelSpec("m", "http://127.0.0.1:9/v1", "m")
    rc.complete(MSGS, model=spec)
    with pytest.raises(BudgetExhausted):
        rc.complete(MSGS, model=spec)


def test_fake_server_main_serves_until_interrupted(monkeypatch, capsys):
    calls = []

    def fake_sleep(s):
        calls.append(s)
        raise KeyboardInterrupt

    monkeypatch.setattr("mutators.fake_server.time.sleep", fake_sleep)
    assert fake_main(["--cassette", str(FIXTURES / "faults.jsonl"), "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:" in out and calls
