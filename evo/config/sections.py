"""The sections of a config but ``[llm]``: ``[run]``, ``[tasks]`` (loading user task files),
``[search]``, ``[mutator]``, ``[compile]``, ``[evaluator]``, ``[ray]``, ``[profile]`` and
``[tuning]``; those a component's settings record declares are built from it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Field, field_validator, model_validator

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

#: Paths of task files already loaded in this process (resolved), so validating a second
#: config that names the same file does not register its tasks twice.
_LOADED_TASK_FILES: set[Path] = set()


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


def _load_task_file(path: Path) -> Path:
    """Item validator of ``tasks.files``: the file must exist; its tasks get registered."""
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
            hint = suggest(family, families)
            did = f" (did you mean \"family:{hint}\"?)" if hint else ""
            raise ValueError(
                f"unknown task family{did}; known families: "
                + ", ".join(f'"family:{f}"' for f in families)
            )
        return entry
    names = sorted(registry.task_names())
    if entry not in names:
        hint = suggest(entry, names)
        did = f" (did you mean \"{hint}\"?)" if hint else ""
        raise ValueError(
            f"unknown task{did}; use a task name or \"family:<name>\" "
            f"(families: {', '.join(families)}; `evo tasks` lists all tasks)\n"
            f"  known tasks: {', '.join(names)}"
        )
    return entry


class TasksConfig(Section):
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
    from evo import tasks as registry  # lazy: the registry imports torch

    names = getattr(registry, "gpu_names", None)
    return tuple(names()) if callable(names) else KNOWN_GPUS
