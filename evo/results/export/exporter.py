"""The export itself: one directory per chosen task (see :mod:`evo.results.export` for the
layout) and ``export.json``."""

from __future__ import annotations

import json
import logging
import re
import shutil
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from evo.core.records import Candidate, Evaluation, Status
from evo.results.export.choose import Choice, choose_champions, resolve_target
from evo.results.export.errors import ExportError
from evo.results.export.manifest import (
    MANIFEST_VERSION,
    compile_resources,
    lineage_ids,
    sha256,
    timings,
    versions,
)
from evo.results.export.render import abi_fields, build_script, render_template
from evo.results.export.source import bake_params, op_identifier
from evo.results.export.task_io import io_dims, output_dtypes, reference_module, reference_params

if TYPE_CHECKING:  # pragma: no cover
    from evaluators.base import CompileSettings
    from evo.store import Store

__all__ = ["ExportedTask", "ExportResult", "JudgeRecheckError", "export", "judge_recheck", "TEST_MAX_BYTES"]

log = logging.getLogger(__name__)

#: Shapes whose compulsory bytes exceed this are left out of test_op.py's accuracy check
#: (the fp64 ground truth needs twice that again); the benchmark shape of many tasks is GBs.
TEST_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class ExportedTask:
    """One exported task: its directory, the chosen candidate, and the .so (None when it
    could not be built here; ``so_note`` says why)."""

    task: str
    candidate_id: str
    directory: Path
    selection: str
    fitness: float | None
    so_path: Path | None
    so_note: str = ""
    test_note: str = ""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` did: the run, the exported tasks, and skipped tasks with reasons."""

    run_id: str
    out_dir: Path
    exported: tuple[ExportedTask, ...]
    skipped: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "out_dir": str(self.out_dir),
            "exported": [
                {"task": e.task, "candidate_id": e.candidate_id, "directory": str(e.directory),
                 "selection": e.selection, "fitness": e.fitness,
                 "so": str(e.so_path) if e.so_path else None, "so_note": e.so_note, "test_note": e.test_note}
                for e in self.exported
            ],
            "skipped": dict(self.skipped),
        }


def _compile_settings(run: Mapping[str, Any], override: "CompileSettings | None", arch: str | None) -> "CompileSettings":
    import dataclasses

    from evaluators.base import CompileSettings

    if override is not None:
        s = override
    else:
        c = (run.get("config") or {}).get("compile") or {}
        s = CompileSettings(
            arch=str(c.get("arch", "sm_90a")), timeout_s=float(c.get("timeout_s", 300.0)),
            memory_mb=int(c.get("memory_mb", 8192)), cache_dir=str(c.get("cache_dir", ".evo/cache")),
        )
    return dataclasses.replace(s, arch=arch) if arch else s


class PolicyRecheckError(ExportError):
    """The kernel chosen for a task fails the source policy of this version: that task is
    skipped (its reason in ``ExportResult.skipped``), the others are exported."""


def _recheck(cand: Candidate, ev: Evaluation, choice: Choice) -> dict[str, Any]:
    """Which checks the exported kernel passed, for ``manifest["checks"]``; raises ExportError
    when it fails today's policy.

    The policy is re-run here, on the source exactly as exported (tunables baked in as
    ``#define`` lines) and on the candidate with its parameters: the run may have used an
    older, looser policy, and the exported ``.so`` is loaded into the user's own process,
    unsandboxed. The other entries are the verdicts of the run's evaluation (decided by the
    judge, which never loads candidate code; see docs/SECURITY.md for what that does and does
    not guarantee)."""
    from evaluators.policy import check_policy

    baked = bake_params(cand.source, cand.params, header="")
    for what, res in (("as exported", check_policy(baked)), ("with its parameters", check_policy(cand.source, cand.params))):
        if res.status is not Status.OK:
            raise PolicyRecheckError(
                f"candidate {cand.id[:16]} ({cand.task}) fails today's source policy {what}: {res.reason}. "
                "It was evaluated under an older policy and is not exported; re-evaluate it with "
                f"`evo check` (or search again) under this version")
    stage = {s.stage: s.status.value for s in ev.stages}
    return {
        "policy": "ok (re-checked at export)",
        "compile": stage.get("compile", "not recorded"),
        "correctness": stage.get("correctness", "not recorded"),
        "timing": stage.get("timing", "not recorded"),
        "champion_confirmation": choice.confirmation or None,
        "sandbox": ev.env.get("sandbox") or None,
        "seccomp": ev.env.get("seccomp") or None,
    }


def judge_recheck(cand: Candidate, so_bytes: bytes, task_files: Sequence[str] = (),
                  gpu: bool | None = None) -> dict[str, Any]:
    """The exported binary through the judge and a runner on every shape of its task
    (:mod:`evaluators.judge`: the verdict from a process that never loads the candidate),
    for ``manifest["checks"]["judge"]``; raises :class:`JudgeRecheckError` when it is not
    correct and timed. Without a CUDA GPU here (``gpu`` None: detected) nothing is run and
    the entry says so: the stored verdicts are then all the manifest has."""
    from evaluators.base import HarnessSettings
    from evaluators.pipeline import gpu_available, run_built

    if not (gpu_available() if gpu is None else gpu):
        return {"status": "not re-checked: no CUDA GPU on this machine (run `evo export` on a GPU machine "
                          "for the judge's re-check)"}
    settings = HarnessSettings(task_files=tuple(task_files))
    rep = run_built(cand, so_bytes, settings, mode="check+time", task_files=tuple(task_files))
    stages = {s.stage: s for s in rep.stages}
    if not rep.passed or rep.fitness is None:
        bad = next((s for s in rep.stages if s.status not in (Status.OK, Status.SKIPPED)), rep.stages[-1])
        raise JudgeRecheckError(
            f"candidate {cand.id[:16]} ({cand.task}) failed the judge's re-check at export: {bad.stage} "
            f"{bad.status.value}: {bad.reason[:300]}. It is not exported; `evo check` shows the full verdict")
    return {"status": "ok", "correctness": stages["correctness"].status.value, "shapes_checked": "all",
            "timing": stages["timing"].status.value, "fitness": rep.fitness, "gpu": rep.env.get("gpu"),
            "protocol": rep.env.get("protocol"), "sandbox": rep.env.get("sandbox"),
            "seccomp": rep.env.get("seccomp")}


class JudgeRecheckError(ExportError):
    """The exported binary failed the judge's re-check: that task is skipped."""


def _export_one(store: "Store", run: Mapping[str, Any], choice: Choice, out_dir: Path,
                settings: "CompileSettings", build: bool, recheck: bool = True,
                task_registry: Any = None) -> ExportedTask:
    from evaluators.compile import abi_include_dir
    from evo.tasks.registry import BUILTIN_TASKS

    tasks = BUILTIN_TASKS if task_registry is None else task_registry

    run_id = run["id"]
    cand: Candidate = store.get_candidate(choice.candidate_id)
    ev = store.get_evaluation(cand.id, run_id)
    if ev is None or not ev.correct:
        status = ev.status.value if ev else "not evaluated"
        raise ExportError(f"candidate {cand.id[:16]} ({cand.task}) is not correct in run {run_id} "
                          f"({status}); only correct kernels are exported (see `evo top {run_id}`)")
    try:
        task = tasks.get(cand.task)
    except KeyError as e:
        raise ExportError(f"task {cand.task!r} is not registered in this install (a user task? pass its "
                          f"file with --task-file): {e}") from None
    checks = _recheck(cand, ev, choice)
    d = out_dir / cand.task
    d.mkdir(parents=True, exist_ok=True)
    for stale in d.glob("kernel_*.so"):
        stale.unlink()

    header = (f"cute-evo export of task {cand.task}, candidate {cand.id}\n"
              f"run {run_id}, speedup {ev.fitness:.4f}x over the reference on {ev.gpu or 'the run GPU'}\n"
              f"build: bash build.sh [ARCH]  (see manifest.json)")
    (d / "kernel.cu").write_text(bake_params(cand.source, cand.params, header=header), encoding="utf-8")
    shutil.copyfile(abi_include_dir() / "evo_abi.h", d / "evo_abi.h")
    script = d / "build.sh"
    script.write_text(build_script(settings.arch, settings.extra_flags), encoding="utf-8")
    script.chmod(0o755)

    so_path: Path | None = None
    so_note = ""
    compile_info: dict[str, Any] = {}
    if build:
        from evaluators.compile import CutlassNotFound, NvccNotFound, compile_candidate

        try:
            outcome = compile_candidate(cand, settings)
        except (NvccNotFound, CutlassNotFound) as e:
            so_note = f"no prebuilt .so: {e}. Build it where nvcc is installed: bash build.sh {settings.arch}"
        else:
            if outcome.ok and outcome.so_bytes:
                if recheck:
                    checks["judge"] = judge_recheck(cand, outcome.so_bytes, tasks.files)
                so_path = d / f"kernel_{settings.arch}.so"
                so_path.write_bytes(outcome.so_bytes)
                compile_info = {"cache_key": outcome.key, "cached": outcome.cached,
                                **compile_resources(Evaluation(cand.id, (outcome.result,)))}
            else:
                so_note = (f"the rebuild for {settings.arch} failed ({outcome.result.status.value}: "
                           f"{outcome.result.reason}); see build.sh")
    else:
        so_note = "not built (build disabled); run: bash build.sh"
    if "judge" not in checks:
        checks["judge"] = {"status": "not re-checked: " + (so_note or "re-check disabled (--no-recheck)")}
    if so_note:
        log.warning("%s: %s", cand.task, so_note)

    ref_text, test_note = reference_module(task)
    (d / "reference.py").write_text(ref_text, encoding="utf-8")

    in_dims, out_dims, n_in = io_dims(task)
    names = reference_params(task, n_in)
    if in_dims is None:
        in_dims = [()] * n_in
        test_note = test_note or "input dims unknown: only device/dtype/contiguity are checked"
    ident = op_identifier(cand.task)
    n_out = len(out_dims) if out_dims is not None else 1
    ret_ann = "torch.Tensor" if n_out == 1 else f"typing.Tuple[{', '.join(['torch.Tensor'] * n_out)}]"
    ret_expr = "outs[0]" if n_out == 1 else "tuple(outs)"
    arches = [settings.arch] if so_path else []
    fitness = ev.fitness
    op_text = render_template(
        "op.py",
        op_name=ident, op_name_repr=repr(ident), task_repr=repr(cand.task),
        when=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        run_id=run_id, cid=cand.id, cid_repr=repr(cand.id), fitness=f"{fitness:.3f}x", gpu=ev.gpu or "the run GPU",
        example=f"y = torch.ops.evo.{ident}({', '.join(names)})   # == op.{ident}(...)",
        signature=f"evo::{ident}({', '.join(names)}) -> "
                  + ("Tensor" if n_out == 1 else f"({', '.join(['Tensor'] * n_out)})"),
        dtype=task.dtype,
        dims_doc="\n".join(f"    {n}: [{', '.join(map(str, dims))}]" for n, dims in zip(names, in_dims))
                 + ("\n    output: " + "; ".join(f"[{', '.join(map(str, o))}]" for o in out_dims)
                    if out_dims else ""),
        task_description="\nTask: " + textwrap.fill(task.description, 88),
        inputs_repr=repr([(n, tuple(dims)) for n, dims in zip(names, in_dims)]),
        outputs_repr=repr(out_dims), scalars_repr=repr(tuple(float(s) for s in task.scalars)),
        output_dtypes_repr=repr(output_dtypes(task, in_dims)),
        arches_repr=repr(arches),
        params_annotated=", ".join(f"{n}: torch.Tensor" for n in names),
        params_plain=", ".join(names), params_tuple=", ".join(names) + ("," if len(names) == 1 else ""),
        return_annotation=ret_ann, return_expr=ret_expr,
        **abi_fields(),
    )
    (d / "op.py").write_text(op_text, encoding="utf-8")

    check_shapes = [i for i, s in enumerate(task.shapes) if task.bytes(s) <= TEST_MAX_BYTES]
    if not check_shapes:
        check_shapes = [min(range(len(task.shapes)), key=lambda i: task.bytes(task.shapes[i]))]
    test_text = render_template(
        "test_op.py",
        op_name=ident, task_repr=repr(cand.task), task_ident=re.sub(r"\W", "_", cand.task),
        here_hint=f"{cand.task}/test_op.py", max_gb=f"{TEST_MAX_BYTES / 2**30:.0f}",
        check_shapes_repr=repr(check_shapes),
        skip_mark=f"\npytestmark = pytest.mark.skip(reason={test_note!r})\n" if test_note else "",
    )
    (d / "test_op.py").write_text(test_text, encoding="utf-8")

    tool_versions = versions(settings)
    env = dict(ev.env)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "task": cand.task,
        "op": f"evo::{ident}",
        "candidate_id": cand.id,
        "run_id": run_id,
        "run_name": run.get("name"),
        "run_config_hash": run.get("config_hash"),
        "selection": choice.selection,
        "confirmation": choice.confirmation,
        "fitness": fitness,
        "operator": cand.operator,
        "generation": cand.generation,
        "island": cand.island,
        "params": dict(cand.params),
        "lineage": lineage_ids(store, cand.id, run_id),
        "gpu": ev.gpu or env.get("gpu"),
        "gpu_capability": env.get("capability"),
        "driver": env.get("driver"),
        "cuda": env.get("cuda"),
        "torch": env.get("torch"),
        "python": env.get("python"),
        "protocol": env.get("protocol"),
        "cutlass": tool_versions["cutlass"],
        "nvcc": tool_versions["nvcc"],
        "arch": settings.arch,
        "compile_flags": list(settings.extra_flags),
        "checks": checks,
        "timings": timings(ev),
        "compile": compile_info or compile_resources(ev),
        "env": env,
        "so": so_path.name if so_path else None,
        "so_note": so_note or None,
        "test_note": test_note or None,
        "task_spec": {
            "dtype": task.dtype, "scalars": list(task.scalars), "shapes": [dict(s) for s in task.shapes],
            "bench_shapes": task.bench_shapes,
            "inputs": [{"name": n, "dims": list(dims)} for n, dims in zip(names, in_dims)],
            "outputs": [list(o) for o in out_dims] if out_dims else None,
        },
    }
    files = ["kernel.cu", "evo_abi.h", "build.sh", "op.py", "reference.py", "test_op.py"]
    if so_path:
        files.append(so_path.name)
    manifest["files"] = {f: sha256(d / f) for f in files}
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    log.info("exported %s (%s) to %s", cand.task, cand.short_id, d)
    return ExportedTask(cand.task, cand.id, d, choice.selection, fitness, so_path, so_note, test_note)


def export(
    store: "Store",
    target: str,
    out_dir: str | Path,
    *,
    tasks: Sequence[str] | None = None,
    compile_settings: "CompileSettings | None" = None,
    arch: str | None = None,
    build: bool = True,
    recheck: bool = True,
    on_task: Callable[[str, int, int], None] | None = None,
    task_registry: Any = None,
) -> ExportResult:
    """Export a run's champions (``target`` = run id) or one kernel (``target`` = candidate
    id), prefixes accepted, into ``out_dir`` (see the module docstring for the layout).

    ``tasks`` limits a run export to those tasks. The .so is built with ``compile_settings``
    (default: the run config's ``[compile]`` section) for ``arch`` (default: its
    ``compile.arch``); ``build=False`` writes everything but the .so. Returns an
    :class:`ExportResult`; tasks without a correct candidate are in ``skipped``. When no
    task has anything to export, raises :class:`ExportError` saying why for each task and
    writes nothing (no directory, no ``export.json``). ``on_task(task, done, total)`` is
    called before each task's export (and once with ``done == total`` at the end): progress.

    ``recheck`` (default): on a machine with a CUDA GPU, every exported binary is evaluated
    again by the judge and a runner on every shape of its task (:func:`judge_recheck`) before
    it is written; one that fails is skipped with the reason, and the manifest records that
    check (``checks["judge"]``), not only the verdicts stored by the run.

    Tasks are looked up in ``task_registry`` (None: the built-in tasks) plus the run's user
    task files (its config's ``tasks.files``), which the judge's re-check is given too.
    """
    run_id, cid = resolve_target(store, target)
    run = store.get_run(run_id)
    from evo.tasks.user import TaskFileError, run_task_registry

    try:  # the run's user tasks: their references and inputs go into the export
        registry = run_task_registry(run.get("config"), run_id, base=task_registry)
    except TaskFileError as e:
        raise ExportError(str(e)) from None
    settings = _compile_settings(run, compile_settings, arch)
    out = Path(out_dir)
    if cid is not None:
        c = store.get_candidate(cid)
        choices, skipped = [Choice(c.task, cid, "explicit id")], {}
    else:
        choices, skipped = choose_champions(store, run_id, tasks)
    if not choices:
        why = "; ".join(skipped.values()) or f"run {run_id} has no candidates"
        raise ExportError(f"nothing to export from run {run_id}, so nothing was written: {why}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create the export directory {out}: {e}") from e
    exported = []
    for i, ch in enumerate(choices):
        if on_task is not None:
            on_task(ch.task, i, len(choices))
        try:
            exported.append(_export_one(store, run, ch, out, settings, build, recheck, registry))
        except PolicyRecheckError as e:
            log.warning("%s", e)
            skipped[ch.task] = str(e)
        except JudgeRecheckError as e:
            log.warning("%s", e)
            skipped[ch.task] = str(e)
            shutil.rmtree(out / ch.task, ignore_errors=True)
        except OSError as e:
            raise ExportError(f"cannot write the export of {ch.task} into {out}: {e}") from e
    if not exported:
        raise ExportError(f"nothing exported from run {run_id}: " + "; ".join(skipped.values()))
    if on_task is not None:
        on_task("", len(choices), len(choices))
    result = ExportResult(run_id, out, tuple(exported), skipped)
    summary = result.as_dict()
    summary["exported_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out / "export.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result
