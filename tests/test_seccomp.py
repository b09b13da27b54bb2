"""The seccomp filter every runner installs before it loads the candidate
(evaluators/sandbox/seccomp.py ``seccomp_program``; the C++ runner installs it on the judge's
``SECCOMP``, tests/test_runner.py checks that path with the real runner).

A Python child (fixtures/sandbox/seccomp_child.py: a thread started before confinement, as
CUDA's are, then the filter, then ctypes loads the candidate) runs a small gcc-built .so
(fixtures/sandbox/syscalls.c) that tries every way out of its process, through the real
sandbox launch (wrapper, namespaces, Landlock).
A control run with seccomp switched off shows the same .so does get out, so the confined
run measures the filter, not a broken fixture.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators import sandbox as sb
from evaluators.judge.runner_process import runner_env
from evaluators.sandbox.seccomp import _ARCHES, _machine
from fakes.sandboxed import run_sandboxed  # noqa: E402  (tests/ is on sys.path)

FIX = Path(__file__).parent / "fixtures" / "sandbox"
CHILD = str(FIX / "seccomp_child.py")
ARCH_OK = _machine() in _ARCHES

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the stand-in")
needs_arch = pytest.mark.skipif(not ARCH_OK, reason=f"no seccomp table for {_machine()}")

#: attempts the filter must refuse with EPERM (the name in syscalls.c -> what it is)
DENIED = ("fork", "clone_process", "socket_unix", "socket_inet", "socketpair", "ptrace",
          "process_vm_readv", "kill_parent", "kill_all", "unshare_user", "io_uring_setup")


@pytest.fixture(scope="module")
def so_bytes(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("seccomp-so")
    out = d / "syscalls.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(FIX / "syscalls.c"), "-lpthread"],
                   check=True, capture_output=True, text=True)
    return out.read_bytes()


@pytest.fixture(autouse=True)
def fresh_probe():
    sb.reset_probe()
    yield
    sb.reset_probe()


def _run(so: bytes, tmp_path: Path, args: dict, sandbox: sb.SandboxSettings | None = None):
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    jobdir = tmp_path / f"job{len(list(tmp_path.glob('job*')))}"
    jobdir.mkdir()
    (jobdir / "kernel.so").write_bytes(so)
    # the markers directory is writable under Landlock: only seccomp stands between a
    # command and its marker
    sandbox = dataclasses.replace(sandbox or sb.SandboxSettings(), extra_writable=(str(markers),))
    env = {**runner_env(), "PYTHONPATH": str(Path(sb.__file__).resolve().parents[2])}
    ran = run_sandboxed([sys.executable, CHILD, str(jobdir), json.dumps({"markers": str(markers), "hostile": 1, **args})],
                        jobdir, 60, sandbox, env=env)
    return ran, sorted(q.name for q in markers.iterdir())


def _lines(text: str) -> dict[str, tuple[int, int]]:
    out = {}
    for line in text.splitlines():
        name, rc, err = line.split()
        out[name] = (int(rc), int(err))
    return out


@needs_gcc
@needs_arch
def test_candidate_cannot_exec_fork_open_sockets_or_ptrace_but_threads_work(so_bytes, tmp_path):
    rep, markers = _run(so_bytes, tmp_path, {})
    assert rep.rc == 0, rep.stderr[-2000:]
    assert rep.seen["seccomp"].startswith("seccomp-bpf"), rep.seen["seccomp"]
    assert "seccomp-required" in rep.layers
    seen = rep.seen
    for where in ("main", "early"):   # early: a thread that existed before the filter (TSYNC)
        got = _lines(seen[where])
        for name in DENIED:
            assert got[name] == (-1, errno.EPERM), f"{where} thread: {name} -> {got[name]}"
        if "sys_fork" in got:                     # x86_64 has a fork system call of its own
            assert got["sys_fork"] == (-1, errno.EPERM)
        assert got["system"][0] == -1
        assert got["posix_spawn"] == (-1, errno.EPERM), got["posix_spawn"]
        assert got["execve"] == (-1, errno.EPERM), "execve in place returned: it was refused"
        assert got["thread"] == (0, 0), "pthread_create must keep working (CUDA, torch, OpenMP)"
        assert got["kill_self"] == (0, 0), "signals to itself stay allowed (abort, raise)"
    assert markers == [], f"a command got through: {markers}"


@needs_gcc
@needs_arch
def test_control_without_seccomp_the_same_candidate_gets_out(so_bytes, tmp_path):
    """Seccomp off (EVO_SANDBOX_SECCOMP=0; the rest of the sandbox on): fork, exec, system()
    and sockets work, so the test above measures the filter."""
    rep, markers = _run(so_bytes, tmp_path, {"hostile": 0}, sb.SandboxSettings(seccomp=False))
    assert rep.rc == 0, rep.stderr[-2000:]
    assert rep.seen["seccomp"] == "off (EVO_SANDBOX_SECCOMP=0)"
    assert "seccomp-required" not in rep.layers
    got = _lines(rep.seen["main"])
    assert got["fork"][0] == 0 and got["socket_unix"][0] == 0 and got["thread"] == (0, 0)
    assert {"fork_exec", "system", "posix_spawn"} <= set(markers), markers


@needs_gcc
@pytest.mark.skipif(_machine() != "x86_64", reason="i386 system calls exist on x86_64 only")
def test_i386_system_calls_kill_the_process(so_bytes, tmp_path):
    """``int 0x80`` enters the i386 table with other numbers: the filter's arch check kills."""
    rep, _ = _run(so_bytes, tmp_path, {"int80": True})
    if rep.rc == -signal.SIGSEGV:
        pytest.skip("this kernel has no i386 emulation (int 0x80 faults before any filter)")
    assert rep.rc == -signal.SIGSYS, (rep.rc, rep.stderr[-1000:])
    rep, _ = _run(so_bytes, tmp_path, {"int80": True}, sb.SandboxSettings(seccomp=False))
    assert rep.rc == 0 and int(rep.seen["int80"]) > 0, "control: allowed"


@needs_gcc
def test_a_filter_that_cannot_be_installed_stops_before_the_candidate_loads(so_bytes, tmp_path):
    """Never an unconfined candidate: the install raises, naming the switch, before the load."""
    rep, markers = _run(so_bytes, tmp_path, {"arch": "riscv64"})
    assert rep.rc != 0 and "no system call table for architecture 'riscv64'" in rep.stderr, rep.stderr[-1000:]
    assert "EVO_SANDBOX_SECCOMP=0" in rep.stderr and rep.seen == {} and markers == []


def test_switches():
    assert sb.SandboxSettings.from_env({}).seccomp is True
    assert sb.SandboxSettings.from_env({"EVO_SANDBOX_SECCOMP": "0"}).seccomp is False
    assert sb.seccomp_wanted({}) is True, "a process started without the variable confines itself"
    assert sb.seccomp_wanted({"EVO_SANDBOX_SECCOMP": "1"}) and not sb.seccomp_wanted({"EVO_SANDBOX_SECCOMP": "0"})


def test_launch_tells_the_child(tmp_path):
    on = sb.sandbox_launch(["true"], {}, tmp_path, 10, sb.SandboxSettings(enabled=False))
    assert on.env[sb.SECCOMP_ENV] == "0", "EVO_SANDBOX=0 switches seccomp off with the rest"
    on = sb.sandbox_launch(["true"], {sb.SECCOMP_ENV: "0"}, tmp_path, 10, sb.SandboxSettings())
    assert on.env[sb.SECCOMP_ENV] == "1", "the launch decides, not the inherited environment"


def _header_numbers(path: Path) -> dict[str, int]:
    out = {}
    for m in re.finditer(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", path.read_text(), re.M):
        out.setdefault(m.group(1), int(m.group(2)))
    return out


@pytest.mark.parametrize("arch,header", [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    ("aarch64", "/usr/include/asm-generic/unistd.h"),
])
def test_syscall_tables_match_the_kernel_headers(arch, header):
    """The hand-written numbers are the kernel's (aarch64 uses the generic table)."""
    if not os.path.exists(header):
        pytest.skip(f"{header} not installed")
    want = _header_numbers(Path(header))
    table = _ARCHES[arch].nr
    wrong = {n: (v, want.get(n)) for n, v in table.items() if want.get(n) != v}
    assert not wrong, f"{arch}: (ours, header's) {wrong}"
    for name in list(sb.SECCOMP_DENIED) + list(sb.SECCOMP_ARG_CHECKED):
        assert name in table or name not in want, f"{arch}: {name} exists but has no number here"


def test_unknown_architecture_is_refused_with_the_switch_named():
    with pytest.raises(sb.SandboxError, match="no system call table for architecture 'mips'.*EVO_SANDBOX_SECCOMP=0"):
        sb.seccomp_program("mips", 1)


def test_program_shape():
    """Jumps fit classic BPF (8-bit offsets) and every path ends in a return."""
    for arch in _ARCHES:
        prog = sb.seccomp_program(arch, 4242)
        assert len(prog) < 4096 and prog[-1] == (0x06, 0, 0, 0x7FFF0000)
        for i, (code, jt, jf, _k) in enumerate(prog):
            if code & 0x07 == 0x05:
                assert i + 1 + max(jt, jf) < len(prog)
