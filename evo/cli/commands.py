"""`evo` command line: a thin layer over the Python API (Typer + rich).

This module makes the Typer app, registers the commands of :mod:`evo.cli.search` (search,
fake-llm), :mod:`evo.cli.inspect` (runs, top, show, lineage, status, report, export) and
:mod:`evo.cli.kernels` (tasks, check, tune, bench) in the order ``evo --help`` lists them,
and is the console script's entry point. Only the root callback configures logging
handlers. Every command's help ends with an example (``tests/test_cli.py`` fails if one
lacks it). Listing commands take ``--json``.
"""

from __future__ import annotations

import logging
import sys

import typer

from evo.cli.common import db_path as _db_path
from evo.cli.common import err_console
from evo.cli.inspect import export, lineage, report, runs, show, status, top
from evo.cli.kernels import bench, check, tasks, tune
from evo.cli.search import fake_llm, search

log = logging.getLogger(__name__)

app = typer.Typer(
    name="evo",
    help=(
        "Evolve fast CuTe GPU kernels for PyTorch reference tasks, verified by a hardened "
        "evaluator, with every attempt kept in a SQLite lineage database.\n\n"
        "Example: evo search configs/demo.toml"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)



def _setup_logging(verbose: int) -> None:
    # One line per record on the terminal (own packages; errors from anyone); everything,
    # third-party start-up notices included, in the log file (evo.cli.common.setup_logging).
    from evo.cli.common import setup_logging

    setup_logging(verbose)


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-v, -vv)."),
) -> None:
    _setup_logging(verbose)


#: The commands in the order ``evo --help`` lists them.
COMMANDS = (
    ("search", search), ("runs", runs), ("top", top), ("show", show), ("lineage", lineage),
    ("tasks", tasks), ("check", check), ("tune", tune), ("bench", bench), ("fake-llm", fake_llm),
    ("status", status), ("report", report), ("export", export),
)
for _name, _fn in COMMANDS:
    app.command(_name)(_fn)


def main() -> None:  # console script entry point
    try:
        app()
    except Exception as e:
        # A store failure no command caught (a damaged database file, found mid-query) is
        # one line naming the file and the fix, not a traceback.
        from rich.markup import escape

        from evo.store import CorruptDatabaseError, StoreError, is_corruption

        if isinstance(e, StoreError):
            msg = str(e)
        elif is_corruption(e):
            argv = sys.argv[1:]
            db = next((a.split("=", 1)[1] for a in argv if a.startswith("--db=")), None)
            db = db or next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--db"), None)
            msg = str(CorruptDatabaseError(_db_path(db), e))
        else:
            raise
        err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
