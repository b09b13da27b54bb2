"""Export champions as standalone PyTorch ops: ``evo export RUN|ID --out DIR``.

For each task (a run: every task's champion; an id: that one kernel) this writes
``DIR/<task>/``:

``kernel.cu``        the candidate's source with its tunable values baked in as ``#define``
                     lines at the very top (before the source's ``#ifndef`` defaults), so it
                     builds with no ``-D`` flags;
``evo_abi.h``        the kernel ABI header it includes;
``kernel_<arch>.so`` the prebuilt shared object for the run's GPU arch (``compile.arch`` of
                     the run's config, e.g. ``sm_90a``), built by
                     :func:`evaluators.compile.compile_candidate` exactly as the search built
                     it (a compile-cache hit when run where the search ran). Without nvcc or
                     the CUTLASS headers it is left out and the manifest says why;
``build.sh``         ``bash build.sh [ARCH]`` rebuilds it for another arch with nvcc and the
                     CUTLASS headers of the ``nvidia-cutlass`` wheel;
``op.py``            registers the custom op ``evo::<task>`` (``torch.library.custom_op``, with
                     a fake impl for ``torch.compile``/meta tensors). It loads the .so with
                     ctypes, checks device / dtype / rank / named-dimension consistency /
                     contiguity, allocates outputs and calls ``evo_launch`` on
                     ``torch.cuda.current_stream()``. It imports only torch, ctypes and the
                     standard library, so it works in a fresh Python with torch alone;
``reference.py``     the task's reference copied as plain torch code, its input generator
                     and its tolerance rule (standalone too);
``test_op.py``       pytest: the op against the reference on the task's shapes (CUDA needed;
                     the input-validation test runs on CPU);
``manifest.json``    lineage ids, fitness, GPU, driver, CUDA, CUTLASS, torch and nvcc
                     versions, run config hash, timings from the evaluation metrics, compile
                     resources, file hashes.

``DIR/export.json`` lists what was exported and what was skipped (and why).

The generated files are templates in ``evo/export_templates/*.tmpl`` (package data), rendered
by :func:`render_template`; op.py's copy of the ABI struct, dtype codes and entry-point
signatures is rendered from :mod:`evaluators.abi` (see :func:`abi_fields`), itself checked
against ``evo_abi.h`` by ``tests/test_abi_header.py``.

Which candidate: a task's confirmed champion (``Store.champions`` with
``confirmation.confirmed``), else its best correct candidate (``Store.top_k``); a task with no
correct candidate is skipped with a reason, never exported. An explicit id must be correct.

Errors: :class:`~evo.store.UnknownIdError` (no run and no candidate matches; names near
matches of both), :class:`ExportError` (the candidate is not correct, the output is not
writable, an explicit ``--task`` the run lacks).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import re
import shutil
import string
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from evo.records import Candidate, Evaluation

if TYPE_CHECKING:  # pragma: no cover
    from evaluators.base import CompileSettings
    from evo.store import Store
    from evo.tasks.base import Task

__all__ = [
    "ExportError",
    "NotStandaloneError",
    "ExportedTask",
    "ExportResult",
    "Choice",
    "export",
    "resolve_target",
    "choose_champions",
    "bake_params",
    "op_identifier",
    "standalone_source",
    "build_script",
    "render_template",
    "template_fields",
    "abi_fields",
    "ExportTemplateError",
    "TEMPLATES_DIR",
    "MANIFEST_VERSION",
    "TEST_MAX_BYTES",
]

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
#: Shapes whose compulsory bytes exceed this are left out of test_op.py's accuracy check
#: (the fp64 ground truth needs twice that again); the benchmark shape of many tasks is GBs.
TEST_MAX_BYTES = 1 << 30
#: Modules a copied reference may use (imported under the same name in reference.py).
_SAFE_MODULE_PREFIXES = ("torch", "math", "numpy", "functools", "operator", "itertools", "typing")
_CONST_TYPES = (int, float, str, bool, type(None))


class ExportError(RuntimeError):
    """The export cannot be done as asked; the message names the problem and the fix."""


class NotStandaloneError(ValueError):
    """A task function cannot be copied as self-contained source (it uses something other
    than torch, math, numpy, constants and other module-level functions of its module)."""


@dataclass(frozen=True)
class Choice:
    """The candidate chosen for a task and why (``selection`` is shown to people)."""

    task: str
    candidate_id: str
    selection: str
    confirmation: dict[str, Any] = field(default_factory=dict)


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


# --------------------------------------------------------------------------- choosing


def resolve_target(store: "Store", target: str) -> tuple[str, str | None]:
    """``(run_id, candidate_id or None)`` for a run id / candidate id (or unique prefix).

    A run match wins; then a candidate match (its run: the latest run that evaluated it).
    When neither matches, raises :class:`~evo.store.UnknownIdError` naming near matches of
    both kinds; an ambiguous prefix raises :class:`~evo.store.AmbiguousIdError`.
    """
    from evo.store import AmbiguousIdError, UnknownIdError

    from evo.status import resolve_run

    try:
        return resolve_run(store, target), None
    except AmbiguousIdError:
        raise
    except UnknownIdError as run_err:
        try:
            cid = store.resolve_id(target)
        except AmbiguousIdError:
            raise
        except UnknownIdError as cand_err:
            near_runs = ", ".join(run_err.near[:5]) or "none"
            near_cands = ", ".join(n[:16] for n in cand_err.near[:5]) or "none"
            raise UnknownIdError(
                f"{target!r} is neither a run nor a candidate id; near runs: {near_runs}; "
                f"closest candidate ids: {near_cands} (see `evo runs` and `evo top RUN`)",
                query=target, near=tuple(run_err.near) + tuple(cand_err.near), kind="run or candidate",
            ) from None
    rows = store.db.execute(
        "SELECT run_id FROM evaluations WHERE candidate_id = ? ORDER BY rowid DESC LIMIT 1", [cid]
    ).fetchall()
    if not rows:
        raise ExportError(f"candidate {cid[:16]} has no evaluation in any run; only evaluated, correct "
                          "kernels can be exported")
    return rows[0][0], cid


def choose_champions(store: "Store", run_id: str, tasks: Sequence[str] | None = None
                     ) -> tuple[list[Choice], dict[str, str]]:
    """Per task of the run (or of ``tasks``): the candidate to export, and skipped tasks.

    Order of preference: the confirmed champion; the best correct candidate (noting an
    unconfirmed champion); a task with no correct candidate is skipped with the reason.
    """
    run_tasks = sorted({c.task for c in store.candidates(run_id)})
    wanted = list(tasks) if tasks else run_tasks
    unknown = [t for t in wanted if t not in run_tasks]
    if unknown:
        raise ExportError(f"run {run_id} has no task {', '.join(map(repr, unknown))}; its tasks: "
                          f"{', '.join(run_tasks) or 'none'}")
    champs = {c["task"]: c for c in store.champions(run_id)}
    best = store.best_per_task(run_id)
    chosen: list[Choice] = []
    skipped: dict[str, str] = {}
    for task in wanted:
        ch = champs.get(task)
        if ch and ch["confirmation"].get("confirmed"):
            ev = store.get_evaluation(ch["candidate_id"], run_id)
            if ev is not None and ev.correct:
                chosen.append(Choice(task, ch["candidate_id"], "confirmed champion", dict(ch["confirmation"])))
                continue
        if task in best:
            cand, _ = best[task]
            if ch is None:
                why = "best correct kernel (no champion recorded)"
            elif ch["candidate_id"] == cand.id:
                why = "best correct kernel (champion not confirmed by re-timing)"
            else:
                why = "best correct kernel (the recorded champion is not confirmed)"
            chosen.append(Choice(task, cand.id, why, dict(ch["confirmation"]) if ch else {}))
            continue
        n = len(store.candidates(run_id, task))
        skipped[task] = (f"no correct candidate for {task} in run {run_id} ({n} candidates, none passed "
                         "every stage); nothing to export")
    return chosen, skipped


# --------------------------------------------------------------------------- sources


def bake_params(source: str, params: Mapping[str, str] | Sequence[tuple[str, str]], *, header: str = "") -> str:
    """``source`` with ``#define NAME VALUE`` for each tunable at the very top, so that its
    ``#ifndef NAME`` defaults are skipped and the file builds with no ``-D`` flags (the
    same preprocessor state as the search's ``-DNAME=VALUE``)."""
    items = sorted(dict(params).items())
    lines = [f"// {ln}".rstrip() for ln in header.splitlines()] if header else []
    if items:
        lines.append("// Tunable values of this kernel (were -D flags during the search):")
        lines += [f"#define {k} {v}" for k, v in items]
    if not lines:
        return source
    return "\n".join(lines) + "\n\n" + source


def op_identifier(task: str) -> str:
    """The op's name inside the ``evo`` namespace: ``task`` with non-identifier characters
    replaced by ``_`` (prefixed ``t_`` if it starts with a digit)."""
    name = re.sub(r"\W", "_", task)
    return f"t_{name}" if not name or name[0].isdigit() else name


def _module_ok(mod_name: str) -> bool:
    return any(mod_name == p or mod_name.startswith(p + ".") for p in _SAFE_MODULE_PREFIXES)


def _public_home(val: Any, name: str) -> str | None:
    """The public module a torch/math function was imported from (``from torch import relu``
    makes ``relu`` a global whose ``__module__`` is private), or None."""
    import torch
    import torch.nn.functional

    for mod_name, mod in (("torch", torch), ("torch.nn.functional", torch.nn.functional), ("math", math)):
        if getattr(mod, name, None) is val:
            return mod_name
    return None


def standalone_source(fn: Callable[..., Any]) -> tuple[str, str]:
    """``(source, name)``: self-contained Python source defining ``fn`` (as ``name``) plus the
    module-level functions and constants it uses, with imports of torch/math/numpy modules.

    Raises :class:`NotStandaloneError` for callables that are not plain functions (a lambda,
    a class instance, a closure) or that use anything else from their module.
    """
    imports: dict[str, str] = {}
    consts: dict[str, str] = {}
    blocks: list[str] = []
    done: set[int] = set()

    def visit(f: Callable[..., Any]) -> None:
        if id(f) in done:
            return
        done.add(id(f))
        if not inspect.isfunction(f) or f.__name__ == "<lambda>":
            raise NotStandaloneError(
                f"{f!r} is not a plain module-level function; only those can be copied into a "
                "standalone export")
        cv = inspect.getclosurevars(f)
        if cv.nonlocals:
            raise NotStandaloneError(f"{f.__qualname__} is a closure over {sorted(cv.nonlocals)}; "
                                     "define it at module level to export it")
        for name, val in sorted(cv.globals.items()):
            if inspect.ismodule(val):
                if not _module_ok(val.__name__):
                    raise NotStandaloneError(f"{f.__qualname__} uses module {val.__name__!r}; only "
                                             f"{', '.join(_SAFE_MODULE_PREFIXES)} can be exported")
                imports[name] = (f"import {val.__name__}" if name == val.__name__
                                 else f"import {val.__name__} as {name}")
            elif inspect.isfunction(val) and val.__module__ == f.__module__:
                visit(val)
                if val.__name__ != name:
                    consts[name] = val.__name__
            elif isinstance(val, _CONST_TYPES) or (
                isinstance(val, tuple) and all(isinstance(x, _CONST_TYPES) for x in val)
            ):
                if isinstance(val, float) and not math.isfinite(val):
                    consts[name] = f"float({str(val)!r})"
                else:
                    consts[name] = repr(val)
            elif (src_mod := _public_home(val, name)) is not None:
                imports[name] = f"from {src_mod} import {name}"
            else:
                raise NotStandaloneError(f"{f.__qualname__} uses the global {name!r} "
                                         f"({type(val).__name__}); only constants, torch/math/numpy "
                                         "and module-level functions can be exported")
        try:
            src = textwrap.dedent(inspect.getsource(f))
        except (OSError, TypeError) as e:
            raise NotStandaloneError(f"the source of {f.__qualname__} is not available: {e}") from e
        blocks.append(src.rstrip() + "\n")

    visit(fn)
    parts = sorted(set(imports.values()))
    if consts:
        parts.append("")
        parts += [f"{k} = {v}" for k, v in sorted(consts.items())]
    parts.append("")
    parts += [b + "\n" for b in blocks]  # post-order: helpers first, the function last
    return "\n".join(parts).rstrip() + "\n", fn.__name__


# --------------------------------------------------------------------------- generated files

#: The generated files' templates (shipped as package data, like ``mutators/prompts``).
TEMPLATES_DIR = Path(__file__).with_name("export_templates")


class ExportTemplateError(RuntimeError):
    """A template under :data:`TEMPLATES_DIR` is missing or does not match the fields the
    code renders it with: a broken install or a code bug, never the user's input."""


class _FieldTemplate(string.Template):
    """``${name}`` with a lower-case ``name`` is a field; every other ``$`` is literal text.

    The templates are bash and Python, full of ``$VAR``, ``${VAR:-x}`` and f-strings, so
    unlike the prompts' templates there is no ``$$`` escape to remember: a field is always
    braced and lower-case, and nothing else is touched.
    """

    flags = 0  # case-sensitive: ${BASH_SOURCE[0]} and ${NVCC:-} are bash, not fields
    pattern = r"""
    \$(?:
      (?P<escaped>(?!))             |
      (?P<named>(?!))               |
      \{(?P<braced>[a-z][a-z0-9_]*)\} |
      (?P<invalid>(?!))
    )
    """


@lru_cache(maxsize=None)
def _template(name: str) -> _FieldTemplate:
    path = TEMPLATES_DIR / f"{name}.tmpl"
    try:
        return _FieldTemplate(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ExportTemplateError(
            f"export template {path} cannot be read ({e}); the package data evo/export_templates/*.tmpl "
            "is incomplete: reinstall cute-evo") from None


def template_fields(name: str) -> set[str]:
    """The field names template ``name`` (e.g. ``"op.py"``) uses."""
    return set(_template(name).get_identifiers())


def render_template(name: str, **fields: Any) -> str:
    """Template ``name`` with ``fields`` substituted (values via ``str``, inserted verbatim and
    not re-scanned). The fields given must be exactly those the template uses: a missing or an
    unused one raises :class:`ExportTemplateError` naming it (a template and its caller out of
    step must fail here, not produce a subtly different file)."""
    used = template_fields(name)
    missing, unused = sorted(used - fields.keys()), sorted(fields.keys() - used)
    if missing or unused:
        raise ExportTemplateError(
            f"export template {name}.tmpl and evo/export.py disagree: missing field(s) "
            f"{', '.join(missing) or 'none'}, unused field(s) {', '.join(unused) or 'none'}")
    return _template(name).substitute({k: str(v) for k, v in fields.items()})


def _wrap_items(head: str, items: Sequence[str], tail: str, column: int, width: int) -> str:
    """``head + ", ".join(items) + tail`` for a value that starts at ``column`` of its line,
    broken greedily before an item that would pass ``width`` columns; continuation lines
    are aligned under the first item."""
    indent = " " * (column + len(head))
    lines: list[str] = []
    cur, start = head, column
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else tail)
        if i and start + len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur, start = indent + piece, 0
        else:
            cur = cur + (" " if i else "") + piece
    lines.append(cur)
    return "\n".join(lines)


def _py_ctype(name: str) -> str:
    """Python source for an ABI type name of :mod:`evaluators.abi` (``EvoTensor*`` ->
    ``ctypes.POINTER(EvoTensor)``), as the exported op.py spells it."""
    if name == "EvoTensor*":
        return "ctypes.POINTER(EvoTensor)"
    if name.endswith("*"):
        return f"ctypes.POINTER(ctypes.{name[:-1]})"
    return f"ctypes.{name}"


def abi_fields() -> dict[str, str]:
    """The ABI fields of ``op.py.tmpl``, rendered from :mod:`evaluators.abi` (the one Python
    statement of ``evo_abi.h``): the struct, dtype codes and entry-point signatures."""
    from evaluators import abi

    if abi.WORKSPACE_ARGS != abi.LAUNCH_ARGS[:-1]:  # op.py.tmpl writes ws.argtypes = fn.argtypes[:-1]
        raise ExportTemplateError("evaluators.abi.WORKSPACE_ARGS is no longer LAUNCH_ARGS[:-1]; "
                                  "op.py.tmpl binds evo_workspace_bytes that way: update it")
    fields = ["["]
    for name, ct, n in abi.EVO_TENSOR_FIELDS:
        size = "" if n is None else (" * _MAX_DIMS" if n == abi.MAX_DIMS else f" * {n}")
        fields.append(f'        ("{name}", ctypes.{ct}{size}),')
    fields.append("    ]")
    codes = [f"torch.{dt}: {code}" for dt, code in abi.EVO_DTYPES.items()]
    return {
        "abi_version": str(abi.ABI_VERSION),
        "max_dims": str(abi.MAX_DIMS),
        "evo_tensor_fields": "\n".join(fields),
        # wrapped where op.py.tmpl places them: a module constant (88 columns) and a code line (120)
        "dtype_codes": _wrap_items("{", codes, "}", column=len("_DTYPE_CODES = "), width=88),
        "launch_argtypes": _wrap_items("[", [_py_ctype(t) for t in abi.LAUNCH_ARGS], "]",
                                       column=len("                fn.argtypes = "), width=120),
        "launch_restype": _py_ctype(abi.LAUNCH_RESTYPE),
        "workspace_restype": _py_ctype(abi.WORKSPACE_RESTYPE),
    }


def build_script(arch: str, extra_flags: Sequence[str] = ()) -> str:
    """``build.sh``: rebuild ``kernel_<ARCH>.so`` from kernel.cu (``bash build.sh sm_100a``)."""
    return render_template("build.sh", arch=arch, extra_flags=" ".join(_shell_quote(f) for f in extra_flags))


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _reference_module(task: "Task") -> tuple[str, str]:
    """``(reference.py text, note)``; the note is non-empty when the reference or the input
    generator could not be copied (the test then skips, saying why)."""
    from evo.tasks.inputs import TensorInputs

    note = ""
    try:
        ref_src, ref_name = standalone_source(task.reference)
    except NotStandaloneError as e:
        note = f"the reference of {task.name} cannot be copied standalone: {e}"
        ref_src, ref_name = (
            f"def _unavailable(*args):\n    raise RuntimeError({note!r})\n", "_unavailable")
    inputs_block: str
    if isinstance(task.make_inputs, TensorInputs):
        specs = [{"dims": list(s.dims), "structure": s.structure} for s in task.make_inputs.specs]
        # The sampler is copied from evo.tasks.inputs, so the export draws exactly what the
        # harness draws (it uses only torch and this module's DISTRIBUTIONS).
        from evo.tasks.inputs import sample

        inputs_block = (f"INPUT_SPECS = {specs!r}\nINPUT_DTYPE = {task.make_inputs.dtype!r}\n\n\n"
                        + textwrap.dedent(inspect.getsource(sample)) + "\n\n"
                        + render_template("tensor_inputs.py"))
    else:
        try:
            gen_src, gen_name = standalone_source(task.make_inputs)
            inputs_block = gen_src + f"\n\nmake_inputs = {gen_name}\n"
        except NotStandaloneError as e:
            note = note or f"the input generator of {task.name} cannot be copied standalone: {e}"
            inputs_block = ("def make_inputs(shape, generator, dist, device):\n"
                            f"    raise RuntimeError({note!r})\n")
    tol = task.tolerance
    text = render_template(
        "reference.py",
        task_repr=repr(task.name), description=textwrap.fill(task.description, 90),
        dtype=task.dtype, reference_dtype=task.reference_dtype,
        scalars_repr=repr(tuple(task.scalars)), shapes_repr=repr([dict(s) for s in task.shapes]),
        bench_shapes_repr=repr(int(task.bench_shapes)), distributions_repr=repr(list(task.distributions)),
        atol_repr=repr(tol.atol), rtol_repr=repr(tol.rtol), rel_l2_repr=repr(tol.rel_l2),
        atol_relative_repr=repr(bool(tol.atol_relative)),
        reference_module=task.reference.__module__ if hasattr(task.reference, "__module__") else "?",
        reference_src=ref_src, reference_name=ref_name, inputs_block=inputs_block,
    )
    return text, note


# --------------------------------------------------------------------------- helpers


def _reference_params(task: "Task", n_inputs: int) -> list[str]:
    """Python identifiers for the op's arguments: the reference's parameter names."""
    names: list[str] = []
    try:
        sig = inspect.signature(task.reference)
        names = [p.name for p in sig.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        pass
    if len(names) != n_inputs or len(set(names)) != n_inputs or not all(n.isidentifier() for n in names):
        names = [f"x{i}" for i in range(n_inputs)]
    reserved = {"torch", "ctypes", "typing", "outs", "inputs"}
    return [f"{n}_" if n in reserved else n for n in names]


def _io_dims(task: "Task") -> tuple[list[tuple[str, ...]] | None, list[tuple] | None, int]:
    """(input dims, output dims or None, number of inputs) from the task's declarations."""
    from evo.tasks.counts import TensorBytes
    from evo.tasks.inputs import TensorInputs

    ins = outs = None
    if isinstance(task.make_inputs, TensorInputs):
        ins = [tuple(s.dims) for s in task.make_inputs.specs]
    if isinstance(task.bytes, TensorBytes):
        outs = [tuple(o) for o in task.bytes.outputs]
        if ins is None:
            ins = [tuple(s.dims) for s in task.bytes.inputs]
    if ins is not None:
        return ins, outs, len(ins)
    try:
        params = inspect.signature(task.reference).parameters.values()
        n = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    except (TypeError, ValueError) as e:
        raise ExportError(f"cannot tell how many inputs task {task.name!r} takes: its make_inputs is not "
                          f"a TensorInputs and its reference has no signature ({e})") from None
    return None, outs, n


def _output_dtypes(task: "Task", in_dims: list[tuple] | None) -> list[str] | None:
    """Per output, the dtype the op returns: the task dtype for floating outputs, the
    reference's own for integer / boolean ones (argmax indices, masks), found by running the
    reference on meta tensors of the smallest shape. None: every output in the task dtype
    (the inputs' dims are unknown, or the reference does not run on meta tensors)."""
    import torch

    from evo.tasks.inputs import TensorInputs

    if in_dims is None:
        return None
    in_dtype = task.make_inputs.dtype if isinstance(task.make_inputs, TensorInputs) else task.dtype
    shape = min(task.shapes, key=lambda s: task.bytes(s))
    try:
        metas = [torch.empty(tuple(shape[d] if isinstance(d, str) else d for d in dims),
                             dtype=getattr(torch, in_dtype), device="meta") for dims in in_dims]
        outs = task.reference(*metas)
    except Exception:  # noqa: BLE001 - a reference that needs real data: assume floating outputs
        return None
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [task.dtype if o.is_floating_point() else str(o.dtype).replace("torch.", "") for o in outs]


def _timings(ev: Evaluation) -> dict[str, Any]:
    t = ev.stage("timing")
    if t is None:
        return {}
    keep = ("shape", "median_ms", "iqr_ms", "ref_median_ms", "ref_iqr_ms", "speedup", "sol_ms", "pct_sol",
            "input_copies")
    shapes = [{k: row.get(k) for k in keep if k in row} for row in t.metrics.get("shapes", []) if isinstance(row, dict)]
    out: dict[str, Any] = {"shapes": shapes}
    for k in ("reps", "warmup", "flush_mb", "fitness"):
        if k in t.metrics:
            out[k] = t.metrics[k]
    out["stage_seconds"] = t.seconds
    return out


def _compile_resources(ev: Evaluation) -> dict[str, Any]:
    c = ev.stage("compile")
    if c is None:
        return {}
    keep = ("registers", "smem_bytes", "stack_frame", "spill_stores", "spill_loads", "wgmma_serialized",
            "nvcc_seconds", "so_size")
    return {k: c.metrics[k] for k in keep if k in c.metrics}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _versions(settings: "CompileSettings") -> dict[str, str | None]:
    """nvcc and CUTLASS versions of this machine (None where unavailable)."""
    out: dict[str, str | None] = {"nvcc": None, "cutlass": None}
    try:
        from evaluators.compile import cutlass_version

        out["cutlass"] = cutlass_version()
    except Exception as e:  # noqa: BLE001 - any failure means "unknown"
        log.info("CUTLASS version unknown: %s", e)
    try:
        from evaluators.compile import find_nvcc, nvcc_version

        out["nvcc"] = nvcc_version(find_nvcc(settings))
    except Exception as e:  # noqa: BLE001
        log.info("nvcc version unknown: %s", e)
    return out


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


def _lineage_ids(store: "Store", cid: str, run_id: str) -> dict[str, Any]:
    from evo.lineage import first_parent_chain

    chain = first_parent_chain(store, cid, run_id=run_id)
    return {
        "first_parent_chain": [
            {"id": s.candidate.id, "operator": s.candidate.operator, "generation": s.candidate.generation,
             "fitness": s.fitness, "other_parents": list(s.other_parents)}
            for s in chain
        ],
        "ancestors": [c.id for c in store.ancestry(cid)[1:]],
    }


# --------------------------------------------------------------------------- export


def _export_one(store: "Store", run: Mapping[str, Any], choice: Choice, out_dir: Path,
                settings: "CompileSettings", build: bool) -> ExportedTask:
    import evo.tasks as T
    from evaluators.compile import abi_include_dir

    run_id = run["id"]
    cand: Candidate = store.get_candidate(choice.candidate_id)
    ev = store.get_evaluation(cand.id, run_id)
    if ev is None or not ev.correct:
        status = ev.status.value if ev else "not evaluated"
        raise ExportError(f"candidate {cand.id[:16]} ({cand.task}) is not correct in run {run_id} "
                          f"({status}); only correct kernels are exported (see `evo top {run_id}`)")
    try:
        task = T.get_task(cand.task)
    except KeyError as e:
        raise ExportError(f"task {cand.task!r} is not registered in this install (a user task? pass its "
                          f"file with --task-file): {e}") from None
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
                so_path = d / f"kernel_{settings.arch}.so"
                so_path.write_bytes(outcome.so_bytes)
                compile_info = {"cache_key": outcome.key, "cached": outcome.cached,
                                **_compile_resources(Evaluation(cand.id, (outcome.result,)))}
            else:
                so_note = (f"the rebuild for {settings.arch} failed ({outcome.result.status.value}: "
                           f"{outcome.result.reason}); see build.sh")
    else:
        so_note = "not built (build disabled); run: bash build.sh"
    if so_note:
        log.warning("%s: %s", cand.task, so_note)

    ref_text, test_note = _reference_module(task)
    (d / "reference.py").write_text(ref_text, encoding="utf-8")

    in_dims, out_dims, n_in = _io_dims(task)
    names = _reference_params(task, n_in)
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
        output_dtypes_repr=repr(_output_dtypes(task, in_dims)),
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

    versions = _versions(settings)
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
        "lineage": _lineage_ids(store, cand.id, run_id),
        "gpu": ev.gpu or env.get("gpu"),
        "gpu_capability": env.get("capability"),
        "driver": env.get("driver"),
        "cuda": env.get("cuda"),
        "torch": env.get("torch"),
        "python": env.get("python"),
        "protocol": env.get("protocol"),
        "cutlass": versions["cutlass"],
        "nvcc": versions["nvcc"],
        "arch": settings.arch,
        "compile_flags": list(settings.extra_flags),
        "timings": _timings(ev),
        "compile": compile_info or _compile_resources(ev),
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
    manifest["files"] = {f: _sha256(d / f) for f in files}
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
    on_task: Callable[[str, int, int], None] | None = None,
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
    """
    run_id, cid = resolve_target(store, target)
    run = store.get_run(run_id)
    from evo.tasks.user import TaskFileError, load_run_task_files

    try:  # the run's user tasks: their references and inputs go into the export
        load_run_task_files(run.get("config"), run_id)
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
            exported.append(_export_one(store, run, ch, out, settings, build))
        except OSError as e:
            raise ExportError(f"cannot write the export of {ch.task} into {out}: {e}") from e
    if on_task is not None:
        on_task("", len(choices), len(choices))
    result = ExportResult(run_id, out, tuple(exported), skipped)
    summary = result.as_dict()
    summary["exported_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out / "export.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result
