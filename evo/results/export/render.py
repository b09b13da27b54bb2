"""The generated files' templates (``templates/*.tmpl``, package data) and the fields
rendered into them, the ABI's among them (from :mod:`evaluators.abi`)."""

from __future__ import annotations

import string
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from evo.results.export.errors import ExportTemplateError

__all__ = ["TEMPLATES_DIR", "template_fields", "render_template", "abi_fields", "build_script"]

#: The generated files' templates (shipped as package data, like ``mutators/llm/prompt/prompts``).
TEMPLATES_DIR = Path(__file__).with_name("templates")


class _FieldTemplate(string.Template):
    """``${name}`` with a lower-case ``name`` is a field; every other ``$`` is literal text.

    The templates are bash and Python, full of ``$VAR``, ``${VAR:-x}`` and f-strings, so
    unlike the prompts' templates there is no ``$$`` escape to remember: a field is always
    braced and lower-case, and nothing else is touched.
    """

    flags = 0  # case-sensitive: ${BASH_SOURCE[0]} and ${NVCC:-} are bash, not fields
    pattern = r"""
    \$(?:
      (?P<escaped>(?!))             |
      (?P<named>(?!))               |
      \{(?P<braced>[a-z][a-z0-9_]*)\} |
      (?P<invalid>(?!))
    )
    """


@lru_cache(maxsize=None)
def _template(name: str) -> _FieldTemplate:
    path = TEMPLATES_DIR / f"{name}.tmpl"
    try:
        return _FieldTemplate(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ExportTemplateError(
            f"export template {path} cannot be read ({e}); the package data evo/results/export/templates/*.tmpl "
            "is incomplete: reinstall cute-evo") from None


def template_fields(name: str) -> set[str]:
    """The field names template ``name`` (e.g. ``"op.py"``) uses."""
    return set(_template(name).get_identifiers())


def render_template(name: str, **fields: Any) -> str:
    """Template ``name`` with ``fields`` substituted (values via ``str``, inserted verbatim and
    not re-scanned). The fields given must be exactly those the template uses: a missing or an
    unused one raises :class:`ExportTemplateError` naming it (a template and its caller out of
    step must fail here, not produce a subtly different file)."""
    used = template_fields(name)
    missing, unused = sorted(used - fields.keys()), sorted(fields.keys() - used)
    if missing or unused:
        raise ExportTemplateError(
            f"export template {name}.tmpl and evo/results/export disagree: missing field(s) "
            f"{', '.join(missing) or 'none'}, unused field(s) {', '.join(unused) or 'none'}")
    return _template(name).substitute({k: str(v) for k, v in fields.items()})


def _wrap_items(head: str, items: Sequence[str], tail: str, column: int, width: int) -> str:
    """``head + ", ".join(items) + tail`` for a value that starts at ``column`` of its line,
    broken greedily before an item that would pass ``width`` columns; continuation lines
    are aligned under the first item."""
    indent = " " * (column + len(head))
    lines: list[str] = []
    cur, start = head, column
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else tail)
        if i and start + len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur, start = indent + piece, 0
        else:
            cur = cur + (" " if i else "") + piece
    lines.append(cur)
    return "\n".join(lines)


def _py_ctype(name: str) -> str:
    """Python source for an ABI type name of :mod:`evaluators.abi` (``EvoTensor*`` ->
    ``ctypes.POINTER(EvoTensor)``), as the exported op.py spells it."""
    if name == "EvoTensor*":
        return "ctypes.POINTER(EvoTensor)"
    if name.endswith("*"):
        return f"ctypes.POINTER(ctypes.{name[:-1]})"
    return f"ctypes.{name}"


def abi_fields() -> dict[str, str]:
    """The ABI fields of ``op.py.tmpl``, rendered from :mod:`evaluators.abi` (the one Python
    statement of ``evo_abi.h``): the struct, dtype codes and entry-point signatures."""
    from evaluators import abi

    if abi.WORKSPACE_ARGS != abi.LAUNCH_ARGS[:-1]:  # op.py.tmpl writes ws.argtypes = fn.argtypes[:-1]
        raise ExportTemplateError("evaluators.abi.WORKSPACE_ARGS is no longer LAUNCH_ARGS[:-1]; "
                                  "op.py.tmpl binds evo_workspace_bytes that way: update it")
    fields = ["["]
    for name, ct, n in abi.EVO_TENSOR_FIELDS:
        size = "" if n is None else (" * _MAX_DIMS" if n == abi.MAX_DIMS else f" * {n}")
        fields.append(f'        ("{name}", ctypes.{ct}{size}),')
    fields.append("    ]")
    codes = [f"torch.{dt}: {code}" for dt, code in abi.EVO_DTYPES.items()]
    return {
        "abi_version": str(abi.ABI_VERSION),
        "max_dims": str(abi.MAX_DIMS),
        "evo_tensor_fields": "\n".join(fields),
        # wrapped where op.py.tmpl places them: a module constant (88 columns) and a code line (120)
        "dtype_codes": _wrap_items("{", codes, "}", column=len("_DTYPE_CODES = "), width=88),
        "launch_argtypes": _wrap_items("[", [_py_ctype(t) for t in abi.LAUNCH_ARGS], "]",
                                       column=len("                fn.argtypes = "), width=120),
        "launch_restype": _py_ctype(abi.LAUNCH_RESTYPE),
        "workspace_restype": _py_ctype(abi.WORKSPACE_RESTYPE),
    }


def build_script(arch: str, extra_flags: Sequence[str] = ()) -> str:
    """``build.sh``: rebuild ``kernel_<ARCH>.so`` from kernel.cu (``bash build.sh sm_100a``)."""
    return render_template("build.sh", arch=arch, extra_flags=" ".join(_shell_quote(f) for f in extra_flags))


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
