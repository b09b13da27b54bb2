"""Failures that cannot heal stop a model at once; repeated transient failures open its
circuit breaker; with no model left the mutator raises NoModelLeft (a MutatorStopped).

Measured before this change: an endpoint answering 401 on every call got 600 requests (3 x
max_evaluations) before the engine stopped. Here one request stops the model.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evo.core.records import Candidate, Member
from mutators.base import MutationContext, MutatorStopped
from mutators.llm.replay.cassette import Cassette
from mutators.llm.client.calls import LLMCall
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.http_errors import classify_http_error
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer
from mutators.llm.client.health import ModelHealth, NoModelLeft
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import SimpleContextProvider, TaskInfo
from mutators.llm.answer.patch import Block, render_blocks

FIX = Path(__file__).parent / "fixtures" / "llm"
GOOD = (FIX / "tiny_kernel.cu").read_text()
TASK = "tiny_copy"
INFO = TaskInfo(reference_src="def reference(x):\n    return x.clone()", abi_text="// abi", shapes_text="- N=8",
                dtype="float32", tolerance_text="exact")
PATCH = render_blocks([Block("  if (i < n) d(i) = s(i);\n", "  if (i < n) d(i) = s(i) + 0.0f;\n")])
PARENT = Member(candidate=Candidate.create(TASK, GOOD, {}, operator="seed"), fitness=1.0)


def _mutator(server, names=("a",), **health_kw):
    url = server if isinstance(server, str) else server.base_url
    models = [ModelSpec(n, url, f"model-{n}", key_env="EVO_TEST_NO_KEY") for n in names]
    stops: list[tuple[str, str]] = []
    health = ModelHealth(models, on_stop=lambda n, line: stops.append((n, line)), **health_kw)
    client = LLMClient(timeout_s=2, max_attempts=1, backoff_base_s=0.01, rng=random.Random(0))
    waits: list[float] = []
    mut = LLMMutator(client, models, SimpleContextProvider({TASK: INFO}), health=health, sleep=waits.append)
    return mut, stops, waits


def _propose(mut, i=0):
    return mut.propose([PARENT], MutationContext(TASK, 0, 1), random.Random(i))


@pytest.mark.parametrize("status, body, kind", [
    (401, {"error": {"message": "Incorrect API key provided: sk-abc. You can find your API key at "
                                "https://platform.openai.com/account/api-keys.", "type": "invalid_request_error",
                     "param": None, "code": "invalid_api_key"}}, "auth"),
    (404, {"error": {"message": "The model `gpt-9` does not exist or you do not have access to it.",
                     "type": "invalid_request_error", "param": None, "code": "model_not_found"}}, "model_not_found"),
    (400, {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                                "'max_completion_tokens' instead.", "type": "invalid_request_error",
                     "param": "max_tokens", "code": "unsupported_parameter"}}, "unsupported_parameter"),
    (429, {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                     "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}, "quota"),
], ids=["401", "404", "400-unsupported", "429-quota"])
def test_a_fatal_answer_stops_the_model_after_one_request(status, body, kind):
    import json

    with FakeLLMServer(Cassette([{"status": status, "raw": json.dumps(body), "repeat": True}])) as srv:
        mut, stops, _ = _mutator(srv)
        assert _propose(mut) is None
        assert len(srv.requests) == 1
        with pytest.raises(NoModelLeft) as ei:
            _propose(mut)
        assert len(srv.requests) == 1, "no request after the model was stopped"
    assert isinstance(ei.value, MutatorStopped)
    (name, line), = stops
    assert name == "a" and f"[fatal:{kind}]" in line and "\n" not in line
    assert "model 'a' stopped" in str(ei.value)
    assert mut.last_failure.call_error and f"[fatal:{kind}]" in mut.last_failure.call_error


def test_each_model_is_stopped_by_its_own_fatal_answer_then_no_model_is_left():
    with FakeLLMServer(Cassette([{"status": 401, "repeat": True}])) as srv:
        mut, stops, _ = _mutator(srv, names=("bad", "worse"))
        assert _propose(mut, 0) is None and _propose(mut, 1) is None
        with pytest.raises(NoModelLeft) as ei:
            _propose(mut, 2)
        assert len(srv.requests) == 2 and {r["model"] for r in srv.requests} == {"model-bad", "model-worse"}
    assert {n for n, _ in stops} == {"bad", "worse"}
    assert "'bad'" in str(ei.value) and "'worse'" in str(ei.value)


def test_one_stopped_model_leaves_the_bandit_to_the_rest():
    with FakeLLMServer(Cassette([{"response": PATCH, "repeat": True}])) as srv:
        mut, stops, _ = _mutator(srv, names=("x", "y"))
        # stop x by hand (as a 401 would), then every proposal goes to y
        mut.health.record("x", LLMCall("x", "h", (), "", error="HTTP 401 [fatal:auth] (not retried): bad key"))
        for i in range(4):
            assert _propose(mut, i) is not None
        assert {r["model"] for r in srv.requests} == {"model-y"} and len(srv.requests) == 4
    assert [n for n, _ in stops] == ["x"]


def test_breaker_opens_after_failures_in_a_row_then_waits_and_stops_after_trips():
    with FakeLLMServer(Cassette([{"status": 503, "repeat": True}])) as srv:
        mut, stops, waits = _mutator(srv, failures=2, cooldown_s=7.0, trips=2)
        assert _propose(mut) is None and _propose(mut) is None       # 2 failures: breaker opens (trip 1)
        assert [s.status for s in mut.health.states()] == ["open"]
        assert _propose(mut) is None                                  # no other model: waits 7 s, half-open try
        assert waits == [7.0]
        with pytest.raises(NoModelLeft, match="circuit breaker: 2 openings without a successful call"):
            _propose(mut)                                             # half-open failure: trip 2 = stopped
        assert len(srv.requests) == 3
    assert len(stops) == 1 and "HTTP 503" in stops[0][1]


def test_a_success_closes_the_breaker_and_forgets_the_trips():
    cas = Cassette([{"status": 503}, {"status": 503}, {"response": PATCH}, {"status": 503}, {"status": 503},
                    {"response": PATCH.replace("0.0f", "1.0f")}])
    with FakeLLMServer(cas) as srv:
        mut, stops, waits = _mutator(srv, failures=2, cooldown_s=1.0, trips=2)
        results = [_propose(mut, i) for i in range(6)]
    assert [r is not None for r in results] == [False, False, True, False, False, True]
    assert waits == [1.0, 1.0] and not stops  # each outage opened the breaker once, then healed


def test_open_model_sits_out_while_another_is_usable():
    with FakeLLMServer(Cassette([{"response": PATCH, "repeat": True}])) as srv:
        mut, _, waits = _mutator(srv, names=("flaky", "ok"), failures=1, trips=5)
        mut.health.record("flaky", LLMCall("flaky", "h", (), "", error="timeout after 2s (gave up after 1 attempts)"))
        picks = []
        for i in range(3):
            _propose(mut, i)
            picks.append(srv.requests[-1]["model"])
    assert picks[0] == "model-ok" and not waits  # open for failures * 1 = 1 choice, then half-open again
    assert "model-flaky" in picks[1:]


def test_replayed_fatal_errors_stop_the_model_the_same_way():
    from mutators.llm.replay.cassette import ReplayClient
    from mutators.llm.client.calls import prompt_hash

    mut, stops, _ = _mutator("http://127.0.0.1:9/v1")
    msgs = mut.render("optimize", PARENT, MutationContext(TASK, 0, 1), mut.models[0], chain=PARENT.id).messages
    rows = [{"prompt_hash": prompt_hash(msgs, "model-a"), "response": "",
             "error": "HTTP 404 [fatal:model_not_found] (not retried): The model `model-a` does not exist."}]
    mut.client = ReplayClient(rows)
    assert _propose(mut) is None
    with pytest.raises(NoModelLeft, match="model_not_found"):
        _propose(mut)


@pytest.mark.parametrize("status, body, fatal, retry", [
    (500, "oops", None, True), (502, "", None, True), (408, "", None, True), (409, "", None, True),
    (429, '{"error": {"message": "Rate limit reached for gpt-4o", "type": "tokens", "code": "rate_limit_exceeded"}}',
     None, True),
    (400, '{"error": {"message": "Invalid \'messages[1].content\': string too long.", "type": "invalid_request_error"}}',
     None, False),
    (400, '{"error": {"message": "Unsupported value: \'temperature\' does not support 0.7 with this model. Only the '
          'default (1) value is supported.", "type": "invalid_request_error", "param": "temperature", '
          '"code": "unsupported_value"}}', "unsupported_parameter", False),
    (400, '{"error": {"message": "This model\'s maximum context length is 128000 tokens. However, your messages '
          'resulted in 130000 tokens.", "type": "invalid_request_error", "param": "messages", '
          '"code": "context_length_exceeded"}}', None, False),  # not fatal: tests/test_llm_context.py
    (403, "Forbidden", "forbidden", False),
    (404, '{"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}',
     "model_not_found", False),
])
def test_classify_http_error(status, body, fatal, retry):
    kind, retryable, detail = classify_http_error(status, body)
    assert (kind, retryable) == (fatal, retry)
    assert "\n" not in detail
