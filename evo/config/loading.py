"""Loading: a TOML file or a mapping, with dotted-key overrides, validated once into the
frozen :class:`~evo.config.model.Config`; every mistake a :class:`~evo.config.errors.ConfigError`."""

from __future__ import annotations

import copy
import logging
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evo.config.errors import ConfigError
from evo.config.fields import CONFIG_DIR
from evo.config.messages import describe, model_at
from evo.config.model import Config

__all__ = ["load_config", "parse_config", "parse_override", "demo_config_path"]

logger = logging.getLogger(__name__)


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
    path = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
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
    token = CONFIG_DIR.set(path.resolve().parent if path is not None else None)
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
        problems = [describe(err, override_keys) for err in errors]
        if any(k.startswith("tasks.files") for k, _ in problems):
            # Tasks of a file that failed to load are unknown to include: one error, not one
            # per included task listing every built-in name.
            problems = [(k, m) for k, m in problems if not k.startswith("tasks.include")]
        raise ConfigError(source, problems) from None
    finally:
        CONFIG_DIR.reset(token)
    config._source_path = path
    config._source = source
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
            owner = model_at(prefix[:-1])
            is_value = owner is not None and part in owner.model_fields and model_at(prefix) is None
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
