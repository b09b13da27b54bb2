"""What to confine: :class:`SandboxSettings`, read from the environment's switches
(``EVO_SANDBOX*``, ``EVO_SECRET_ENV``; docs/SECURITY.md), and the variables the launcher sets
in the child's environment for the harness (:data:`SECCOMP_ENV`, :data:`LAYERS_ENV`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    v = environ.get(name)
    if v is None or v.strip() == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class SandboxSettings:
    """What to confine (:mod:`evaluators.sandbox` describes each layer).

    ``enabled=False`` launches the child directly (environment scrub and private HOME/TMPDIR
    still apply). ``network``: isolate the network. ``landlock``: use Landlock at all
    (TCP deny, signal scoping, and file writes if ``landlock_fs``). ``cpu_factor`` /
    ``cpu_min_s``: RLIMIT_CPU = max(cpu_min_s, cpu_factor * wall timeout). ``nofile``:
    RLIMIT_NOFILE. ``nproc_margin``: RLIMIT_NPROC = the user's task count now + margin
    (0 = do not set). ``fsize_mb``: RLIMIT_FSIZE (0 = do not set). ``secret_env``: extra
    variable names never passed to a candidate. ``extra_writable``: more paths writable under
    ``landlock_fs``. ``landlock_reads``: file reads only beneath :func:`harness_paths`'s set
    (Python, the project's packages, system libraries, CUDA, the job directory, task files'
    directories, ``extra_readable``).
    """

    enabled: bool = True
    network: bool = True
    landlock: bool = True
    landlock_fs: bool = True
    landlock_reads: bool = True
    seccomp: bool = True
    cpu_factor: float = 2.0
    cpu_min_s: float = 60.0
    nofile: int = 1024
    nproc_margin: int = 512
    fsize_mb: int = 1024
    secret_env: tuple[str, ...] = ()
    extra_writable: tuple[str, ...] = ()
    extra_readable: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "SandboxSettings":
        e = os.environ if environ is None else environ
        secrets_ = tuple(x.strip() for x in e.get("EVO_SECRET_ENV", "").split(",") if x.strip())
        writable = tuple(x for x in e.get("EVO_SANDBOX_WRITABLE", "").split(os.pathsep) if x)
        return cls(
            enabled=_flag(e, "EVO_SANDBOX", True),
            network=_flag(e, "EVO_SANDBOX_NET", True),
            landlock=_flag(e, "EVO_SANDBOX_LANDLOCK", True),
            landlock_fs=_flag(e, "EVO_SANDBOX_LANDLOCK_FS", True),
            landlock_reads=_flag(e, "EVO_SANDBOX_READS", True),
            extra_readable=tuple(x for x in e.get("EVO_SANDBOX_READABLE", "").split(os.pathsep) if x),
            seccomp=_flag(e, SECCOMP_ENV, True),
            secret_env=secrets_,
            extra_writable=writable,
        )


#: Set by :func:`sandbox_launch` in the child's environment: ``"1"`` the harness must
#: install :func:`install_seccomp` before it loads the candidate (failure = harness error),
#: ``"0"`` the user switched it off (``EVO_SANDBOX_SECCOMP=0`` or ``EVO_SANDBOX=0``). A
#: harness started without it installs the filter too (the safe default).
SECCOMP_ENV = "EVO_SANDBOX_SECCOMP"
#: Set by :func:`sandbox_launch` in the child's environment: the layers applied, so that the
#: harness can name them when CUDA does not start inside them.
LAYERS_ENV = "EVO_SANDBOX_LAYERS"
