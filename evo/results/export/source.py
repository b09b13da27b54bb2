"""The exported sources: a kernel with its tunables baked in, the op's identifier, and
Python functions copied as self-contained source (the task's reference and inputs)."""

from __future__ import annotations

import inspect
import math
import re
import textwrap
from typing import Any, Callable, Mapping, Sequence

from evo.results.export.errors import NotStandaloneError

__all__ = ["bake_params", "op_identifier", "standalone_source"]

#: Modules a copied reference may use (imported under the same name in reference.py).
_SAFE_MODULE_PREFIXES = ("torch", "math", "numpy", "functools", "operator", "itertools", "typing")
_CONST_TYPES = (int, float, str, bool, type(None))


def bake_params(source: str, params: Mapping[str, str] | Sequence[tuple[str, str]], *, header: str = "") -> str:
    """``source`` with ``#define NAME VALUE`` for each tunable at the very top, so that its
    ``#ifndef NAME`` defaults are skipped and the file builds with no ``-D`` flags (the
    same preprocessor state as the search's ``-DNAME=VALUE``)."""
    items = sorted(dict(params).items())
    lines = [f"// {ln}".rstrip() for ln in header.splitlines()] if header else []
    if items:
        lines.append("// Tunable values of this kernel (were -D flags during the search):")
        lines += [f"#define {k} {v}" for k, v in items]
    if not lines:
        return source
    return "\n".join(lines) + "\n\n" + source


def op_identifier(task: str) -> str:
    """The op's name inside the ``evo`` namespace: ``task`` with non-identifier characters
    replaced by ``_`` (prefixed ``t_`` if it starts with a digit)."""
    name = re.sub(r"\W", "_", task)
    return f"t_{name}" if not name or name[0].isdigit() else name


def _module_ok(mod_name: str) -> bool:
    return any(mod_name == p or mod_name.startswith(p + ".") for p in _SAFE_MODULE_PREFIXES)


def _public_home(val: Any, name: str) -> str | None:
    """The public module a torch/math function was imported from (``from torch import relu``
    makes ``relu`` a global whose ``__module__`` is private), or None."""
    import torch
    import torch.nn.functional

    for mod_name, mod in (("torch", torch), ("torch.nn.functional", torch.nn.functional), ("math", math)):
        if getattr(mod, name, None) is val:
            return mod_name
    return None


def standalone_source(fn: Callable[..., Any]) -> tuple[str, str]:
    """``(source, name)``: self-contained Python source defining ``fn`` (as ``name``) plus the
    module-level functions and constants it uses, with imports of torch/math/numpy modules.

    Raises :class:`NotStandaloneError` for callables that are not plain functions (a lambda,
    a class instance, a closure) or that use anything else from their module.
    """
    imports: dict[str, str] = {}
    consts: dict[str, str] = {}
    blocks: list[str] = []
    done: set[int] = set()

    def visit(f: Callable[..., Any]) -> None:
        if id(f) in done:
            return
        done.add(id(f))
        if not inspect.isfunction(f) or f.__name__ == "<lambda>":
            raise NotStandaloneError(
                f"{f!r} is not a plain module-level function; only those can be copied into a "
                "standalone export")
        cv = inspect.getclosurevars(f)
        if cv.nonlocals:
            raise NotStandaloneError(f"{f.__qualname__} is a closure over {sorted(cv.nonlocals)}; "
                                     "define it at module level to export it")
        for name, val in sorted(cv.globals.items()):
            if inspect.ismodule(val):
                if not _module_ok(val.__name__):
                    raise NotStandaloneError(f"{f.__qualname__} uses module {val.__name__!r}; only "
                                             f"{', '.join(_SAFE_MODULE_PREFIXES)} can be exported")
                imports[name] = (f"import {val.__name__}" if name == val.__name__
                                 else f"import {val.__name__} as {name}")
            elif inspect.isfunction(val) and val.__module__ == f.__module__:
                visit(val)
                if val.__name__ != name:
                    consts[name] = val.__name__
            elif isinstance(val, _CONST_TYPES) or (
                isinstance(val, tuple) and all(isinstance(x, _CONST_TYPES) for x in val)
            ):
                if isinstance(val, float) and not math.isfinite(val):
                    consts[name] = f"float({str(val)!r})"
                else:
                    consts[name] = repr(val)
            elif (src_mod := _public_home(val, name)) is not None:
                imports[name] = f"from {src_mod} import {name}"
            else:
                raise NotStandaloneError(f"{f.__qualname__} uses the global {name!r} "
                                         f"({type(val).__name__}); only constants, torch/math/numpy "
                                         "and module-level functions can be exported")
        try:
            src = textwrap.dedent(inspect.getsource(f))
        except (OSError, TypeError) as e:
            raise NotStandaloneError(f"the source of {f.__qualname__} is not available: {e}") from e
        blocks.append(src.rstrip() + "\n")

    visit(fn)
    parts = sorted(set(imports.values()))
    if consts:
        parts.append("")
        parts += [f"{k} = {v}" for k, v in sorted(consts.items())]
    parts.append("")
    parts += [b + "\n" for b in blocks]  # post-order: helpers first, the function last
    return "\n".join(parts).rstrip() + "\n", fn.__name__
