"""A Python child launched as the judge launches a runner, for the sandbox's own tests.

:func:`run_sandboxed` starts ``argv`` through :func:`evaluators.sandbox.sandbox_launch` with the
runner's environment (:func:`evaluators.judge.runner_process.runner_env`), waits at most
``timeout_s`` (then kills its process group), and returns how it ended and what it wrote to
``JOBDIR/seen.json``: the test's own record of what the child could do, never a verdict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence


@dataclass
class Ran:
    """How a sandboxed child ended: its exit status (negative: a signal; None: killed at the
    deadline), stderr, the layers applied (``Launch.summary``) and what it wrote to
    seen.json (``{}``: nothing)."""

    rc: int | None
    stderr: str
    layers: str
    seen: dict


def run_sandboxed(argv: Sequence[str], jobdir: Path, timeout_s: float, sandbox=None, *, readable: Sequence[str] = (),
                  env: Mapping[str, str] | None = None) -> Ran:
    from evaluators import sandbox as sb
    from evaluators.judge.runner_process import runner_env

    jobdir.mkdir(parents=True, exist_ok=True)
    ln = sb.sandbox_launch(list(argv), dict(env) if env is not None else runner_env(), jobdir, timeout_s,
                           sandbox or sb.SandboxSettings.from_env(), readable=readable)
    p = subprocess.Popen(ln.argv, env=ln.env, cwd=jobdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout_s)
        rc: int | None = p.returncode
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if rc is None:
        _, err = p.communicate()
    seen = jobdir / "seen.json"
    return Ran(rc, err.decode(errors="replace"), ln.summary, json.loads(seen.read_text()) if seen.exists() else {})
