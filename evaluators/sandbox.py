"""Sandbox for the isolated harness child: what a candidate's native code may reach.

:func:`evaluators.isolation.run_isolated` asks :func:`sandbox_launch` to turn the child's
``argv`` and environment into a sandboxed launch. The child is started through a tiny Python
*exec wrapper* (``python -I -S -c WRAPPER CONFIG argv...``) that confines itself and then
``execv``\\ s the real child, so the confinement is inherited by the harness, the candidate's
``.so`` and anything they start. (A wrapper rather than ``preexec_fn``: the parent is often a
threaded Ray worker, where ``preexec_fn`` is unsafe.)

Layers, each applied only where the kernel allows it (:func:`probe` detects once per process
and logs one WARNING for what is missing):

- **environment**: a whitelist (``isolation.child_env``) minus anything secret-looking, minus
  the names in ``SandboxSettings.secret_env`` / ``$EVO_SECRET_ENV`` (e.g. an LLM ``key_env``
  without KEY/TOKEN in its name), minus any variable whose *value* carries a secret's value;
  ``HOME``, ``TMPDIR``, ``XDG_CACHE_HOME`` point into the private job directory.
- **network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; as root directly,
  otherwise inside a new user namespace that maps the user to itself). Inside it there is no
  interface but a downed loopback: no internet, no LAN, and not even the host's 127.0.0.1
  (local LLM servers, the Ray GCS, the DB's host). Where namespaces are refused, Landlock
  (ABI >= 4) still denies every TCP ``connect``/``bind``; UDP then stays open (WARNING).
- **signals**: Landlock signal scoping (ABI >= 6): the candidate cannot signal processes
  outside its sandbox (the GPU actor, the driver), though its own children it can.
- **rlimits**: CPU seconds (``cpu_factor`` x the wall timeout, at least ``cpu_min_s``),
  open files, processes (``RLIMIT_NPROC`` counts *all* tasks of the user, so it is set to the
  user's current count plus ``nproc_margin``; root ignores it, so it is skipped with a
  WARNING), file size (``fsize_mb``: a candidate cannot fill the disk through its logs),
  core dumps off. Never the address space: CUDA reserves far more than it uses.
- **filesystem writes** (opt-in, ``landlock_fs`` / ``EVO_SANDBOX_LANDLOCK_FS=1``): Landlock
  allows writes only below the job directory, ``/dev`` (GPU device files), the child's own
  ``/proc/self`` (the CUDA driver writes there in ``cuInit``) and any ``extra_writable`` path.
  Off by default: reads are never restricted, and it is the layer
  most likely to meet site specifics (MPS pipes, shared caches). Without it the candidate
  can write wherever its user can; see docs/SECURITY.md.

OOM score: the child sets ``oom_score_adj = 1000`` so the kernel's OOM killer picks a
runaway candidate before anything else.

Switches (environment, read by :meth:`SandboxSettings.from_env`, inherited by Ray workers
started from the driver): ``EVO_SANDBOX=0`` (no wrapper at all: environment scrub only),
``EVO_SANDBOX_NET=0``, ``EVO_SANDBOX_LANDLOCK=0`` (no Landlock at all),
``EVO_SANDBOX_LANDLOCK_FS=1``, ``EVO_SANDBOX_WRITABLE=/a:/b``, ``EVO_SECRET_ENV=NAME,NAME``.

Failure policy: the probe runs the very same wrapper once per process, so a layer that is
used is known to work. If the wrapper still fails to confine itself, it writes
``error.json`` and exits :data:`~evaluators.isolation.HARNESS_BUG_EXIT`, which
``run_isolated`` raises as ``HarnessError``: the candidate never runs unconfined by accident.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

__all__ = [
    "SandboxSettings",
    "Capabilities",
    "Launch",
    "probe",
    "reset_probe",
    "sandbox_launch",
    "scrub_env",
    "describe",
    "user_task_count",
]

log = logging.getLogger(__name__)

_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PASSWD", "AUTH")
# Values shorter than this, or that look like paths, are not scanned for inside other
# variables (false positives: "1", "true", "/usr/bin"); API keys are long opaque strings.
_MIN_SECRET_VALUE = 16


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    v = environ.get(name)
    if v is None or v.strip() == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class SandboxSettings:
    """What to confine (see the module docstring for each layer).

    ``enabled=False`` launches the child directly (environment scrub and private HOME/TMPDIR
    still apply). ``network``: isolate the network. ``landlock``: use Landlock at all
    (TCP deny, signal scoping, and file writes if ``landlock_fs``). ``cpu_factor`` /
    ``cpu_min_s``: RLIMIT_CPU = max(cpu_min_s, cpu_factor * wall timeout). ``nofile``:
    RLIMIT_NOFILE. ``nproc_margin``: RLIMIT_NPROC = the user's task count now + margin
    (0 = do not set). ``fsize_mb``: RLIMIT_FSIZE (0 = do not set). ``secret_env``: extra
    variable names never passed to a candidate. ``extra_writable``: more paths writable under
    ``landlock_fs``.
    """

    enabled: bool = True
    network: bool = True
    landlock: bool = True
    landlock_fs: bool = False
    cpu_factor: float = 2.0
    cpu_min_s: float = 60.0
    nofile: int = 1024
    nproc_margin: int = 512
    fsize_mb: int = 1024
    secret_env: tuple[str, ...] = ()
    extra_writable: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "SandboxSettings":
        e = os.environ if environ is None else environ
        secrets_ = tuple(x.strip() for x in e.get("EVO_SECRET_ENV", "").split(",") if x.strip())
        writable = tuple(x for x in e.get("EVO_SANDBOX_WRITABLE", "").split(os.pathsep) if x)
        return cls(
            enabled=_flag(e, "EVO_SANDBOX", True),
            network=_flag(e, "EVO_SANDBOX_NET", True),
            landlock=_flag(e, "EVO_SANDBOX_LANDLOCK", True),
            landlock_fs=_flag(e, "EVO_SANDBOX_LANDLOCK_FS", False),
            secret_env=secrets_,
            extra_writable=writable,
        )


@dataclass(frozen=True)
class Capabilities:
    """What this machine lets an unprivileged-by-design child do to itself (probed once).

    ``netns``: ``"root"`` (plain network namespace), ``"userns"`` (inside a user namespace)
    or ``""`` (refused). ``landlock_abi``: 0 when Landlock is unavailable. ``is_root``:
    RLIMIT_NPROC is not enforced for root. ``notes``: why a layer is missing.
    """

    netns: str
    landlock_abi: int
    is_root: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    """A sandboxed launch: run ``argv`` with ``env``; ``layers`` says what is applied."""

    argv: list[str]
    env: dict[str, str]
    layers: tuple[str, ...] = field(default=())

    @property
    def summary(self) -> str:
        return ", ".join(self.layers) if self.layers else "none"


# ----------------------------------------------------------------------------- environment


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


# ----------------------------------------------------------------------------- the wrapper

#: Exit code of the wrapper when it cannot confine itself (== isolation.HARNESS_BUG_EXIT).
_SETUP_FAILED_EXIT = 70

# Runs as ``python -I -S -c _WRAPPER CONFIG_JSON argv...``: confine, then exec argv.
# Standard library only; Python 3.8+; syscall numbers 444-446 are the same on every arch.
_WRAPPER = r'''
import ctypes, json, os, resource, struct, sys, traceback
cfg = json.loads(sys.argv[1])
argv = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def fail(what):
    msg = "sandbox setup failed at %s: %s" % (what, traceback.format_exc(limit=2).strip().splitlines()[-1])
    jd = cfg.get("jobdir")
    if jd:
        try:
            with open(os.path.join(jd, "error.json"), "w") as f:
                json.dump({"error": msg, "traceback": traceback.format_exc()}, f)
        except OSError:
            pass
    sys.stderr.write(msg + "\n")
    os._exit(70)
def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return r
step = "rlimits"
try:
    for name, soft, hard in cfg.get("rlimits", []):
        res = getattr(resource, name)
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))
    step = "oom_score_adj"
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    mode = cfg.get("netns", "")
    if mode:
        step = "network namespace (%s)" % mode
        CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
        if mode == "root":
            check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        elif mode == "userns":
            uid, gid = os.getuid(), os.getgid()
            check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write("%d %d 1" % (uid, uid))
            with open("/proc/self/gid_map", "w") as f:
                f.write("%d %d 1" % (gid, gid))
        else:
            raise ValueError("unknown netns mode %r" % mode)
    ll = cfg.get("landlock")
    if ll:
        step = "landlock"
        abi = check(libc.syscall(444, None, 0, 1), "landlock ABI")
        fs = 0
        if ll.get("fs"):
            fs = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) \
                | (1 << 10) | (1 << 11) | (1 << 12)
            if abi >= 2:
                fs |= 1 << 13
            if abi >= 3:
                fs |= 1 << 14
        net = 3 if (ll.get("net") and abi >= 4) else 0
        scoped = 2 if (ll.get("signal") and abi >= 6) else 0
        if fs or net or scoped:
            if abi >= 6:
                attr = struct.pack("<QQQ", fs, net, scoped)
            elif abi >= 4:
                attr = struct.pack("<QQ", fs, net)
            else:
                attr = struct.pack("<Q", fs)
            buf = ctypes.create_string_buffer(attr, len(attr))
            rfd = check(libc.syscall(444, buf, ctypes.c_size_t(len(attr)), 0), "landlock_create_ruleset")
            for path in ll.get("writable", []) if fs else []:
                try:
                    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                rule = ctypes.create_string_buffer(struct.pack("<Qi", fs, pfd), 12)
                check(libc.syscall(445, rfd, 1, rule, 0), "landlock_add_rule(%s)" % path)
                os.close(pfd)
            check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
            check(libc.syscall(446, rfd, 0), "landlock_restrict_self")
            os.close(rfd)
except BaseException:
    fail(step)
try:
    os.execv(argv[0], argv)
except BaseException:
    fail("exec %r" % (argv[:1],))
'''

# A child used by the probe: exits 0 inside an isolated network namespace.
_NETNS_CHECK = (
    "import socket, sys\n"
    "names = [n for _, n in socket.if_nameindex()]\n"
    "sys.exit(0 if names in ([], ['lo']) else 3)\n"
)


def _wrapper_argv(cfg: dict, argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, json.dumps(cfg), *argv]


# ----------------------------------------------------------------------------- probing


def _landlock_abi() -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        r = libc.syscall(444, None, ctypes.c_size_t(0), 1)
    except (OSError, AttributeError):
        return 0
    return int(r) if r > 0 else 0


def _try_netns(mode: str) -> tuple[bool, str]:
    """Run the wrapper in ``mode`` around a check that it sees no interface but lo."""
    with tempfile.TemporaryDirectory(prefix="evo-sandbox-probe-") as d:
        argv = _wrapper_argv({"netns": mode, "jobdir": d}, [sys.executable, "-I", "-S", "-c", _NETNS_CHECK])
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"{mode}: {e}"
    if p.returncode == 0:
        return True, ""
    return False, f"{mode}: " + ((p.stderr or "").strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]


_probe_lock = threading.Lock()
_probed: Capabilities | None = None


def reset_probe() -> None:
    """Forget the cached probe (tests; or after the machine's policy changed)."""
    global _probed
    with _probe_lock:
        _probed = None


def probe() -> Capabilities:
    """Detect, once per process, which layers this kernel allows; log one WARNING per gap."""
    global _probed
    with _probe_lock:
        if _probed is not None:
            return _probed
        t0 = time.monotonic()
        notes: list[str] = []
        netns = ""
        errs = []
        for mode in ("root", "userns"):
            ok, why = _try_netns(mode)
            if ok:
                netns = mode
                break
            errs.append(why)
        abi = _landlock_abi()
        is_root = os.geteuid() == 0
        if not netns:
            notes.append("no network namespace (" + "; ".join(errs) + ")")
            log.warning(
                "SANDBOX: network namespaces are not available here (%s); candidates are NOT cut off "
                "from the network%s. Run on a host or container that allows unshare(CLONE_NEWNET) "
                "(root, CAP_SYS_ADMIN, or unprivileged user namespaces) for full isolation.",
                "; ".join(errs),
                " except that Landlock denies TCP connect/bind (UDP stays open)" if abi >= 4 else "",
            )
        if abi == 0:
            notes.append("no Landlock")
            log.warning("SANDBOX: Landlock is not available in this kernel: no signal scoping, no TCP "
                        "fallback, no write protection outside the job directory")
        elif abi < 6:
            notes.append(f"Landlock ABI {abi} < 6: no signal scoping")
        if is_root:
            notes.append("running as root: RLIMIT_NPROC is not enforced")
            log.warning("SANDBOX: running as root: RLIMIT_NPROC is not enforced for root, so a fork "
                        "bomb is bounded only by the wall-clock timeout; run the search as a dedicated "
                        "non-root user")
        _probed = Capabilities(netns=netns, landlock_abi=abi, is_root=is_root, notes=tuple(notes))
        log.info("sandbox probe (%.2fs): netns=%s landlock_abi=%d root=%s", time.monotonic() - t0,
                 netns or "unavailable", abi, is_root)
        return _probed


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


# ----------------------------------------------------------------------------- launch


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
) -> Launch:
    """The sandboxed form of launching ``argv`` with ``env`` for the job in ``jobdir``.

    Always: the environment is scrubbed (:func:`scrub_env`) and ``HOME``/``TMPDIR``/
    ``XDG_CACHE_HOME`` point into ``jobdir``. With ``settings.enabled`` (default), ``argv``
    is wrapped so the child confines itself before ``exec`` (see the module docstring).
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
        ll = {"fs": bool(s.landlock_fs), "net": s.network and caps.landlock_abi >= 4,
              "signal": caps.landlock_abi >= 6,
              # /proc/self resolves (in the wrapper, which execs the child in place) to the
              # child's own /proc entry: the CUDA driver writes there during cuInit, which
              # otherwise fails with CUDA_ERROR_OPERATING_SYSTEM (304; seen on an H200 host)
              "writable": [str(jd), "/dev", "/proc/self", *s.extra_writable]}
        if ll["fs"] or ll["net"] or ll["signal"]:
            cfg["landlock"] = ll
            parts = [n for n, on in (("fs-writes", ll["fs"]), ("tcp-deny", ll["net"]), ("signal-scope", ll["signal"]))
                     if on]
            layers.append(f"landlock{caps.landlock_abi}(" + ",".join(parts) + ")")
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
                     + (" + write protection" if s.landlock_fs else ""))
    return "sandbox: " + ", ".join(parts) + (f" [{'; '.join(caps.notes)}]" if caps.notes else "")
