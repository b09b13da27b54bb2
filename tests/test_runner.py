"""The runner (evaluators/runner/evo_runner.cpp, host backend) and the judge's handle on it
(evaluators/judge/runner_process.py), on the CPU, under the default sandbox.

The host runner is built once (module fixture, the build cache); small candidates are built
with g++ from tests/fixtures/runner/. Each test starts a real runner through
``RunnerProcess.start`` (sandbox wrapper, network namespace, Landlock, rlimits) and plays the
judge: it owns the host buffers (files in the job directory, mapped here with numpy), poisons
outputs, and checks what the runner did from that memory alone. The Python stand-in
(tests/fakes/runner_standin.py) plays runners that forge, die, hang, lie or babble.

The cuda backend is compiled here (no GPU needed); the gpu test maps a torch allocation
through CUDA IPC and runs a relu candidate on a GPU machine.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evaluators import protocol
from evaluators.judge.runner_process import RunnerGone, RunnerProcess, RunnerStartError, RunnerTimeout
from evaluators.protocol import Done, Failed, Loaded, Mapped, ProtocolViolation, TensorArg
from evaluators.sandbox.seccomp import _ARCHES, _machine

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "runner"
STANDIN = str(Path(__file__).parent / "fakes" / "runner_standin.py")
CACHE = ROOT / ".evo" / "cache"
CANDIDATES = ("relu", "mutate_input", "segfault", "hang", "result_then_exit0", "escape", "workspace")

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the host runner and its candidates"),
    pytest.mark.skipif(_machine() not in _ARCHES, reason=f"no seccomp table for {_machine()}"),
]


@pytest.fixture(scope="module")
def runner() -> Path:
    from evaluators.runner import runner_binary

    return runner_binary("host", cache_dir=CACHE)


@pytest.fixture(scope="module")
def sos(tmp_path_factory) -> dict[str, Path]:
    """The test candidates, built in parallel."""
    from evaluators.runner.build import _cuda_include
    from evaluators.compile.toolchain import abi_include_dir

    d = tmp_path_factory.mktemp("runner-sos")
    inc = [f"-I{FIX}", f"-I{abi_include_dir()}"] + ([f"-I{c}"] if (c := _cuda_include()) else [])
    procs = {n: subprocess.Popen(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", *inc, "-o", str(d / f"{n}.so"),
                                  str(FIX / f"{n}.cpp")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for n in CANDIDATES}
    for n, p in procs.items():
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{n}.cpp: {out.decode()}"
    return {n: d / f"{n}.so" for n in CANDIDATES}


class Job:
    """A test judge's side of one runner: host buffers in the job directory, the runner."""

    def __init__(self, tmp_path: Path, binary, **start) -> None:
        self.dir = tmp_path / "job"
        self.dir.mkdir()
        self.views: dict[int, np.memmap] = {}
        self.binary = binary
        self.rp = RunnerProcess.start(binary, jobdir=self.dir, start_timeout_s=30.0, **start)

    def buffer(self, buf: int, nbytes: int) -> np.memmap:
        path = self.dir / f"buf{buf}"
        m = np.memmap(path, dtype=np.uint8, mode="w+", shape=(nbytes,))
        self.views[buf] = m
        reply, _ = self.rp.request(protocol.map_host(buf, str(path), nbytes), 5.0)
        assert reply == Mapped(buf)
        return m

    def f32(self, buf: int, n: int) -> np.ndarray:
        return self.views[buf][: 4 * n].view(np.float32)

    def load(self, so: Path):
        dst = self.dir / "kernel.so"   # the judge puts the candidate in the job directory
        shutil.copyfile(so, dst)
        return self.rp.request(protocol.load(str(dst)), 10.0)[0]

    def close(self) -> None:
        self.rp.close()


def vec(buf: int, n: int, dtype: str = "float32", offset: int = 0) -> TensorArg:
    return TensorArg(buf, offset, dtype, (n,), (1,))


def relu_job(tmp_path: Path, binary, so: Path | None, n: int = 1000, **start):
    """A started runner with in (buf 0) and out (buf 1) of n float32, seccomp on, ``so`` loaded."""
    job = Job(tmp_path, binary, **start)
    job.buffer(0, 4 * n)
    job.buffer(1, 4 * n)
    x = job.f32(0, n)
    x[:] = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    job.f32(1, n)[:] = np.nan  # poison
    if job.rp.seccomp_required:
        assert job.rp.install_seccomp() >= 1
    if so is not None:
        assert isinstance(job.load(so), Loaded)
    return job, protocol.call([vec(0, n)], [vec(1, n)], [])


# --- the native runner --------------------------------------------------------------------------

def test_honest_relu_under_the_full_sandbox(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, None)
    try:
        rp = job.rp
        assert rp.backend == "host" and rp.pid > 0
        assert "env-scrub" in rp.layers and "seccomp-required" in rp.layers, rp.layers
        reply, wall = rp.request(protocol.nullcall(), 5.0)
        assert isinstance(reply, Done) and (reply.rc, reply.last_error) == (0, 0) and 0 <= reply.ms * 1e-3 <= wall
        assert isinstance(job.load(sos["relu"]), Loaded)
        x_before = job.f32(0, 1000).copy()
        reply, wall = rp.request(call, 10.0)
        assert isinstance(reply, Done) and (reply.rc, reply.last_error) == (0, 0), reply
        assert reply.ms * 1e-3 <= wall
        # the verdict's inputs are the judge's memory: out written right, in unchanged
        np.testing.assert_array_equal(job.f32(1, 1000), np.maximum(x_before, 0))
        np.testing.assert_array_equal(job.f32(0, 1000), x_before)
        assert rp.close() == 0
    finally:
        job.close()


def test_landlock_confines_the_native_runner_to_its_job_directory(runner, tmp_path):
    from evaluators import sandbox as sb

    if sb.probe().landlock_abi == 0:
        pytest.skip("no Landlock here")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(64))
    job = Job(tmp_path, runner)
    try:
        assert any(l.startswith("landlock") for l in job.rp.layers), job.rp.layers
        for path in (str(outside), "/etc/passwd"):
            reply, _ = job.rp.request(protocol.map_host(0, path, 16), 5.0)
            assert isinstance(reply, Failed) and "Permission denied" in reply.message, reply
        job.buffer(0, 16)  # inside the job directory
    finally:
        job.close()


def test_an_input_the_candidate_changed_is_seen_in_the_judges_memory(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, sos["mutate_input"])
    try:
        before = job.f32(0, 1000).copy()
        reply, _ = job.rp.request(call, 10.0)
        assert isinstance(reply, Done) and reply.rc == 0  # it says nothing of it...
        assert job.f32(0, 1000)[0] == 12345.0 != before[0]  # ...the judge's memory does
    finally:
        job.close()


def test_a_segfault_is_runner_gone_with_its_signal(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, sos["segfault"])
    try:
        with pytest.raises(RunnerGone) as ei:
            job.rp.request(call, 10.0)
        assert ei.value.returncode == -signal.SIGSEGV and "SIGSEGV" in str(ei.value)
        with pytest.raises(RunnerGone):  # and it is never used again
            job.rp.request(protocol.nullcall(), 1.0)
    finally:
        job.close()


def test_a_hanging_kernel_is_killed_at_the_deadline(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, sos["hang"])
    try:
        t0 = time.monotonic()
        with pytest.raises(RunnerTimeout):
            job.rp.request(call, 1.0)
        assert time.monotonic() - t0 < 3.0
        assert job.rp.returncode == -signal.SIGKILL
    finally:
        job.close()


def test_result_written_then_exit_0_is_a_crash(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, sos["result_then_exit0"])
    try:
        with pytest.raises(RunnerGone) as ei:
            job.rp.request(call, 10.0)
        assert ei.value.returncode == 0, "it exited 0..."
        assert (job.dir / "result.json").is_file() and (job.dir / "error.json").is_file(), "...after forging"
        assert np.isnan(job.f32(1, 1000)).all(), "and computed nothing"
    finally:
        job.close()


def test_seccomp_refuses_exec_and_sockets_from_the_constructor_and_the_call(runner, sos, tmp_path):
    job = Job(tmp_path, runner)
    try:
        job.buffer(0, 24)
        assert job.rp.install_seccomp() >= 1
        assert isinstance(job.load(sos["escape"]), Loaded), "the constructor's refused calls did not stop the load"
        reply, _ = job.rp.request(protocol.call([], [TensorArg(0, 0, "int32", (6,), (1,))], []), 10.0)
        assert isinstance(reply, Done) and reply.rc == errno.EPERM, reply
        seen = job.views[0].view(np.int32).tolist()
        assert seen == [-1, errno.EPERM, -1, errno.EPERM, -1, errno.EPERM], seen
    finally:
        job.close()


def test_control_without_seccomp_the_same_candidate_gets_out(runner, sos, tmp_path):
    job = Job(tmp_path, runner, seccomp=False)
    try:
        assert not job.rp.seccomp_required
        job.buffer(0, 24)
        assert isinstance(job.load(sos["escape"]), Loaded), "--no-seccomp: LOAD without SECCOMP"
        reply, _ = job.rp.request(protocol.call([], [TensorArg(0, 0, "int32", (6,), (1,))], []), 10.0)
        assert isinstance(reply, Done) and reply.rc == 0, reply
        seen = job.views[0].view(np.int32).tolist()
        assert seen == [-1, errno.ENOENT, 0, 0, 0, 0], "execve reached the file system; sockets were made"
    finally:
        job.close()


def test_load_is_refused_without_seccomp_and_only_once(runner, sos, tmp_path):
    job = Job(tmp_path, runner)
    try:
        reply = job.load(sos["relu"])
        assert isinstance(reply, Failed) and reply.where == "load" and "seccomp" in reply.message
        job.rp.install_seccomp()
        assert isinstance(job.load(sos["relu"]), Loaded)
        again = job.load(sos["relu"])
        assert isinstance(again, Failed) and again.where == "load"
    finally:
        job.close()


def test_malformed_commands_are_err_args_and_the_runner_lives_on(runner, sos, tmp_path):
    job, call = relu_job(tmp_path, runner, sos["relu"])
    try:
        rp = job.rp
        bad = [
            "CALL 1 0 0 0 1",                       # truncated tensor
            "CALL x",                               # not a number
            call + " 7",                            # a token too many
            "CALL 1 0 0 9 1 10 1 1 0 0 0 0",        # dtype code 9
            "CALL 1 0 0 0 9 " + "1 " * 18 + "0 0",  # 9 dims
            "CALL 1 5 0 0 1 10 1 0 0",              # buffer 5 is not mapped
            "CALL 1 0 0 0 1 99999999999999999999 1 0 0",  # shape out of range
            "CALL 0 0 1 nan-ish",                   # scalar not a number
            "FROB 1 2",                             # unknown command
            "MAP 0 host",                           # too few fields
            "CALL  1",                              # double space
        ]
        for line in bad:
            reply, _ = rp.request(line, 5.0)
            assert isinstance(reply, Failed) and reply.where == "args", (line[:60], reply)
        assert np.isnan(job.f32(1, 1000)).all(), "no malformed call reached the candidate"
        reply, _ = rp.request(call, 5.0)
        assert isinstance(reply, Done) and reply.rc == 0
    finally:
        job.close()


def test_the_line_reader_without_the_sandbox(runner):
    """Straight to the binary: an over-long line, binary junk, commands before HELLO, a wrong
    version; each answered, none fatal; QUIT ends it with status 0."""
    lines = [b"NULLCALL", b"HELLO 1", b"HELLO 2", b"CALL " + b"1" * 70000, b"\xff\xfe junk", b"MAP 0 ipc " + b"ab" * 64 + b" 4",
             b"NULLCALL", b"QUIT", b"NULLCALL"]
    p = subprocess.run([str(runner)], input=b"\n".join(lines) + b"\n", capture_output=True, timeout=20)
    replies = [protocol.parse_reply(l) for l in p.stdout.splitlines(keepends=True)]
    assert [type(r).__name__ for r in replies] == ["Failed", "Failed", "Ready", "Failed", "Failed", "Failed", "Done"]
    assert [r.where for r in replies if isinstance(r, Failed)] == ["state", "hello", "args", "args", "map"]
    assert replies[5].message == "ipc needs the cuda backend"
    assert p.returncode == 0


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.timeout(60)
def test_inherited_fds_are_closed_at_start_unless_keep_fds(runner, keep):
    """A runner started with an fd above 2 (the judge's close_fds forgot one) closes it before
    HELLO; with ``--keep-fds`` (started below ncu, whose injection connected to its frontend
    before main) it keeps it. Read from /proc/<pid>/fd once it answered READY."""
    r, w = os.pipe()
    try:
        argv = [str(runner), *(["--keep-fds"] if keep else [])]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(w,))
        try:
            p.stdin.write(protocol.hello().encode() + b"\n")
            p.stdin.flush()
            assert isinstance(protocol.parse_reply(p.stdout.readline()), protocol.Ready)
            fds = {int(x) for x in os.listdir(f"/proc/{p.pid}/fd")}
            assert (w in fds) is keep, fds
        finally:
            p.stdin.close()
            p.wait(timeout=10)
    finally:
        os.close(r)
        os.close(w)
    assert p.returncode == 0


def test_an_unknown_flag_is_usage_status_2(runner):
    p = subprocess.run([str(runner), "--keep-everything"], input=b"", capture_output=True, timeout=20)
    assert p.returncode == 2 and b"--keep-fds" in p.stderr


def test_a_tensor_outside_its_buffer_is_refused(runner, sos, tmp_path):
    job, _ = relu_job(tmp_path, runner, sos["relu"], n=256)
    try:
        out = vec(1, 256)
        for arg in (vec(0, 257),                                   # one element too many
                    vec(0, 256, offset=4),                         # shifted by one element
                    vec(0, 1, offset=1024),                        # starts at the end
                    TensorArg(0, 0, "float32", (2, 128), (129, 1)),  # strides reach past the end
                    TensorArg(0, 0, "float32", (2,), (-1,)),       # a negative stride before the start
                    TensorArg(0, 0, "float64", (256,), (1,)),      # 8-byte elements: twice the bytes
                    TensorArg(0, 0, "float32", (2, 2), (1 << 40, 1))):  # huge stride: no overflow
            reply, _ = job.rp.request(protocol.call([arg], [out], []), 5.0)
            assert isinstance(reply, Failed) and reply.where == "args" and "outside" in reply.message, (arg, reply)
        # the exact fit and an empty view at the end are fine
        for arg in (vec(0, 256), TensorArg(0, 1024, "float32", (0,), (1,)), vec(0, 128, offset=512)):
            reply, _ = job.rp.request(protocol.call([arg], [vec(1, arg.shape[0])], []), 5.0)
            assert isinstance(reply, Done), (arg, reply)
    finally:
        job.close()


def test_workspace_is_appended_and_poisoned_before_every_call(runner, sos, tmp_path):
    job = Job(tmp_path, runner)
    try:
        job.buffer(0, 4)
        job.rp.install_seccomp()
        assert job.load(sos["workspace"]) == Loaded(True)
        call = protocol.call([], [TensorArg(0, 0, "int32", (1,), (1,))], [])
        for _ in range(2):  # the second call finds the first's scribbles poisoned again
            job.views[0][:] = 0
            reply, _ = job.rp.request(call, 5.0)
            assert isinstance(reply, Done) and reply.rc == 0
            assert job.views[0].view(np.int32)[0] == 1
    finally:
        job.close()


def test_a_runner_that_does_not_start_is_our_failure(tmp_path):
    with pytest.raises(RunnerStartError, match="status 3"):
        RunnerProcess.start([sys.executable, "-c", "import sys; sys.exit(3)"], jobdir=tmp_path / "job",
                            start_timeout_s=10.0)


# --- the judge's side against runners that misbehave (the Python stand-in) ----------------------

def standin(tmp_path: Path, behaviour: str, *extra: str):
    return relu_job(tmp_path, [sys.executable, STANDIN, behaviour, *extra], Path(STANDIN), n=64)


def test_standin_honest_relu(tmp_path):
    job, call = standin(tmp_path, "honest:relu")
    try:
        x = job.f32(0, 64).copy()
        reply, _ = job.rp.request(call, 10.0)
        assert isinstance(reply, Done) and reply.rc == 0
        np.testing.assert_array_equal(job.f32(1, 64), np.maximum(x, 0))
    finally:
        job.close()


@pytest.mark.parametrize("code", [0, 70])
def test_standin_forging_a_result_or_a_harness_bug_is_a_crash(tmp_path, code):
    job, call = standin(tmp_path, f"forge:{code}")
    try:
        with pytest.raises(RunnerGone) as ei:
            job.rp.request(call, 10.0)
        assert ei.value.returncode == code
        assert (job.dir / "result.json").is_file() and (job.dir / "error.json").is_file()
    finally:
        job.close()


def test_standin_dying_mid_call(tmp_path):
    job, call = standin(tmp_path, "die:segv")
    try:
        with pytest.raises(RunnerGone) as ei:
            job.rp.request(call, 10.0)
        assert ei.value.returncode == -signal.SIGSEGV
    finally:
        job.close()


def test_standin_hanging_is_killed_at_the_deadline(tmp_path):
    job, call = standin(tmp_path, "hang")
    try:
        t0 = time.monotonic()
        with pytest.raises(RunnerTimeout):
            job.rp.request(call, 0.5)
        assert time.monotonic() - t0 < 2.5 and job.rp.returncode is not None
    finally:
        job.close()


def test_standin_lying_about_its_time_disagrees_with_the_judges_clock(tmp_path):
    job, call = standin(tmp_path, "lie:10", "--sleep-ms", "50")
    try:
        reply, wall = job.rp.request(call, 10.0)
        assert isinstance(reply, Done) and wall >= 0.05
        assert reply.ms * 1e-3 < wall / 5, "the reported time is a tenth of what the judge's clock saw"
    finally:
        job.close()


def test_standin_garbage_is_a_protocol_violation_and_the_runner_is_killed(tmp_path):
    job, call = standin(tmp_path, "garbage")
    try:
        with pytest.raises(ProtocolViolation) as ei:
            job.rp.request(call, 10.0)
        assert not isinstance(ei.value, RunnerGone)
        assert job.rp.returncode is not None
    finally:
        job.close()


def test_standin_skipping_the_work_leaves_the_poison(tmp_path):
    job, call = standin(tmp_path, "skip")
    try:
        reply, _ = job.rp.request(call, 10.0)
        assert isinstance(reply, Done) and reply.rc == 0
        assert np.isnan(job.f32(1, 64)).all(), "the judge sees nothing was written"
    finally:
        job.close()


# --- the cuda backend ---------------------------------------------------------------------------

def _nvcc() -> str | None:
    try:
        from evaluators.base import CompileSettings
        from evaluators.compile.toolchain import find_nvcc

        return find_nvcc(CompileSettings())
    except Exception:  # noqa: BLE001 - no nvcc: skip
        return None


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc to compile the cuda runner")
def test_the_cuda_backend_compiles():
    from evaluators.runner import runner_binary

    path = runner_binary("cuda", cache_dir=CACHE)
    assert path.is_file() and os.access(path, os.X_OK) and path.read_bytes()[:4] == b"\x7fELF"
    assert runner_binary("cuda", cache_dir=CACHE) == path, "built once"


@pytest.mark.gpu
def test_cuda_runner_maps_the_judges_buffers_and_runs_relu(tmp_path):
    torch = pytest.importorskip("torch")
    if _nvcc() is None or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and nvcc")
    from evaluators.compile.toolchain import abi_include_dir
    from evaluators.runner import runner_binary

    binary = runner_binary("cuda", cache_dir=CACHE)
    so = tmp_path / "relu_cuda.so"
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    subprocess.run([_nvcc(), "-std=c++17", "-O2", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                    f"-I{abi_include_dir()}", str(FIX / "relu_cuda.cu"), "-o", str(so)], check=True,
                   capture_output=True, text=True)
    from evaluators.judge.exchange import IpcExchange

    n = 1 << 20
    ex = IpcExchange()   # the judge's own exchange: one cuMemAlloc per tensor, its IPC handle
    bx, by = ex.alloc(4 * n), ex.alloc(4 * n)
    x, y = bx.view(torch.float32, (n,)), by.view(torch.float32, (n,))
    x.copy_(torch.randn(n, device="cuda"))
    y.fill_(float("nan"))
    torch.cuda.synchronize()
    jobdir = tmp_path / "job"
    rp = RunnerProcess.start(binary, jobdir=jobdir, readable=[str(tmp_path)])
    try:
        assert rp.backend == "cuda"
        args = []
        for b in (bx, by):
            reply, _ = rp.request(b.map_line(), 30.0)
            assert reply == Mapped(b.buf), reply
            args.append(TensorArg(b.buf, 0, "float32", (n,), (1,)))
        reply, _ = rp.request(protocol.nullcall(), 10.0)
        assert isinstance(reply, Done) and reply.last_error == 0, reply
        assert rp.install_seccomp() >= 2, "CUDA's own threads are filtered too"
        assert isinstance(rp.request(protocol.load(str(so)), 30.0)[0], Loaded)
        reply, wall = rp.request(protocol.call(args[:1], args[1:], []), 30.0)
        assert isinstance(reply, Done) and (reply.rc, reply.last_error) == (0, 0), reply
        assert 0 < reply.ms * 1e-3 <= wall
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x))
    finally:
        rp.close()
        ex.free(bx)
        ex.free(by)
