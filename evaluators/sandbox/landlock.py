"""Landlock: the stdlib-only code that applies a rule set (:data:`LANDLOCK_CODE`, run by the
child's exec wrapper and by nvcc's), the kernel's Landlock ABI, and the files a Python
process (:func:`harness_paths`: a stand-in runner) or the native runner (:func:`runner_paths`) may read, list and
write, derived per launch.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence


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


def _landlock_abi() -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        r = libc.syscall(444, None, ctypes.c_size_t(0), 1)
    except (OSError, AttributeError):
        return 0
    return int(r) if r > 0 else 0


#: Read-only system locations a runner needs (each only if it exists): shared
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
    """What a Python child (a stand-in runner) may read, list and write under Landlock, derived from this
    machine and the launch, never a fixed list of its paths: ``{"read", "list", "write"}``.

    read: the child's Python (its prefixes and every ``sys.path`` entry it will have, asked
    from the interpreter with the child's ``PYTHONPATH``; the project root only through
    :func:`_project_entries`), :data:`SYSTEM_READABLE`, the loader's configured library
    directories and ``LD_LIBRARY_PATH``, the CUDA toolkit (``CUDA_HOME``, ``CUDA_PATH``,
    /usr/local/cuda), files named in ``argv`` (the entry script), and ``readable``.
    write (and read): the job directory, :data:`SYSTEM_WRITABLE`, the MPS pipe and log
    directories when set or present, and ``writable``.
    """
    project = Path(__file__).resolve().parents[2]
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
    return {"read": _uniq(read), "list": _uniq(listed), "write": _uniq(_write_paths(env, jobdir, writable))}


def _uniq(xs: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in xs if not (x in seen or seen.add(x))]


def _write_paths(env: Mapping[str, str], jobdir: str | os.PathLike[str], writable: Sequence[str]) -> list[str]:
    """The job directory, :data:`SYSTEM_WRITABLE`, the MPS pipe and log directories when set
    or present, and ``writable``."""
    write = [str(jobdir), *SYSTEM_WRITABLE]
    for var, default in (("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), ("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")):
        d = env.get(var) or default
        if os.path.isdir(d):
            write.append(d)
    write += [str(p) for p in writable]
    return write


def _elf_interpreter(path: str) -> str | None:
    """The dynamic loader a 64-bit little-endian ELF executable names (``PT_INTERP``), or None."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            for i in range(min(phnum, 256)):
                f.seek(phoff + i * phentsize)
                ph = f.read(56)
                if len(ph) < 56:
                    return None
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", ph, 0)
                if p_type == 3:  # PT_INTERP
                    f.seek(p_offset)
                    return f.read(min(p_filesz, 4096)).split(b"\0", 1)[0].decode("utf-8", "replace") or None
    except (OSError, struct.error):
        return None
    return None


def _libc_dirs() -> list[str]:
    """Directories of the C library and loader this machine's processes map (from this
    process's own /proc/self/maps: the runner links the same system libc)."""
    out: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                name = parts[-1] if len(parts) >= 6 else ""
                base = os.path.basename(name)
                if name.startswith("/") and (base.startswith(("libc.so", "libc-", "ld-linux", "libstdc++.so"))):
                    out.append(os.path.dirname(os.path.realpath(name)))
    except OSError:
        pass
    return out


def runner_paths(binary: str | os.PathLike[str], env: Mapping[str, str], jobdir: str | os.PathLike[str], *,
                 readable: Sequence[str] = (), writable: Sequence[str] = ()) -> dict[str, list[str]]:
    """What a native runner (:mod:`evaluators.runner`, no Python) may read, list and write
    under Landlock: ``{"read", "list", "write"}``, like :func:`harness_paths` but without any
    Python: no interpreter is asked, no project package is readable.

    read: the runner binary itself, its dynamic loader (``PT_INTERP``) and the C library's
    directories, :data:`SYSTEM_READABLE` (system libraries, where the NVIDIA driver's libraries
    and /etc/ld.so.cache live, what the CUDA driver reads in /proc and /sys), the loader's
    configured library directories and ``LD_LIBRARY_PATH``, the CUDA toolkit (a candidate
    linked against a shared cudart), and ``readable`` (the candidate's .so when it is not in the
    job directory). write (and read): the job directory (the candidate's .so and the host
    backend's buffers live there), /dev (/dev/nvidia*, /dev/shm), the runner's own
    /proc/self, the MPS directories, and ``writable``.
    """
    b = os.path.realpath(os.fspath(binary))
    read = [b]
    interp = _elf_interpreter(b)
    if interp:
        read += [interp, os.path.dirname(os.path.realpath(interp))]
    read += _libc_dirs()
    read += list(SYSTEM_READABLE) + _ld_conf_dirs()
    read += [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p.startswith("/")]
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            read.append(os.path.realpath(root))
    read += [str(p) for p in readable]
    return {"read": _uniq(read), "list": [], "write": _uniq(_write_paths(env, jobdir, writable))}
