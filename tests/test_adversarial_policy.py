"""Host-side attack corpus: every attack is rejected by the static policy with the right rule,
and (defence in depth) the runtime layer each fixture names stops it when policy is bypassed.

Fixtures: tests/fixtures/attacks/*.cu. Each header names the attack and, as ``key: value``
lines, ``expect-rule`` (the first policy violation, or ``none``), ``compiles`` (whether nvcc
would build it if policy were bypassed), ``runtime-layer`` and ``runtime-expect`` (the
verdict with policy bypassed: ``crash`` = the attack was stopped and the candidate
reported an error, ``ok`` = the attack got through, a documented gap, ``timeout``,
``compile_error``), with ``-root`` / ``-files-open`` (Landlock file rules off) variants where
they differ.

The runtime half runs on the CPU: the attack's .so is loaded by a CPU stand-in of a runner
(fixtures/attacks/cpu_child.py: the runner's seccomp filter, then the load and one call)
inside the very sandbox the judge gives every runner. The GPU half
(tests/gpu/test_adversarial_gpu.py) repeats it through the judge and the real runner.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from evaluators import sandbox as sb
from evaluators.judge.runner_process import runner_env as _runner_env
from evaluators.sandbox.landlock import _landlock_abi
from evaluators.base import CompileSettings
from evaluators.policy import POLICY_RULES, check_policy
from evo.core.records import Candidate, Status
from fakes.listener import TcpListener  # noqa: E402
from fakes.sandboxed import run_sandboxed  # noqa: E402

ATTACKS = Path(__file__).parent / "fixtures" / "attacks"
CPU_CHILD = str(ATTACKS / "cpu_child.py")
PORT = 47613  # the port the network attacks dial on the host's loopback
VICTIM_DB = Path("/tmp/evo-attack-victim.db")
KEY = "sk-attack-test-0123456789abcdefghij"


def source(path: Path) -> str:
    """A fixture's exact text: no newline translation (a lone CR is part of an attack)."""
    return path.read_bytes().decode("utf-8")


def header(path: Path) -> dict[str, str]:
    """``key: value`` lines of the first comment block (continuation lines appended); lines
    before it (a directive that must come first, after a BOM) are skipped."""
    out: dict[str, str] = {}
    last = None
    lines = source(path).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("//"))
    for line in lines[start:]:
        if not line.startswith("//"):
            break
        body = line[2:].strip()
        m = re.match(r"([a-z][a-z-]*):\s*(.*)$", body)
        if m:
            last = m.group(1)
            out[last] = m.group(2).strip()
        elif last and line.startswith("//  "):
            out[last] += " " + body
    out["attack"] = next((l[len("// ATTACK:"):].strip() for l in lines if l.startswith("// ATTACK:")), "")
    return out


FIXTURES = sorted(ATTACKS.glob("*.cu"))
NAMES = [p.stem for p in FIXTURES]
#: Desyncs of the policy's C++ reader and other policy bypasses found on the CPU machine: each
#: ran its payload (a connection to the host's loopback, through a shell or raw syscalls)
#: past the policy of 2c48e1c. With the sandbox off they still do (the control test below),
#: which shows the text the policy once skipped is code to the compiler.
BYPASSES = ["ns_alias_system", "asm_label_macro", "weakref_system", "pragma_redefine_extname", "hd_raw_syscall",
            "digraph_braces", "formfeed_paste", "bom_paste", "lone_cr_comment", "dollar_raw_string", "python_capi"]


def test_corpus_is_complete_and_well_formed():
    wanted = {"system_shell", "popen_env", "fopen_db", "socket_connect", "getenv_key", "proc_environ",
              "fork_bomb", "sleep_forever", "dlopen_cublas", "host_spin", "asm_syscall", "include_file",
              "template_bomb", *BYPASSES, "vtab_include"}
    assert wanted <= set(NAMES)
    rules = {r.name for r in POLICY_RULES} | {"none"}
    for p in FIXTURES:
        h = header(p)
        assert h["attack"], f"{p.name}: header must name the attack"
        assert h.get("expect-rule") in rules, f"{p.name}: expect-rule {h.get('expect-rule')!r}"
        assert h.get("compiles") in ("yes", "no") and h.get("runtime-layer") and h.get("runtime-expect")


@pytest.mark.parametrize("name", NAMES)
def test_policy_rejects_with_the_right_rule(name):
    h = header(ATTACKS / f"{name}.cu")
    res = check_policy(source(ATTACKS / f"{name}.cu"))
    if h["expect-rule"] == "none":
        assert res.status is Status.OK, "a fixture documented as invisible to policy must pass it"
        return
    assert res.status is Status.REJECTED
    assert res.reason.startswith(f"policy rule {h['expect-rule']} violated"), res.reason


# ----------------------------------------------------------------------------- compile


def _nvcc() -> str | None:
    for c in (os.environ.get("EVO_NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.path.exists(c):
            return c
    return None


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="needs nvcc")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every fixture compiled as if policy were bypassed: name -> CompileOutcome."""
    from evaluators.compile import compile_candidate

    cs = CompileSettings(cache_dir=str(tmp_path_factory.mktemp("cc")), nvcc=_nvcc() or "nvcc",
                         timeout_s=60, memory_mb=2048)

    def build(p: Path):
        return p.stem, compile_candidate(Candidate.create("kb19_relu", source(p), {}), cs)

    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, FIXTURES))


@needs_nvcc
def test_compiles_claims_hold(built):
    for name, out in built.items():
        want = header(ATTACKS / f"{name}.cu")["compiles"] == "yes"
        assert out.ok == want, f"{name}: compiles={want} claimed, got {out.result.status.value}: {out.result.reason}"


@needs_nvcc
@pytest.mark.parametrize("name", ["include_file", "vtab_include"])
def test_include_of_a_host_file_never_reaches_the_compile_log(built, name):
    """nvcc would quote an included file in its errors, and errors go back to the LLM in
    repair prompts; nvcc runs under Landlock (evaluators.compile.nvcc_landlock), so a file
    outside the include path, the toolchain and the work directory does not open at all.
    (vtab_include: the include the policy's lexer once misread as code is a real directive to
    nvcc.) Without Landlock in the kernel, evaluators.compile.withhold_foreign drops the
    diagnostics located in the file instead."""
    out = built[name]
    text = out.result.reason + out.result.artifacts.get("log", "") + out.result.artifacts.get("errors", "")
    assert out.result.status is Status.COMPILE_ERROR
    assert "root:" not in text, text[:1500]
    if _landlock_abi() >= 1:
        assert "/etc/passwd: Permission denied" in text or "cannot open source file" in text, text[:1500]


@needs_nvcc
def test_template_bomb_ends_quickly_as_compile_error_or_timeout(tmp_path):
    from evaluators.compile import compile_candidate

    cs = CompileSettings(cache_dir=str(tmp_path), nvcc=_nvcc() or "nvcc", timeout_s=15, memory_mb=1024)
    t0 = time.monotonic()
    out = compile_candidate(Candidate.create("kb19_relu", (ATTACKS / "template_bomb.cu").read_text(), {}), cs)
    assert time.monotonic() - t0 < 40
    assert out.result.status in (Status.COMPILE_ERROR, Status.TIMEOUT), out.result.reason
    if out.result.status is Status.COMPILE_ERROR:
        assert "memory" in out.result.reason and out.result.metrics.get("resource_failure")


# ----------------------------------------------------------------------------- runtime (CPU)




def _cpu_run(so: bytes, tmp_path: Path, timeout_s: float, sandbox=None) -> tuple[str, str]:
    """(status, reason) of one call of ``so``'s ``evo_launch`` in a sandboxed CPU stand-in for a
    runner (fixtures/attacks/cpu_child.py), by the judge's rules for a runner: killed at the
    deadline is ``timeout``, dead without a return code is ``crash``, a nonzero return code is
    ``crash``."""
    jobdir = tmp_path / f"job{len(list(tmp_path.glob('job*')))}"
    jobdir.mkdir()
    (jobdir / "kernel.so").write_bytes(so)
    env = {**_runner_env(), "PYTHONPATH": str(Path(sb.__file__).resolve().parents[2])}
    ran = run_sandboxed([sys.executable, CPU_CHILD, str(jobdir)], jobdir, timeout_s, sandbox, env=env)
    if ran.rc is None:
        return "timeout", f"killed after {timeout_s} s"
    if "rc" not in ran.seen:
        return "crash", f"the runner died ({ran.rc}): {ran.stderr[-300:]}"
    rc = ran.seen["rc"]
    return ("ok", "") if rc == 0 else ("crash", f"evo_launch returned {rc}")


@pytest.fixture()
def listener():
    try:
        lst = TcpListener(PORT)
    except OSError as e:
        pytest.skip(f"port {PORT} is busy: {e}")
    yield lst
    lst.close()


def _expected(h: dict[str, str], *, files_open: bool) -> str:
    if files_open and "runtime-expect-files-open" in h:
        return h["runtime-expect-files-open"]
    if os.geteuid() == 0 and "runtime-expect-root" in h:
        return h["runtime-expect-root"]
    return h["runtime-expect"]


RUNTIME_CPU = ["system_shell", "popen_env", "getenv_key", "proc_environ", "socket_connect", "asm_syscall",
               "fopen_db", "sleep_forever", "host_spin"]


@needs_nvcc
@pytest.mark.parametrize("name", RUNTIME_CPU)
def test_runtime_layer_stops_the_attack_when_policy_is_bypassed(name, built, listener, tmp_path, monkeypatch):
    caps = sb.probe()
    h = header(ATTACKS / f"{name}.cu")
    if name in ("system_shell", "socket_connect") and not caps.netns and caps.landlock_abi < 4:
        pytest.skip("no network isolation available on this kernel")
    if name == "asm_syscall" and (caps.landlock_abi < 6 or os.uname().machine != "x86_64"):
        pytest.skip("signal scoping needs Landlock ABI 6 (and the fixture is x86-64)")
    if name == "system_shell" and not shutil.which("python3"):
        pytest.skip("the shell attack dials out through python3")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    VICTIM_DB.write_bytes(b"SQLite format 3\x00")
    try:
        # files_open: Landlock's file rules switched off (EVO_SANDBOX_READS=0, _LANDLOCK_FS=0)
        for files_open in ((False, True) if "runtime-expect-files-open" in h else (False,)):
            expect = _expected(h, files_open=files_open)
            status, reason = _cpu_run(built[name].so_bytes, tmp_path, 4.0,
                                      sb.SandboxSettings(landlock_fs=not files_open, landlock_reads=not files_open))
            assert status == expect, f"{name} (files_open={files_open}): {status}: {reason}"
            if expect == "crash":
                assert "evo_launch returned" in reason, reason
            if name == "fopen_db":
                pwned = VICTIM_DB.read_bytes().startswith(b"pwned")
                assert pwned == files_open, "the DB is written exactly when the file rules are off"
        if name in ("system_shell", "socket_connect"):
            assert listener.accepted == 0, "nothing inside the sandbox reached the host's loopback"
    finally:
        VICTIM_DB.unlink(missing_ok=True)


@needs_nvcc
def test_attacks_get_through_without_the_sandbox(built, listener, tmp_path, monkeypatch):
    """Control: with the sandbox off (environment still scrubbed), the network attacks do
    reach the host, so the runtime test above measures the sandbox, not a broken fixture."""
    if not shutil.which("python3"):
        pytest.skip("needs python3")
    for name in ("socket_connect", "system_shell"):
        status, reason = _cpu_run(built[name].so_bytes, tmp_path, 10.0, sb.SandboxSettings(enabled=False))
        assert status == "ok", reason
    assert listener.accepted >= 2


@needs_nvcc
def test_bypass_payloads_run_without_the_sandbox(built, listener, tmp_path):
    """Control for the reader's desyncs: with the sandbox off, every bypass fixture's payload
    really runs (each reaches the host's loopback), so what the policy now
    rejects is code the compiler built, not text it skipped."""
    if not shutil.which("python3"):
        pytest.skip("the shell payloads dial out through python3")
    x86 = os.uname().machine == "x86_64"
    for name in BYPASSES:
        if "(x86-64 host code)" in source(ATTACKS / f"{name}.cu") and not x86:
            continue
        before = listener.accepted
        status, reason = _cpu_run(built[name].so_bytes, tmp_path, 10.0, sb.SandboxSettings(enabled=False))
        assert status == "ok", (name, reason)
        deadline = time.monotonic() + 3.0  # the listener counts on its own thread
        while listener.accepted == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert listener.accepted > before, f"{name}: its payload did not reach the listener"
