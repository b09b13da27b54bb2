"""Sandbox for the runner: what a candidate's native code may reach.

The judge (:meth:`evaluators.judge.runner_process.RunnerProcess.start`) asks
:func:`sandbox_launch` to turn the runner's ``argv`` and environment into a sandboxed launch.
The runner is started through a tiny Python *exec wrapper* (``python -I -S -c WRAPPER CONFIG
argv...``) that confines itself and then ``execv``\\ s the runner, so the confinement is
inherited by the runner, the candidate's ``.so`` and anything they start. (A wrapper rather
than ``preexec_fn``: the parent is often a threaded Ray worker, where ``preexec_fn`` is unsafe.)

Layers, each applied only where the kernel allows it (:func:`probe` detects once per process
and logs one WARNING for what is missing):

- **environment**: a whitelist (:func:`evaluators.judge.runner_process.runner_env`) minus anything secret-looking, minus
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
- **files** (Landlock, default on): the runner reads only beneath :func:`~evaluators.sandbox.landlock.runner_paths`'s set
  (a Python stand-in: :func:`harness_paths`'s), derived per launch (its binary and the
  libraries it loads, system libraries and programs, CUDA, what CUDA reads in /proc and /sys,
  the job directory, ``EVO_SANDBOX_READABLE``) and writes
  only below the job directory, ``/dev``, its own ``/proc/self`` (the CUDA driver writes there
  in ``cuInit``), the MPS pipe directory and ``EVO_SANDBOX_WRITABLE``: not /etc/passwd, other
  processes' /proc entries, the lineage DB, the user's files. ``EVO_SANDBOX_READS=0`` /
  ``EVO_SANDBOX_LANDLOCK_FS=0`` switch reads / writes off (docs/SECURITY.md). nvcc runs under
  the same kind of rules (``evaluators.compile.nvcc_landlock``).
- **system calls** (in the runner itself, on the judge's ``SECCOMP`` right before ``LOAD``:
  after its CUDA context is made, so nothing CUDA needs at start-up is blocked, while the
  wrapper can still ``exec`` the runner; :func:`seccomp_program`): a seccomp-bpf filter, synced
  to every thread, refuses with ``EPERM`` ``execve``/``execveat``, ``fork``/``vfork``,
  ``clone`` without ``CLONE_THREAD`` or with a namespace flag (threads stay allowed;
  ``clone3`` answers ``ENOSYS`` so glibc falls back to ``clone``), every socket call,
  ``ptrace``/``process_vm_*``, mounts and namespaces, kexec/modules/bpf/perf/userfaultfd,
  keyrings, io_uring, signals to any process but itself, terminal injection (TIOCSTI).
  Another architecture's calls (i386 ``int 0x80``, x32) kill the process. Checked for
  x86_64 and aarch64; elsewhere, or when the kernel refuses, the runner does not start (our
  failure, before the candidate is loaded) unless ``EVO_SANDBOX_SECCOMP=0``.
- **parents not readable**: :func:`sandbox_launch` makes the process that starts the runner
  undumpable (:func:`make_undumpable`), so the runner cannot read its ``/proc/<ppid>/environ``
  or ``mem``; the driver does the same when it starts the runtime, and starts a local Ray
  instance without its secrets (:func:`secrets_withheld`).

OOM score: the wrapper sets ``oom_score_adj = 1000`` so the kernel's OOM killer picks a
runaway candidate before anything else.

Switches (environment, read by :meth:`SandboxSettings.from_env`, inherited by Ray workers
started from the driver): ``EVO_SANDBOX=0`` (no wrapper at all: environment scrub only),
``EVO_SANDBOX_NET=0``, ``EVO_SANDBOX_SECCOMP=0``, ``EVO_SANDBOX_LANDLOCK=0`` (no Landlock at all),
``EVO_SANDBOX_LANDLOCK_FS=0``, ``EVO_SANDBOX_READS=0``, ``EVO_SANDBOX_WRITABLE=/a:/b``,
``EVO_SANDBOX_READABLE=/a:/b``, ``EVO_SECRET_ENV=NAME,NAME``.

Failure policy: the probe runs the very same wrapper once per process, so a layer that is
used is known to work. If the wrapper still fails to confine itself, it says so on stderr and
exits 70 before the ``exec``; the judge sees a runner that did not start (our failure, a
``HarnessError`` of kind ``runner``): the candidate never runs unconfined by accident.

Layout:

===================  ========================================================================
``launch.py``        :func:`sandbox_launch` (the runner's launch), :func:`describe`, rlimits
``settings.py``      :class:`SandboxSettings` from the switches; the variables set for the runner
``environment.py``   secrets: the scrubbed environment, secrets withheld, undumpable parents
``wrapper.py``       the exec wrapper that confines itself, then execs the runner
``capabilities.py``  what this machine allows, probed once with the same wrapper
``landlock.py``      Landlock's code, its ABI, the paths a runner may read and write
``seccomp.py``       the seccomp-bpf filter a runner installs before loading the candidate
===================  ========================================================================
"""

from __future__ import annotations

from evaluators.sandbox.capabilities import Capabilities, probe, reset_probe
from evaluators.sandbox.environment import make_undumpable, scrub_env, secret_names, secrets_withheld
from evaluators.sandbox.landlock import LANDLOCK_CODE, SYSTEM_READABLE, SYSTEM_WRITABLE, harness_paths
from evaluators.sandbox.launch import Launch, describe, sandbox_launch, user_task_count
from evaluators.sandbox.seccomp import (
    SECCOMP_ARG_CHECKED,
    SECCOMP_DENIED,
    SandboxError,
    install_seccomp,
    seccomp_program,
    seccomp_threads_filtered,
    seccomp_wanted,
)
from evaluators.sandbox.settings import LAYERS_ENV, SECCOMP_ENV, SandboxSettings

__all__ = [
    "LANDLOCK_CODE",
    "LAYERS_ENV",
    "SECCOMP_ARG_CHECKED",
    "SECCOMP_DENIED",
    "SECCOMP_ENV",
    "SYSTEM_READABLE",
    "SYSTEM_WRITABLE",
    "SandboxError",
    "SandboxSettings",
    "harness_paths",
    "install_seccomp",
    "make_undumpable",
    "seccomp_program",
    "seccomp_threads_filtered",
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
