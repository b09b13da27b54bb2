"""One harness child process of the parent side: started for its job, or warm with a spec
(evaluators.warm) and given its job later; gated; waited for with its wall-clock limit, its
whole process group killed after; what it left turned into a
:class:`~evaluators.harness_job.HarnessReport` (a result counts only from a clean exit; a
death is a crash with the stderr tail and the last progress marker; a harness bug raises
:class:`~evaluators.harness_job.HarnessError`). :func:`evaluators.isolation.run_isolated`
decides which children a job needs; this module runs one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from evaluators.base import HarnessSettings
from evaluators.child.protocol import HARNESS_BUG_EXIT, stage_from_json
from evaluators.harness_job import (HARNESS_FIXES, STDERR_TAIL, HarnessError, HarnessJob, HarnessReport,
                                    ShapeTiming, child_env, job_json)
from evo.core.records import StageResult, Status

__all__ = ["ChildProcess", "timeout_for"]

log = logging.getLogger(__name__)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, n: int = STDERR_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    # faulthandler's one-line list of loaded extension modules drowns the useful frames.
    data = b"\n".join(l for l in data.split(b"\n") if not l.startswith(b"Extension modules:"))
    text = data[-n:].decode("utf-8", "replace")
    if len(data) > n:
        text = "...[trimmed]\n" + text.split("\n", 1)[-1]
    return text.strip()


def _progress(jobdir: Path) -> str:
    try:
        p = json.loads((jobdir / "progress.json").read_text())
    except (OSError, ValueError):
        return ""
    parts = [str(p.get("stage", ""))]
    if p.get("shape") is not None:
        parts.append(f"shape {p['shape']}")
    if p.get("trial") is not None:
        parts.append(f"trial {p['trial']}")
    if p.get("dist"):
        parts.append(f"({p['dist']})")
    if p.get("step"):
        parts.append(f"at {p['step']}")
    return " ".join(x for x in parts if x)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _failure_report(
    status: Status, reason: str, mode: str, artifacts: dict[str, str], seconds: float, rc: int | None
) -> HarnessReport:
    first = "timing" if mode == "time-only" else "correctness"
    stages = [StageResult(first, status, reason, {}, artifacts, seconds)]
    if first == "correctness":
        stages.append(
            StageResult("timing", Status.SKIPPED, f"not run: correctness {status.value}")
        )
    else:
        stages.insert(0, StageResult("correctness", Status.SKIPPED, "time-only re-confirmation"))
    return HarnessReport(stages=tuple(stages), seconds=seconds, returncode=rc)


def _parse_result(data: Mapping[str, Any], seconds: float, rc: int) -> HarnessReport:
    stages = tuple(stage_from_json(s) for s in data.get("stages", []))
    timings = tuple(ShapeTiming.from_row(t) for t in data.get("timings", []))
    fit = data.get("fitness")
    env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
    return HarnessReport(
        stages=stages,
        fitness=None if fit is None else float(fit),
        timings=timings,
        env=env,
        seconds=seconds,
        returncode=rc,
    )



def timeout_for(settings: HarnessSettings, mode: str) -> float:
    """A child's wall-clock limit: its task's adaptive value, never above ``timeout_s``."""
    per_child = settings.timeout_time_s if mode == "time-only" else settings.timeout_check_s
    return float(min(per_child, settings.timeout_s) if per_child else settings.timeout_s)


class ChildProcess:
    """One harness child process doing ``mode`` for ``job``, started on construction.

    :meth:`finish` waits for it (``settings.timeout_s`` from the call, then the whole process
    group is killed) and turns what it left into a :class:`HarnessReport`; :meth:`abort`
    kills it unread. Either removes the private job directory (unless ``keep_dir``).
    ``gate=True``: the child prepares (imports, CUDA context) and then waits for
    :meth:`open_gate` before any GPU work (``job.json`` key ``gate``; evaluators.child.harness).

    ``job=None`` with ``spec`` (:func:`spec_json`): a *warm* child, started before its
    candidate exists (evaluators.warm): it writes ``imported`` once it has imported torch
    and the task, waits for :meth:`allow_cuda` to create its CUDA context, writes ``ready``
    and waits for :meth:`deliver` to write its ``kernel.so`` and ``job.json`` and open the
    gate. Same sandbox, environment and private directory as any child; its timeout starts
    at delivery.
    """

    def __init__(
        self,
        job: HarnessJob | None,
        settings: HarnessSettings,
        mode: str,
        seed: int,
        *,
        entry: str,
        python: str | None,
        keep_dir: bool,
        workdir: str | Path | None,
        sandbox: Any,
        gate: bool = False,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        from evaluators.sandbox import SandboxSettings, sandbox_launch

        if (job is None) == (spec is None):
            raise ValueError("ChildProcess needs a job or (for a warm child) a spec, not both")
        self.job, self.settings, self.mode, self.keep_dir = job, settings, mode, keep_dir
        self.seed = seed
        #: this child's wall-clock limit (a warm child's is set again by deliver)
        self.timeout_s = timeout_for(settings, mode)
        self.jobdir = Path(tempfile.mkdtemp(prefix="evo-harness-", dir=workdir))
        self.t0 = time.monotonic()
        self._files: list[Any] = []
        try:
            if job is not None:
                payload = self._write_job(job, settings, seed)
                payload["gate"] = gate
                (self.jobdir / "job.json").write_text(json.dumps(payload, indent=1))
            else:
                payload = dict(spec)
                (self.jobdir / "spec.json").write_text(json.dumps(payload, indent=1))
            env = child_env(settings.device, self.jobdir)
            exe = python or sys.executable
            argv = ([exe, entry, str(self.jobdir)] if entry.endswith(".py")
                    else [exe, "-m", entry, str(self.jobdir)])
            # user task files import siblings: their directories stay readable under Landlock
            task_dirs = sorted({str(Path(f).parent) for f in payload["task_files"]})
            self.launch = sandbox_launch(argv, env, self.jobdir, self.timeout_s,
                                         sandbox if sandbox is not None else SandboxSettings.from_env(),
                                         readable=task_dirs)
            self._files = [open(self.jobdir / "stdout.log", "wb"), open(self.jobdir / "stderr.log", "wb")]
            self.proc = subprocess.Popen(
                self.launch.argv,
                cwd=str(self.jobdir),
                env=self.launch.env,
                stdin=subprocess.DEVNULL,
                stdout=self._files[0],
                stderr=self._files[1],
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            self._cleanup()
            raise
        self.pgid = self.proc.pid  # start_new_session: the child leads its own group

    def _write_job(self, job: HarnessJob, settings: HarnessSettings, seed: int) -> dict[str, Any]:
        so = self.jobdir / "kernel.so"
        so.write_bytes(bytes(job.so_bytes))
        os.chmod(so, 0o700)
        payload = job_json(job, settings, seed)
        payload["mode"] = self.mode
        return payload

    def open_gate(self) -> None:
        """Let a gated child start its GPU work; its clock and timeout start now."""
        (self.jobdir / "go").touch()
        self.t0 = time.monotonic()

    # --------------------------------------------------------------- a warm child
    def alive(self) -> bool:
        return self.proc.poll() is None

    def imported(self) -> bool:
        """A warm child has imported torch and its task (no GPU work yet)."""
        return (self.jobdir / "imported").exists()

    def allow_cuda(self) -> None:
        """Let a warm child create its CUDA context and prepare its references."""
        (self.jobdir / "cuda").touch()

    def ready(self) -> bool:
        """A warm child is prepared and waits for its job (doing no GPU work)."""
        return (self.jobdir / "ready").exists()

    def deliver(self, job: HarnessJob, settings: HarnessSettings, seed: int) -> None:
        """Give a warm child its candidate: ``kernel.so`` and ``job.json`` (written whole,
        then renamed), then the gate; its clock and ``timeout_s`` start now."""
        self.job, self.settings, self.seed = job, settings, seed
        self.timeout_s = timeout_for(settings, self.mode)
        payload = self._write_job(job, settings, seed)
        tmp = self.jobdir / "job.json.tmp"
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.jobdir / "job.json")
        self.open_gate()

    def abort(self) -> None:
        """Kill the child's group unread and clean up."""
        try:
            _kill_group(self.pgid)
            self.proc.wait()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for f in self._files:
            f.close()
        if not self.keep_dir:
            shutil.rmtree(self.jobdir, ignore_errors=True)
        else:
            log.info("kept harness job dir %s", self.jobdir)

    def finish(self) -> HarnessReport:
        """Wait for the child, then its report; raises HarnessError for a harness bug."""
        try:
            return self._report()
        finally:
            self._cleanup()

    def _report(self) -> HarnessReport:
        job, settings, mode, jobdir, proc = self.job, self.settings, self.mode, self.jobdir, self.proc
        timed_out = False
        try:
            rc = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self.pgid)
            rc = proc.wait()
        finally:
            # Anything the child left behind in its group (grandchildren) goes too.
            _kill_group(self.pgid)
        seconds = time.monotonic() - self.t0
        stderr = _tail(jobdir / "stderr.log")
        arts = {"stderr": stderr} if stderr else {}
        where = _progress(jobdir)
        log.debug("harness %s rc=%s in %.1fs", job.candidate_id[:12], rc, seconds)
        if timed_out:
            reason = f"timed out after {self.timeout_s:.3g}s (process group killed)"
            if self.timeout_s < settings.timeout_s and settings.timeout_note:
                reason += f" [{settings.timeout_note}]"
            if where:
                reason += f"; last step: {where}"
            return _failure_report(Status.TIMEOUT, reason, mode, arts, seconds, None)
        result = jobdir / "result.json"
        if rc == HARNESS_BUG_EXIT and (jobdir / "error.json").exists():
            try:
                err_data = json.loads((jobdir / "error.json").read_text())
            except ValueError:
                err_data = {"error": "error.json unreadable"}
            kind = str(err_data.get("kind") or "bug")
            kind = kind if kind in HARNESS_FIXES else "bug"
            raise HarnessError(
                f"the GPU harness failed on task {job.task!r} (not the candidate's fault): "
                f"{str(err_data.get('error', '?')).strip()}",
                fix=HARNESS_FIXES[kind], detail=str(err_data.get("traceback", "")), kind=kind,
            )
        if result.exists() and rc != 0:
            # A result is accepted only from a clean exit: a child that died (a kernel that
            # wrote its own result file and then aborted) is a crash, whatever files exist.
            why = (f"process killed by {_signal_name(rc)}" if rc < 0 else f"process exited with code {rc}")
            why += " after a result file appeared (a result counts only from a clean exit)"
            if stderr:
                why += f"; stderr tail: {stderr[-600:]}"
            return _failure_report(Status.CRASH, why, mode, arts, seconds, rc)
        if result.exists():
            try:
                data = json.loads(result.read_text())
            except ValueError as e:
                return _failure_report(
                    Status.CRASH, f"harness result unreadable: {e}", mode, arts, seconds, rc
                )
            report = _parse_result(data, seconds, rc)
            return replace(report, env={**report.env, "sandbox": self.launch.summary})
        if rc < 0:
            why = f"process killed by {_signal_name(rc)}"
        else:
            why = f"process exited with code {rc} without a result"
        if where:
            why += f" during {where}"
        if stderr:
            why += f"; stderr tail: {stderr[-600:]}"
        return _failure_report(Status.CRASH, why, mode, arts, seconds, rc)

