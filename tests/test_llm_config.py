"""Per-model request settings: [[llm.models]] keys -> ModelSpec -> the JSON body actually sent.

The body is asserted on what the fake endpoint received over real HTTP (127.0.0.1), so a
setting that the config accepts but the client drops would fail here.
"""

from __future__ import annotations

import random

import pytest

from evo.config import ConfigError, LLMModelConfig, parse_config
from mutators.llm.replay.cassette import Cassette
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import LLMConfigError, ModelSpec, is_openai_reasoning_model
from mutators.llm.replay.fake_server import FakeLLMServer

MINIMAL = {"tasks": {"include": ["kb19_relu"]}, "mutator": {"kind": "llm"}}
MODEL = {"name": "m", "base_url": "http://127.0.0.1:8000/v1", "model": "Qwen/Qwen3-32B"}
MSGS = [{"role": "user", "content": "hi"}]


def _cfg(**model_keys):
    return parse_config({**MINIMAL, "llm": {"models": [{**MODEL, **model_keys}]}}, source="x.toml")


def _err(**model_keys) -> str:
    with pytest.raises(ConfigError) as ei:
        _cfg(**model_keys)
    return str(ei.value)


@pytest.mark.parametrize("model_id, reasoning", [
    ("o1", True), ("o1-mini", True), ("o3-mini-2025-01-31", True), ("o4-mini", True), ("gpt-5", True),
    ("gpt-5-mini", True), ("gpt-5.1", True), ("openai/gpt-5", True), ("GPT-5.2-codex", True),
    ("gpt-4.1", False), ("gpt-4o", False), ("Qwen/Qwen3-32B", False), ("o2", False), ("gpt-50", False),
    ("llama-3-o1", False),
])
def test_reasoning_family_detection(model_id, reasoning):
    assert is_openai_reasoning_model(model_id) is reasoning


def test_config_keys_map_one_to_one_onto_model_spec():
    """search._make_llm_mutator builds ModelSpec(**entry.model_dump()): every key must be a field."""
    cfg = _cfg(max_output_tokens=1000, token_param="max_completion_tokens", temperature=0.3, top_p=0.9,
               reasoning_effort="low", extra_body={"chat_template_kwargs": {"enable_thinking": False}},
               context_tokens=32768, stream=True, timeout_s=30, concurrency=2)
    spec = ModelSpec(**cfg.llm.models[0].model_dump())
    assert (spec.max_output_tokens, spec.token_field, spec.temperature, spec.top_p) == (1000, "max_completion_tokens",
                                                                                       0.3, 0.9)
    assert spec.reasoning_effort == "low" and spec.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert (spec.context_tokens, spec.stream, spec.timeout_s, spec.concurrency) == (32768, True, 30, 2)
    assert set(LLMModelConfig.model_fields) <= set(ModelSpec.__dataclass_fields__)


def test_defaults_leave_sampling_to_the_endpoint():
    spec = ModelSpec(**_cfg().llm.models[0].model_dump())
    assert spec.request_fields() == {"model": "Qwen/Qwen3-32B", "max_tokens": 8192}


@pytest.mark.parametrize("keys, expect", [
    ({"reasoning_effort": "extreme"}, 'llm.models[0].reasoning_effort = "extreme": allowed: "none", "minimal", '
                                      '"low", "medium", "high" or "xhigh"'),
    ({"token_param": "max_new_tokens"}, 'llm.models[0].token_param = "max_new_tokens": did you mean "max_tokens"? '
                                        'allowed: "auto", "max_tokens" or "max_completion_tokens"'),
    ({"temperature": 2.5}, "llm.models[0].temperature = 2.5: must be between 0 and 2"),
    ({"top_p": 0}, "llm.models[0].top_p = 0: must be > 0"),
    ({"context_tokens": 100}, "llm.models[0].context_tokens = 100: must be >= 256"),
    ({"context_tokens": 4096, "max_output_tokens": 8192},
     "llm.models[0].context_tokens = 4096: must be larger than max_output_tokens = 8192"),
    ({"stream": "yes"}, 'llm.models[0].stream = "yes": must be true or false'),
    ({"timeout_s": 0}, "llm.models[0].timeout_s = 0: must be > 0"),
    ({"concurrency": 0}, "llm.models[0].concurrency = 0: must be between 1 and 256"),
    ({"extra_body": {"temperature": 0.1}}, "llm.models[0].extra_body.temperature: set by a typed key"),
    ({"max_tokens": 100}, "did you mean 'llm.models[0].max_output_tokens'?"),
    ({"model": "o3-mini", "temperature": 0.7},
     'llm.models[0].temperature = 0.7: model "o3-mini" is an OpenAI reasoning model, which accepts only temperature 1'),
    ({"model": "gpt-5", "top_p": 0.9}, 'llm.models[0].top_p = 0.9: model "gpt-5" is an OpenAI reasoning model'),
], ids=lambda v: str(v)[:40])
def test_validation_errors_name_key_value_and_what_is_allowed(keys, expect):
    msg = _err(**keys)
    assert expect in msg, msg
    assert msg.startswith("x.toml: ")


def test_reasoning_rules_do_not_apply_when_the_user_says_max_tokens():
    spec = ModelSpec(**_cfg(model="gpt-5", token_param="max_tokens", temperature=0.2).llm.models[0].model_dump())
    # OpenAI's parameter rules do not apply, but gpt-5 still reasons: the reasoning output budget
    assert not spec.reasoning and spec.request_fields()["max_tokens"] == 32768
    assert _cfg(model="o3", temperature=1).llm.models[0].temperature == 1


def test_model_spec_checks_the_same_rules():
    base = dict(name="m", base_url="http://127.0.0.1:1/v1", model="x")
    for bad, match in [({"token_param": "n"}, "token_param='n'; allowed: auto, max_tokens, max_completion_tokens"),
                       ({"reasoning_effort": "max"}, "reasoning_effort='max'; allowed"),
                       ({"extra_body": {"stream": True}}, "extra_body sets stream"),
                       ({"context_tokens": 10, "max_output_tokens": 10}, "context_tokens=10 must be larger"),
                       ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
                       ({"concurrency": 0}, "concurrency=0 must be >= 1")]:
        with pytest.raises(LLMConfigError, match=match):
            ModelSpec(**base, **bad)


# ---- what goes on the wire --------------------------------------------------------------------


def _sent(spec_kw: dict, **client_kw) -> dict:
    with FakeLLMServer(Cassette([{"response": "ok"}])) as srv:
        spec = ModelSpec(name="m", base_url=srv.base_url, key_env="EVO_TEST_UNSET_KEY", **spec_kw)
        call = LLMClient(timeout_s=5, max_attempts=1, rng=random.Random(0), **client_kw).complete(MSGS, model=spec)
        assert call.ok, call.error
        return srv.requests[0]["body"]


def test_reasoning_model_gets_max_completion_tokens_and_no_sampling_fields():
    body = _sent({"model": "o4-mini", "max_output_tokens": 5000, "reasoning_effort": "high"})
    assert body["max_completion_tokens"] == 5000 and "max_tokens" not in body
    assert body["reasoning_effort"] == "high" and "temperature" not in body and "top_p" not in body
    assert "stream" not in body


def test_plain_model_gets_max_tokens_and_only_the_sampling_fields_set():
    body = _sent({"model": "Qwen/Qwen3-32B", "max_output_tokens": 700, "temperature": 0.6,
                  "extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20}})
    assert body["max_tokens"] == 700 and "max_completion_tokens" not in body
    assert body["temperature"] == 0.6 and "top_p" not in body and "reasoning_effort" not in body
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_k"] == 20
    assert body["model"] == "Qwen/Qwen3-32B" and body["messages"] == MSGS


def test_explicit_token_param_wins():
    assert "max_completion_tokens" in _sent({"model": "llama", "token_param": "max_completion_tokens"})
    assert "max_tokens" in _sent({"model": "gpt-5", "token_param": "max_tokens"})


def test_per_model_timeout_overrides_the_client_timeout():
    import time

    with FakeLLMServer(Cassette([{"response": "late", "delay_s": 3.0, "repeat": True}])) as srv:
        fast = ModelSpec(name="fast", base_url=srv.base_url, model="x", key_env="EVO_TEST_UNSET_KEY", timeout_s=0.2)
        client = LLMClient(timeout_s=5, max_attempts=1)
        t = time.monotonic()
        call = client.complete(MSGS, model=fast)
        assert time.monotonic() - t < 2.0 and "timeout after 0.2s" in call.error
        slow = ModelSpec(name="slow", base_url=srv.base_url, model="x", key_env="EVO_TEST_UNSET_KEY")
        assert client.complete(MSGS, model=slow).ok


def test_per_model_concurrency_caps_that_model_only():
    import threading

    with FakeLLMServer(Cassette([{"response": "a", "delay_s": 0.3, "repeat": True}])) as srv:
        one = ModelSpec(name="one", base_url=srv.base_url, model="x", key_env="EVO_TEST_UNSET_KEY", concurrency=1)
        client = LLMClient(timeout_s=5, max_attempts=1, concurrency=8)
        threads = [threading.Thread(target=client.complete, args=(MSGS,), kwargs={"model": one}) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        starts = sorted(r["time"] for r in srv.requests)
    # one at a time: each request starts after the previous one's 0.3 s answer
    assert starts[1] - starts[0] >= 0.25 and starts[2] - starts[1] >= 0.25


def test_zero_prices_with_a_budget_warn_once_per_model(caplog):
    from mutators.llm.client.budget import Budget

    free = ModelSpec(name="free", base_url="http://127.0.0.1:9/v1", model="x")
    paid = ModelSpec(name="paid", base_url="http://127.0.0.1:9/v1", model="x", price_in_per_mtok=1.0)
    with caplog.at_level("WARNING", logger="mutators.llm.client.chat"):
        LLMClient([free, paid], budget=Budget(5.0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'free'" in lines[0] and "llm.budget_usd = 5 does not limit its calls" in lines[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="mutators.llm.client.chat"):
        LLMClient([free])  # no budget: nothing to warn about
    assert not caplog.records


def test_make_mutator_wires_the_llm_section(tmp_path):
    from evo.engine.search import make_mutator
    from evo.store import Store

    cfg = parse_config({**MINIMAL, "llm": {
        "models": [{**MODEL, "context_tokens": 32768, "stream": True}], "repair_rounds": 2, "repair_per_lineage": 5,
        "breaker_failures": 4, "breaker_cooldown_s": 9.0, "breaker_trips": 2}}, source="x.toml")
    with Store(tmp_path / "e.db") as store:
        run = store.create_run("w", {}, seed=0, config_hash="x")
        mut = make_mutator(cfg, store=store, run_id=run)
        (spec,) = mut.models
        assert (spec.context_tokens, spec.stream, spec.token_field) == (32768, True, "max_tokens")
        assert (mut.repairs.rounds, mut.repairs.per_lineage) == (2, 5)
        assert (mut.health.failures, mut.health.cooldown_s, mut.health.trips) == (4, 9.0, 2)
        # a stop is recorded as an event of the run
        mut.health.on_stop("m", "model 'm' stopped: test")
        assert any(e["kind"] == "llm_model_stopped" for e in store.events(run))
