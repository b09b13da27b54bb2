"""Helpers shared by the CLI modules (evo.cli.commands, evo.cli.search, evo.cli.inspect,
evo.cli.kernels): output, errors, the DB path, logging and id resolution (tables and values
are :mod:`evo.results.tables`).

Errors print as one red ``error:`` line on stderr and exit with code 2; JSON goes to stdout.

Logging (:func:`setup_logging`): the terminal shows one line per record (``warning: ...``)
from cute-evo's own packages, and errors from anyone; every record, third-party start-up
notices included (Ray's token-authentication notice, "Started a local Ray instance"), goes
to the log file :func:`log_path` (``$EVO_LOG``, default ``.evo/evo.log``), created on the
first record.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["DEFAULT_DB", "DbOpt", "JsonOpt", "console", "err_console", "fail", "db_path", "open_reader",
           "emit_json", "setup_logging", "log_path", "OWN_PACKAGES", "store_error_text",
           "distinguishable_ids", "resolve_run", "ProgressOpt"]

DEFAULT_DB = "runs/evo.db"
DbOpt = typer.Option(
    None, "--db", help="Lineage database (default: $EVO_DB or runs/evo.db).", show_default=False
)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
ProgressOpt = typer.Option(True, "--progress/--no-progress",
                           help="Show a progress bar (never when stdout is not a terminal).")

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


# --------------------------------------------------------------------------- logging

#: Top-level packages whose log records reach the terminal (others only the log file).
OWN_PACKAGES = ("evo", "evaluators", "mutators", "populations")


def log_path() -> Path:
    """The CLI's log file: ``$EVO_LOG``, else ``.evo/evo.log`` under the working directory."""
    return Path(os.environ.get("EVO_LOG") or ".evo/evo.log")


class _OwnOrError(logging.Filter):
    """Lets through cute-evo's own records and anyone's errors: third-party start-up notices
    (Ray, Optuna, ...) stay out of the user's terminal and go to the log file only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".", 1)[0] in OWN_PACKAGES or record.levelno >= logging.ERROR


class _OneLineHandler(logging.Handler):
    """``warning: message`` as one line on stderr (no time/level columns that make a long
    message wrap into a block); tracebacks only at ``-vv``."""

    _STYLE = {"WARNING": "yellow", "ERROR": "bold red", "CRITICAL": "bold red"}

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if self.tracebacks and record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            level = record.levelname.lower()
            style = self._STYLE.get(record.levelname, "dim")
            err_console.print(f"[{style}]{level}:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


class _LazyFileHandler(logging.FileHandler):
    """A FileHandler that creates its directory on the first record and, when it cannot
    write, stays silent (a log file must never break a command)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True, encoding="utf-8")
        self._broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._broken:
            return
        try:
            if self.stream is None:
                Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
            super().emit(record)
        except OSError:
            self._broken = True

    def handleError(self, record: logging.LogRecord) -> None:
        self._broken = True


def setup_logging(verbose: int = 0) -> None:
    """Configure the root logger for a CLI command (replacing earlier handlers).

    Terminal: WARNING and up (INFO with ``-v``, DEBUG with ``-vv``) from :data:`OWN_PACKAGES`,
    ERROR and up from anyone. Log file (:func:`log_path`): INFO and up (DEBUG with ``-vv``)
    from everyone.
    """
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    term = _OneLineHandler(tracebacks=verbose >= 2)
    term.setLevel(max(logging.WARNING - 10 * verbose, logging.DEBUG))
    term.addFilter(_OwnOrError())
    file = _LazyFileHandler(log_path())
    file.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(term)
    root.addHandler(file)
    root.setLevel(min(term.level, file.level))
    # Ray, once imported, prints through its own stderr handler and does not propagate;
    # evo.engine.runtime.route_ray_logs() undoes that before Ray starts, and this does it for a Ray
    # imported earlier in the process (without importing it here: the CLI stays fast).
    ray_logger = logging.getLogger("ray")
    for h in list(ray_logger.handlers):
        if type(h).__name__ == "PlainRayHandler":
            ray_logger.removeHandler(h)
            ray_logger.propagate = True
    # Optuna, once imported, prints through its own stderr handler and does not propagate
    # (evo.tuning.tuning routes it on import); this covers an Optuna imported earlier in the process.
    optuna_logger = logging.getLogger("optuna")
    for h in list(optuna_logger.handlers):
        optuna_logger.removeHandler(h)
    optuna_logger.propagate = True
    optuna_logger.setLevel(logging.NOTSET)  # the handlers' levels decide, as for our own records


# --------------------------------------------------------------------------- ids


def distinguishable_ids(ids: Sequence[str], min_len: int = 12) -> list[str]:
    """The ids cut to the shortest common length (at least ``min_len``) at which no two are
    equal: what an ambiguity message shows so the user can pick one and type it."""
    ids = list(ids)
    n = min(min_len, max((len(i) for i in ids), default=0))
    longest = max((len(i) for i in ids), default=0)
    while n < longest and len({i[:n] for i in ids}) < len(set(ids)):
        n += 1
    return [i[:n] for i in ids]


def store_error_text(e: Exception) -> str:
    """The line to print for a store error; an ambiguous id prefix lists the matches at a
    length that tells them apart (full run ids; candidate ids cut to a distinguishing length)."""
    from evo.store import AmbiguousIdError

    if isinstance(e, AmbiguousIdError) and e.near:
        shown = e.near if e.kind == "run" else distinguishable_ids(e.near)
        more = " and more" if "and more" in str(e) else ""
        return (f"{e.kind} id prefix {e.query!r} is ambiguous: it matches {', '.join(shown)}{more}; "
                "type more characters")
    return str(e)


def resolve_run(store: Any, text: str) -> str:
    """The full id of the run ``text`` names (id or unique prefix), else :func:`fail`."""
    from evo.results.status import resolve_run as _resolve
    from evo.store import StoreError

    try:
        return _resolve(store, text)
    except StoreError as e:
        fail(store_error_text(e))


def with_task_files(base: Any, files: Sequence[Any]) -> Any:
    """``base`` (a :class:`evo.tasks.TaskRegistry`) plus the user tasks of ``files`` (the
    commands' ``--task-file``); a file that fails to load ends the command with its error."""
    tasks = base
    for f in files:
        try:
            tasks = tasks.with_files([f])
        except (OSError, ValueError, TypeError) as e:
            fail(str(e))
    return tasks
