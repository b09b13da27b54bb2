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
  :class:`evo.tuning.tuning_settings.TuningSettings`, ``[search]``
  :class:`evo.engine.engine_settings.EngineSettings`. Those frozen dataclasses declare each key's
  one default and one set of bounds (``config_key``, :mod:`evo.core.settings`); this module
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
* ``tasks.files`` are checked to exist, never run: validating a config changes nothing
  global. ``tasks.include`` is checked against the built-in tasks
  (``evo.tasks.BUILTIN_TASKS``); with task files, an entry no built-in matches is checked by
  :func:`load_tasks`, which the search calls once at its start to load the files into its own
  :class:`evo.tasks.TaskRegistry` (same :class:`ConfigError` lines). The registry is imported
  lazily, so importing this module stays cheap.
* Secrets never live here: later sections name environment variables, not keys.

Modules: :mod:`.errors` (ConfigError), :mod:`.fields` (path fields, the strict section base,
section models built from settings records), :mod:`.sections` (the sections but ``[llm]``),
:mod:`.tasks` (the search's task registry from ``[tasks]``),
:mod:`.llm` (``[llm]``), :mod:`.model` (the whole :class:`Config`), :mod:`.loading` (TOML,
overrides, validation), :mod:`.messages` (a ValidationError as one line per problem).
"""

from evo.config.errors import ConfigError
from evo.config.fields import section_model
from evo.config.llm import LLMConfig, LLMModelConfig
from evo.config.loading import demo_config_path, load_config, parse_config, parse_override
from evo.config.model import Config
from evo.config.sections import (
    KNOWN_GPUS,
    CompileConfig,
    EvaluatorConfig,
    MutatorConfig,
    ProfileConfig,
    RayConfig,
    RunConfig,
    SearchConfig,
    TasksConfig,
    TuningConfig,
)
from evo.config.tasks import load_tasks

__all__ = [
    "CompileConfig",
    "Config",
    "ConfigError",
    "EvaluatorConfig",
    "KNOWN_GPUS",
    "LLMConfig",
    "LLMModelConfig",
    "MutatorConfig",
    "ProfileConfig",
    "RayConfig",
    "RunConfig",
    "SearchConfig",
    "TasksConfig",
    "TuningConfig",
    "demo_config_path",
    "load_config",
    "load_tasks",
    "section_model",
    "parse_config",
    "parse_override",
]
