"""First contact with an endpoint, as a new user meets it: a key variable that is not set is
one line with its fix before any compile (with or without --no-probe); a base_url without
/v1 that the server answers 404 says "add /v1 to base_url?"; a 429 or 500 in the dry run's
probe is a warning saying a real run retries it, not a failed dry run. Against the project's
fake endpoint (only /v1 paths served, like vLLM and api.openai.com)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evo.cli import app
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.cassette import Cassette
from mutators.llm.replay.fake_server import FakeLLMServer
from tests.fakes.instant_compile import patch_compiles
from tests.fakes.llm_config import write_llm_config




@pytest.fixture()
def compiles(monkeypatch):
    return patch_compiles(monkeypatch)


def _config(tmp_path: Path, base_url: str, key_env: str = "EVO_TEST_FC_KEY") -> Path:
    return write_llm_config(tmp_path, [{"name": "gpt", "base_url": base_url, "model": "gpt-4.1", "key_env": key_env}])


def _dry_run(cfg: Path, *extra: str):
    return CliRunner().invoke(app, ["search", str(cfg), "--dry-run", "--no-progress", *extra])


@pytest.mark.parametrize("extra", [(), ("--no-probe",)])
def test_a_missing_key_is_one_line_with_the_fix_before_any_compile(compiles, tmp_path, monkeypatch, extra):
    monkeypatch.delenv("EVO_TEST_FC_UNSET", raising=False)
    res = _dry_run(_config(tmp_path, "https://api.openai.com/v1", key_env="EVO_TEST_FC_UNSET"), *extra)
    assert res.exit_code != 0
    assert compiles == [], "nothing was compiled"
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    text = " ".join(lines)
    assert "environment variable EVO_TEST_FC_UNSET is not set" in text and "export EVO_TEST_FC_UNSET=" in text
    assert len(lines) <= 3, res.output  # one message (the console may wrap it)


def test_a_real_run_checks_the_keys_before_anything(tmp_path, monkeypatch):
    from evo.config import load_config
    from evo.engine import search

    monkeypatch.delenv("EVO_TEST_FC_UNSET", raising=False)
    cfg = load_config(_config(tmp_path, "https://api.openai.com/v1", key_env="EVO_TEST_FC_UNSET"))
    with pytest.raises(search.SearchError, match="EVO_TEST_FC_UNSET is not set"):
        search.run_search(cfg, progress=False)
    assert not (tmp_path / "evo.db").exists(), "no database or run was made"


@pytest.mark.parametrize("dialect", ["openai", "vllm"])
def test_a_base_url_without_v1_says_add_v1(dialect):
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), dialect=dialect) as srv:
        root = srv.base_url.removesuffix("/v1")
        spec = ModelSpec("m", root, "gpt-4.1", key_env="EVO_TEST_NO_KEY", max_output_tokens=64)
        call = LLMClient(max_attempts=1).probe(spec)
        good = LLMClient(max_attempts=1).probe(ModelSpec("m", srv.base_url, "gpt-4.1", key_env="EVO_TEST_NO_KEY",
                                                          max_output_tokens=64))
    assert call.error is not None and "HTTP 404" in call.error and "add /v1 to base_url?" in call.error
    assert good.ok


@pytest.mark.parametrize("status", [429, 500])
def test_a_transient_probe_failure_warns_and_says_a_real_run_retries(compiles, tmp_path, status):
    with FakeLLMServer(Cassette([{"status": status, "repeat": True}])) as srv:
        res = _dry_run(_config(tmp_path, srv.base_url))
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("model gpt ")]
    assert f"WARNING: HTTP {status}" in line and "a real run retries" in line and "FAILED" not in line


def test_a_fatal_probe_failure_still_fails_the_dry_run(compiles, tmp_path):
    with FakeLLMServer(Cassette([{"status": 401, "repeat": True}])) as srv:
        res = _dry_run(_config(tmp_path, srv.base_url))
    assert res.exit_code == 1 and "FAILED: HTTP 401 [fatal:auth]" in res.output


def test_a_refused_connection_fails_the_dry_run_and_asks_whether_the_server_is_up(compiles, tmp_path):
    with FakeLLMServer(Cassette([])) as srv:
        url = srv.base_url  # the port is free again once the server stops
    res = _dry_run(_config(tmp_path, url))
    assert res.exit_code == 1
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("model gpt ")]
    assert "FAILED: connection error" in line and "is the server up" in line


def test_a_task_whose_prompt_fits_no_model_fails_the_dry_run(compiles, tmp_path):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1")
    cfg.write_text(cfg.read_text() + "context_tokens = 2048\nmax_output_tokens = 1024\n")
    res = _dry_run(cfg, "--no-probe")
    assert res.exit_code == 1, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("prompt kb19_relu")]
    assert "FAILED: fits no model" in line and "gpt: TOO LARGE" in line


@pytest.mark.parametrize("fake, model, api, fix", [
    ({"dialect": "vllm", "api_key": "sk-right"}, "gpt-4.1", "auto", "check the variable key_env names"),
    ({"dialect": "openai", "models": ["gpt-4.1"]}, "gpt-4o-typo", "auto", "check model and base_url"),
    ({"dialect": "openai", "responses_only": ["o3-pro"]}, "o3-pro", "chat", 'set api = "responses"'),
], ids=["vllm-401", "unknown-model", "chat-only-pinned"])
def test_a_fatal_probe_failure_is_one_line_with_its_fix(monkeypatch, fake, model, api, fix):
    """The endpoint's own text often names no fix (vLLM's 401 is {"error": "Unauthorized"}):
    the dry run's line adds the fix a stopped model's line names."""
    from evo.engine.llm_check import ModelProbe

    monkeypatch.setenv("EVO_TEST_FC_KEY", "sk-wrong")
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), **fake) as srv:
        spec = ModelSpec("gpt", srv.base_url, model, key_env="EVO_TEST_FC_KEY", max_output_tokens=64, api=api)
        call = LLMClient(max_attempts=1).probe(spec)
    line = ModelProbe("gpt", model, spec.base_url, call.error, call.latency_s).line()
    assert "\n" not in line and ": FAILED: HTTP 4" in line and "[fatal:" in line, line
    assert "(fix: " in line and fix in line, line


# ---- the probe comes before the compiles ---------------------------------------------------


@pytest.mark.parametrize("fake, model, fix", [
    ({"api_key": "sk-right"}, "gpt-4.1", "check the variable key_env names"),
    ({"models": ["gpt-4.1"]}, "gpt-4o-typo", "check model and base_url"),
], ids=["401", "unknown-model"])
def test_a_fatal_probe_failure_stops_the_dry_run_before_any_compile(compiles, tmp_path, monkeypatch, fake, model,
                                                                    fix):
    monkeypatch.setenv("EVO_TEST_FC_KEY", "sk-wrong")
    with FakeLLMServer(Cassette([{"response": "OK", "repeat": True}]), dialect="openai", **fake) as srv:
        cfg = _config(tmp_path, srv.base_url)
        cfg.write_text(cfg.read_text().replace('model = "gpt-4.1"', f'model = "{model}"'))
        res = _dry_run(cfg)
    assert res.exit_code == 1, res.output
    assert compiles == [], "no seed was compiled"
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("model gpt ")]
    assert ": FAILED: HTTP 4" in line and "(fix: " in line and line.endswith(f"{fix})"), line
    assert "seeds through policy and compile" not in res.output and "stopped before compiling" in res.output


def test_a_transient_probe_failure_is_said_before_the_compiles_which_go_on(compiles, tmp_path):
    with FakeLLMServer(Cassette([{"status": 429, "repeat": True}])) as srv:
        res = _dry_run(_config(tmp_path, srv.base_url))
    assert res.exit_code == 0, res.output
    assert [c.task for c in compiles] == ["kb19_relu"], "the seeds are compiled"
    out = res.output.splitlines()
    warned = next(i for i, ln in enumerate(out) if ln.startswith("model gpt ") and "WARNING: HTTP 429" in ln)
    table = next(i for i, ln in enumerate(out) if "seeds through policy and compile" in ln)
    assert warned < table, res.output
