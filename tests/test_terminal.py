"""The CLI in a real 80-column terminal (a pseudo-terminal; issue 34).

Runs ``evo runs``, ``evo status`` and ``evo top`` as a user does, in a fresh process whose
stdout is a pty of 80 columns, on a recorded run (tests/_inspect_run.py), and checks that
every id a user types next (run id, 12-character candidate ids, task names) is visible
whole, that nothing is cut with an ellipsis and that no line is wider than the terminal.
Also checks that progress bars appear on a terminal and never in piped output.
No GPU; POSIX only (the pty module).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _inspect_run import BAD_TASK, TASK, build_run

pty = pytest.importorskip("pty")
import fcntl  # noqa: E402
import struct  # noqa: E402
import termios  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLS = 80
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[=>78]")


def run_in_terminal(args: list[str], *, cols: int = COLS, rows: int = 300, timeout: float = 120,
                    cwd: Path = ROOT, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m evo.cli ARGS`` with stdin/stdout/stderr on a pty of ``cols`` x ``rows``.

    Returns (exit code, the screen text without escape sequences, the raw output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    e = {k: v for k, v in (env or os.environ).items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    e["TERM"] = "xterm-256color"
    p = subprocess.Popen([sys.executable, "-m", "evo.cli", *args], stdin=slave, stdout=slave, stderr=slave,
                         cwd=cwd, env=e, close_fds=True, start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                p.kill()
                pytest.fail(f"evo {' '.join(args)} did not finish in {timeout} s")
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
    finally:
        os.close(master)
    rc = p.wait(timeout=30)
    raw = b"".join(chunks).decode("utf-8", errors="replace")
    screen = _ANSI.sub("", raw).replace("\r\n", "\n").replace("\r", "\n")
    return rc, screen, raw


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terminal")
    built = build_run(tmp / "evo.db", tmp / "cache")
    return built, {**os.environ, "EVO_LOG": str(tmp / "evo.log")}


def _check_screen(screen: str) -> None:
    assert "…" not in screen, "a table cut a value with an ellipsis:\n" + screen
    wide = [ln for ln in screen.splitlines() if len(ln) > COLS]
    assert not wide, f"lines wider than {COLS} columns:\n" + "\n".join(wide)


def test_runs_status_top_show_whole_ids_at_80_columns(recorded):
    built, env = recorded
    db = str(built.db)
    rc, screen, _ = run_in_terminal(["runs", "--db", db], env=env)
    assert rc == 0, screen
    _check_screen(screen)
    assert built.run_id in screen

    rc, screen, _ = run_in_terminal(["status", built.run_id[:12], "--db", db], env=env)
    assert rc == 0, screen
    _check_screen(screen)
    assert built.run_id in screen and built.llm.id[:12] in screen
    assert re.search(rf"\b{TASK}\b", screen) and re.search(rf"\b{BAD_TASK}\b", screen)

    rc, screen, _ = run_in_terminal(["top", built.run_id[:12], "--db", db], env=env)
    assert rc == 0, screen
    _check_screen(screen)
    for cand in (built.llm, built.knobs, built.seed):
        assert cand.id[:12] in screen, (cand.id[:12], screen)
    assert re.search(rf"\b{TASK}\b", screen)


def test_tasks_shows_every_task_name_whole_at_80_columns(recorded):
    import evo.tasks as T

    _, env = recorded
    rc, screen, _ = run_in_terminal(["tasks", "--gpu", "H200"], env=env)
    assert rc == 0, screen
    _check_screen(screen)
    for name in T.task_names():
        assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", screen, re.M), name


def test_progress_bar_on_a_terminal_only(recorded, tmp_path):
    built, env = recorded
    args = ["export", built.run_id, "--no-build", "--db", str(built.db), "--task", TASK]
    rc, screen, raw = run_in_terminal([*args, "--out", str(tmp_path / "a")], env=env)
    assert rc == 0, screen
    assert "exporting" in screen, "a terminal gets the progress bar"
    rc, screen, _ = run_in_terminal([*args, "--out", str(tmp_path / "b"), "--no-progress"], env=env)
    assert rc == 0 and "exporting" not in screen, screen
    piped = subprocess.run([sys.executable, "-m", "evo.cli", *args, "--out", str(tmp_path / "c")], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "exporting" not in piped.stdout + piped.stderr and "\x1b[" not in piped.stdout + piped.stderr
