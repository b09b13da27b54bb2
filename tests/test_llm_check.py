"""`evo search CONFIG --dry-run` with the llm mutator: one probe request per model against the
real local fake endpoint (mutators/llm/replay/fake_server.py on 127.0.0.1), one line each, exit 1 when
a model fails; `--no-probe` sends nothing; per task the largest starting prompt against each
model's window. Seeds' compiles are faked (no nvcc needed); everything else is real."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evo.cli import app
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer
from tests.fakes.instant_compile import patch_compiles
from tests.fakes.llm_config import write_llm_config

ROOT = Path(__file__).resolve().parents[1]




@pytest.fixture()
def server(monkeypatch):
    patch_compiles(monkeypatch)
    monkeypatch.setenv("EVO_TEST_GOOD_KEY", "sk-good")
    monkeypatch.setenv("EVO_TEST_BAD_KEY", "sk-wrong")
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), api_key="sk-good") as srv:
        yield srv


def _config(tmp_path: Path, base_url: str) -> Path:
    return write_llm_config(tmp_path, [
        {"name": "good", "base_url": base_url, "model": "fake-coder", "key_env": "EVO_TEST_GOOD_KEY",
         "context_tokens": 32768, "max_output_tokens": 4096},
        {"name": "bad", "base_url": base_url, "model": "fake-coder", "key_env": "EVO_TEST_BAD_KEY",
         "context_tokens": 3328, "max_output_tokens": 256},
    ])


def _dry_run(cfg: Path, *extra: str):
    return CliRunner().invoke(app, ["search", str(cfg), "--dry-run", "--no-progress", *extra])


def _line(output: str, start: str) -> str:
    (line,) = [ln for ln in output.splitlines() if ln.startswith(start)]
    return line


def test_a_model_answering_401_fails_the_dry_run_with_its_own_line(server, tmp_path):
    res = _dry_run(_config(tmp_path, server.base_url))
    assert res.exit_code == 1, res.output
    assert len(server.requests) == 2  # one probe per model, no retry
    good = _line(res.output, "model good ")
    assert good.startswith(f"model good (fake-coder at {server.base_url}): ok (")
    bad = _line(res.output, "model bad ")
    assert bad.startswith(f"model bad (fake-coder at {server.base_url}): FAILED: HTTP 401 [fatal:auth]")
    assert "Incorrect API key provided" in bad


def test_no_probe_sends_no_request_and_still_sizes_the_prompts(server, tmp_path):
    res = _dry_run(_config(tmp_path, server.base_url), "--no-probe")
    assert res.exit_code == 0, res.output
    assert server.requests == []
    assert "LLM models: not probed (--no-probe)" in res.output
    assert not any(ln.startswith("model ") for ln in res.output.splitlines())
    line = _line(res.output, "prompt kb19_relu (")
    tokens = int(line.split("~", 1)[1].split(" tokens", 1)[0].replace(",", ""))
    assert tokens > 1000  # the seed as parent, the reference and the ABI: thousands of characters
    assert "good: fits 28,672 tokens (context_tokens - max_output_tokens)" in line
    # kb19_relu's prompt is over 3,072 tokens (even at 4.5 characters a token) with every optional part
    # left out and its other ops elided
    assert "bad: TOO LARGE for 3,072 tokens (context_tokens - max_output_tokens)" in line


def test_the_offline_mutator_probes_nothing(server):
    from evo.engine import search
    from evo.config import load_config

    rep = search.dry_run(load_config(ROOT / "configs" / "demo.toml"))
    assert rep["ok"] and rep["probes"] == [] and rep["prompts"] == []
    assert server.requests == []
