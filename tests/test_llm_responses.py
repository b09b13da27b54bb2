"""The Responses API client, the choice of API per model (auto switches on api.openai.com's
"only supported in v1/responses" answer), reasoning-model defaults and the call settings
kept in the store; over real HTTP against the project's fake endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import random
import urllib.request

import pytest

from evo.store import Store
from evo.store.schema import MIGRATIONS
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.health import ModelHealth
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
ANSWER = {"response": "the kernel", "reasoning": "r" * 400, "tokens_in": 3000, "tokens_out": 900,
          "cached_tokens": 2000, "repeat": True}


def _spec(srv: FakeLLMServer, model: str = "o3-pro", **kw) -> ModelSpec:
    base = dict(name="m", base_url=srv.base_url, model=model, key_env="EVO_TEST_UNSET_KEY", price_in_per_mtok=2.0,
                price_out_per_mtok=8.0, price_cached_input_per_mtok=0.5)
    base.update(kw)
    return ModelSpec(**base)


def _client(**kw) -> LLMClient:
    base = dict(timeout_s=5.0, max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.02, rng=random.Random(0))
    base.update(kw)
    return LLMClient(**base)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_switches_a_responses_only_model_to_the_responses_api(stream):
    with FakeLLMServer(Cassette([ANSWER]), dialect="openai", responses_only=["o3-pro"]) as srv:
        client = _client()
        spec = _spec(srv, reasoning_effort="high", stream=stream)
        first = client.complete(MSGS, model=spec)
        second = client.complete(MSGS, model=spec)
        reqs = list(srv.requests)
    assert [(r["path"], r["status"]) for r in reqs] == [("/v1/chat/completions", 404), ("/v1/responses", 200),
                                                         ("/v1/responses", 200)]
    assert first.ok and first.response == "the kernel" and first.api == "responses" and first.attempts == 2
    assert second.ok and second.attempts == 1 and client.api_for(spec) == "responses"
    body = reqs[1]["body"]
    assert body["instructions"] == "be brief" and body["input"] == [{"role": "user", "content": "hello"}]
    assert body["max_output_tokens"] == 32768 and body["reasoning"] == {"effort": "high"}
    assert "messages" not in body and "max_completion_tokens" not in body and "reasoning_effort" not in body
    # the Responses usage: input/output tokens, reasoning tokens, cached input at its own price
    assert (first.tokens_in, first.tokens_out, first.reasoning_tokens, first.cached_tokens) == (3000, 900, 100, 2000)
    assert first.cost == pytest.approx((1000 * 2.0 + 2000 * 0.5 + 900 * 8.0) / 1e6)
    assert first.finish_reason == "stop"


def test_a_model_pinned_to_chat_stops_with_the_fix():
    with FakeLLMServer(Cassette([ANSWER]), dialect="openai", responses_only=["o3-pro"]) as srv:
        spec = _spec(srv, api="chat")
        call = _client().complete(MSGS, model=spec)
        probe = _client().probe(spec)
        n = len(srv.requests)
    assert call.fatal == "wrong_api" and "only supported in v1/responses" in call.error and n == 2
    assert probe.fatal == "wrong_api"
    health = ModelHealth([spec])
    line = health.record("m", call)
    assert line is not None and 'set api = "responses"' in line


def test_the_probe_of_an_auto_model_finds_the_responses_api():
    with FakeLLMServer(Cassette([ANSWER]), dialect="openai", responses_only=["o3-pro"]) as srv:
        client = _client()
        probe = client.probe(_spec(srv))
        paths = [r["path"] for r in srv.requests]
    assert probe.ok and probe.api == "responses" and paths == ["/v1/chat/completions", "/v1/responses"]


def test_an_answer_cut_at_max_output_tokens_is_finish_length():
    cut = dict(ANSWER, finish_reason="length", response="")
    with FakeLLMServer(Cassette([cut]), dialect="openai") as srv:
        call = _client().complete(MSGS, model=_spec(srv, api="responses", max_output_tokens=1000))
        body = srv.requests[0]["body"]
    assert call.ok and call.finish_reason == "length" and call.response == "" and call.reasoning_tokens == 100
    assert body["max_output_tokens"] == 1000 and "reasoning" not in body


def test_the_fake_refuses_chat_fields_on_the_responses_api_as_openai_does():
    with FakeLLMServer(Cassette([ANSWER]), dialect="openai") as srv:
        req = urllib.request.Request(srv.base_url + "/responses", method="POST",
                                     data=json.dumps({"model": "gpt-4.1", "input": "hi", "max_tokens": 5}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
    err = json.loads(e.value.read())["error"]
    assert e.value.code == 400 and err["message"] == "Unknown parameter: 'max_tokens'." and err["param"] == "max_tokens"


# ---- reasoning-model defaults ----------------------------------------------------------------------


@pytest.mark.parametrize("kw, reasoning, max_out, timeout", [
    ({"model": "o4-mini"}, True, 32768, 600.0),
    ({"model": "Qwen/Qwen3-32B", "reasoning_effort": "high"}, True, 32768, 600.0),
    ({"model": "deepseek-ai/DeepSeek-R1"}, True, 32768, 600.0),
    ({"model": "gpt-4.1"}, False, 8192, None),
    ({"model": "o3", "reasoning_model": False}, False, 8192, None),
    ({"model": "o3", "max_output_tokens": 5000, "timeout_s": 90}, True, 5000, 90),
])
def test_reasoning_models_get_a_larger_output_budget_and_a_longer_timeout(kw, reasoning, max_out, timeout):
    spec = ModelSpec(name="m", base_url="http://127.0.0.1:1/v1", **kw)
    assert (spec.reasoning_model, spec.max_output_tokens, spec.timeout_s) == (reasoning, max_out, timeout)


def test_a_timed_out_reasoning_call_is_retried_once_not_at_full_cost_again():
    hangs = [{"delay_s": 5}, {"delay_s": 5}, {"response": "late"}]
    with FakeLLMServer(Cassette(hangs)) as srv:
        thinking = _client(max_attempts=4).complete(MSGS, model=_spec(srv, "o4-mini", timeout_s=0.3))
        sent = len(srv.requests)
    assert not thinking.ok and sent == 2 and thinking.attempts == 2 and thinking.retries == 1
    assert "retried at most 1 time" in thinking.error and thinking.usage_estimated
    with FakeLLMServer(Cassette(hangs)) as srv:
        plain = _client(max_attempts=4).complete(MSGS, model=_spec(srv, "gpt-4.1", timeout_s=0.3))
    assert plain.ok and plain.response == "late" and plain.attempts == 3


# ---- what the store keeps --------------------------------------------------------------------------


class _StoreV2(Store):
    migrations = MIGRATIONS[:2]


def test_calls_are_stored_with_finish_reason_reasoning_retries_and_request_settings(tmp_path):
    path = tmp_path / "old.db"
    with _StoreV2(path) as old:  # a database from before these columns
        rid = old.create_run("r", {}, seed=0, config_hash="")
        old.add_llm_call(rid, prompt="[]", response="x", model="m", prompt_hash="h0")
    with FakeLLMServer(Cassette([{"status": 500}, ANSWER]), dialect="openai") as srv:
        call = _client().complete(MSGS, model=_spec(srv, api="responses", reasoning_effort="low"))
    with Store(path) as s:
        s.add_llm_call(rid, **call.to_row())
        before, row = s.llm_calls(rid)
    assert before["api"] is None and before["retries"] is None and before["response"] == "x"
    assert (row["finish_reason"], row["reasoning_tokens"], row["cached_tokens"], row["retries"]) == ("stop", 100, 2000, 1)
    assert (row["api"], row["max_output_tokens"], row["reasoning_effort"], row["timeout_s"]) == ("responses", 32768,
                                                                                               "low", 600.0)
