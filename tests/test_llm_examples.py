"""The example LLM configs (configs/examples/openai_reasoning.toml, vllm.toml) pass their dry
run against the project's fake endpoint, with only base_url (and the database) pointed
elsewhere: the OpenAI one in the openai dialect through the Responses API, the vLLM one in
the vllm dialect with its window read from the server's model list and its prompts counted
by the server's /tokenize."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evo.cli import app
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer
from tests.fakes.instant_compile import patch_compiles

EXAMPLES = Path(__file__).resolve().parent.parent / "configs" / "examples"
QWEN = "Qwen/Qwen2.5-Coder-32B-Instruct"




@pytest.fixture()
def compiles(monkeypatch):
    return patch_compiles(monkeypatch)


def _pointed_at(example: str, base_url: str, tmp_path: Path) -> Path:
    text = (EXAMPLES / example).read_text()
    text, n = re.subn(r'(?m)^base_url = "[^"]*"', f'base_url = "{base_url}"', text)
    assert n == 1
    text = re.sub(r'(?m)^db = "[^"]*"', f'db = "{tmp_path / "evo.db"}"', text)
    out = tmp_path / example
    out.write_text(text)
    return out


def _dry_run(cfg: Path):
    return CliRunner().invoke(app, ["search", str(cfg), "--dry-run", "--no-progress"])


def _lines(output: str, start: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith(start)]


def test_openai_reasoning_example_dry_runs_through_the_responses_api(compiles, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example")
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), dialect="openai", api_key="sk-example",
                       models=["o4-mini"], responses_only=["o4-mini"]) as srv:
        res = _dry_run(_pointed_at("openai_reasoning.toml", srv.base_url, tmp_path))
        requests = list(srv.requests)
    assert res.exit_code == 0, res.output
    (probe,) = _lines(res.output, "model o4-mini ")
    assert ": ok (" in probe
    (req,) = requests
    assert req["path"] == "/v1/responses" and req["status"] == 200
    assert req["body"]["reasoning"] == {"effort": "medium"} and "max_output_tokens" in req["body"]
    prompts = _lines(res.output, "prompt ")
    assert len(prompts) == 2 and all("o4-mini: fits 167,232 tokens" in ln for ln in prompts), prompts


@pytest.mark.parametrize("max_model_len, fits", [(32768, True), (4352, False)])
def test_vllm_example_takes_its_window_from_the_servers_model_list(compiles, tmp_path, max_model_len, fits):
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), dialect="vllm", models=[QWEN],
                       context_tokens=max_model_len) as srv:
        res = _dry_run(_pointed_at("vllm.toml", srv.base_url, tmp_path))
        requests = list(srv.requests)
        root = srv.base_url.removesuffix("/v1")
    chat = [r for r in requests if r["path"] != "/tokenize"]
    assert [r["path"] for r in chat] == ["/v1/chat/completions"] and chat[0]["body"]["top_k"] == 20
    assert any(r["path"] == "/tokenize" and r["status"] == 200 for r in requests), "the server counted the prompts"
    (counted,) = _lines(res.output, "tokens of model qwen-coder: ")
    assert f"counted by the vLLM server's POST {root}/tokenize" in counted, counted
    (probe,) = _lines(res.output, "model qwen-coder ")
    assert f"window {max_model_len:,} tokens (max_model_len in the server's model list)" in probe, probe
    prompts = _lines(res.output, "prompt ")
    assert len(prompts) == 2
    room = f"{max_model_len - 4096:,} tokens (context_tokens - max_output_tokens)"
    if fits:
        assert res.exit_code == 0, res.output
        assert all(f"qwen-coder: fits {room}" in ln for ln in prompts), prompts
    else:  # the server's small window is enforced before any call is sent
        assert res.exit_code == 1
        assert all(f"qwen-coder: TOO LARGE for {room}" in ln for ln in prompts), prompts
