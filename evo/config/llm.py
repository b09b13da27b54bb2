"""``[llm]``: the LLM mutator's client and its ``[[llm.models]]`` (docs/llm.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from evo.config.fields import PathField, Section

__all__ = ["LLMModelConfig", "LLMConfig"]


class LLMModelConfig(Section):
    """One ``[[llm.models]]`` entry: an OpenAI-compatible endpoint and model.

    The API key is read from the environment variable named by ``key_env`` (never from the
    file); local endpoints (127.0.0.1/localhost) may leave it unset. ``max_output_tokens``
    and ``timeout_s`` left unset take the defaults of the model's kind (a reasoning model's
    are larger; ``reasoning_model`` unset means detected from ``model`` and
    ``reasoning_effort``); ``api`` picks chat completions, the Responses API, or ``auto``
    (docs/llm.md).
    """

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base_url: str = Field(..., pattern=r"^https?://")
    model: str = Field(..., min_length=1)
    key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    weight: float = Field(1.0, ge=0)
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)
    price_cached_input_per_mtok: float | None = Field(None, ge=0)
    max_output_tokens: int | None = Field(None, ge=1)
    token_param: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto"
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, strict=False)
    context_tokens: int | None = Field(None, ge=256)
    stream: bool = False
    timeout_s: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1, le=256)
    api: Literal["auto", "chat", "responses"] = "auto"
    reasoning_model: bool | None = None


def _check_llm_model(i: int, m: LLMModelConfig) -> str | None:
    """The first cross-key problem of ``[[llm.models]]`` entry ``i`` (None if fit)."""
    from mutators.llm.client.model_spec import (  # lazy: imports openai
        RESERVED_BODY_KEYS,
        default_max_output_tokens,
        is_openai_reasoning_model,
        is_reasoning_model,
    )

    key = f"llm.models[{i}]"
    thinks = m.reasoning_model if m.reasoning_model is not None else is_reasoning_model(m.model, m.reasoning_effort)
    max_out = m.max_output_tokens if m.max_output_tokens is not None else default_max_output_tokens(thinks)
    reasoning = m.token_param != "max_tokens" and is_openai_reasoning_model(m.model)
    if reasoning and m.temperature is not None and m.temperature != 1:
        return (f"{key}.temperature = {m.temperature}: model \"{m.model}\" is an OpenAI reasoning model, which "
                "accepts only temperature 1; remove the key (or set token_param = \"max_tokens\" if this "
                "endpoint is not OpenAI's and takes any temperature)")
    if reasoning and m.top_p is not None and m.top_p != 1:
        return (f"{key}.top_p = {m.top_p}: model \"{m.model}\" is an OpenAI reasoning model, which does not "
                "take top_p; remove the key (or set token_param = \"max_tokens\" if this endpoint is not OpenAI's)")
    clash = sorted(set(m.extra_body) & set(RESERVED_BODY_KEYS))
    if clash:
        return (f"{key}.extra_body.{clash[0]}: set by a typed key, not extra_body (allowed in extra_body: any key "
                f"except {', '.join(RESERVED_BODY_KEYS)}; use max_output_tokens, token_param, temperature, top_p, "
                "reasoning_effort, stream)")
    if m.context_tokens is not None and m.context_tokens <= max_out:
        unset = "" if m.max_output_tokens is not None else f" (the default of {'a reasoning' if thinks else 'a'} model)"
        return (f"{key}.context_tokens = {m.context_tokens}: must be larger than max_output_tokens = "
                f"{max_out}{unset} (the window holds the prompt and the answer)")
    return None


class LLMConfig(Section):
    """``[llm]``: the client of the ``llm`` mutator (docs/llm.md)."""

    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0, le=20)
    backoff_base_s: float = Field(1.0, ge=0)
    concurrency: int = Field(4, ge=1, le=256)
    budget_usd: float = Field(20.0, gt=0)
    max_response_kb: int = Field(256, ge=1)
    inspirations: int = Field(2, ge=0, le=3)
    max_failed_attempts: int = Field(0, ge=0)
    breaker_failures: int = Field(5, ge=1, le=1000)
    breaker_cooldown_s: float = Field(30.0, ge=0)
    breaker_trips: int = Field(3, ge=1, le=100)
    repair_rounds: int = Field(3, ge=0, le=20)
    repair_per_lineage: int = Field(12, ge=0)
    cassette: PathField | None = None
    replay_run: str = ""
    models: tuple[LLMModelConfig, ...] = Field(
        ..., min_length=1, strict=False, description="a list of [[llm.models]] tables"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> "LLMConfig":
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"llm.models: duplicate name(s) {', '.join(dup)}: each model needs its own name")
        for i, m in enumerate(self.models):
            problem = _check_llm_model(i, m)
            if problem:
                raise ValueError(problem)
        return self
