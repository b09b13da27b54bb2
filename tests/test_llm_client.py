"""LLMClient, cassettes, replay and the fake endpoint, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import openai
import pytest

from mutators.llm.replay.cassette import Cassette, CassetteError, CassetteRecorder, ReplayClient, ReplayMiss
from mutators.llm.client.budget import Budget, BudgetExhausted
from mutators.llm.client.calls import LLMCall, prompt_hash
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.replay.fake_server import main as fake_main

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

    monkeypatch.setattr("mutators.llm.replay.fake_server.time.sleep", fake_sleep)
    assert fake_main(["--cassette", str(FIXTURES / "faults.jsonl"), "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:" in out and calls
    assert fake_main(["--cassette", str(FIXTURES / "faults.jsonl"), "--port", "0", "--dialect", "vllm",
                      "--context-tokens", "4096", "--models", "a,b"]) == 0
    assert "(vllm; cassette" in capsys.readouterr().out


# ---- strict dialects: the fake behaves like the real servers -------------------------------------


def _raw_post(srv: FakeLLMServer, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(srv.base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


UNSUPPORTED_MAX_TOKENS = {"error": {
    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' "
               "instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}


def test_openai_dialect_rejects_max_tokens_for_reasoning_models_with_the_real_body():
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect="openai") as srv:
        status, body = _raw_post(srv, {"model": "o3-mini", "messages": MSGS, "max_tokens": 10})
        assert (status, json.loads(body)) == (400, UNSUPPORTED_MAX_TOKENS)
        status, body = _raw_post(srv, {"model": "gpt-5", "messages": MSGS, "temperature": 0.7})
        assert status == 400 and json.loads(body)["error"] == {
            "message": "Unsupported value: 'temperature' does not support 0.7 with this model. Only the default (1) "
                       "value is supported.", "type": "invalid_request_error", "param": "temperature",
            "code": "unsupported_value"}
        assert _raw_post(srv, {"model": "gpt-5", "messages": MSGS, "temperature": 1})[0] == 200
        assert _raw_post(srv, {"model": "gpt-4.1", "messages": MSGS, "max_tokens": 10, "temperature": 0.7})[0] == 200
        status, body = _raw_post(srv, {"model": "gpt-4.1", "messages": MSGS, "chat_template_kwargs": {}})
        assert status == 400 and "Unrecognized request argument supplied: chat_template_kwargs" in body.decode()
        # rejected requests used up no cassette entry, and are logged with their status
        assert [r["status"] for r in srv.requests] == [400, 400, 200, 200, 400]


def test_client_defaults_pass_openai_reasoning_rules_and_a_wrong_setting_stops_at_once():
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect="openai") as srv:
        ok = _client().complete(MSGS, model=_spec(srv, model="o4-mini", reasoning_effort="low"))
        assert ok.ok and srv.requests[-1]["body"]["max_completion_tokens"] == 256
        forced = _client().complete(MSGS, model=_spec(srv, model="o4-mini", token_param="max_tokens"))
        assert forced.fatal == "unsupported_parameter" and forced.attempts == 1
        assert "Use 'max_completion_tokens' instead." in forced.error and "param=max_tokens" in forced.error
        hot = _client().complete(MSGS, model=_spec(srv, model="gpt-5", temperature=0.2))
        assert hot.fatal == "unsupported_parameter" and "'temperature' does not support 0.2" in hot.error
        vllm_only = _client().complete(MSGS, model=_spec(srv, model="gpt-4.1", extra_body={"top_k": 20}))
        assert vllm_only.fatal == "unsupported_parameter" and "top_k" in vllm_only.error
        assert len(srv.requests) == 4, "fatal answers are not retried"


def test_vllm_dialect_takes_extra_body_and_answers_context_length_like_vllm():
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect="vllm", context_tokens=1000) as srv:
        spec = _spec(srv, model="Qwen/Qwen3-32B", max_output_tokens=600,
                     extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert _client().complete(MSGS, model=spec).ok
        long = [{"role": "user", "content": "x" * 4000}]  # 1004 prompt tokens + 600 > 1000
        call = _client().complete(long, model=spec)
        long = [{"role": "user", "content": "x" * 2000}]  # 504 prompt tokens + 600 > 1000
        status, body = _raw_post(srv, {"model": "m", "messages": long, "max_tokens": 600})
    assert call.too_large and call.fatal is None and call.attempts == 1 and call.window == 1000
    assert "This model's maximum context length is 1000 tokens. However, you requested 1604 tokens (1004 in the " \
           "messages, 600 in the completion)." in call.error
    assert status == 400 and json.loads(body) == {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400,
        "message": "This model's maximum context length is 1000 tokens. However, you requested 1104 tokens (504 in "
                   "the messages, 600 in the completion). Please reduce the length of the messages or completion."}


@pytest.mark.parametrize("dialect", ["openai", "vllm"])
def test_wrong_key_and_unknown_model(dialect):
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect=dialect, api_key="sk-right-key-1234",
                       models=["served-model"]) as srv:
        bad_key = _client().complete(MSGS, model=_spec(srv, model="served-model"))  # sends the dummy local key
        import os

        os.environ["EVO_TEST_FAKE_KEY"] = "sk-right-key-1234"
        try:
            wrong_model = _client().complete(MSGS, model=_spec(srv, model="gpt-9", key_env="EVO_TEST_FAKE_KEY"))
            right = _client().complete(MSGS, model=_spec(srv, model="served-model", key_env="EVO_TEST_FAKE_KEY"))
        finally:
            del os.environ["EVO_TEST_FAKE_KEY"]
    assert bad_key.fatal == "auth" and wrong_model.fatal == "model_not_found" and right.ok
    if dialect == "openai":
        assert "Incorrect API key provided" in bad_key.error and "code=invalid_api_key" in bad_key.error
        assert "The model `gpt-9` does not exist or you do not have access to it." in wrong_model.error
    else:
        assert "The model `gpt-9` does not exist." in wrong_model.error


def test_429_without_retry_after_uses_backoff_and_quota_429_is_fatal():
    waits: list[float] = []
    cas = Cassette([{"status": 429}, {"response": "ok"}, {"status": 429, "error_code": "insufficient_quota"}])
    with FakeLLMServer(cas, dialect="openai") as srv:
        client = _client(sleep=lambda s: waits.append(s))
        first = client.complete(MSGS, model=_spec(srv))
        quota = client.complete(MSGS, model=_spec(srv))
    assert first.ok and first.attempts == 2 and len(waits) == 1 and 0.01 <= waits[0] < 0.015
    assert quota.fatal == "quota" and quota.attempts == 1 and "exceeded your current quota" in quota.error


# ---- streaming ------------------------------------------------------------------------------------


def test_sse_format_of_the_fake():
    cas = Cassette([{"response": "a" * 30, "tokens_in": 7, "tokens_out": 8, "repeat": True}])
    with FakeLLMServer(cas) as srv:
        _, with_usage = _raw_post(srv, {"model": "m", "messages": MSGS, "stream": True,
                                        "stream_options": {"include_usage": True}})
        _, without = _raw_post(srv, {"model": "m", "messages": MSGS, "stream": True})
    events = [ln[len("data: "):] for ln in with_usage.decode().split("\n\n") if ln]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "a" * 30
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 8,
                                                                  "total_tokens": 15}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    plain = [json.loads(e) for e in without.decode().split("\n\n") if e and e != "data: [DONE]"
             for e in [e[len("data: "):]]]
    assert all("usage" not in c for c in plain) and all(c["choices"] for c in plain)


def test_streamed_answer_is_collected_with_usage_from_the_last_chunk():
    text = "Here is the patch.\n" + "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n" * 3
    cas = Cassette([{"response": text, "reasoning": "Let me think about tiles. " * 5, "tokens_in": 1200,
                     "tokens_out": 345, "finish_reason": "stop"}])
    with FakeLLMServer(cas, dialect="openai") as srv:
        call = _client().complete(MSGS, model=_spec(srv, model="gpt-5-mini", stream=True))
        body = srv.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert call.ok and call.response == text, "reasoning_content is never part of the answer"
    assert (call.tokens_in, call.tokens_out, call.usage_estimated) == (1200, 345, False)
    assert call.reasoning_tokens == len("Let me think about tiles. " * 5) // 4 and call.finish_reason == "stop"


def test_timeout_mid_stream_charges_what_was_sent_and_streamed():
    cas = Cassette([{"response": "y" * 400, "stream_stall_s": 3, "repeat": True}])
    with FakeLLMServer(cas) as srv:
        call = _client(timeout_s=0.4, max_attempts=2).complete(MSGS, model=_spec(srv, stream=True))
    assert not call.ok and "timeout after 0.4s after" in call.error and "streamed chunks" in call.error
    assert call.attempts == 2 and call.usage_estimated
    from mutators.llm.client.calls import estimate_tokens

    # both attempts: the prompt, and the half of the 400 characters that arrived before the stall
    assert call.tokens_in == 2 * estimate_tokens(MSGS) and call.tokens_out == 2 * estimate_tokens("y" * 192)
    assert call.cost == pytest.approx((call.tokens_in * 2.0 + call.tokens_out * 8.0) / 1e6) and call.cost > 0


def test_timed_out_attempts_and_answers_without_usage_are_charged_by_estimate():
    from mutators.llm.client.calls import estimate_tokens

    cas = Cassette([{"delay_s": 5}, {"response": "z" * 80, "usage": False}])
    with FakeLLMServer(cas) as srv:
        call = _client(timeout_s=0.3, max_attempts=2).complete(MSGS, model=_spec(srv))
    assert call.ok and call.usage_estimated
    assert call.tokens_in == 2 * estimate_tokens(MSGS) and call.tokens_out == estimate_tokens("z" * 80)
    assert call.cost > 0


def test_reasoning_content_counts_for_cost_only():
    from mutators.llm.client.calls import estimate_tokens

    cas = Cassette([{"response": "", "reasoning": "r" * 400, "finish_reason": "length", "usage": False}])
    with FakeLLMServer(cas) as srv:
        call = _client().complete(MSGS, model=_spec(srv))
    assert call.ok and call.response == "" and call.finish_reason == "length"
    assert call.tokens_out == estimate_tokens("r" * 400) == call.reasoning_tokens


def test_probe_checks_a_models_settings_with_one_tiny_request():
    got: list[LLMCall] = []
    budget = Budget(0.000001)
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), dialect="openai") as srv:
        client = _client(sink=got.append, budget=budget)
        ok = client.probe(_spec(srv, model="gpt-5-mini", max_output_tokens=9000))
        bad = client.probe(_spec(srv, model="gpt-5-mini", token_param="max_tokens"))
        bodies = [r["body"] for r in srv.requests]
    assert ok.ok and ok.kind == "probe" and bodies[0]["max_completion_tokens"] == 32
    assert bad.fatal == "unsupported_parameter" and len(bodies) == 2, "one attempt, no retries"
    assert got == [] and budget.spent == 0, "a probe is a check, not a search call"
