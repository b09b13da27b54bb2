"""Secrets kept from a candidate's process: the child's environment scrubbed
(:func:`scrub_env`), secrets withheld from long-lived helper processes the driver starts
(:func:`secrets_withheld`), and the parents made undumpable (:func:`make_undumpable`), so the
child cannot read their ``/proc/<pid>/environ`` or ``mem``.
"""

from __future__ import annotations

import ctypes
import logging
import os
from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

log = logging.getLogger(__name__)


_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PASSWD", "AUTH")
# Values shorter than this, or that look like paths, are not scanned for inside other
# variables (false positives: "1", "true", "/usr/bin"); API keys are long opaque strings.
_MIN_SECRET_VALUE = 16


def scrub_env(env: Mapping[str, str], *, extra: Sequence[str] = (),
              parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` without secrets: names in ``extra``, names with a secret marker, and any
    variable whose value contains the value of such a variable in ``parent`` (the process
    environment by default), so a key copied into an innocuous name does not leak either."""
    parent = os.environ if parent is None else parent
    extra_set = {x.upper() for x in extra}

    def secret_name(k: str) -> bool:
        u = k.upper()
        return u in extra_set or any(m in u for m in _SECRET_MARKERS)

    values = {v for k, v in list(parent.items()) + list(env.items())
              if secret_name(k) and len(v) >= _MIN_SECRET_VALUE and not v.startswith(("/", "."))
              and not any(c.isspace() for c in v)}
    out = {}
    for k, v in env.items():
        if secret_name(k):
            continue
        if v and any(s in v for s in values):
            continue
        out[k] = v
    return out


def secret_names(env: Mapping[str, str] | None = None, *, extra: Sequence[str] = ()) -> list[str]:
    """Names in ``env`` (the process environment by default) that :func:`scrub_env` would
    drop: secret-looking names, ``extra`` and ``$EVO_SECRET_ENV``, and variables carrying a
    secret's value."""
    # imported here: at import time this module needs only the standard library, so that
    # make_undumpable can be loaded from this file alone (tests/test_sandbox.py does)
    from evaluators.sandbox.settings import SandboxSettings

    env = os.environ if env is None else env
    names = tuple(extra) + SandboxSettings.from_env(env).secret_env
    kept = scrub_env(env, extra=names, parent=env)
    # EVO_SECRET_ENV holds names, not a secret: processes started without the secrets still
    # learn which names to scrub from what they pass on
    return sorted(k for k in env if k not in kept and k != "EVO_SECRET_ENV")


@contextmanager
def secrets_withheld(extra: Sequence[str] = ()) -> Iterator[list[str]]:
    """Remove every secret (:func:`secret_names`) from ``os.environ`` for the block, then put
    them back; yields the names removed.

    For starting long-lived helper processes from the driver (the local Ray instance: its
    GCS, raylet and every worker inherit the environment they were started with): the
    driver alone keeps the LLM key, so no process that a candidate's process could read
    (an ancestor, a sibling of the same user) holds it. Not thread-safe against other
    threads reading the environment meanwhile; call it before the LLM client starts.
    """
    # Ray's own settings (RAY_AUTH_MODE, a RAY_* token) configure the processes being started:
    # they stay, unless named explicitly.
    names = [k for k in secret_names(os.environ, extra=extra) if not k.startswith("RAY_") or k in extra]
    saved = {k: os.environ[k] for k in names}
    for k in names:
        del os.environ[k]
    try:
        yield names
    finally:
        for k, v in saved.items():
            os.environ[k] = v


_PR_SET_DUMPABLE, _PR_GET_DUMPABLE = 4, 3


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process; True if it is (now) not dumpable.

    A process of the same user may read another's ``/proc/<pid>/environ``, ``mem``, ``maps``
    and ``fd/`` only while that process is dumpable (without CAP_SYS_PTRACE). Called by
    :func:`sandbox_launch` in the process that starts harness children (the GPU actor, or
    ``evo check``'s own process) and by the driver when it starts the runtime, so a candidate
    cannot read them. Side effects: no core dumps of this process, and debuggers (py-spy,
    gdb) need root to attach. ``execve`` resets it, so children are unaffected.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_GET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) == 0:
            return True
        if libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0:
            log.warning("SANDBOX: prctl(PR_SET_DUMPABLE, 0) failed (%s): processes of this user can "
                        "read this process's environment and memory", os.strerror(ctypes.get_errno()))
            return False
    except (OSError, AttributeError) as e:  # no libc prctl (not Linux)
        log.warning("SANDBOX: cannot make this process undumpable (%s)", e)
        return False
    return True
