"""The judge's handle on one runner process (:class:`RunnerProcess`): start it sandboxed, send
it one command line at a time (:mod:`evaluators.protocol`), read one reply per command under a
deadline, and end it.

Trusted side. Nothing here loads candidate code, and nothing a runner writes is read as a
verdict: a reply is parsed strictly (:func:`evaluators.protocol.parse_reply`) into a return
code and an event time at most, and files the runner leaves in its job directory (a forged
``result.json`` or ``error.json``) are never opened. What goes wrong is an exception:

- :class:`RunnerStartError`: our failure. The runner could not be started, did not answer
  ``HELLO`` with ``READY``, or answered ``ERR`` (or nothing) before any candidate code was in
  it (:meth:`RunnerProcess.start`, :meth:`RunnerProcess.install_seccomp`).
- :class:`RunnerGone` (a :class:`~evaluators.protocol.ProtocolViolation`): the runner closed
  its output or exited; the message names the exit status or signal and ends with the tail of
  its stderr. After ``LOAD`` that is the candidate's crash, whatever the exit status (a
  candidate that writes a result and calls ``exit(0)`` is a crash).
- :class:`RunnerTimeout`: no reply before the deadline; the runner's process group has been
  killed.
- :class:`~evaluators.protocol.ProtocolViolation`: anything else outside the protocol (a
  malformed line, two replies to one command, output nobody asked for); the runner has been
  killed. A runner is never used again after any of these.

The runner is started through :func:`evaluators.sandbox.sandbox_launch` (scrubbed environment,
private HOME and TMPDIR in the job directory, rlimits, network namespace, Landlock with
:func:`evaluators.sandbox.landlock.runner_paths`'s read set for the native runner) in a
session of its own, with its stdin and stdout as pipes and its stderr in
``jobdir/runner.stderr``. seccomp is installed by the runner itself, in its own process, when
the judge sends ``SECCOMP`` (:meth:`RunnerProcess.install_seccomp`) before ``LOAD``; the runner
refuses ``LOAD`` without it unless started with ``--no-seccomp`` (``seccomp=False`` or the
user's ``EVO_SANDBOX_SECCOMP=0``).

``wrap`` (:meth:`RunnerProcess.start`): a trusted program the judge starts in front of the
sandboxed runner (a profiler: ``[ncu, options...]``, :mod:`evaluators.judge.profile`). It is
started as ``[*wrap, <the sandbox wrapper>, <the runner>]``: the runner is confined by the same
:func:`~evaluators.sandbox.sandbox_launch` as without it (the wrapper becomes the runner by
``exec``, so Landlock's ``/proc/self`` rule is the runner's), its seccomp filter is made for the
runner's own pid (a descendant of the wrapping program, found once it answered ``READY``), and
the wrapping program, which never loads candidate code, is not confined.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from evaluators import protocol
from evaluators.protocol import MAX_LINE, PROTOCOL_VERSION, Failed, ProtocolViolation, Ready, Reply, Seccomped

if TYPE_CHECKING:
    from evaluators.sandbox import SandboxSettings

__all__ = ["RunnerGone", "RunnerProcess", "RunnerStartError", "RunnerTimeout", "runner_env"]

#: Variables of the judge's environment a runner sees (then scrubbed by sandbox_launch):
#: the loader's and the CUDA driver's knobs, the locale. Nothing else.
_ENV_KEEP = frozenset({"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH"})
_ENV_KEEP_PREFIXES = ("CUDA_", "NVIDIA_")
#: How long a runner that closed its stdout gets to exit before it is killed (its status is
#: then SIGKILL's), and how long ``close`` waits after ``QUIT``.
_EXIT_GRACE_S = 1.0


class RunnerStartError(RuntimeError):
    """Our failure: the runner could not be started, did not become ready, or failed before
    any candidate code was loaded into it (HELLO, MAP, SECCOMP)."""


class RunnerGone(ProtocolViolation):
    """The runner closed its output or exited. ``returncode``: its exit status (negative: the
    signal that ended it; None: unknown); ``stderr_tail``: the end of its stderr."""

    def __init__(self, message: str, *, returncode: int | None = None, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class RunnerTimeout(Exception):
    """No reply before the deadline; the runner's process group has been killed."""


def runner_env(base: Mapping[str, str] | None = None, *, cuda_device: str | None = None) -> dict[str, str]:
    """A runner's environment before :func:`~evaluators.sandbox.sandbox_launch` scrubs it: a
    whitelist of ``base`` (this process's environment by default), and
    ``CUDA_VISIBLE_DEVICES = cuda_device`` when given."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    if cuda_device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
    return env


def _status(rc: int | None) -> str:
    if rc is None:
        return "is still running"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"was killed by {name}"
    return f"exited with status {rc}"


def _stat(pid: int) -> tuple[str, int, str] | tuple[()]:
    """``(comm, ppid, start time)`` of ``pid`` from /proc/<pid>/stat, ``()`` when gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return ()
    lp, rp = raw.find("("), raw.rfind(")")
    rest = raw[rp + 2:].split()
    if lp < 0 or rp < lp or len(rest) < 20:
        return ()
    return raw[lp + 1:rp], int(rest[1]), rest[19]


def _descendant(root: int, name: str) -> tuple[int, str] | None:
    """The one descendant of ``root`` whose command name is ``name`` (as /proc truncates it to
    15 bytes): ``(pid, start time)``, or None when there is none or more than one."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, int, str]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                info[int(d)] = st  # type: ignore[assignment]
                children.setdefault(st[1], []).append(int(d))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if info[pid][0] == name.encode()[:15].decode("utf-8", "replace"):
            found.append(pid)
        todo += children.get(pid, [])
    return (found[0], info[found[0]][2]) if len(found) == 1 else None


class RunnerProcess:
    """One runner process, started by :meth:`start`; see the module's docstring."""

    def __init__(self, proc: subprocess.Popen, *, jobdir: Path, layers: tuple[str, ...], seccomp: bool,
                 stderr_file: Any) -> None:
        self._proc = proc
        self.pid: int = proc.pid
        #: the pid of the runner itself (``pid`` unless a ``wrap`` program started it: then its
        #: child, found after READY) and its start time (/proc/<pid>/stat field 22)
        self.runner_pid: int = proc.pid
        self._runner_start: str | None = None
        self.jobdir = jobdir
        self.layers: tuple[str, ...] = layers
        #: whether the runner refuses LOAD until SECCOMP succeeded (False: started --no-seccomp)
        self.seccomp_required = seccomp
        self.backend: str = ""
        self._stderr_file = stderr_file
        self._stderr_path = jobdir / "runner.stderr"
        self._in = proc.stdin.fileno()    # type: ignore[union-attr]
        self._out = proc.stdout.fileno()  # type: ignore[union-attr]
        os.set_blocking(self._in, False)
        self._buf = b""
        self._dead = False

    # --- start ---------------------------------------------------------------------------------

    @classmethod
    def start(cls, binary: Path | str | Sequence[str], *, jobdir: Path, sandbox: "SandboxSettings | None" = None,
              timeout_s: float = 600.0, start_timeout_s: float = 30.0, seccomp: bool = True,
              env: Mapping[str, str] | None = None, cuda_device: str | None = None,
              readable: Sequence[str] = (), wrap: Sequence[str] = ()) -> "RunnerProcess":
        """Start a runner for the job in ``jobdir`` (created if missing; the runner's cwd) and
        wait for ``READY`` (at most ``start_timeout_s``: the CUDA context is made at HELLO).

        ``binary``: the runner's path (:func:`evaluators.runner.runner_binary`), or an argv
        prefix (a list or tuple: a stand-in such as ``[python, standin.py, behaviour]``; Landlock
        then gets the Python read set of :func:`~evaluators.sandbox.harness_paths` when
        ``argv[0]`` is a Python). ``sandbox``: the settings (default: from the environment).
        ``timeout_s``: the runner's whole life, for its CPU-time rlimit. ``seccomp``: the
        runner must get the filter before LOAD (False, or the sandbox's seccomp switched off,
        starts it with ``--no-seccomp``). ``env``: the base environment (default
        :func:`runner_env`); ``cuda_device``: its ``CUDA_VISIBLE_DEVICES``. ``readable``: more
        paths Landlock lets the runner read (a candidate .so outside the job directory).
        ``wrap``: a trusted program started in front of the sandboxed runner (see the module's
        docstring); it must pass its stdin and stdout through to the runner and print nothing
        on stdout itself. Raises :class:`RunnerStartError`.
        """
        from evaluators.sandbox import SandboxSettings, sandbox_launch

        argv = [os.fspath(binary)] if isinstance(binary, (str, os.PathLike)) else [os.fspath(a) for a in binary]
        if not argv:
            raise ValueError("RunnerProcess.start: empty argv")
        s = sandbox if sandbox is not None else SandboxSettings.from_env()
        want_seccomp = bool(seccomp and s.enabled and s.seccomp)
        if not want_seccomp:
            argv.append("--no-seccomp")
        if wrap:
            # a profiler's injection library connects to its frontend before the runner's main:
            # the runner keeps those fds (it would otherwise close every fd above 2 at start);
            # what the candidate may do with them is bounded by seccomp (module docstring of
            # evaluators.judge.profile)
            argv.append("--keep-fds")
        jobdir = Path(jobdir)
        jobdir.mkdir(parents=True, exist_ok=True)
        base = runner_env(cuda_device=cuda_device) if env is None else dict(env)
        if cuda_device is not None:
            base["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
        native = not Path(argv[0]).name.startswith("python")
        try:
            launch = sandbox_launch(argv, base, jobdir, timeout_s, s, readable=readable, native=native)
            stderr_file = open(jobdir / "runner.stderr", "ab")
        except Exception as e:  # noqa: BLE001 - any failure here is ours
            raise RunnerStartError(f"cannot prepare the runner's launch: {type(e).__name__}: {e}") from e
        try:
            proc = subprocess.Popen([*map(os.fspath, wrap), *launch.argv], cwd=str(jobdir), env=launch.env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr_file,
                                    start_new_session=True, close_fds=True, bufsize=0)
        except OSError as e:
            stderr_file.close()
            raise RunnerStartError(f"cannot start the runner {argv[0]}: {e}") from e
        rp = cls(proc, jobdir=jobdir, layers=launch.layers, seccomp=want_seccomp, stderr_file=stderr_file)
        try:
            reply, _ = rp.request(protocol.hello(), start_timeout_s)
        except (ProtocolViolation, RunnerTimeout) as e:
            rp.kill()
            raise RunnerStartError(f"the runner did not start ({argv[0]}): {e}") from e
        if not isinstance(reply, Ready) or reply.version != PROTOCOL_VERSION:
            tail = rp.stderr_tail()
            rp.kill()
            raise RunnerStartError(f"the runner answered HELLO {PROTOCOL_VERSION} with {reply}"
                                   + (f"; its stderr: {tail}" if tail else ""))
        rp.backend = reply.backend
        if wrap:
            found = _descendant(rp.pid, Path(argv[0]).name)
            if found is None:
                tail = rp.stderr_tail()
                rp.kill()
                raise RunnerStartError(f"the runner answered READY under {os.fspath(wrap[0])} but no one process "
                                       f"{Path(argv[0]).name!r} was found below it"
                                       + (f"; stderr: {tail}" if tail else ""))
            rp.runner_pid, rp._runner_start = found
        return rp

    # --- one command, one reply --------------------------------------------------------------

    def request(self, line: str, timeout_s: float) -> tuple[Reply, float]:
        """Send one command line and read its reply: ``(reply, seconds)``, the seconds on
        ``time.perf_counter`` from just before the write to the reply's last byte read.

        ``ERR`` comes back as a :class:`~evaluators.protocol.Failed` reply; whose failure it is
        depends on whether the candidate is loaded, which the caller knows. Raises
        :class:`RunnerTimeout` (killed), :class:`RunnerGone`, or
        :class:`~evaluators.protocol.ProtocolViolation` (killed)."""
        if self._dead:
            raise RunnerGone(f"the runner {_status(self._proc.poll())} earlier; it takes no more commands",
                             returncode=self._proc.poll())
        if "\n" in line or len(line) + 1 > MAX_LINE:
            raise ValueError(f"a command is one line of at most {MAX_LINE} bytes")
        what = line.split(" ", 1)[0][:16]
        # output nobody asked for (a second reply, the candidate's own printing): not a runner
        # that follows the protocol
        if not self._buf and self._readable(0.0):
            self._fill(what)  # its end of output instead: RunnerGone
        if self._buf:
            self._violation(f"the runner said something unasked before {what} ({len(self._buf)} bytes)")
        data = (line + "\n").encode("ascii")
        t0 = time.perf_counter()
        deadline = t0 + float(timeout_s)
        while data:
            left = deadline - time.perf_counter()
            if left <= 0:
                self._timeout(what, timeout_s)
            try:
                _, w, _ = select.select([], [self._in], [], left)
                if not w:
                    continue
                n = os.write(self._in, data)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                self._gone(f"while {what} was sent")
            data = data[n:]
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                raw, rest = self._buf[: nl + 1], self._buf[nl + 1:]
                self._buf = b""
                if rest:
                    self._violation(f"more than one line in reply to {what} ({len(rest)} more bytes)")
                try:
                    reply = protocol.parse_reply(raw)
                except ProtocolViolation as e:
                    self._violation(f"reply to {what}: {e}")
                return reply, time.perf_counter() - t0
            if len(self._buf) > MAX_LINE:
                self._violation(f"reply to {what} longer than {MAX_LINE} bytes")
            left = deadline - time.perf_counter()
            if left <= 0 or not self._readable(left):
                if time.perf_counter() >= deadline:
                    self._timeout(what, timeout_s)
                continue
            self._fill(what)

    def _readable(self, timeout: float) -> bool:
        r, _, _ = select.select([self._out], [], [], max(0.0, timeout))
        return bool(r)

    def _fill(self, what: str) -> None:
        try:
            chunk = os.read(self._out, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self._gone(f"while waiting for the reply to {what}")
        self._buf += chunk

    def _timeout(self, what: str, timeout_s: float) -> None:
        self.kill()
        raise RunnerTimeout(f"no reply to {what} within {timeout_s:g} s; the runner was killed")

    def _violation(self, message: str) -> None:
        self.kill()
        raise ProtocolViolation(message + "; the runner was killed")

    def _gone(self, when: str) -> None:
        """The runner closed its output: wait briefly for its exit status, then raise."""
        try:
            rc = self._proc.wait(_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()  # it closed stdout but lives on: no longer a runner
            rc = self._proc.returncode
        self._kill_group()
        self._dead = True
        tail = self.stderr_tail()
        raise RunnerGone(f"the runner {_status(rc)} {when}" + (f"; its stderr ends: {tail}" if tail else ""),
                         returncode=rc, stderr_tail=tail)

    # --- seccomp ------------------------------------------------------------------------------

    def install_seccomp(self, timeout_s: float = 10) -> int:
        """Have the runner install the seccomp filter made for its pid
        (:func:`evaluators.sandbox.seccomp_program`, written as 8-byte ``struct sock_filter``
        records to ``jobdir/seccomp.bpf``); returns the threads the runner reports filtered.
        Before LOAD, so any failure is ours: :class:`RunnerStartError`."""
        from evaluators.sandbox.seccomp import SandboxError, _machine, seccomp_program

        try:
            prog = seccomp_program(_machine(), self.runner_pid)
        except SandboxError as e:
            self.kill()
            raise RunnerStartError(str(e)) from e
        path = self.jobdir / "seccomp.bpf"
        path.write_bytes(b"".join(struct.pack("<HBBI", *insn) for insn in prog))
        try:
            reply, _ = self.request(protocol.seccomp(str(path)), timeout_s)
        except (ProtocolViolation, RunnerTimeout) as e:
            self.kill()
            raise RunnerStartError(f"installing seccomp in the runner: {e}") from e
        if not isinstance(reply, Seccomped) or reply.threads < 1:
            tail = self.stderr_tail()
            self.kill()
            why = f"{reply.where}: {reply.message}" if isinstance(reply, Failed) else str(reply)
            raise RunnerStartError(f"the runner could not install seccomp: {why}"
                                   + (f"; its stderr: {tail}" if tail else ""))
        return reply.threads

    # --- the end ------------------------------------------------------------------------------

    def close(self, grace_s: float = _EXIT_GRACE_S) -> int | None:
        """``QUIT``, wait up to ``grace_s`` (a second; a ``wrap`` program may need longer to
        finish after its runner quit), then SIGKILL the runner's whole process group;
        returns its exit status (negative: a signal)."""
        if self._proc.poll() is None and not self._dead:
            try:
                os.write(self._in, b"QUIT\n")
            except OSError:
                pass
            try:
                self._proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL the runner's process group now, reap it and close the pipes."""
        self._dead = True
        self._kill_group()
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL of an unkillable (D-state) process
            pass
        for f in (self._proc.stdin, self._proc.stdout, self._stderr_file):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # start_new_session: the runner leads its group
        except (ProcessLookupError, PermissionError):
            pass
        # a runner started by a wrap program that gave it a group of its own: killed by pid,
        # once its start time shows the pid is still that runner's
        if self._runner_start is not None and _stat(self.runner_pid)[2:3] == (self._runner_start,):
            try:
                os.kill(self.runner_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def stderr_tail(self, n: int = 2000) -> str:
        """The last ``n`` bytes of the runner's stderr (the candidate writes there too)."""
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - n))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        if size > n:
            text = "...[trimmed]\n" + text.split("\n", 1)[-1]
        return text.strip()

    def __enter__(self) -> "RunnerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
