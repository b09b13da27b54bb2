"""The export's errors: what the user asked cannot be done, a task function cannot be
copied, a template and its caller disagree."""

from __future__ import annotations

__all__ = ["ExportError", "NotStandaloneError", "ExportTemplateError"]


class ExportError(RuntimeError):
    """The export cannot be done as asked; the message names the problem and the fix."""


class NotStandaloneError(ValueError):
    """A task function cannot be copied as self-contained source (it uses something other
    than torch, math, numpy, constants and other module-level functions of its module)."""


class ExportTemplateError(RuntimeError):
    """A template under :data:`evo.results.export.render.TEMPLATES_DIR` is missing or does not
    match the fields the code renders it with: a broken install or a code bug, never the
    user's input."""
