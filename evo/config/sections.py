"""The sections of a config but ``[llm]``: ``[run]``, ``[tasks]`` (user task files are checked
to exist, not run), ``[search]``, ``[mutator]``, ``[compile]``, ``[evaluator]``, ``[ray]``,
``[profile]`` and ``[tuning]``; those a component's settings record declares are built from it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.profile import ProfileSettings
from evo.config.fields import CONFIG_DIR, InputPathField, PathField, Section, int_or_auto, section_model, suggest
from evo.engine.engine_settings import EngineSettings
from evo.tuning.tuning_settings import TuningSettings
from mutators.knobs import KnobsSettings

__all__ = ["KNOWN_GPUS", "RunConfig", "TasksConfig", "SearchConfig", "MutatorConfig", "CompileConfig",
           "EvaluatorConfig", "RayConfig", "ProfileConfig", "TuningConfig"]

logger = logging.getLogger(__name__)

#: GPU names accepted by ``run.gpu`` when the task suite does not publish its own list
#: (``evo.tasks.gpu_names()``, if it exists, takes precedence). Matching is case-insensitive.
KNOWN_GPUS: tuple[str, ...] = ("H100", "H200")

class RunConfig(Section):
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


def _check_task_file(path: Path) -> Path:
    """Item validator of ``tasks.files``: the file must exist. It is not run here: the search
    loads it into its task registry (:func:`evo.config.tasks.load_tasks`)."""
    if not path.is_file():
        if path.exists():
            raise ValueError("is not a file")
        base = CONFIG_DIR.get()
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
    return path


def task_entry_problem(entry: str, tasks: Any) -> str | None:
    """What is wrong with the ``tasks.include`` entry ``entry`` (a task name or
    ``family:<name>``) against the registry ``tasks`` (:class:`evo.tasks.TaskRegistry`), or None."""
    families = sorted(tasks.families())
    if entry.startswith("family:"):
        family = entry[len("family:"):]
        if family not in families:
            hint = suggest(family, families)
            did = f" (did you mean \"family:{hint}\"?)" if hint else ""
            return (f"unknown task family{did}; known families: "
                    + ", ".join(f'"family:{f}"' for f in families))
        return None
    names = sorted(tasks.names())
    if entry not in names:
        hint = suggest(entry, names)
        did = f" (did you mean \"{hint}\"?)" if hint else ""
        return (f"unknown task{did}; use a task name or \"family:<name>\" "
                f"(families: {', '.join(families)}; `evo tasks` lists all tasks)\n"
                f"  known tasks: {', '.join(names)}")
    return None


def _check_task_entry(entry: str, info: ValidationInfo) -> str:
    """Item validator of ``tasks.include`` against the built-in tasks. With ``tasks.files``, an
    entry no built-in task matches may name one of theirs: it is checked when the search
    loads them (:func:`evo.config.tasks.load_tasks`), with the same message."""
    from evo.tasks.registry import BUILTIN_TASKS  # lazy: the registry builds every task

    problem = task_entry_problem(entry, BUILTIN_TASKS)
    if problem is not None and not info.data.get("files"):
        raise ValueError(problem)
    return entry


class TasksConfig(Section):
    """``[tasks]``: which tasks to search.

    ``files`` is declared before ``include``, so the include check knows whether entries that
    name no built-in task may name a user task (checked when the search loads the files).
    """

    files: tuple[Annotated[InputPathField, AfterValidator(_check_task_file)], ...] = Field(
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


class _SearchRules(Section):
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
    ":class:`evo.engine.engine_settings.EngineSettings`).", base=_SearchRules, module=__name__)


class _MutatorKind(Section):
    """The ``[mutator]`` key no settings record declares: which mutator proposes children."""

    kind: Literal["knobs", "llm"] = "knobs"


MutatorConfig = section_model(
    KnobsSettings, "MutatorConfig",
    "``[mutator]``: how children are proposed: the offline ``knobs`` mutator or ``llm`` (needs an "
    "``[llm]`` section, see docs/llm.md); the knobs mutator's keys: :class:`mutators.knobs.KnobsSettings`.",
    base=_MutatorKind, module=__name__)


CompileConfig = section_model(
    CompileSettings, "CompileConfig", "``[compile]``: nvcc settings (keys: :class:`evaluators.base.CompileSettings`).",
    module=__name__)

EvaluatorConfig = section_model(
    HarnessSettings, "EvaluatorConfig",
    "``[evaluator]``: correctness and timing protocol (keys: :class:`evaluators.base.HarnessSettings`).",
    module=__name__)


class RayConfig(Section):
    """``[ray]``: where to run. ``RAY_ADDRESS`` is honoured by the runtime, not here."""

    address: str = ""
    num_gpus: Union[int, Literal["auto"]] = "auto"
    num_cpus: Union[int, Literal["auto"]] = "auto"

    @field_validator("num_gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        return int_or_auto(v, 0)

    @field_validator("num_cpus", mode="before")
    @classmethod
    def _cpus(cls, v: Any) -> Any:
        return int_or_auto(v, 1)


ProfileConfig = section_model(
    ProfileSettings, "ProfileConfig",
    "``[profile]``: delayed Nsight Compute profiling of survivors, docs/profiling.md (keys: "
    ":class:`evaluators.profile.ProfileSettings`).", module=__name__)

TuningConfig = section_model(
    TuningSettings, "TuningConfig",
    "``[tuning]``: Optuna studies over the tunables of new top-k members, docs/tuning.md (keys: "
    ":class:`evo.tuning.tuning_settings.TuningSettings`).", module=__name__)


def _known_gpus() -> tuple[str, ...]:
    """GPU names the task suite knows (``evo.tasks.gpu_names()`` if defined, else KNOWN_GPUS)."""
    from evo import tasks as registry  # lazy: the registry builds every task

    names = getattr(registry, "gpu_names", None)
    return tuple(names()) if callable(names) else KNOWN_GPUS
