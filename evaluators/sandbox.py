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
- **files** (Landlock, default on): the child reads only beneath :func:`harness_paths`'s set,
  derived per launch (its Python's prefixes and ``sys.path``, the project's packages but not
  the rest of the project, system libraries and programs, CUDA, what CUDA reads in /proc and
  /sys, the job directory, user task files' directories, ``EVO_SANDBOX_READABLE``) and writes
  only below the job directory, ``/dev``, its own ``/proc/self`` (the CUDA driver writes there
  in ``cuInit``), the MPS pipe directory and ``EVO_SANDBOX_WRITABLE``: not /etc/passwd, other
  processes' /proc entries, the lineage DB, the user's files. ``EVO_SANDBOX_READS=0`` /
  ``EVO_SANDBOX_LANDLOCK_FS=0`` switch reads / writes off (docs/SECURITY.md). nvcc runs under
  the same kind of rules (``evaluators.compile.nvcc_landlock``).
- **system calls** (in the harness itself, :func:`install_seccomp`, right before it loads the
  candidate: after torch and CUDA are initialised, so nothing they need at start-up is
  blocked, while the wrapper can still ``exec`` the harness): a seccomp-bpf filter, synced
  to every thread, refuses with ``EPERM`` ``execve``/``execveat``, ``fork``/``vfork``,
  ``clone`` without ``CLONE_THREAD`` or with a namespace flag (threads stay allowed;
  ``clone3`` answers ``ENOSYS`` so glibc falls back to ``clone``), every socket call,
  ``ptrace``/``process_vm_*``, mounts and namespaces, kexec/modules/bpf/perf/userfaultfd,
  keyrings, io_uring, signals to any process but itself, terminal injection (TIOCSTI).
  Another architecture's calls (i386 ``int 0x80``, x32) kill the process. Checked for
  x86_64 and aarch64; elsewhere, or when the kernel refuses, the harness stops with a
  harness error of kind ``sandbox`` unless ``EVO_SANDBOX_SECCOMP=0``.
- **parents not readable**: :func:`sandbox_launch` makes the process that starts the child
  undumpable (:func:`make_undumpable`), so the child cannot read its ``/proc/<ppid>/environ``
  or ``mem``; the driver does the same when it starts the runtime, and starts a local Ray
  instance without its secrets (:func:`secrets_withheld`).

OOM score: the child sets ``oom_score_adj = 1000`` so the kernel's OOM killer picks a
runaway candidate before anything else.

Switches (environment, read by :meth:`SandboxSettings.from_env`, inherited by Ray workers
started from the driver): ``EVO_SANDBOX=0`` (no wrapper at all: environment scrub only),
``EVO_SANDBOX_NET=0``, ``EVO_SANDBOX_SECCOMP=0``, ``EVO_SANDBOX_LANDLOCK=0`` (no Landlock at all),
``EVO_SANDBOX_LANDLOCK_FS=0``, ``EVO_SANDBOX_READS=0``, ``EVO_SANDBOX_WRITABLE=/a:/b``,
``EVO_SANDBOX_READABLE=/a:/b``, ``EVO_SECRET_ENV=NAME,NAME``.

Failure policy: the probe runs the very same wrapper once per process, so a layer that is
used is known to work. If the wrapper still fails to confine itself, it writes
``error.json`` and exits :data:`~evaluators.child.protocol.HARNESS_BUG_EXIT`, which
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = [
    "SECCOMP_ENV",
    "SandboxError",
    "SandboxSettings",
    "harness_paths",
    "install_seccomp",
    "make_undumpable",
    "seccomp_program",
    "seccomp_wanted",
    "secret_names",
    "secrets_withheld",
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


def secret_names(env: Mapping[str, str] | None = None, *, extra: Sequence[str] = ()) -> list[str]:
    """Names in ``env`` (the process environment by default) that :func:`scrub_env` would
    drop: secret-looking names, ``extra`` and ``$EVO_SECRET_ENV``, and variables carrying a
    secret's value."""
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


# ----------------------------------------------------------------------------- the wrapper

#: Exit code of the wrapper when it cannot confine itself (== protocol.HARNESS_BUG_EXIT).
_SETUP_FAILED_EXIT = 70

# Runs as ``python -I -S -c _WRAPPER CONFIG_JSON argv...``: confine, then exec argv.
# Standard library only; Python 3.8+; syscall numbers 444-446 are the same on every arch.
_WRAPPER_HEAD = r'''
import ctypes, json, os, resource, stat, struct, sys, traceback
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
'''

#: Landlock in stdlib-only Python, shared by this module's exec wrapper and the compile
#: stage's (``evaluators.compile``): ``landlock_apply(libc, ll, check)`` with ``ll`` =
#: ``{"fs_read": bool, "fs_write": bool, "net": bool, "signal": bool, "read": [paths],
#: "list": [paths], "write": [paths]}``. ``fs_read``: reading files and listing directories
#: is allowed only beneath ``read`` (and ``write``) paths, listing also beneath ``list``;
#: ``fs_write``: every kind of write only beneath ``write``. Missing paths are skipped; rights
#: that do not apply to a file (directory ones) are dropped for file rules. Execution is not
#: restricted by Landlock (seccomp forbids it to candidates; nvcc must run its tools).
LANDLOCK_CODE = r'''
def landlock_apply(libc, ll, check):
    import os, stat, struct, ctypes
    abi = check(libc.syscall(444, None, 0, 1), "landlock ABI")
    READ, LIST = 1 << 2, 1 << 3
    wr = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) \
        | (1 << 11) | (1 << 12)
    if abi >= 2:
        wr |= 1 << 13
    if abi >= 3:
        wr |= 1 << 14
    file_rights = (1 << 0) | (1 << 1) | READ | (1 << 14) | (1 << 15)
    fs = (wr if ll.get("fs_write") else 0) | ((READ | LIST) if ll.get("fs_read") else 0)
    net = 3 if (ll.get("net") and abi >= 4) else 0
    scoped = 2 if (ll.get("signal") and abi >= 6) else 0
    if not (fs or net or scoped):
        return
    if abi >= 6:
        attr = struct.pack("<QQQ", fs, net, scoped)
    elif abi >= 4:
        attr = struct.pack("<QQ", fs, net)
    else:
        attr = struct.pack("<Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    rfd = check(libc.syscall(444, buf, ctypes.c_size_t(len(attr)), 0), "landlock_create_ruleset")

    def add(path, rights):
        rights &= fs
        if not rights:
            return
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                rights &= file_rights
            if rights:
                rule = ctypes.create_string_buffer(struct.pack("<Qi", rights, pfd), 12)
                check(libc.syscall(445, rfd, 1, rule, 0), "landlock_add_rule(%s)" % path)
        finally:
            os.close(pfd)

    for path in ll.get("read", []):
        add(path, READ | LIST)
    for path in ll.get("list", []):
        add(path, LIST)
    for path in ll.get("write", []):
        add(path, wr | READ | LIST)
    check(libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
          "prctl(PR_SET_NO_NEW_PRIVS)")
    check(libc.syscall(446, rfd, 0), "landlock_restrict_self")
    os.close(rfd)
'''

_WRAPPER_BODY = r'''
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
        landlock_apply(libc, ll, check)
except BaseException:
    fail(step)
try:
    os.execv(argv[0], argv)
except BaseException:
    fail("exec %r" % (argv[:1],))
'''

_WRAPPER = _WRAPPER_HEAD + LANDLOCK_CODE + _WRAPPER_BODY

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
                        "fallback, no read or write protection outside the job directory")
        elif abi < 6:
            notes.append(f"Landlock ABI {abi} < 6: no signal scoping")
        if is_root:
            notes.append("running as root: RLIMIT_NPROC is not enforced")
            # Short enough for one line of an 80-column terminal; the detail goes to the log file.
            log.warning("sandbox: as root, RLIMIT_NPROC is not enforced; run as a non-root user")
            log.info("sandbox: RLIMIT_NPROC is not enforced for root, so a fork bomb is bounded only "
                     "by the wall-clock timeout; run the search as a dedicated non-root user")
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


# ----------------------------------------------------------------------------- seccomp

#: Set by :func:`sandbox_launch` in the child's environment: ``"1"`` the harness must
#: install :func:`install_seccomp` before it loads the candidate (failure = harness error),
#: ``"0"`` the user switched it off (``EVO_SANDBOX_SECCOMP=0`` or ``EVO_SANDBOX=0``). A
#: harness started without it installs the filter too (the safe default).
SECCOMP_ENV = "EVO_SANDBOX_SECCOMP"
#: Set by :func:`sandbox_launch` in the child's environment: the layers applied, so that the
#: harness can name them when CUDA does not start inside them.
LAYERS_ENV = "EVO_SANDBOX_LAYERS"


class SandboxError(RuntimeError):
    """A confinement layer the harness must apply could not be applied: our failure (the
    harness reports it with ``kind = "sandbox"``); the candidate never runs unconfined."""


@dataclass(frozen=True)
class _Arch:
    name: str
    audit_arch: int
    nr: Mapping[str, int]
    #: x86_64 also accepts x32 system calls (``nr | 0x40000000``) under the same audit
    #: arch: without this check they would bypass every rule below.
    x32_bit: int = 0


_NR_X86_64 = {
    "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "socketpair": 53,
    "accept4": 288, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    "clone3": 435, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "kexec_load": 246,
    "kexec_file_load": 320, "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
    "personality": 135, "unshare": 272, "setns": 308, "perf_event_open": 298, "userfaultfd": 323,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "kcmp": 312, "kill": 62, "tkill": 200, "tgkill": 234,
    "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "ioctl": 16, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "pidfd_getfd": 438, "pidfd_send_signal": 424, "seccomp": 317,
}
# aarch64 uses the generic table (asm-generic/unistd.h): no fork/vfork (glibc forks by clone).
_NR_AARCH64 = {
    "socket": 198, "connect": 203, "accept": 202, "bind": 200, "listen": 201, "socketpair": 199,
    "accept4": 242, "clone": 220, "execve": 221, "execveat": 281, "clone3": 435, "ptrace": 117,
    "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
    "pivot_root": 41, "chroot": 51, "kexec_load": 104, "kexec_file_load": 294, "bpf": 280,
    "keyctl": 219, "add_key": 217, "request_key": 218, "personality": 92, "unshare": 97,
    "setns": 268, "perf_event_open": 241, "userfaultfd": 282, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "name_to_handle_at": 264, "open_by_handle_at": 265,
    "kcmp": 272, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
    "rt_tgsigqueueinfo": 240, "ioctl": 29, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438,
    "pidfd_send_signal": 424, "seccomp": 277,
}
_ARCHES = {
    "x86_64": _Arch("x86_64", 0xC000003E, _NR_X86_64, x32_bit=0x40000000),
    "aarch64": _Arch("aarch64", 0xC00000B7, _NR_AARCH64),
}

#: System calls the candidate's process may not make at all (``EPERM``), and why.
SECCOMP_DENIED: dict[str, str] = {
    **dict.fromkeys(("execve", "execveat"), "no program may be started (a shell, curl, a compiler)"),
    **dict.fromkeys(("fork", "vfork"), "no new process (only threads, see clone)"),
    **dict.fromkeys(("socket", "socketpair", "connect", "accept", "accept4", "bind", "listen"),
                    "no socket of any family: Unix sockets reach local daemons (the raylet, "
                    "a container runtime) that the network namespace does not cut off"),
    **dict.fromkeys(("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
                    "no access to another process's memory or files (the GPU actor, the driver)"),
    **dict.fromkeys(("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
                     "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns"),
                    "no new namespaces or mounts (inside a user namespace the child holds capabilities)"),
    **dict.fromkeys(("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
                     "bpf", "perf_event_open", "userfaultfd", "open_by_handle_at", "name_to_handle_at"),
                    "kernel attack surface a kernel never needs"),
    **dict.fromkeys(("keyctl", "add_key", "request_key"), "no access to the kernel keyrings (credentials)"),
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"),
                    "io_uring operations (socket, connect, open) bypass seccomp's per-syscall rules"),
    "tkill": "signals only through tgkill, whose target is checked",
    "pidfd_send_signal": "signals only to itself (kill/tgkill checked)",
}
#: Checked by argument (the rest of the call is allowed):
#: ``clone``: only with CLONE_THREAD and no namespace flag (threads: CUDA, torch, OpenMP);
#: ``clone3``: ENOSYS (its flags sit in memory a filter cannot read; glibc then uses clone);
#: ``kill`` / ``tgkill`` / ``rt_sigqueueinfo`` / ``rt_tgsigqueueinfo``: only to its own pid
#: (``kill(0, ...)``: its own process group, which the harness child leads alone);
#: ``ioctl``: not TIOCSTI / TIOCLINUX (typing into a terminal the user has open);
#: ``personality``: only the query ``personality(0xffffffff)``.
SECCOMP_ARG_CHECKED = ("clone", "clone3", "kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                       "ioctl", "personality")

_CLONE_THREAD = 0x00010000
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# classic BPF
_LD_W_ABS = 0x20
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45  # BPF_JMP | op | BPF_K
_RET = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_OFF_NR, _OFF_ARCH = 0, 4


def _arg_lo(i: int) -> int:
    """Offset of the low 32 bits of syscall argument ``i`` in ``struct seccomp_data``
    (little-endian). The kernel reads pid, ioctl and clone-flag bits from the low word too."""
    return 16 + 8 * i


def seccomp_program(arch: str, pid: int) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions for ``arch`` and the process ``pid``.

    Wrong audit arch (e.g. i386 calls through ``int 0x80`` on x86_64) or an x32 call: the
    process is killed. Denied calls return ``EPERM``. Raises :class:`SandboxError` for an
    architecture without a table.
    """
    a = _ARCHES.get(arch)
    if a is None:
        raise SandboxError(f"seccomp: no system call table for architecture {arch!r} "
                           f"(known: {', '.join(_ARCHES)}); set EVO_SANDBOX_SECCOMP=0 to run without it")
    eperm, allow = _RET_ERRNO | _EPERM, _RET_ALLOW
    p: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ, 1, 0, a.audit_arch),
        (_RET, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if a.x32_bit:
        p += [(_JGE, 0, 1, a.x32_bit), (_RET, 0, 0, _RET_KILL_PROCESS)]
    nr = a.nr
    pid &= 0xFFFFFFFF

    def block(name: str, body: list[tuple[int, int, int, int]]) -> None:
        # every body ends in a return on every path, so the next test needs no reload of nr
        p.append((_JEQ, 0, len(body), nr[name]))
        p.extend(body)

    block("clone", [(_LD_W_ABS, 0, 0, _arg_lo(0)),
                    (_JSET, 0, 2, _CLONE_THREAD),       # no CLONE_THREAD: a process -> EPERM
                    (_JSET, 1, 0, _CLONE_NS_FLAGS),     # a namespace flag -> EPERM
                    (_RET, 0, 0, allow),
                    (_RET, 0, 0, eperm)])
    block("clone3", [(_RET, 0, 0, _RET_ERRNO | _ENOSYS)])
    block("kill", [(_LD_W_ABS, 0, 0, _arg_lo(0)),
                   (_JEQ, 2, 0, pid),
                   (_JEQ, 1, 0, 0),
                   (_RET, 0, 0, eperm),
                   (_RET, 0, 0, allow)])
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        block(name, [(_LD_W_ABS, 0, 0, _arg_lo(0)),
                     (_JEQ, 1, 0, pid),
                     (_RET, 0, 0, eperm),
                     (_RET, 0, 0, allow)])
    block("ioctl", [(_LD_W_ABS, 0, 0, _arg_lo(1)),
                    (_JEQ, 1, 0, _TIOCSTI),
                    (_JEQ, 0, 1, _TIOCLINUX),
                    (_RET, 0, 0, eperm),
                    (_RET, 0, 0, allow)])
    block("personality", [(_LD_W_ABS, 0, 0, _arg_lo(0)),
                          (_JEQ, 0, 1, 0xFFFFFFFF),
                          (_RET, 0, 0, allow),
                          (_RET, 0, 0, eperm)])
    for name in SECCOMP_DENIED:
        if name in nr:
            p += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, eperm)]
    p.append((_RET, 0, 0, allow))
    return p


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1


def _machine() -> str:
    import platform

    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def seccomp_threads_filtered() -> tuple[int, int]:
    """``(threads, threads in seccomp filter mode)`` of this process, from /proc/self/task."""
    n = filtered = 0
    for t in os.scandir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t.name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Seccomp:"):
                        n += 1
                        filtered += line.split()[1] == b"2"
                        break
        except OSError:  # a thread that just exited
            continue
    return n, filtered


def install_seccomp() -> str:
    """Confine this process, every thread of it and everything it starts (see the module
    docstring); returns a one-line description for the evaluation's ``env``.

    Called by the harness child right before it loads the candidate, after torch and CUDA are
    initialised (CUDA's own threads exist by then: ``SECCOMP_FILTER_FLAG_TSYNC`` puts them
    under the filter too, so a host callback the candidate queues on a driver thread is
    confined as well). Sets ``PR_SET_NO_NEW_PRIVS`` first. Raises :class:`SandboxError` when
    the filter cannot be installed or verified: the harness must then not run the candidate.
    """
    import sys as _sys

    arch = _machine()
    if _sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        raise SandboxError(f"seccomp: only 64-bit little-endian processes are supported (this is {arch}, "
                           f"{_sys.byteorder}-endian); set EVO_SANDBOX_SECCOMP=0 to run without it")
    prog = seccomp_program(arch, os.getpid())
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise SandboxError(f"seccomp: filter of {len(prog)} instructions exceeds the kernel's 4096")
    insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), insns)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        e = ctypes.get_errno()
        raise SandboxError(f"seccomp: prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(e)}")
    r = libc.syscall(ctypes.c_long(_ARCHES[arch].nr["seccomp"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                     ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if r != 0:
        e = ctypes.get_errno()
        why = (f"thread {r} could not be synchronised" if r > 0 else os.strerror(e))
        raise SandboxError(f"seccomp: installing the filter failed ({why}); the kernel needs "
                           "CONFIG_SECCOMP_FILTER and Linux >= 3.17; set EVO_SANDBOX_SECCOMP=0 to run "
                           "without it (docs/SECURITY.md)")
    n, filtered = seccomp_threads_filtered()
    if n == 0 or filtered != n:
        raise SandboxError(f"seccomp: only {filtered} of {n} threads are filtered after install")
    return (f"seccomp-bpf ({arch}, {len(prog)} instructions, {n} threads): no exec, fork, socket, "
            "ptrace, mount, namespaces; signals to itself only")


def seccomp_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the harness must install the filter (:data:`SECCOMP_ENV`, default yes)."""
    return _flag(os.environ if environ is None else environ, SECCOMP_ENV, True)



# ----------------------------------------------------------------------------- file access

#: Read-only system locations the harness child needs (each only if it exists): shared
#: libraries (the CUDA driver's among them), system programs, locale and time zone data, the loader's cache,
#: what the CUDA driver and torch read from /proc and /sys. Not /etc as a whole (passwd,
#: ssh, tokens), not /home, /root, /var, /tmp, /opt, other processes' /proc entries.
SYSTEM_READABLE = (
    "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib", "/usr/share",
    "/bin", "/usr/bin",  # exec needs read access under Landlock: nvidia-smi (before seccomp)
    "/usr/local/nvidia", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.preload",
    "/etc/localtime",
    "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys", "/proc/driver", "/proc/devices",
    "/proc/filesystems", "/proc/version", "/proc/modules", "/proc/uptime", "/proc/loadavg", "/sys",
)
#: Written by the CUDA driver: /dev (device files, /dev/shm), the process's own /proc entry
#: (cuInit writes below /proc/self: CUDA_ERROR_OPERATING_SYSTEM (304) on an H200 without it;
#: the wrapper resolves /proc/self to the child itself, which it becomes by exec).
SYSTEM_WRITABLE = ("/dev", "/proc/self")


def _ld_conf_dirs() -> list[str]:
    """Library directories the dynamic loader is configured with (/etc/ld.so.conf.d)."""
    out: list[str] = []
    d = Path("/etc/ld.so.conf.d")
    try:
        files = sorted(d.glob("*.conf"))
    except OSError:
        return out
    for f in files:
        try:
            for line in f.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("/"):
                    out.append(line)
        except OSError:
            continue
    return out


_layout_cache: dict[tuple[str, str], dict] = {}
_LAYOUT = ("import json, sys; print(json.dumps({'prefixes': [sys.prefix, sys.base_prefix, sys.exec_prefix, "
           "sys.base_exec_prefix], 'path': [p for p in sys.path if p]}))")


def _python_layout(python: str, pythonpath: str) -> dict:
    """Prefixes and ``sys.path`` of ``python`` run with ``pythonpath`` (asked once per pair;
    this process's own when ``python`` cannot be asked)."""
    key = (python, pythonpath)
    if key not in _layout_cache:
        own = {"prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix],
               "path": [p for p in sys.path if p]}
        try:
            p = subprocess.run([python, "-c", _LAYOUT], capture_output=True, text=True, timeout=60,
                               env={"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": pythonpath},
                               stdin=subprocess.DEVNULL, cwd="/")
            layout = json.loads(p.stdout) if p.returncode == 0 else own
        except (OSError, ValueError, subprocess.TimeoutExpired):
            layout = own
        _layout_cache[key] = layout
    return _layout_cache[key]


def _project_entries(root: Path) -> tuple[list[str], list[str]]:
    """The project root on ``sys.path``: its Python packages and package metadata are
    readable, the root itself only listable (Python's import system lists it), so the rest
    of it (the lineage DB under .evo/, configs, a .env file) is not."""
    read: list[str] = []
    try:
        for c in sorted(root.iterdir()):
            if (c.is_dir() and (c / "__init__.py").is_file()) or c.name.endswith((".egg-info", ".dist-info")):
                read.append(str(c))
    except OSError:
        pass
    return read, [str(root)]


def harness_paths(argv: Sequence[str], env: Mapping[str, str], jobdir: str | os.PathLike[str], *,
                  readable: Sequence[str] = (), writable: Sequence[str] = ()) -> dict[str, list[str]]:
    """What the harness child may read, list and write under Landlock, derived from this
    machine and the launch, never a fixed list of its paths: ``{"read", "list", "write"}``.

    read: the child's Python (its prefixes and every ``sys.path`` entry it will have, asked
    from the interpreter with the child's ``PYTHONPATH``; the project root only through
    :func:`_project_entries`), :data:`SYSTEM_READABLE`, the loader's configured library
    directories and ``LD_LIBRARY_PATH``, the CUDA toolkit (``CUDA_HOME``, ``CUDA_PATH``,
    /usr/local/cuda), files named in ``argv`` (the entry script), and ``readable``.
    write (and read): the job directory, :data:`SYSTEM_WRITABLE`, the MPS pipe and log
    directories when set or present, and ``writable``.
    """
    project = Path(__file__).resolve().parent.parent
    read: list[str] = []
    listed: list[str] = []
    python = argv[0] if argv else sys.executable
    layout = _python_layout(python, env.get("PYTHONPATH", ""))
    read += [p for p in layout["prefixes"] if p]
    for entry in layout["path"]:
        try:
            real = Path(entry).resolve()
        except (OSError, RuntimeError):
            continue
        if real == project:
            r, l = _project_entries(real)
            read += r
            listed += l
        elif real.is_dir() or real.is_file():  # zip files on sys.path are files
            read.append(str(real))
    read += list(SYSTEM_READABLE) + _ld_conf_dirs()
    read += [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p.startswith("/")]
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            read.append(os.path.realpath(root))
    read += [a for a in argv[1:] if a.startswith("/") and os.path.isfile(a)]
    read += [str(p) for p in readable]
    write = [str(jobdir), *SYSTEM_WRITABLE]
    for var, default in (("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), ("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")):
        d = env.get(var) or default
        if os.path.isdir(d):
            write.append(d)
    write += [str(p) for p in writable]

    def uniq(xs: list[str]) -> list[str]:
        seen: set[str] = set()
        return [x for x in xs if not (x in seen or seen.add(x))]

    return {"read": uniq(read), "list": uniq(listed), "write": uniq(write)}


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
    readable: Sequence[str] = (),
) -> Launch:
    """The sandboxed form of launching ``argv`` with ``env`` for the job in ``jobdir``.

    Always: the environment is scrubbed (:func:`scrub_env`) and ``HOME``/``TMPDIR``/
    ``XDG_CACHE_HOME`` point into ``jobdir``. With ``settings.enabled`` (default), ``argv``
    is wrapped so the child confines itself before ``exec`` (see the module docstring).
    ``readable``: more paths the child may read under Landlock (user task files' directories).
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
    # The harness reads this before it loads the candidate (install_seccomp); set here, where
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
        paths = harness_paths(argv, e, jd, readable=(*readable, *s.extra_readable), writable=s.extra_writable)
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
    parts.append("seccomp in the harness" if s.seccomp else "NO seccomp (EVO_SANDBOX_SECCOMP=0)")
    return "sandbox: " + ", ".join(parts) + (f" [{'; '.join(caps.notes)}]" if caps.notes else "")
