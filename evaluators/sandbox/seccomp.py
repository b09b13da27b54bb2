"""The seccomp-bpf filter a runner installs in itself right before it loads the candidate
(:func:`seccomp_program`, made by the judge for the runner's pid and installed by the runner on
``SECCOMP``; :func:`install_seccomp` installs it in a Python process): what it refuses (:data:`SECCOMP_DENIED`,
:data:`SECCOMP_ARG_CHECKED`), per architecture (x86_64, aarch64), as classic BPF
(:func:`seccomp_program`).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Mapping

from evaluators.sandbox.settings import SECCOMP_ENV, _flag


class SandboxError(RuntimeError):
    """A confinement layer that must be applied could not be: our failure (reported as a
    runner that did not start); the candidate never runs unconfined."""


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
#: (``kill(0, ...)``: its own process group, which the runner leads alone);
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
    """Confine this process, every thread of it and everything it starts (the filter of
    :mod:`evaluators.sandbox`); returns a one-line description for the evaluation's ``env``.

    For a Python process that loads candidate code (a stand-in runner, the filter's own tests);
    the C++ runner installs the same program itself. Call it right before the load, once
    every thread exists (``SECCOMP_FILTER_FLAG_TSYNC`` puts existing threads under the filter
    too). Sets ``PR_SET_NO_NEW_PRIVS`` first. Raises :class:`SandboxError` when the filter
    cannot be installed or verified: the candidate must then not be loaded.
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
    """Whether the filter must be installed (:data:`SECCOMP_ENV`, default yes)."""
    return _flag(os.environ if environ is None else environ, SECCOMP_ENV, True)
