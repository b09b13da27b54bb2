"""What a seed kernel is: a template plus task-specific ``#define`` lines (no registry here).

Kept apart from :mod:`evo.tasks.seeds` so that the seed tables of several modules
(``seeds.py``'s memory-bound families, ``gemm_seeds.py``'s GEMMs) can import
:class:`SeedSpec` without importing each other.

A template is ``evo/tasks/kernels/<template>.cu``. It contains exactly one marker line
``// @evo:task-config``; rendering puts the spec's ``#define NAME VALUE`` lines right after
it, so a rendered seed is one self-contained source (only ``cute/``, ``cutlass/``, CUDA
headers and ``evo_abi.h`` included). ``tunable_defaults`` optionally moves a tunable's
default for this task (both the ``@tunable`` annotation and its ``#ifndef`` block are
rewritten, so the two stay in agreement); the new default must be one of the declared
choices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from evo.core.tunables import TunableError, parse_tunables

__all__ = ["SeedSpec", "TASK_CONFIG_MARKER", "render", "template_source", "template_path"]

TASK_CONFIG_MARKER = "// @evo:task-config"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SeedSpec:
    """A seed: ``template`` name, ``defines`` inserted at the marker, a one-line description.

    ``defines`` are ``(NAME, VALUE)`` pairs rendered as ``#define NAME VALUE`` in order;
    ``tunable_defaults`` are ``(TUNABLE, VALUE)`` pairs that replace the template's defaults.
    """

    template: str
    defines: tuple[tuple[str, str], ...]
    description: str
    tunable_defaults: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name, _ in self.defines + self.tunable_defaults:
            if not _NAME_RE.match(name):
                raise ValueError(f"SeedSpec: {name!r} is not a valid macro name")


def template_path(template: str):
    """The ``Traversable`` of ``kernels/<template>.cu`` (package data, works from a wheel)."""
    return resources.files("evo.tasks").joinpath("kernels", f"{template}.cu")


@lru_cache(maxsize=None)
def template_source(template: str) -> str:
    """Text of a template; FileNotFoundError names the kernels folder and what it holds."""
    path = template_path(template)
    if not path.is_file():
        folder = resources.files("evo.tasks").joinpath("kernels")
        have = sorted(p.name[:-3] for p in folder.iterdir() if p.name.endswith(".cu"))
        raise FileNotFoundError(f"no seed template {template!r} in evo/tasks/kernels; templates: {have}")
    return path.read_text(encoding="utf-8")


def render(spec: SeedSpec) -> str:
    """The self-contained seed source for ``spec`` (see the module docstring)."""
    text = template_source(spec.template)
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == TASK_CONFIG_MARKER]
    if len(hits) != 1:
        raise ValueError(
            f"template {spec.template!r} must contain exactly one line {TASK_CONFIG_MARKER!r}, "
            f"found {len(hits)}"
        )
    config = [f"#define {name} {value}" for name, value in spec.defines]
    lines[hits[0] + 1 : hits[0] + 1] = config
    out = "\n".join(lines) + "\n"
    if spec.tunable_defaults:
        out = _move_defaults(out, dict(spec.tunable_defaults), spec.template)
    return out


def _move_defaults(source: str, new: dict[str, str], template: str) -> str:
    declared = {t.name: t for t in parse_tunables(source)}
    for name, value in new.items():
        if name not in declared:
            raise TunableError(f"template {template!r} declares no tunable {name}; it has {sorted(declared)}")
        if value not in declared[name].choices:
            raise TunableError(
                f"template {template!r}: default {name} = {value!r} is not one of "
                f"{{{', '.join(declared[name].choices)}}}"
            )
        source, n1 = re.subn(
            rf"(//\s*@tunable\s+{name}\s*=\s*)\S+(\s+in\b)", rf"\g<1>{value}\g<2>", source, count=1
        )
        source, n2 = re.subn(
            rf"(#\s*ifndef\s+{name}\s*\n\s*#\s*define\s+{name}\s+)\S+", rf"\g<1>{value}", source, count=1
        )
        if n1 != 1 or n2 != 1:
            raise TunableError(f"template {template!r}: could not rewrite the default of {name}")
    return source
