"""The ``evo`` command line (Typer + rich): the app and its commands in
:mod:`evo.cli.commands`; the commands by concept in :mod:`evo.cli.search`,
:mod:`evo.cli.inspect` and :mod:`evo.cli.kernels`; helpers in :mod:`evo.cli.common`.

``app`` and ``main`` (the console script's entry point, ``evo = "evo.cli:main"``) are loaded on
first use (PEP 562), so that importing one CLI module does not load all of them;
``python -m evo.cli`` runs :mod:`evo.cli.__main__`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from evo.cli import commands

        return getattr(commands, name)
    # AttributeError (not ImportError) lets `from evo.cli import common` fall back to the submodule.
    raise AttributeError(f"module 'evo.cli' has no attribute {name!r}")
