"""A pydantic ValidationError entry as one line naming the dotted key, the bad value and what
is allowed (with a did-you-mean for unknown keys and sections, and the removed keys' advice)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel

from evo.config.fields import suggest
from evo.config.model import Config

__all__ = ["describe", "model_at", "value_line"]

#: Keys that existed once and were removed, with what to do instead: an old config that
#: still sets one gets this line rather than a bare "unknown key".
_REMOVED_KEYS: dict[str, str] = {
    "compile.workers": "removed (no code could honour it): compiles run as Ray tasks, one per CPU that Ray "
                       "has; set [ray] num_cpus to run fewer, and delete this line",
    "evaluator.isolation": "removed: every verdict now comes from the judge, which never loads candidate "
                           "code, and each candidate runs in a sandboxed runner (docs/evaluator.md); delete "
                           "this line",
    "evaluator.warm_children": "removed with the Python harness children it kept warm: the judge stays warm "
                               "and starts the next candidate's runner itself (docs/evaluator.md); delete this line",
    "evaluator.check_concurrency": "removed with the Python harness: the judge checks one candidate at a time "
                                   "and starts the next one's runner meanwhile (docs/evaluator.md); delete this line",
    "evaluator.fresh_timing_process": "removed with the Python harness: the judge times every candidate in the "
                                      "runner that ran its correctness trials, which holds nothing of the "
                                      "judge's (docs/evaluator.md); delete this line",
}


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


def value_line(key: str, value: Any, msg: str) -> str:
    """One problem line about a value: ``tasks.include[0] = "kb19_relux": unknown task ...``."""
    return f"{key} = {_fmt(value)}: {msg}"


def model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
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
    model = model_at(loc[:-1])
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


def describe(err: Mapping[str, Any], override_keys: set[str]) -> tuple[str, str]:
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
        parent = model_at(loc[:-1])
        allowed = list(parent.model_fields) if parent is not None else []
        name = str(loc[-1])
        note = "set by override; " if via else ""
        if len(loc) == 1:
            if not isinstance(value, Mapping):  # a key written above any [section] header?
                owners = [s for s in allowed if name in model_at((s,)).model_fields]
                did = f"did you mean '{owners[0]}.{name}'?; " if owners else ""
                return key, (
                    f"unknown top-level key '{name}' ({note}{did}keys belong in a section: "
                    f"{', '.join(f'[{a}]' for a in allowed)})"
                )
            hint = suggest(name, allowed)
            did = f"did you mean [{hint}]?; " if hint else ""
            return key, f"unknown section [{name}] ({note}{did}allowed: {', '.join(allowed)})"
        if key in _REMOVED_KEYS:
            return key, f"'{key}' = {_fmt(value)}{' (set by override)' if via else ''} was {_REMOVED_KEYS[key]}"
        prefix = _dotted(loc[:-1])
        hint = suggest(name, allowed)
        did = f"did you mean '{prefix}.{hint}'?; " if hint else ""
        return key, f"unknown key '{key}' ({note}{did}allowed: {', '.join(allowed)})"

    if kind == "missing":
        section = model_at(loc)
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
            hint = suggest(value, [a for a in get_args(field.annotation) if isinstance(a, str)])
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
