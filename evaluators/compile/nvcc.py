"""One nvcc run: its argv (the path-free flags are part of the cache key) and running it in
its own process group under the memory limit and, where the kernel has it, Landlock, killed
whole on timeout.

The limits are set by a tiny Python ``exec`` wrapper rather than ``preexec_fn``, which is
unsafe in threaded processes such as Ray workers. The wrapper's own failures (it could not
set its limits or start nvcc) are tagged lines with exit codes of their own, so they are
never read as nvcc's (:mod:`evaluators.compile.infrastructure` raises them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from evaluators.base import CompileSettings
from evaluators.compile.toolchain import abi_include_dir, cutlass_include_dir


_LOG_READ_MAX = 4 * 1024 * 1024  # never read more of a runaway log than this
_SOURCE_NAME = "candidate.cu"
_OUTPUT_NAME = "candidate.so"


def gencode_flags(arch: str) -> list[str]:
    """``"sm_90a"`` -> ``["-gencode=arch=compute_90a,code=sm_90a"]`` (also ``sm_100a``, ``sm_80``)."""
    m = re.fullmatch(r"sm_(\d{2,3}[a-z]?)", arch.strip())
    if not m:
        raise ValueError(f"compile.arch = {arch!r} is not an SM architecture like 'sm_90a' or 'sm_100a'")
    v = m.group(1)
    return [f"-gencode=arch=compute_{v},code=sm_{v}"]


def build_flags(settings: CompileSettings) -> list[str]:
    """The path-free nvcc flags (they are part of the cache key)."""
    return [
        "-std=c++17",
        "-O3",
        *gencode_flags(settings.arch),
        "--expt-relaxed-constexpr",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Xptxas",
        "-v",
        "-lineinfo",
        *settings.extra_flags,
    ]


def _define_flags(params: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"-D{k}={v}" for k, v in params]


def build_command(
    nvcc: str, source_path: str, out_path: str, settings: CompileSettings,
    params: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """The full nvcc argv for one build."""
    return [
        nvcc,
        *build_flags(settings),
        f"-I{abi_include_dir()}",
        f"-I{cutlass_include_dir()}",
        *_define_flags(params),
        source_path,
        "-o",
        out_path,
    ]


#: First words of every line the limit wrapper itself prints (its own failures, before nvcc).
_WRAPPER_TAG = "evo-compile-wrapper:"
#: Exit codes of the limit wrapper's own failures: it could not set its limits / start nvcc.
_WRAPPER_SETUP_EXIT, _WRAPPER_EXEC_EXIT = 71, 72


# ``python -I -S -c _LIMIT_WRAPPER CONFIG_JSON cmd...``: limits, then exec cmd. Its own
# failures are tagged and get exit codes of their own, so they are never read as nvcc's.
_LIMIT_WRAPPER = r'''
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
def die(code, what, e):
    sys.stdout.write("%s %s: %s\n" % (cfg["tag"], what, e))
    sys.stdout.flush()
    os._exit(code)
try:
    lim = int(cfg.get("as_bytes", 0))
    if lim > 0:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            lim = min(lim, hard)
        resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
except BaseException as e:
    die(cfg["setup_exit"], "setting the limits failed", repr(e))
if cfg.get("landlock"):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def check(r, what):
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))
        return r
    try:
        landlock_apply(libc, cfg["landlock"], check)
    except BaseException as e:
        die(cfg["setup_exit"], "Landlock failed", repr(e))
try:
    os.execv(sys.argv[2], sys.argv[2:])
except BaseException as e:
    die(cfg["exec_exit"], "cannot start %s" % sys.argv[2], repr(e))
'''


@dataclass(frozen=True)
class _Run:
    returncode: int | None  # None: timed out
    log: str
    seconds: float


def _run_limited(cmd: list[str], cwd: str, timeout_s: float, memory_mb: int,
                 landlock: dict[str, Any] | None = None) -> _Run:
    """Run ``cmd`` in its own process group under an address-space limit (and, given
    ``landlock``, :data:`evaluators.sandbox.LANDLOCK_CODE`'s file rules); kill the group on
    timeout."""
    log_path = os.path.join(cwd, "nvcc.log")
    from evaluators.sandbox import LANDLOCK_CODE, scrub_env

    # nvcc reads machine-written source: it gets no secrets (the LLM key stays in the driver).
    env = dict(scrub_env(os.environ), TMPDIR=cwd, TMP=cwd, TEMP=cwd)
    cfg = {"as_bytes": max(0, int(memory_mb)) * 1024 * 1024, "tag": _WRAPPER_TAG,
           "setup_exit": _WRAPPER_SETUP_EXIT, "exec_exit": _WRAPPER_EXEC_EXIT, "landlock": landlock}
    argv = [sys.executable, "-I", "-S", "-c", LANDLOCK_CODE + _LIMIT_WRAPPER, json.dumps(cfg), *cmd]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log_f:
        proc = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_f, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )
        rc: int | None
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None or rc is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            else:
                # nvcc is done; make sure no straggler of its group keeps running
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    seconds = time.perf_counter() - t0
    with open(log_path, "rb") as f:
        data = f.read(_LOG_READ_MAX)
    return _Run(rc, data.decode("utf-8", "replace"), seconds)
