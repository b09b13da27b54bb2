"""Prompt sizes counted where a tokenizer is known, against the project's fake endpoint:

- a vLLM server's ``POST /tokenize`` (the fake's vLLM dialect answers it exactly in vLLM's
  shape, counting as its window check does): a prompt the character estimate would trim,
  or send on trial into a 400, is decided by the server's count; a server without the route
  (404) falls back to the estimate, said once, asked once;
- OpenAI encodings (optional ``bpe-openai``): a tiny fake encoding stands in for it, so the
  selection (model id -> encoding, none for other ids, nothing without the package) and its
  use are tested with nothing installed; one test uses the real package when present.
"""

from __future__ import annotations

import json
import logging
import random
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from evo.cli import app
from evo.core.records import Candidate, Member
from mutators.base import MutationContext
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.client.tokenize import ServerTokenCounter
from mutators.llm.mutator import LLMMutator
from mutators.llm.prompt import tokens
from mutators.llm.prompt.context import SimpleContextProvider
from mutators.llm.prompt.tokens import EncodingCounter, FirstCounter, encoding_for
from mutators.llm.replay.cassette import Cassette
from tests.fakes.llm_prompt import kernel_source, task_info
from mutators.llm.replay.fake_server import FakeLLMServer, prompt_tokens
from tests.fakes.instant_compile import patch_compiles
from tests.fakes.llm_config import write_llm_config

CTX = MutationContext("t", 0, 1)


_info = task_info
_src = kernel_source


PARENT = Member(candidate=Candidate.create("t", _src(60), {}, operator="seed"), fitness=1.0)


def _provider(inspirations=False):
    others = [(_src(150, 2.0), 1.3, {}), (_src(150, 3.0), 1.2, {})] if inspirations else []
    return SimpleContextProvider({"t": _info()}, inspirations={("t", 0): others})


def _spec(srv, model="m", **kw):
    return ModelSpec("m", srv.base_url, model, key_env="EVO_TEST_NO_KEY", **kw)


def _mutator(spec, provider, counter=None):
    attempts = []
    mut = LLMMutator(LLMClient(timeout_s=5, max_attempts=1), [spec], provider, attempt_sink=attempts.append,
                     token_counter=counter)
    return mut, attempts


def _shortest(srv, provider, model="m"):
    """The optimize prompt with every optional part left out (a window nothing fits)."""
    mut, _ = _mutator(_spec(srv, model, context_tokens=200, max_output_tokens=100), provider)
    return mut.render("optimize", PARENT, CTX, mut.models[0], chain="x").messages


def _chat(srv):
    return [r for r in srv.requests if r["path"] != "/tokenize"]


# ---- the fake's /tokenize is vLLM's ----------------------------------------------------------


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_fakes_tokenize_route_answers_in_vllms_shape():
    msgs = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "u" * 400}]
    with FakeLLMServer(Cassette([]), dialect="vllm", models=["q"], context_tokens=4096) as srv:
        root = srv.base_url.removesuffix("/v1")
        st, chat = _post(f"{root}/tokenize", {"model": "q", "messages": msgs})
        st2, plain = _post(f"{root}/tokenize", {"model": "q", "prompt": "x" * 40})
        st3, unknown = _post(f"{root}/tokenize", {"model": "other", "messages": msgs})
        st4, bad = _post(f"{root}/tokenize", {"model": "q"})
        st5, under_v1 = _post(f"{srv.base_url}/tokenize", {"model": "q", "messages": msgs})
    assert st == 200 and sorted(chat) == ["count", "max_model_len", "token_strs", "tokens"]
    assert chat["count"] == prompt_tokens(msgs) == len(chat["tokens"]) and chat["max_model_len"] == 4096
    assert st2 == 200 and plain["count"] == 11
    assert st3 == 404 and unknown["type"] == "NotFoundError" and unknown["object"] == "error"
    assert st4 == 400 and bad["type"] == "BadRequestError"
    assert st5 == 404 and under_v1 == {"detail": "Not Found"}, "served at the root, not under /v1"
    with FakeLLMServer(Cassette([]), dialect="openai") as srv:
        assert _post(srv.base_url.removesuffix("/v1") + "/tokenize", {"messages": msgs})[0] == 404, "vLLM's alone"


# ---- vLLM: the server's count decides -------------------------------------------------------


def test_a_prompt_the_estimate_would_trim_is_sent_whole_by_the_servers_count():
    prov = _provider(inspirations=True)
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}]), dialect="vllm", models=["m"]) as srv:
        whole = _mutator(_spec(srv), prov)[0].render("optimize", PARENT, CTX, _spec(srv), chain="x").messages
        chars = sum(len(m["content"]) for m in whole)
        budget = int(chars / 3.5)  # over at 3 characters a token, under the fake's count (~4)
        assert prompt_tokens(whole) < budget < chars / 3
        srv.context_tokens = budget + 1000
        spec = _spec(srv, context_tokens=budget + 1000, max_output_tokens=1000)
        counter = ServerTokenCounter()
        for c in (None, counter):
            mut, _ = _mutator(spec, prov, c)
            mut.propose([PARENT], CTX, random.Random(0))
            mut.render("optimize", PARENT, CTX, spec, chain="y")  # the same prompt again: counted once
    estimated, counted = _chat(srv)
    assert "Left out to fit" in estimated["messages"][-1]["content"], "the estimate trims it"
    assert "Left out to fit" not in counted["messages"][-1]["content"], "the server's count sends it whole"
    assert counted["status"] == 200
    asked = [r for r in srv.requests if r["path"] == "/tokenize"]
    assert len(asked) == counter.requests == 1 and asked[0]["body"]["messages"] == counted["messages"]
    assert asked[0]["body"]["model"] == "m"


def _trial_window(srv, prov):
    """A window the shortest prompt is over by the fake's count but under at 4.5 characters a
    token: the uncounted estimate sends it on trial and meets the server's 400."""
    short = _shortest(srv, prov)
    chars = sum(len(m["content"]) for m in short)
    budget = prompt_tokens(short) - 60
    assert chars / 4.5 + 16 < budget, "the estimate sends it on trial"
    return budget + 100


@pytest.mark.parametrize("tokenize", [True, False], ids=["counted", "no-route-falls-back"])
def test_a_prompt_over_the_window_is_not_sent_when_the_server_counts_it(tokenize, caplog):
    prov = _provider()
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}]), dialect="vllm", models=["m"],
                       tokenize=tokenize) as srv:
        window = _trial_window(srv, prov)
        srv.context_tokens = window
        spec = _spec(srv, context_tokens=window, max_output_tokens=100)
        counter = ServerTokenCounter()
        mut, attempts = _mutator(spec, prov, counter)
        with caplog.at_level(logging.WARNING, logger="mutators.llm.client.tokenize"):
            for i in range(2):
                mut.propose([PARENT], CTX, random.Random(i))
    asked = [r["status"] for r in srv.requests if r["path"] == "/tokenize"]
    said = [r for r in caplog.records if "/tokenize" in r.getMessage()]
    if tokenize:
        assert _chat(srv) == [], "counted over the window: never sent"
        assert all("prompt too large" in a.problems[0] and "not sent" in a.problems[0] for a in attempts)
        assert asked and set(asked) == {200} and not said
        assert mut.counter_name(spec).startswith("the vLLM server's POST ")
    else:  # the estimate's trial, as without a counter: the 400 then sizes the next prompt
        assert [r["status"] for r in _chat(srv)][:1] == [400]
        assert asked == [] and counter.requests == 1, "asked once (a 404: no route), not again"
        assert len(said) == 1 and "HTTP 404" in said[0].getMessage() and "estimated" in said[0].getMessage()
        assert mut.counter_name(spec) is None


def test_a_server_that_is_not_vllm_is_not_asked():
    with FakeLLMServer(Cassette([]), dialect="lenient", context_tokens=4096) as srv:
        counter = ServerTokenCounter()
        spec = _spec(srv, context_tokens=4096, max_output_tokens=1024)
        assert counter.count(spec, [{"role": "user", "content": "hi"}]) is None and counter.name(spec) is None
    assert counter.requests == 0 and srv.requests == []


# ---- OpenAI encodings (bpe-openai, optional) ------------------------------------------------


class FakeEncoding:
    """tiktoken's ``encode_ordinary``, one token per ``cpt`` characters."""

    def __init__(self, cpt: int) -> None:
        self.cpt = cpt

    def encode_ordinary(self, text: str) -> list[int]:
        return list(range(len(text) // self.cpt))


def test_openai_model_ids_map_to_their_encoding_and_other_ids_to_none():
    o200k = ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini-2025-04-14", "openai/gpt-5", "gpt-5.1", "o1",
             "o3-mini", "o4-mini", "chatgpt-4o-latest", "ft:gpt-4o-mini:acme::x1"]
    cl100k = ["gpt-4", "gpt-4-turbo", "gpt-4-0613", "gpt-3.5-turbo", "gpt-3.5-turbo-0125"]
    other = ["Qwen/Qwen2.5-Coder-32B-Instruct", "llama3", "deepseek-r1", "o5", "gpt-40", "claude-opus", "m"]
    assert [encoding_for(m) for m in o200k] == ["o200k_base"] * len(o200k)
    assert [encoding_for(m) for m in cl100k] == ["cl100k_base"] * len(cl100k)
    assert [encoding_for(m) for m in other] == [None] * len(other)


def test_the_encoding_is_loaded_only_for_a_known_id_and_not_counted_without_the_package():
    loaded = []
    counter = EncodingCounter(load=lambda name: loaded.append(name) or FakeEncoding(4))
    msgs = [{"role": "user", "content": "x" * 400}]
    qwen = ModelSpec("q", "http://127.0.0.1:9/v1", "Qwen/Qwen2.5-Coder-32B-Instruct", key_env="EVO_TEST_NO_KEY")
    gpt = ModelSpec("g", "http://127.0.0.1:9/v1", "gpt-4.1", key_env="EVO_TEST_NO_KEY")
    assert counter.count(qwen, msgs) is None and counter.name(qwen) is None and loaded == []
    assert counter.count(gpt, msgs) == 3 + 3 + 1 + 100 and loaded == ["o200k_base"]  # framing + role + content
    assert counter.count(gpt, msgs) == 107 and loaded == ["o200k_base"], "loaded once"
    absent = EncodingCounter(load=lambda name: None)  # bpe-openai not installed
    assert absent.count(gpt, msgs) is None and absent.name(gpt) is None


@pytest.mark.parametrize("cpt, divisor, sent_estimated, sent_counted", [
    (6, 5.0, False, True),  # over at 4.5 characters a token: the estimate refuses; the encoding fits it
    (2, 4.0, True, False),  # over at 3, under at 4.5: sent on trial; the encoding says it is over
], ids=["estimate-refuses", "estimate-sends"])
def test_a_known_encoding_decides_what_the_estimate_gets_wrong(cpt, divisor, sent_estimated, sent_counted):
    prov = _provider()
    with FakeLLMServer(Cassette([{"response": "no", "repeat": True}]), dialect="openai") as srv:
        chars = sum(len(m["content"]) for m in _shortest(srv, prov, "gpt-4.1"))
        spec = _spec(srv, "gpt-4.1", context_tokens=int(chars / divisor) + 100, max_output_tokens=100)
        sent = []
        for counter in (None, FirstCounter(EncodingCounter(load=lambda name: FakeEncoding(cpt)))):
            before = len(srv.requests)
            mut, attempts = _mutator(spec, prov, counter)
            mut.propose([PARENT], CTX, random.Random(0))
            sent.append(len(srv.requests) > before)
    assert sent == [sent_estimated, sent_counted]


def _dry_run_config(tmp_path, model):
    return write_llm_config(tmp_path, [{"name": "gpt", "base_url": "http://127.0.0.1:9/v1", "model": model,
                                        "key_env": "EVO_TEST_NO_KEY", "context_tokens": 128000,
                                        "max_output_tokens": 8192}])


@pytest.mark.parametrize("installed", [True, False])
def test_the_dry_run_says_which_counter_each_model_uses(tmp_path, monkeypatch, installed):
    patch_compiles(monkeypatch)
    monkeypatch.setattr(tokens, "load_bpe_openai", lambda name: FakeEncoding(4) if installed else None)
    res = CliRunner().invoke(app, ["search", str(_dry_run_config(tmp_path, "gpt-4.1")), "--dry-run",
                                   "--no-progress", "--no-probe"])
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("tokens of model gpt: ")]
    (prompt,) = [ln for ln in res.output.splitlines() if ln.startswith("prompt kb19_relu")]
    if installed:
        assert line == "tokens of model gpt: counted by o200k_base (test_llm_tokens)", line
        assert "tokens counted)" in prompt
    else:
        assert "estimated from characters" in line and "pip install 'cute-evo[tokens]'" in line, line
        assert "counted" not in prompt


def test_bpe_openai_counts_when_installed():
    """Skipped where the optional package is absent (CI); here it is the real tokenizer."""
    pytest.importorskip("bpe_openai")
    gpt = ModelSpec("g", "http://127.0.0.1:9/v1", "gpt-4.1", key_env="EVO_TEST_NO_KEY")
    counter = EncodingCounter()
    # o200k_base: "hello world" is 2 tokens, "user" 1; 3 a message and 3 for the reply
    assert counter.count(gpt, [{"role": "user", "content": "hello world"}]) == 9
    assert counter.name(gpt).startswith("o200k_base (bpe_openai ")
    cl = ModelSpec("c", "http://127.0.0.1:9/v1", "gpt-4", key_env="EVO_TEST_NO_KEY")
    assert counter.name(cl).startswith("cl100k_base (bpe_openai ")
