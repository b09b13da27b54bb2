"""Search configuration: TOML -> one validated, frozen :class:`Config`, loaded once at the edge.

The CLI (or a script) calls :func:`load_config` once; everything downstream receives the
frozen :class:`Config` (or the settings records derived from it) and never re-reads files.
A bad file raises :class:`ConfigError` whose message names the file, the dotted key, the bad
value and what is allowed, one problem per line, e.g.::

    configs/x.toml: search.islands_per_task = -1: must be between 1 and 64
    configs/x.toml: unknown key 'search.isands' (did you mean 'search.islands_per_task'?; allowed: ...)

Design points (see docs/config.md for the user-facing reference):

* One settings record per section, owned by the component that uses it: ``[compile]`` and
  ``[evaluator]`` are :class:`evaluators.base.CompileSettings` / ``HarnessSettings``,
  ``[profile]`` :class:`evaluators.profile.ProfileSettings`, ``[tuning]``
  :class:`evo.tuning_settings.TuningSettings`, ``[search]``
  :class:`evo.engine_settings.EngineSettings`. Those frozen dataclasses declare each key's
  one default and one set of bounds (``config_key``, :mod:`evo.settings`); this module
  builds the section's pydantic model from them (:func:`section_model`), validates once,
  and ``Config.<x>_settings()`` turns a section back into its record, adding the fields code
  sets (task files, the profile cache, the tuning seed). Sections no component mirrors
  (``[run]``, ``[tasks]``, ``[mutator]``, ``[ray]``, ``[llm]``) are declared here.
* Only knobs that work exist ("no knob ships before it works"); unknown keys are errors, with
  a did-you-mean suggestion, so a typo never silently falls back to a default.
* Types are strict: TOML already carries types, so ``seed = "3"`` or ``archive = 1`` is a
  mistake, not something to coerce. Integers are accepted where a float is expected.
* Paths are made absolute once, at load time, so later ``chdir``s (Ray workers) cannot move
  them. Input files the config names (``tasks.files``) are relative to the config file's
  directory (a config works from any working directory); output locations (``run.db``,
  ``compile.cache_dir``, ``llm.cassette``) are relative to the current working directory.
* ``tasks.files`` are loaded through ``evo.tasks.load_task_file`` before ``tasks.include`` is
  checked against ``evo.tasks.task_names()`` / ``evo.tasks.families()``, so user tasks can be
  included. The registry is imported lazily, so importing this module stays cheap.
* Secrets never live here: later sections name environment variables, not keys.
"""

from __future__ import annotations

import contextvars
import copy
import difflib
import hashlib
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.profile import ProfileSettings
from evo.engine_settings import EngineSettings
from evo.settings import config_keys
from evo.tuning_settings import TuningSettings

__all__ = [
    "CompileConfig",
    "Config",
    "ConfigError",
    "EvaluatorConfig",
    "KNOWN_GPUS",
    "MutatorConfig",
    "ProfileConfig",
    "RayConfig",
    "RunConfig",
    "SearchConfig",
    "TasksConfig",
    "TuningConfig",
    "demo_config_path",
    "load_config",
    "parse_config",
    "parse_override",
]

logger = logging.getLogger(__name__)

#: GPU names accepted by ``run.gpu`` when the task suite does not publish its own list
#: (``evo.tasks.gpu_names()``, if it exists, takes precedence). Matching is case-insensitive.
KNOWN_GPUS: tuple[str, ...] = ("H100", "H200")

#: Keys that existed once and were removed, with what to do instead: an old config that
#: still sets one gets this line rather than a bare "unknown key".
_REMOVED_KEYS: dict[str, str] = {
    "compile.workers": "removed (no code could honour it): compiles run as Ray tasks, one per CPU that Ray "
                       "has; set [ray] num_cpus to run fewer, and delete this line",
}

#: Paths of task files already loaded in this process (resolved), so validating a second
#: config that names the same file does not register its tasks twice.
_LOADED_TASK_FILES: set[Path] = set()


class ConfigError(ValueError):
    """A configuration file or override is wrong; the message says where and how to fix it.

    ``source`` is the file as the user named it (or ``<config>`` for in-memory data);
    ``problems`` holds ``(dotted_key, message)`` pairs, one per mistake (``key`` is ``""``
    for file-level problems such as a missing file or a TOML syntax error).
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {msg}" for _, msg in self.problems))


# --------------------------------------------------------------------------------------
# Field helpers
# --------------------------------------------------------------------------------------


#: Directory of the config file being validated (None for in-memory data): input files the
#: config names (``tasks.files``) are found relative to it, whatever the working directory.
_CONFIG_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar("evo_config_dir", default=None)


def _resolve_path(value: Any) -> Path:
    """An output location (``run.db``, ``compile.cache_dir``): relative paths resolve against
    the current directory, so results land where the user runs the command."""
    if isinstance(value, bool) or not isinstance(value, (str, Path)):
        raise ValueError("must be a path string")
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def _resolve_input_path(value: Any) -> Path:
    """An input file the config names (``tasks.files``): relative paths resolve against the
    config file's directory, so a config works from any working directory; absolute, once."""
    _resolve_path(value)  # same type checks
    path = Path(value).expanduser()
    if path.is_absolute():
        return path.resolve()
    base = _CONFIG_DIR.get() or Path.cwd()
    return (base / path).resolve()


PathField = Annotated[Path, BeforeValidator(_resolve_path)]
InputPathField = Annotated[Path, BeforeValidator(_resolve_input_path)]


def _int_or_auto(value: Any, minimum: int) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ValueError(f"must be an integer >= {minimum} or \"auto\"")


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
    """The closest choice, if any is close. A choice is also compared by its leading
    ``_``-separated parts, so ``isands`` finds ``islands_per_task``."""
    best, best_score = None, 0.0
    for choice in choices:
        parts = choice.split("_")
        candidates = {"_".join(parts[:n]) for n in range(1, len(parts) + 1)}
        score = max(difflib.SequenceMatcher(None, word.lower(), c.lower()).ratio() for c in candidates)
        if score > best_score:
            best, best_score = choice, score
    return best if best_score >= 0.7 else None


class _Section(BaseModel):
    """Base of every section: unknown keys are errors, values are immutable and strict."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, validate_default=True
    )


def section_model(settings: type, name: str, doc: str, base: type[_Section] = _Section) -> type[_Section]:
    """The section model whose keys a component's settings dataclass declares.

    Each ``config_key`` field of ``settings`` (:mod:`evo.settings`) becomes a key of the
    same name (or ``Key.name``), type, default (divided by ``Key.scale``), bounds and
    pattern; a ``Key.path`` key is an output location (:data:`PathField`). Fields set by
    code are not keys. ``base`` carries cross-key validators. The default and the bounds of
    a key thus exist once, on the record; :func:`_record` turns a section back into one.
    """
    hints = get_type_hints(settings)
    spec: dict[str, Any] = {}
    for f, key in config_keys(settings):
        default = f.default / key.scale if key.scale != 1.0 else f.default
        spec[key.name or f.name] = (
            PathField if key.path else hints[f.name],
            Field(default, ge=key.ge, gt=key.gt, le=key.le, lt=key.lt, pattern=key.pattern),
        )
    return create_model(name, __base__=base, __module__=__name__, __doc__=doc, **spec)


def _record(section: BaseModel, settings: type, **by_code: Any) -> Any:
    """The ``settings`` record of a section made by :func:`section_model`: its keys' values
    (paths as strings, scaled values in the record's unit) plus the fields in ``by_code``."""
    values: dict[str, Any] = {}
    for f, key in config_keys(settings):
        value = getattr(section, key.name or f.name)
        values[f.name] = str(value) if key.path else (value * key.scale if key.scale != 1.0 else value)
    return settings(**values, **by_code)


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


class RunConfig(_Section):
    """``[run]``: identity of the run and where it is recorded."""

    name: str = Field("search", min_length=1)
    seed: int = Field(0, ge=0)
    db: PathField = Path("runs/evo.db")
    gpu: str = "auto"

    @field_validator("gpu")
    @classmethod
    def _check_gpu(cls, v: str) -> str:
        if v == "auto":
            return v
        known = _known_gpus()
        for name in known:
            if name.lower() == v.lower():
                return name
        raise ValueError('unknown GPU; allowed: "auto", ' + ", ".join(f'"{g}"' for g in known))


def _load_task_file(path: Path) -> Path:
    """Item validator of ``tasks.files``: the file must exist; its tasks get registered."""
    if not path.is_file():
        if path.exists():
            raise ValueError("is not a file")
        base = _CONFIG_DIR.get()
        msg = f"file not found (looked for {path}"
        if base is not None:
            msg += f"; a relative path is relative to the config file's directory, {base}"
            try:
                rel = path.relative_to(base)
            except ValueError:
                rel = None
            if rel is not None and (Path.cwd() / rel).is_file():
                msg += (f"; {Path.cwd() / rel} exists relative to the working directory: write the "
                        f"path relative to the config file, e.g. {os.path.relpath(Path.cwd() / rel, base)!r}")
        raise ValueError(msg + ")")
    resolved = path.resolve()
    if resolved not in _LOADED_TASK_FILES:
        from evo import tasks as registry  # lazy: the registry imports torch

        try:
            registry.load_task_file(path)
        except Exception as exc:  # user code: any failure of it is a config problem
            raise ValueError(f"could not load task file: {type(exc).__name__}: {exc}") from exc
        _LOADED_TASK_FILES.add(resolved)
        logger.info("loaded user task file %s", path)
    return path


def _check_task_entry(entry: str) -> str:
    """Item validator of ``tasks.include``: a registered task name or ``family:<name>``."""
    from evo import tasks as registry  # lazy: the registry imports torch

    families = sorted(registry.families())
    if entry.startswith("family:"):
        family = entry[len("family:"):]
        if family not in families:
            hint = _suggest(family, families)
            did = f" (did you mean \"family:{hint}\"?)" if hint else ""
            raise ValueError(
                f"unknown task family{did}; known families: "
                + ", ".join(f'"family:{f}"' for f in families)
            )
        return entry
    names = sorted(registry.task_names())
    if entry not in names:
        hint = _suggest(entry, names)
        did = f" (did you mean \"{hint}\"?)" if hint else ""
        raise ValueError(
            f"unknown task{did}; use a task name or \"family:<name>\" "
            f"(families: {', '.join(families)}; `evo tasks` lists all tasks)\n"
            f"  known tasks: {', '.join(names)}"
        )
    return entry


class TasksConfig(_Section):
    """``[tasks]``: which tasks to search.

    ``files`` is declared (hence validated, hence loaded) before ``include``, so tasks defined
    in user files can be included.
    """

    files: tuple[Annotated[InputPathField, AfterValidator(_load_task_file)], ...] = Field(
        (), strict=False,
        description="a list of paths to user task files (relative to the config file's directory)",
    )
    include: tuple[Annotated[str, AfterValidator(_check_task_entry)], ...] = Field(
        ...,
        min_length=1,
        strict=False,
        description='a non-empty list of task names or "family:<name>" entries',
    )

    @field_validator("include")
    @classmethod
    def _no_duplicates(cls, include: tuple[str, ...]) -> tuple[str, ...]:
        seen: set[str] = set()
        for entry in include:
            if entry in seen:
                raise ValueError(f"\"{entry}\" is listed twice")
            seen.add(entry)
        return include


class _SearchRules(_Section):
    """The cross-key rule of ``[search]`` (its keys come from :class:`EngineSettings`)."""

    @model_validator(mode="after")
    def _migration_fits(self) -> "_SearchRules":
        if self.migration_count > self.population_size:
            raise ValueError(
                f"search.migration_count = {self.migration_count}: must be <= "
                f"search.population_size ({self.population_size})"
            )
        return self


SearchConfig = section_model(
    EngineSettings, "SearchConfig",
    "``[search]``: islands, populations, budget and migration (keys: "
    ":class:`evo.engine_settings.EngineSettings`).", base=_SearchRules)


class MutatorConfig(_Section):
    """``[mutator]``: how children are proposed: the offline ``knobs`` mutator or ``llm``
    (needs an ``[llm]`` section, see docs/llm.md)."""

    kind: Literal["knobs", "llm"] = "knobs"
    crossover_rate: float = Field(0.3, ge=0.0, le=1.0)
    perturb_max: int = Field(2, ge=1)


CompileConfig = section_model(
    CompileSettings, "CompileConfig", "``[compile]``: nvcc settings (keys: :class:`evaluators.base.CompileSettings`).")

EvaluatorConfig = section_model(
    HarnessSettings, "EvaluatorConfig",
    "``[evaluator]``: correctness and timing protocol (keys: :class:`evaluators.base.HarnessSettings`).")


class RayConfig(_Section):
    """``[ray]``: where to run. ``RAY_ADDRESS`` is honoured by the runtime, not here."""

    address: str = ""
    num_gpus: Union[int, Literal["auto"]] = "auto"
    num_cpus: Union[int, Literal["auto"]] = "auto"

    @field_validator("num_gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        return _int_or_auto(v, 0)

    @field_validator("num_cpus", mode="before")
    @classmethod
    def _cpus(cls, v: Any) -> Any:
        return _int_or_auto(v, 1)


class LLMModelConfig(_Section):
    """One ``[[llm.models]]`` entry: an OpenAI-compatible endpoint and model.

    The API key is read from the environment variable named by ``key_env`` (never from the
    file); local endpoints (127.0.0.1/localhost) may leave it unset.
    """

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base_url: str = Field(..., pattern=r"^https?://")
    model: str = Field(..., min_length=1)
    key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    weight: float = Field(1.0, ge=0)
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)
    max_output_tokens: int = Field(8192, ge=1)
    token_param: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto"
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, strict=False)
    context_tokens: int | None = Field(None, ge=256)
    stream: bool = False
    timeout_s: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1, le=256)


def _check_llm_model(i: int, m: LLMModelConfig) -> str | None:
    """The first cross-key problem of ``[[llm.models]]`` entry ``i`` (None if fit)."""
    from mutators.client import RESERVED_BODY_KEYS, is_openai_reasoning_model  # lazy: imports openai

    key = f"llm.models[{i}]"
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
    if m.context_tokens is not None and m.context_tokens <= m.max_output_tokens:
        return (f"{key}.context_tokens = {m.context_tokens}: must be larger than max_output_tokens = "
                f"{m.max_output_tokens} (the window holds the prompt and the answer)")
    return None


class LLMConfig(_Section):
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


ProfileConfig = section_model(
    ProfileSettings, "ProfileConfig",
    "``[profile]``: delayed Nsight Compute profiling of survivors, docs/profiling.md (keys: "
    ":class:`evaluators.profile.ProfileSettings`).")

TuningConfig = section_model(
    TuningSettings, "TuningConfig",
    "``[tuning]``: Optuna studies over the tunables of new top-k members, docs/tuning.md (keys: "
    ":class:`evo.tuning_settings.TuningSettings`).")


class Config(_Section):
    """The whole validated configuration. Frozen; build it with :func:`load_config`.

    ``source_path`` is the file it came from (None when built from a mapping).
    """

    run: RunConfig = Field(default_factory=RunConfig)
    tasks: TasksConfig
    search: SearchConfig = Field(default_factory=SearchConfig)
    mutator: MutatorConfig = Field(default_factory=MutatorConfig)
    compile: CompileConfig = Field(default_factory=CompileConfig)
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    tuning: TuningConfig = Field(default_factory=TuningConfig)
    llm: LLMConfig | None = None

    _source_path: Path | None = PrivateAttr(default=None)

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @model_validator(mode="after")
    def _llm_needs_section(self) -> "Config":
        if self.mutator.kind == "llm" and self.llm is None:
            raise ValueError(
                "mutator.kind = \"llm\" needs an [llm] section with at least one [[llm.models]] "
                "entry (see docs/llm.md)"
            )
        return self

    def compile_settings(self) -> CompileSettings:
        """The ``[compile]`` section as the compile stage's settings record."""
        return _record(self.compile, CompileSettings)

    def harness_settings(self) -> HarnessSettings:
        """The ``[evaluator]`` section as the GPU harness's settings record, with the run's
        user task files (``[tasks] files``), which every isolated child imports."""
        return _record(self.evaluator, HarnessSettings, task_files=tuple(str(f) for f in self.tasks.files))

    def profile_settings(self) -> ProfileSettings:
        """The ``[profile]`` section as the profile stage's record; its cache is
        ``profiles`` beside the compile cache."""
        return _record(self.profile, ProfileSettings, cache_dir=str(Path(self.compile.cache_dir).parent / "profiles"))

    def tuning_settings(self) -> TuningSettings:
        """The ``[tuning]`` section as tuning's record (seeded by ``run.seed``)."""
        return _record(self.tuning, TuningSettings, seed=self.run.seed)

    def engine_settings(self) -> EngineSettings:
        """The ``[search]`` section as the engine's record, with the run's profile and tuning
        records when those are enabled (None otherwise: the engine skips them)."""
        return _record(self.search, EngineSettings,
                       profile=self.profile_settings() if self.profile.enabled else None,
                       tuning=self.tuning_settings() if self.tuning.enabled else None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (paths as absolute strings, tuples as lists)."""
        return self.model_dump(mode="json")

    def canonical_json(self) -> str:
        """Sorted-key, whitespace-free JSON of :meth:`to_dict`: what :meth:`hash` hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def hash(self) -> str:
        """sha256 hex digest of the canonical JSON; equal configs hash equal.

        Paths are resolved, so the same file loaded from two directories with relative
        paths hashes differently (it does describe a different run location).
        """
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a TOML file, apply ``overrides``, validate, and return the frozen :class:`Config`.

    ``overrides`` maps dotted keys to values, e.g. ``{"search.max_evaluations": 10}``
    (what CLI flags such as ``--max-evals`` produce); they replace the file's values before
    validation, so they are checked exactly like the file. A value of ``None`` means "not
    given" and is skipped. Raises :class:`ConfigError` for every kind of mistake.
    """
    source = str(path)
    file = Path(path)
    try:
        raw_bytes = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ConfigError(source, [("", "is a directory, not a TOML file")]) from None
    except PermissionError:
        raise ConfigError(source, [("", "permission denied")]) from None
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [("", f"not UTF-8 text (byte {exc.start})")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [("", _toml_error(exc))]) from None
    return _build(data, source, overrides, file)


def parse_config(
    data: Mapping[str, Any], *, source: str = "<config>", overrides: Mapping[str, Any] | None = None
) -> Config:
    """Validate an already-parsed mapping (same rules and errors as :func:`load_config`)."""
    return _build(data, source, overrides, None)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one ``KEY=VALUE`` command-line override, e.g. ``search.islands_per_task=4``.

    VALUE is read as a TOML value (``4``, ``1.5``, ``true``, ``["a", "b"]``, ``"x"``); if it is
    not valid TOML it is taken as a bare string (so ``run.name=nightly`` works).
    """
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise ConfigError("override", [(text, f"{text!r}: expected KEY=VALUE, e.g. search.max_evaluations=10")])
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value


def demo_config_path() -> Path:
    """``configs/demo.toml`` of this checkout: the embedded default config."""
    path = Path(__file__).resolve().parent.parent / "configs" / "demo.toml"
    if not path.is_file():
        raise ConfigError(
            str(path), [("", "embedded demo config not found (installed without configs/?); pass a config file")]
        )
    return path


def _build(
    data: Mapping[str, Any], source: str, overrides: Mapping[str, Any] | None, path: Path | None
) -> Config:
    raw = copy.deepcopy(dict(data))
    override_keys = _apply_overrides(raw, overrides or {}, source)
    token = _CONFIG_DIR.set(path.resolve().parent if path is not None else None)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A list whose items failed also fails its min_length (failed items are dropped
        # before the length check); the item errors already say what is wrong.
        item_locs = {
            tuple(e["loc"][:i])
            for e in errors
            for i, part in enumerate(e["loc"])
            if isinstance(part, int)
        }
        errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in item_locs)]
        problems = [_describe(err, override_keys) for err in errors]
        if any(k.startswith("tasks.files") for k, _ in problems):
            # Tasks of a file that failed to load are unknown to include: one error, not one
            # per included task listing every built-in name.
            problems = [(k, m) for k, m in problems if not k.startswith("tasks.include")]
        raise ConfigError(source, problems) from None
    finally:
        _CONFIG_DIR.reset(token)
    config._source_path = path
    logger.debug("loaded config %s (hash %s)", source, config.hash()[:12])
    return config


def _apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any], source: str) -> set[str]:
    """Set each dotted key in ``raw`` (in place); return the keys that were set."""
    applied: set[str] = set()
    for key, value in overrides.items():
        if value is None:
            continue
        parts = key.split(".") if isinstance(key, str) else []
        if not parts or any(not p.strip() for p in parts):
            raise ConfigError(
                source, [(str(key), f"override {key!r}: not a dotted key like 'search.max_evaluations'")]
            )
        table = raw
        for depth, part in enumerate(parts[:-1]):
            prefix = tuple(parts[: depth + 1])
            owner = _model_at(prefix[:-1])
            is_value = owner is not None and part in owner.model_fields and _model_at(prefix) is None
            child = table.setdefault(part, {})
            if is_value or not isinstance(child, dict):
                raise ConfigError(
                    source,
                    [(key, f"override {key!r}: '{'.'.join(prefix)}' is a value, not a [section]")],
                )
            table = child
        table[parts[-1]] = _plain(value)
        applied.add(key)
    return applied


def _plain(value: Any) -> Any:
    """Python values from callers -> the TOML-like values the validators expect."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_END = re.compile(r"\s*\(at end of document\)\s*$")


def _toml_error(exc: tomllib.TOMLDecodeError) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else "invalid TOML"
    if m := _TOML_POS.search(msg):
        return f"TOML syntax error at line {m[1]}, column {m[2]}: {msg[: m.start()]}"
    if m := _TOML_END.search(msg):
        return f"TOML syntax error at end of file: {msg[: m.start()]}"
    return f"TOML syntax error: {msg}"


# --------------------------------------------------------------------------------------
# ValidationError -> one line per problem
# --------------------------------------------------------------------------------------


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fmt(value: Any, limit: int = 80) -> str:
    """A value as it would be written in TOML (trimmed)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value)
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_fmt(v, limit) for v in value) + "]"
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k} = {_fmt(v, limit)}" for k, v in value.items()) + "}"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model that owns the keys at ``loc`` (None if loc is not a section)."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):  # an entry of a list of sections ([[llm.models]])
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        sub = _section_type(field.annotation) if field is not None else None
        if sub is None:
            return None
        model = sub
    return model


def _section_type(ann: Any) -> type[BaseModel] | None:
    """The section model inside an annotation: ``X``, ``X | None`` or ``tuple[X, ...]``."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def _field_at(loc: tuple[Any, ...]):
    model = _model_at(loc[:-1])
    return model.model_fields.get(loc[-1]) if model is not None and loc else None


def _bounds(loc: tuple[Any, ...]) -> str | None:
    """'between 1 and 64' when the field has both bounds, else None."""
    field = _field_at(loc)
    if field is None:
        return None
    lo = hi = None
    for m in field.metadata:
        lo = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else lo
        hi = getattr(m, "le", None) if getattr(m, "le", None) is not None else hi
    return f"between {_num(lo)} and {_num(hi)}" if lo is not None and hi is not None else None


def _num(x: Any) -> str:
    """Bounds as written by people: 0.0 -> 0, 0.5 -> 0.5."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


_TYPE_WORDS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
    "is_instance_of": "has the wrong type",
}


def _describe(err: Mapping[str, Any], override_keys: set[str]) -> tuple[str, str]:
    """One ValidationError entry -> (dotted key, message line without the file prefix)."""
    loc = tuple(err["loc"])
    key = _dotted(loc)
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    plain_key = ".".join(p for p in loc if isinstance(p, str))
    via = " (set by override)" if any(
        plain_key == k or plain_key.startswith(k + ".") or k.startswith(plain_key + ".") for k in override_keys
    ) else ""

    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = list(parent.model_fields) if parent is not None else []
        name = str(loc[-1])
        note = "set by override; " if via else ""
        if len(loc) == 1:
            if not isinstance(value, Mapping):  # a key written above any [section] header?
                owners = [s for s in allowed if name in _model_at((s,)).model_fields]
                did = f"did you mean '{owners[0]}.{name}'?; " if owners else ""
                return key, (
                    f"unknown top-level key '{name}' ({note}{did}keys belong in a section: "
                    f"{', '.join(f'[{a}]' for a in allowed)})"
                )
            hint = _suggest(name, allowed)
            did = f"did you mean [{hint}]?; " if hint else ""
            return key, f"unknown section [{name}] ({note}{did}allowed: {', '.join(allowed)})"
        if key in _REMOVED_KEYS:
            return key, f"'{key}'{' (set by override)' if via else ''} was {_REMOVED_KEYS[key]}"
        prefix = _dotted(loc[:-1])
        hint = _suggest(name, allowed)
        did = f"did you mean '{prefix}.{hint}'?; " if hint else ""
        return key, f"unknown key '{key}' ({note}{did}allowed: {', '.join(allowed)})"

    if kind == "missing":
        section = _model_at(loc)
        if section is not None:
            required = [
                f"{key}.{n}" + (f": {f.description}" if f.description else "")
                for n, f in section.model_fields.items()
                if f.is_required()
            ]
            return key, f"required section [{key}] is missing" + (f" ({'; '.join(required)})" if required else "")
        field = _field_at(loc)
        what = f" ({field.description})" if field is not None and field.description else ""
        return key, f"required key '{key}' is missing{what}"

    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return key, f"{key} = {_fmt(value)}{via}: must be a table (a [{key}] section)"

    if kind == "value_error":
        msg = str(ctx.get("error", err["msg"]))
        if isinstance(value, Mapping):  # a section-level check: the message names its keys
            return key, msg
        return key, f"{key} = {_fmt(value)}{via}: {msg}"

    if kind in ("greater_than_equal", "less_than_equal"):
        rng = _bounds(loc)
        bound = f"must be {rng}" if rng else (
            f"must be >= {_num(ctx['ge'])}" if kind == "greater_than_equal" else f"must be <= {_num(ctx['le'])}"
        )
        msg = bound
    elif kind == "greater_than":
        msg = f"must be > {_num(ctx['gt'])}"
    elif kind == "less_than":
        msg = f"must be < {_num(ctx['lt'])}"
    elif kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", '"')
        hint = None
        field = _field_at(loc)
        if field is not None and isinstance(value, str):
            hint = _suggest(value, [a for a in get_args(field.annotation) if isinstance(a, str)])
        msg = (f"did you mean \"{hint}\"? " if hint else "") + f"allowed: {expected}"
    elif kind in ("too_short", "string_too_short"):
        msg = "must not be empty" if ctx.get("min_length") == 1 else f"needs at least {ctx.get('min_length')} items"
    elif kind == "string_pattern_mismatch":
        example = " such as \"sm_90a\"" if loc == ("compile", "arch") else ""
        msg = f"must match {ctx.get('pattern')}{example}"
    elif kind in _TYPE_WORDS:
        msg = _TYPE_WORDS[kind]
    else:
        msg = str(err.get("msg", kind))
    return key, f"{key} = {_fmt(value)}{via}: {msg}"


def _known_gpus() -> tuple[str, ...]:
    """GPU names the task suite knows (``evo.tasks.gpu_names()`` if defined, else KNOWN_GPUS)."""
    from evo import tasks as registry  # lazy: the registry imports torch

    names = getattr(registry, "gpu_names", None)
    return tuple(names()) if callable(names) else KNOWN_GPUS
