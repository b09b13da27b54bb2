"""The whole validated configuration, :class:`Config`, and the settings records it gives
each component."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.profile import ProfileSettings
from evo.config.fields import Section, record
from evo.config.llm import LLMConfig
from evo.config.sections import (
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
from evo.engine.engine_settings import EngineSettings
from evo.tuning.tuning_settings import TuningSettings
from mutators.knobs import KnobsSettings

__all__ = ["Config"]


class Config(Section):
    """The whole validated configuration. Frozen; build it with :func:`load_config`.

    ``source_path`` is the file it came from (None when built from a mapping); ``source``
    names it as the user did (``<config>`` or the caller's name for a mapping), the prefix of
    every :class:`~evo.config.errors.ConfigError` line about it.
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
    _source: str = PrivateAttr(default="<config>")

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @property
    def source(self) -> str:
        return self._source

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
        return record(self.compile, CompileSettings)

    def harness_settings(self) -> HarnessSettings:
        """The ``[evaluator]`` section as the judge's settings record, with the run's user task
        files (``[tasks] files``), which the judge imports."""
        return record(self.evaluator, HarnessSettings, task_files=tuple(str(f) for f in self.tasks.files))

    def profile_settings(self) -> ProfileSettings:
        """The ``[profile]`` section as the profile stage's record; its cache is
        ``profiles`` beside the compile cache."""
        return record(self.profile, ProfileSettings, cache_dir=str(Path(self.compile.cache_dir).parent / "profiles"))

    def knobs_settings(self) -> KnobsSettings:
        """The ``[mutator]`` section's knobs keys as the knobs mutator's record."""
        return record(self.mutator, KnobsSettings)

    def tuning_settings(self) -> TuningSettings:
        """The ``[tuning]`` section as tuning's record (seeded by ``run.seed``)."""
        return record(self.tuning, TuningSettings, seed=self.run.seed)

    def engine_settings(self) -> EngineSettings:
        """The ``[search]`` section as the engine's record, with the run's profile and tuning
        records when those are enabled (None otherwise: the engine skips them)."""
        return record(self.search, EngineSettings,
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
