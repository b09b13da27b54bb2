"""The building blocks of the config's sections: path fields (output locations against the
working directory, input files against the config file's directory), ``"auto"`` integers,
did-you-mean suggestions, the strict section base, and section models built from a
component's settings record (:mod:`evo.core.settings`) and back."""

from __future__ import annotations

import contextvars
import difflib
from pathlib import Path
from typing import Annotated, Any, get_type_hints

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from evo.core.settings import config_keys

__all__ = ["CONFIG_DIR", "PathField", "InputPathField", "int_or_auto", "suggest", "Section", "section_model",
           "record"]


#: Directory of the config file being validated (None for in-memory data): input files the
#: config names (``tasks.files``) are found relative to it, whatever the working directory.
CONFIG_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar("evo_config_dir", default=None)


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
    base = CONFIG_DIR.get() or Path.cwd()
    return (base / path).resolve()


PathField = Annotated[Path, BeforeValidator(_resolve_path)]
InputPathField = Annotated[Path, BeforeValidator(_resolve_input_path)]


def int_or_auto(value: Any, minimum: int) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ValueError(f"must be an integer >= {minimum} or \"auto\"")


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
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


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are immutable and strict."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, validate_default=True
    )


def section_model(settings: type, name: str, doc: str, base: type[Section] = Section,
                  module: str = __name__) -> type[Section]:
    """The section model whose keys a component's settings dataclass declares.

    Each ``config_key`` field of ``settings`` (:mod:`evo.core.settings`) becomes a key of the
    same name (or ``Key.name``), type, default (divided by ``Key.scale``), bounds and
    pattern; a ``Key.path`` key is an output location (:data:`PathField`). Fields set by
    code are not keys. ``base`` carries cross-key validators; ``module`` is the module that
    binds the model's name (so that it pickles). The default and the bounds of a key thus
    exist once, on the record; :func:`record` turns a section back into one.
    """
    hints = get_type_hints(settings)
    spec: dict[str, Any] = {}
    for f, key in config_keys(settings):
        default = f.default / key.scale if key.scale != 1.0 else f.default
        spec[key.name or f.name] = (
            PathField if key.path else hints[f.name],
            Field(default, ge=key.ge, gt=key.gt, le=key.le, lt=key.lt, pattern=key.pattern),
        )
    return create_model(name, __base__=base, __module__=module, __doc__=doc, **spec)


def record(section: BaseModel, settings: type, **by_code: Any) -> Any:
    """The ``settings`` record of a section made by :func:`section_model`: its keys' values
    (paths as strings, scaled values in the record's unit) plus the fields in ``by_code``."""
    values: dict[str, Any] = {}
    for f, key in config_keys(settings):
        value = getattr(section, key.name or f.name)
        values[f.name] = str(value) if key.path else (value * key.scale if key.scale != 1.0 else value)
    return settings(**values, **by_code)
