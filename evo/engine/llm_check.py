"""The dry run's checks of the ``llm`` mutator: does each model answer, do the prompts fit.

:func:`probe_models` sends each ``[[llm.models]]`` entry one tiny chat request with its own
request settings (:meth:`mutators.llm.client.chat.LLMClient.probe`: one attempt, no budget, nothing
stored) and returns one :class:`ModelProbe` per model: ``ok``, or the endpoint's error in one
line (a 401 for a wrong key, a 404 for an unknown model id, a 400 for a parameter the model
does not take) or the configuration's (a key variable that is not set). A model served
only by the Responses API is probed there when its ``api`` is ``auto``. For a model that
answered and has no ``context_tokens``, the probe also reads the window from the server's
model list (:mod:`mutators.llm.client.served`: vLLM's ``max_model_len``), which
:func:`prompt_sizes` then fits the prompts to. A replayed run (``llm.replay_run``) calls no
endpoint, so nothing is probed.

:func:`prompt_sizes` renders, per task, the prompts a run starts with (the seed as parent:
optimize and repair; a task without a seed: genesis) through the LLM mutator's own
:meth:`mutators.llm.mutator.LLMMutator.render`, with the task facts a run has before any evaluation
(:func:`evo.engine.llm_context.task_info`), and returns the largest with, per model, whether it
fits the model's window (``context_tokens - max_output_tokens``) whole, only after leaving
optional parts out, or not at all. Later prompts carry more (other islands' kernels,
earlier attempts, measured times, the profile); those are the parts the mutator leaves out
first when a prompt is over the window. Token counts are the mutator's: counted by the
token counter it is given where that knows the model's tokenizer (a vLLM server's
``/tokenize``, an OpenAI encoding with ``bpe-openai`` installed:
:mod:`mutators.llm.prompt.tokens`), else estimated from characters
(:data:`mutators.llm.prompt.templates.BUDGET_CHARS_PER_TOKEN`); :func:`counter_lines` says
which, one line per model.

Neither is called for the offline (``knobs``) mutator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["ModelProbe", "ModelFit", "PromptSize", "probe_models", "prompt_sizes", "missing_keys", "counter_lines",
           "token_counter"]

log = logging.getLogger(__name__)

_TRANSIENT_RE = __import__("re").compile(r"HTTP (?:429|5\d\d|408|409)\b|timeout|invalid JSON|"
                                         r"response (?:has no choices|body is JSON)|endpoint error")


def missing_keys(cfg) -> list[str]:
    """One line per ``[[llm.models]]`` entry whose key variable is unset (and whose endpoint
    is not local), each with its fix; [] when every key is there or the run is replayed."""
    from mutators.llm.client.model_spec import LLMConfigError

    if cfg.mutator.kind != "llm" or cfg.llm is None or cfg.llm.replay_run:
        return []
    out = []
    for m in _model_specs(cfg):
        try:
            m.api_key()
        except LLMConfigError as e:
            out.append(str(e))
    return out


@dataclass(frozen=True)
class ModelProbe:
    """One model's probe: ``error`` is None when the endpoint answered; ``window`` is the
    context window the server's model list reports for a model whose ``context_tokens`` is
    unset (vLLM's ``max_model_len``; None when not asked or not said)."""

    model: str
    model_id: str
    base_url: str
    error: str | None
    seconds: float
    window: int | None = None

    @property
    def transient(self) -> bool:
        """The probe failed in a way a real run retries (429 rate limit, 5xx, timeout, a refused
        or broken connection): a warning, not a failed dry run."""
        e = self.error or ""
        if not e or "[fatal:" in e or "LLMConfigError" in e or "is not set" in e:
            return False
        return bool(_TRANSIENT_RE.match(e))

    @property
    def ok(self) -> bool:
        return self.error is None or self.transient

    def line(self) -> str:
        """The dry run's line for this model."""
        where = f"model {self.model} ({self.model_id} at {self.base_url})"
        if self.error is None:
            from mutators.llm.client.served import WINDOW_SOURCE

            seen = f"; window {self.window:,} tokens ({WINDOW_SOURCE})" if self.window else ""
            return f"{where}: ok ({self.seconds:.2f} s{seen})"
        if (self.error or "").startswith("connection "):
            return (f"{where}: FAILED: {self.error} (is the server up and listening at base_url? a real run would "
                    "retry, then stop the model)")
        if self.transient:
            return (f"{where}: WARNING: {self.error} (transient: a real run retries this with backoff, "
                    "llm.max_retries times a call)")
        from mutators.llm.client.http_errors import FATAL_FIXES

        fix = next((f for k, f in FATAL_FIXES.items() if f"[fatal:{k}]" in self.error), None)
        if fix is None or "add /v1 to base_url?" in self.error:  # that hint is the fix already
            return f"{where}: FAILED: {self.error}"
        return f"{where}: FAILED: {self.error} (fix: {fix})"


@dataclass(frozen=True)
class ModelFit:
    """How a task's largest prompt meets one model's prompt budget, ``window`` =
    ``context_tokens - max_output_tokens`` (None: ``context_tokens`` unset, nothing is fitted);
    ``tokens`` is the prompt as the mutator would send it to that model, counted by
    ``counted_by`` (None: estimated)."""

    model: str
    window: int | None
    tokens: int
    fits: bool
    omitted: tuple[str, ...] = ()
    counted_by: str | None = None

    def text(self) -> str:
        if self.window is None:
            return f"{self.model}: no context_tokens set, sent whole"
        room = f"{self.window:,} tokens (context_tokens - max_output_tokens)"
        size = f"{self.tokens:,} tokens counted" if self.counted_by else f"~{self.tokens:,}"
        if not self.fits:
            return (f"{self.model}: TOO LARGE for {room} even with every optional part left out "
                    f"({size}); calls for this task will not be sent")
        if self.tokens > self.window:  # estimated only: a counted prompt over the window does not fit
            left = f" after leaving out {', '.join(self.omitted)}" if self.omitted else ""
            return (f"{self.model}: MAY FIT {room}{left}: ~{self.tokens:,} tokens at 3 characters a token, under "
                    "the window at 4.5; sent on trial, the endpoint's count then sizes later prompts")
        counted = f" ({size})" if self.counted_by else ""
        if self.omitted:
            return f"{self.model}: fits {room} after leaving out {', '.join(self.omitted)}{counted}"
        return f"{self.model}: fits {room}{counted}"


@dataclass(frozen=True)
class PromptSize:
    """A task's largest starting prompt: its kind, estimated tokens whole, and each model's fit."""

    task: str
    kind: str
    tokens: int
    fits: tuple[ModelFit, ...]

    @property
    def fits_any(self) -> bool:
        """Some model may be sent this prompt (the dry run fails when none may)."""
        return any(f.fits for f in self.fits)

    def line(self) -> str:
        head = "" if self.fits_any else "FAILED: fits no model: "
        return (f"prompt {self.task} ({self.kind}): {head}~{self.tokens:,} tokens; "
                + "; ".join(f.text() for f in self.fits))


def _model_specs(cfg) -> list:
    from mutators.llm.client.model_spec import ModelSpec

    # [[llm.models]] keys map one to one onto ModelSpec fields (tests/test_llm_config.py).
    return [ModelSpec(**m.model_dump()) for m in cfg.llm.models]


def _client(cfg, models):
    from mutators.llm.client.chat import LLMClient

    L = cfg.llm
    return LLMClient(models, timeout_s=L.timeout_s, max_attempts=1, backoff_base_s=L.backoff_base_s,
                     concurrency=L.concurrency, max_response_bytes=L.max_response_kb * 1024)


def probe_models(cfg) -> list[ModelProbe]:
    """Probe every configured model once (see module docstring); [] for a replayed run."""
    from mutators.llm.client.model_spec import LLMConfigError
    from mutators.llm.client.served import with_server_windows

    if cfg.llm.replay_run:
        return []
    models = _model_specs(cfg)
    client = _client(cfg, models)
    out = []
    try:
        for m in models:
            try:
                call = client.probe(m)
                (sized,) = with_server_windows([m]) if call.error is None else (m,)
            except LLMConfigError as e:
                out.append(ModelProbe(m.name, m.model, m.base_url, str(e), 0.0))
                continue
            window = sized.context_tokens if sized is not m else None
            out.append(ModelProbe(m.name, m.model, m.base_url, call.error, call.latency_s, window))
            log.info("probe of model %s: %s", m.name, call.error or "ok")
    finally:
        client.close()
    return out


def token_counter(server: bool):
    """The token counter a run uses (:func:`mutators.llm.prompt.tokens.default_counter`);
    ``server`` False: none that sends a request (``--no-probe``, a replayed run)."""
    from mutators.llm.prompt.tokens import default_counter

    return default_counter(server=server)


def counter_lines(cfg, counter) -> list[str]:
    """One line per model: what counts its prompts' tokens (``counter``'s name for it), or
    that they are estimated, and how to count them where a tokenizer could be known."""
    from mutators.llm.prompt.tokens import ESTIMATE_NAME, encoding_for

    out = []
    for m in _model_specs(cfg):
        name = counter.name(m) if counter is not None else None
        if name is not None:
            out.append(f"tokens of model {m.name}: counted by {name}")
            continue
        hint = ""
        if encoding_for(m.model):
            hint = (f"; {m.model} uses {encoding_for(m.model)}: pip install 'cute-evo[tokens]' (bpe-openai) to "
                    "count them offline")
        out.append(f"tokens of model {m.name}: {ESTIMATE_NAME}{hint}")
    return out


def prompt_sizes(cfg, seeds: dict[str, tuple[str, dict[str, str]]], tasks: list[str],
                 windows: dict[str, int] | None = None, task_registry=None, counter=None) -> list[PromptSize]:
    """Per task of ``tasks``, its largest starting prompt against every model's window
    (``seeds``: the tasks' seed source and params; a task without one starts at genesis;
    ``windows``: windows the probe read from the servers, by model name, for models whose
    ``context_tokens`` is unset; ``task_registry``: where the tasks are looked up, None: the
    built-in tasks; ``counter``: the mutator's token counter, :func:`token_counter`, None:
    every size estimated)."""
    import dataclasses

    from evo.engine.llm_context import task_info
    from evo.core.records import Candidate, Member, Status
    from mutators.base import MutationContext
    from mutators.llm.mutator import LLMMutator
    from mutators.llm.prompt.context import SimpleContextProvider

    models = [dataclasses.replace(m, context_tokens=windows[m.name]) if m.context_tokens is None and
              (windows or {}).get(m.name) else m for m in _model_specs(cfg)]
    gpu = None if cfg.run.gpu == "auto" else cfg.run.gpu
    provider = SimpleContextProvider({t: task_info(t, gpu, task_registry) for t in tasks})
    client = _client(cfg, models)
    try:
        mut = LLMMutator(client, models, provider, n_inspirations=cfg.llm.inspirations, token_counter=counter)
        out = []
        for task in tasks:
            ctx = MutationContext(task, 0, 0)
            if task in seeds:
                cand = Candidate.create(task, *seeds[task])
                starts = [("optimize", Member(cand, None)), ("repair", Member(cand, None, Status.COMPILE_ERROR))]
            else:
                starts = [("genesis", None)]
            kind, parent = max(starts, key=lambda s: mut.render(s[0], s[1], ctx).tokens)
            whole = mut.render(kind, parent, ctx).tokens
            fits = []
            for m in models:
                if m.context_tokens is None:
                    fits.append(ModelFit(m.name, None, whole, True))
                    continue
                r = mut.render(kind, parent, ctx, m)
                fits.append(ModelFit(m.name, r.budget, r.tokens, r.fits, r.omitted, r.counted_by))
            out.append(PromptSize(task, kind, whole, tuple(fits)))
        return out
    finally:
        client.close()
