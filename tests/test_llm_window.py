"""Context windows against the fake endpoint made as strict as vLLM and api.openai.com:
a prompt over the window is a 400 with the real body; the client reads the window, resends
once with less max_tokens when that fits, and otherwise reports a too-large prompt without
stopping the model; the mutator sizes later prompts to the reported window."""

from __future__ import annotations

import json
import random

import pytest

from evo.core.records import Candidate, Member
from mutators.base import MutationContext
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.http_errors import classify_http_error, context_overflow
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt.context import SimpleContextProvider
from mutators.llm.replay.cassette import Cassette
from tests.fakes.llm_prompt import kernel_source, task_info
from mutators.llm.replay.fake_server import FakeLLMServer

OPENAI_BODY = {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages "
                                    "resulted in 9000 tokens. Please reduce the length of the messages.",
                         "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
VLLM_BODY = {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested "
                                           "5000 tokens (4000 in the messages, 1000 in the completion). Please reduce "
                                           "the length of the messages or completion.",
             "type": "BadRequestError", "param": None, "code": 400}


def _spec(srv, **kw):
    return ModelSpec("m", srv.base_url, kw.pop("model", "m"), key_env="EVO_TEST_NO_KEY", **kw)


@pytest.mark.parametrize("body, window, prompt", [(OPENAI_BODY, 8192, 9000), (VLLM_BODY, 4096, 4000)])
def test_the_real_bodies_give_the_window_and_are_not_fatal(body, window, prompt):
    assert context_overflow(400, json.dumps(body)) == (window, prompt)
    assert classify_http_error(400, json.dumps(body))[0] is None, "not fatal"
    assert context_overflow(400, '{"error": {"message": "Invalid value for temperature"}}') is None


def test_vllm_window_resends_once_with_less_max_tokens():
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect="vllm", context_tokens=1000) as srv:
        client = LLMClient(timeout_s=5, max_attempts=1)
        # 504 prompt tokens + 800 > 1000: the window leaves 1000 - 504 - 16 = 480 for the answer
        call = client.complete([{"role": "user", "content": "x" * 2000}], model=_spec(srv, max_output_tokens=800))
        assert call.ok and call.response == "ok" and call.attempts == 2
        assert [r["status"] for r in srv.requests] == [400, 200]
        assert [r["body"]["max_tokens"] for r in srv.requests] == [800, 480]
        assert client.window("m") == 1000


def test_openai_prompt_over_the_window_is_too_large_not_fatal():
    with FakeLLMServer(Cassette([{"response": "ok", "repeat": True}]), dialect="openai", context_tokens=1000) as srv:
        client = LLMClient(timeout_s=5, max_attempts=3)
        call = client.complete([{"role": "user", "content": "x" * 6000}], model=_spec(srv, model="gpt-4.1",
                                                                                        max_output_tokens=500))
    assert call.too_large and call.fatal is None and call.window == 1000
    assert call.prompt_tokens_reported == 1504
    assert "your messages resulted in 1504 tokens" in call.error
    assert len(srv.requests) == 1, "no resend can fit: one request, not retried"
    assert client.window("m") == 1000


class _Provider(SimpleContextProvider):
    pass


_info = task_info
_src = kernel_source


def test_the_model_is_not_stopped_and_later_prompts_fit_the_reported_window():
    parent = Member(candidate=Candidate.create("t", _src(10), {}, operator="seed"), fitness=1.0)
    others = [(_src(150, 2.0), 1.3, {}), (_src(150, 3.0), 1.2, {})]
    prov = SimpleContextProvider({"t": _info()}, inspirations={("t", 0): others})
    window = 3000  # the fake counts ~4 characters a token: the full prompt is over it, the trimmed one well under half
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}]), dialect="vllm", context_tokens=window) as srv:
        spec = _spec(srv, max_output_tokens=window)  # no context_tokens: the window is unknown at start
        attempts, stops = [], []
        mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), [spec], prov, attempt_sink=attempts.append,
                         on_model_stop=lambda *a: stops.append(a))
        ctx = MutationContext("t", 0, 1)
        assert mut.propose([parent], ctx, random.Random(0)) is None
        assert not stops and [s.status for s in mut.health.states()] == ["ok"], "not stopped"
        assert "prompt too large for model 'm'" in attempts[0].problems[0]
        assert "window is 3000" in attempts[0].problems[0]
        assert mut.window(spec) == window and mut.prompt_budget(spec) == window // 2
        assert mut.calibrated("m"), "the 400's count of the prompt calibrates the estimate"
        assert mut.propose([parent], ctx, random.Random(1)) is None  # "no" is prose: rejected, but answered
        assert [r["status"] for r in srv.requests] == [400, 400, 200], "trimmed, then max_tokens reduced once"
        last = srv.requests[-1]
        assert "Left out to fit" in last["messages"][-1]["content"] and last["body"]["max_tokens"] < window
        assert "prose" in " ".join(attempts[1].problems) or attempts[1].call_error is None


# ---- sizes: a calibrated estimate, implausible counts ignored, only models the prompt fits -------------


def _mutator(srv, specs, prov=None, **kw):
    attempts = []
    mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), specs, prov or SimpleContextProvider({"t": _info()}),
                     attempt_sink=attempts.append, **kw)
    return mut, attempts


@pytest.mark.parametrize("tokens_in", [1, 10 ** 7], ids=["under", "over"])
def test_a_physically_implausible_usage_count_is_not_used(tokens_in):
    parent = Member(candidate=Candidate.create("t", _src(40), {}, operator="seed"), fitness=1.0)
    with FakeLLMServer(Cassette([{"response": "no", "tokens_in": tokens_in, "repeat": True}])) as srv:
        mut, _ = _mutator(srv, [_spec(srv, context_tokens=32768, max_output_tokens=4096)])
        mut.propose([parent], MutationContext("t", 0, 1), random.Random(0))
        assert len(srv.requests) == 1
    assert not mut.calibrated("m") and mut.chars_per_token("m") == 3.0


def test_an_uncalibrated_prompt_that_could_fit_is_sent_and_the_count_then_decides():
    parent = Member(candidate=Candidate.create("t", _src(400), {}, operator="seed"), fitness=1.0)
    ctx = MutationContext("t", 0, 1)
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}])) as srv:
        probe, _ = _mutator(srv, [_spec(srv)])
        msgs = probe.render("optimize", parent, ctx, _spec(srv), chain="x").messages
        chars = sum(len(m["content"]) for m in msgs)
        window = int(chars / 3.6) + 1000  # over at 3 characters a token, under at 4.5
        spec = _spec(srv, context_tokens=window, max_output_tokens=1000)
        mut, attempts = _mutator(srv, [spec])
        first = mut.render("optimize", parent, ctx, spec, chain=parent.id)
        assert first.tokens > first.budget and first.fits, "over the conservative estimate, yet sent on trial"
        srv.cassette = Cassette([{"response": "no", "tokens_in": int(chars / 3.1) + 16, "repeat": True}])
        mut.propose([parent], ctx, random.Random(0))
        assert len(srv.requests) == 1, "sent"
        assert mut.calibrated("m") and 2.9 < mut.chars_per_token("m") < 3.0
        mut.propose([parent], ctx, random.Random(1))
        assert len(srv.requests) == 1, "calibrated at 3.1 characters a token: it does not fit, not sent"
        assert "not sent" in attempts[-1].problems[0]


def test_only_models_the_prompt_fits_are_chosen():
    parent = Member(candidate=Candidate.create("t", _src(200), {}, operator="seed"), fitness=1.0)
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}])) as srv:
        small = ModelSpec("small", srv.base_url, "small-8k", key_env="EVO_TEST_NO_KEY", weight=5.0,
                          context_tokens=1200, max_output_tokens=1000)
        big = ModelSpec("big", srv.base_url, "big-128k", key_env="EVO_TEST_NO_KEY", weight=1.0,
                        context_tokens=131072, max_output_tokens=4096)
        mut, attempts = _mutator(srv, [small, big])
        for i in range(6):
            mut.propose([parent], MutationContext("t", 0, 1), random.Random(i))
        assert [r["model"] for r in srv.requests] == ["big-128k"] * 6
        assert not any("too large" in " ".join(a.problems) for a in attempts)
