"""Helpers shared by the CLI modules (evo.cli, evo.cli_inspect): output, errors, the DB path.

Errors print as one red ``error:`` line on stderr and exit with code 2; JSON goes to stdout.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["DEFAULT_DB", "DbOpt", "JsonOpt", "console", "err_console", "fail", "db_path", "open_reader",
           "emit_json", "fmt"]

DEFAULT_DB = "runs/evo.db"
DbOpt = typer.Option(
    None, "--db", help="Lineage database (default: $EVO_DB or runs/evo.db).", show_default=False
)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def db_path(db: Optional[str]) -> str:
    return db or os.environ.get("EVO_DB") or DEFAULT_DB


def open_reader(db: Optional[str]):
    """A read-only Store, or a clean error (missing file, not a lineage DB, newer schema)."""
    from evo.store import Store, StoreError

    try:
        return Store.open_reader(db_path(db))
    except StoreError as e:
        fail(str(e))


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)
