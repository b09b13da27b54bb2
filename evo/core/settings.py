"""Settings records: one frozen dataclass per component, its config keys declared on it.

Every component that reads a config section owns exactly one frozen settings dataclass,
defined beside the code that uses it:

====================  =============================================  =====================
config section        settings record                                used by
====================  =============================================  =====================
``[compile]``         :class:`evaluators.base.CompileSettings`       the compile stage
``[evaluator]``       :class:`evaluators.base.HarnessSettings`       the judge
``[profile]``         :class:`evaluators.profile.ProfileSettings`    the profile stage
``[tuning]``          :class:`evo.tuning.tuning_settings.TuningSettings`    tuning studies
``[search]``          :class:`evo.engine.engine_settings.EngineSettings`    the engine, the islands
``[mutator]``         :class:`mutators.knobs.KnobsSettings`          the knobs mutator
====================  =============================================  =====================

A field declared with :func:`config_key` is a key of its section: the declaration carries
its one default and its one set of bounds. A field with a plain default is set by code (the
GPU actor's per-task timeouts, the run's task files, ``nvcc``'s path, ...) and is not a
config key: writing it in a config file is an "unknown key" error. :mod:`evo.config` builds
each section's pydantic model from these declarations (:func:`evo.config.section_model`)
and validates the file once, at the edge; the records themselves do not re-check bounds, so
code and tests may build a record with any value on purpose (``memory_mb=256`` to provoke an
out-of-memory build).

Why not pydantic models: the records travel to Ray workers (pickle), and the GPU actor imports
:mod:`evaluators.base`: this module imports nothing but the standard library, so no worker
loads pydantic.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

__all__ = ["Key", "config_key", "config_keys"]

#: The ``dataclasses.field`` metadata entry that marks a config key.
_META = "evo.config_key"


@dataclass(frozen=True)
class Key:
    """How one settings field appears in its config section.

    ``ge`` / ``gt`` / ``le`` / ``lt``: numeric bounds, in the config key's unit. ``pattern``:
    a regular expression a string must match. ``path``: an output location, made absolute
    against the working directory when the config is loaded (the record holds it as a
    string). ``name``: the key's name when it differs from the field's (``""``: the same).
    ``scale``: the record holds the config value times ``scale`` (``[search]
    max_wall_minutes`` is ``EngineSettings.max_wall_seconds`` with ``scale=60``); the field's
    default is in the record's unit.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str | None = None
    path: bool = False
    name: str = ""
    scale: float = 1.0


def config_key(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
               lt: float | None = None, pattern: str | None = None, path: bool = False, name: str = "",
               scale: float = 1.0) -> Any:
    """A dataclass field that is a config key, with its default and bounds (see :class:`Key`).

    Use it as the field's default: ``timeout_s: float = config_key(300.0, gt=0)``.
    """
    if isinstance(default, (list, dict, set)):
        raise TypeError("config_key: a mutable default would be shared between records; use a tuple")
    key = Key(ge=ge, gt=gt, le=le, lt=lt, pattern=pattern, path=path, name=name, scale=float(scale))
    return field(default=default, metadata={_META: key})


def config_keys(cls: type) -> list[tuple[Field, Key]]:
    """The config keys of settings dataclass ``cls``, in declaration order (the order the
    config's error messages list them in)."""
    out = []
    for f in fields(cls):
        key = f.metadata.get(_META)
        if key is not None:
            if f.default is MISSING:
                raise TypeError(f"{cls.__name__}.{f.name}: a config key needs a default")
            out.append((f, key))
    return out
