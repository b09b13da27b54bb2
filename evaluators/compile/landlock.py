"""What nvcc may read and write: the Landlock rules of a build, and the compile log's second
layer behind them (diagnostics located in files outside the include path are withheld).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from evaluators.base import CompileSettings
from evaluators.compile.toolchain import _host_compiler, abi_include_dir, cutlass_include_dir

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _toolchain_dirs(nvcc: str, host_cc: str) -> tuple[str, ...]:
    """Directories the toolchain reads: the CUDA toolkit of ``nvcc`` (``<root>/bin/nvcc``:
    the whole root), the host compiler's programs, libraries and system include directories
    (asked from the compiler: ``-print-search-dirs`` and ``-E -v``), the programs nvcc and
    gcc start (sh, as, ld), and the dynamic loader's library directories."""
    out: list[str] = []
    real = Path(os.path.realpath(nvcc))
    root = real.parent.parent if real.parent.name == "bin" and (real.parent.parent / "include").is_dir() else real.parent
    out.append(str(root))
    for prog in (host_cc, "g++", "gcc", "cc", "c++", "sh", "as", "ld"):
        found = prog if os.sep in prog else shutil.which(prog)
        if found and os.path.exists(found):
            out += [os.path.dirname(found), os.path.dirname(os.path.realpath(found))]
    cc = host_cc if os.sep in host_cc else shutil.which(host_cc)
    if cc:
        try:
            dirs = subprocess.run([cc, "-print-search-dirs"], capture_output=True, text=True, timeout=60).stdout
            for line in dirs.splitlines():
                key, _, val = line.partition(": ")
                if key in ("install", "programs", "libraries"):
                    out += [p for p in val.lstrip("=").split(os.pathsep) if p.startswith("/")]
            inc = subprocess.run([cc, "-xc++", "-E", "-v", "/dev/null"], capture_output=True, text=True,
                                 timeout=60, stdin=subprocess.DEVNULL).stderr
            inside = False
            for line in inc.splitlines():
                if line.startswith("#include <...> search starts here"):
                    inside = True
                elif line.startswith("End of search list"):
                    inside = False
                elif inside and line.strip().startswith("/"):
                    out.append(line.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    from evaluators.sandbox.landlock import _ld_conf_dirs

    out += ["/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local/lib"]
    out += _ld_conf_dirs()
    existing = []
    for p in out:
        try:
            rp = os.path.realpath(os.path.normpath(p))
        except OSError:
            continue
        if os.path.exists(rp) and rp not in existing:
            existing.append(rp)
    return tuple(existing)


#: Files nvcc, cicc, ptxas and gcc read outside the directories above (seen with strace on
#: nvcc 13.0 / gcc 12): the loader cache, the time zone, random bytes, the overcommit mode.
_TOOLCHAIN_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/null", "/dev/zero", "/dev/urandom",
                    "/dev/random", "/proc/self", "/proc/sys/vm/overcommit_memory", "/proc/cpuinfo",
                    "/proc/meminfo", "/sys/devices/system/cpu")


def nvcc_landlock(nvcc: str, settings: CompileSettings, workdir: str) -> dict[str, Any] | None:
    """The Landlock rules nvcc runs under, or None where Landlock is off or missing.

    Reads only beneath the include path (the ABI header's and CUTLASS's directories, the
    host compiler's system include directories), the toolchain (:func:`_toolchain_dirs`,
    :data:`_TOOLCHAIN_FILES`), ``$LD_LIBRARY_PATH`` and the private work directory, so
    ``#include "/etc/passwd"`` (or the lineage DB, a key file) fails to open and its content
    cannot reach the compile log, the DB or a repair prompt. Writes only in the work
    directory (and /dev/null). Extra paths: ``EVO_SANDBOX_READABLE`` / ``EVO_SANDBOX_WRITABLE``;
    off with ``EVO_SANDBOX_READS=0`` (reads) / ``EVO_SANDBOX_LANDLOCK_FS=0`` (writes) /
    ``EVO_SANDBOX_LANDLOCK=0`` (both).
    """
    from evaluators.sandbox import SandboxSettings
    from evaluators.sandbox.landlock import _landlock_abi

    s = SandboxSettings.from_env()
    if not (s.enabled and s.landlock) or not (s.landlock_reads or s.landlock_fs):
        return None
    if _landlock_abi() < 1:
        _warn_no_landlock()
        return None
    return {"fs_read": bool(s.landlock_reads), "fs_write": bool(s.landlock_fs), "read": nvcc_readable(nvcc, settings),
            "list": [], "write": [workdir, "/dev/null", *s.extra_writable]}


def nvcc_readable(nvcc: str, settings: CompileSettings) -> list[str]:
    """What nvcc may read besides its work directory (see :func:`nvcc_landlock`)."""
    from evaluators.sandbox import SandboxSettings

    return [str(abi_include_dir()), str(cutlass_include_dir()), *_toolchain_dirs(nvcc, _host_compiler(settings)),
            *_TOOLCHAIN_FILES, *[p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p.startswith("/")],
            *SandboxSettings.from_env().extra_readable]


_DIAG_PATH = re.compile(r"^(/[^\s:(]+)(?:\(\d+\)|:\d+)")


def withhold_foreign(log: str, readable: list[str]) -> str:
    """``log`` with every diagnostic located in a file outside ``readable`` (the include path
    and the toolchain) replaced by one line naming the file, and the source lines the
    compiler quoted under it dropped: a second layer behind nvcc's Landlock rules (a kernel
    without Landlock), so that no content of such a file reaches an artifact."""
    roots = [r.rstrip("/") for r in readable if r]
    out: list[str] = []
    skipping = False
    for line in log.splitlines():
        m = _DIAG_PATH.match(line)
        if m:
            path = os.path.normpath(m.group(1))
            skipping = not any(path == r or path.startswith(r + "/") for r in roots)
            if skipping:
                out.append(f"{path}: [diagnostic withheld: the file is outside the include path]")
                continue
        elif skipping and (line.startswith((" ", "\t")) or not line.strip()):
            if not line.strip():
                skipping = False
                out.append(line)
            continue
        else:
            skipping = False
        out.append(line)
    return "\n".join(out) + ("\n" if log.endswith("\n") else "")


@functools.lru_cache(maxsize=1)
def _warn_no_landlock() -> None:
    logger.warning("SANDBOX: Landlock is not available in this kernel: nvcc can read any file this user can "
                   "(an #include of a host file would reach the compile log)")
