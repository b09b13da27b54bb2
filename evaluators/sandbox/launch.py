"""The sandboxed launch of a runner (:func:`sandbox_launch`): the environment scrubbed,
a private HOME and TMPDIR, rlimits, and the wrapper's configuration for the layers this
machine allows; :func:`describe` says which in one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from evaluators.sandbox.capabilities import Capabilities, probe
from evaluators.sandbox.environment import make_undumpable, scrub_env
from evaluators.sandbox.landlock import harness_paths, runner_paths
from evaluators.sandbox.settings import LAYERS_ENV, SECCOMP_ENV, SandboxSettings
from evaluators.sandbox.wrapper import _wrapper_argv


@dataclass(frozen=True)
class Launch:
    """A sandboxed launch: run ``argv`` with ``env``; ``layers`` says what is applied."""

    argv: list[str]
    env: dict[str, str]
    layers: tuple[str, ...] = field(default=())

    @property
    def summary(self) -> str:
        return ", ".join(self.layers) if self.layers else "none"


def user_task_count(uid: int | None = None) -> int:
    """Tasks (processes + threads) of ``uid`` right now: what RLIMIT_NPROC counts."""
    uid = os.getuid() if uid is None else uid
    n = 0
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid != uid:
                continue
            with open(f"/proc/{d.name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Threads:"):
                        n += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return n


def _rlimits(s: SandboxSettings, timeout_s: float, caps: Capabilities) -> list[list]:
    cpu = int(max(s.cpu_min_s, s.cpu_factor * float(timeout_s)))
    out: list[list] = [["RLIMIT_CPU", cpu, cpu + 5], ["RLIMIT_CORE", 0, 0]]
    if s.nofile > 0:
        out.append(["RLIMIT_NOFILE", s.nofile, s.nofile])
    if s.fsize_mb > 0:
        b = int(s.fsize_mb) * 1024 * 1024
        out.append(["RLIMIT_FSIZE", b, b])
    if s.nproc_margin > 0 and not caps.is_root:
        n = user_task_count() + int(s.nproc_margin)
        out.append(["RLIMIT_NPROC", n, n])
    return out


def sandbox_launch(
    argv: Sequence[str],
    env: Mapping[str, str],
    jobdir: str | os.PathLike[str],
    timeout_s: float,
    settings: SandboxSettings | None = None,
    readable: Sequence[str] = (),
    *,
    native: bool = False,
) -> Launch:
    """The sandboxed form of launching ``argv`` with ``env`` for the job in ``jobdir``.

    Always: the environment is scrubbed (:func:`scrub_env`) and ``HOME``/``TMPDIR``/
    ``XDG_CACHE_HOME`` point into ``jobdir``. With ``settings.enabled`` (default), ``argv``
    is wrapped so the child confines itself before ``exec`` (:mod:`evaluators.sandbox`).
    ``readable``: more paths the child may read under Landlock (user task files' directories).
    ``native``: ``argv[0]`` is a native program with no Python in it (the runner,
    :mod:`evaluators.runner`): Landlock's read set is :func:`runner_paths`'s, not
    :func:`harness_paths`'s (which would ask ``argv[0]`` for its Python layout).
    """
    s = settings or SandboxSettings.from_env()
    jd = Path(jobdir)
    home = jd / "home"
    tmp = jd / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    e = scrub_env(env, extra=s.secret_env)
    e.update(HOME=str(home), TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp),
             XDG_CACHE_HOME=str(home / ".cache"))
    # A Python runner reads this before it loads the candidate (install_seccomp); set here, where
    # the candidate has no say, and only "0" when the user switched the sandbox off.
    e[SECCOMP_ENV] = "1" if (s.enabled and s.seccomp) else "0"
    make_undumpable()
    layers = ["env-scrub", "private-home-tmp"]
    if not s.enabled:
        return Launch(list(argv), e, tuple(layers))
    caps = probe()
    cfg: dict = {"jobdir": str(jd), "rlimits": _rlimits(s, timeout_s, caps)}
    layers.append("rlimits(" + ",".join(r[0][7:].lower() for r in cfg["rlimits"]) + ")")
    if s.network and caps.netns:
        cfg["netns"] = caps.netns
        layers.append(f"netns({caps.netns})")
    if s.landlock and caps.landlock_abi > 0:
        paths = (runner_paths(argv[0], e, jd, readable=(*readable, *s.extra_readable), writable=s.extra_writable)
                 if native else
                 harness_paths(argv, e, jd, readable=(*readable, *s.extra_readable), writable=s.extra_writable))
        ll = {"fs_read": bool(s.landlock_reads), "fs_write": bool(s.landlock_fs),
              "net": s.network and caps.landlock_abi >= 4, "signal": caps.landlock_abi >= 6, **paths}
        if ll["fs_read"] or ll["fs_write"] or ll["net"] or ll["signal"]:
            cfg["landlock"] = ll
            parts = [n for n, on in (("fs-reads", ll["fs_read"]), ("fs-writes", ll["fs_write"]),
                                     ("tcp-deny", ll["net"]), ("signal-scope", ll["signal"])) if on]
            layers.append(f"landlock{caps.landlock_abi}(" + ",".join(parts) + ")")
    if s.seccomp:
        layers.append("seccomp-required")
    # for the child's own error messages (a CUDA that fails to start names the sandbox)
    e[LAYERS_ENV] = ", ".join(layers)
    return Launch(_wrapper_argv(cfg, argv), e, tuple(layers))


def describe(settings: SandboxSettings | None = None) -> str:
    """One line for start-up logs and ``evo`` diagnostics: which layers a candidate gets here."""
    s = settings or SandboxSettings.from_env()
    if not s.enabled:
        return "sandbox disabled (EVO_SANDBOX=0): environment scrub and private HOME/TMPDIR only"
    caps = probe()
    parts = ["env scrub", "private HOME/TMPDIR", "rlimits (cpu, nofile, fsize, core"
             + (")" if caps.is_root or not s.nproc_margin else ", nproc)")]
    if s.network:
        parts.append(f"network namespace ({caps.netns})" if caps.netns else
                     ("NO network namespace; Landlock TCP deny" if caps.landlock_abi >= 4 else
                      "NO network isolation"))
    if s.landlock and caps.landlock_abi:
        parts.append(f"Landlock ABI {caps.landlock_abi}"
                     + (" signal scoping" if caps.landlock_abi >= 6 else "")
                     + (" + read protection" if s.landlock_reads else "")
                     + (" + write protection" if s.landlock_fs else ""))
    parts.append("seccomp in the runner" if s.seccomp else "NO seccomp (EVO_SANDBOX_SECCOMP=0)")
    return "sandbox: " + ", ".join(parts) + (f" [{'; '.join(caps.notes)}]" if caps.notes else "")
