"""What an export takes from its task: ``reference.py`` (the reference, input generator and
tolerance copied as plain torch code) and the op's signature (argument names, input and
output dims, output dtypes)."""

from __future__ import annotations

import inspect
import textwrap
from typing import TYPE_CHECKING

from evo.results.export.errors import ExportError, NotStandaloneError
from evo.results.export.render import render_template
from evo.results.export.source import standalone_source

if TYPE_CHECKING:  # pragma: no cover
    from evo.tasks.base import Task

__all__ = ["reference_module", "reference_params", "io_dims", "output_dtypes"]


def reference_module(task: "Task") -> tuple[str, str]:
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


def reference_params(task: "Task", n_inputs: int) -> list[str]:
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


def io_dims(task: "Task") -> tuple[list[tuple[str, ...]] | None, list[tuple] | None, int]:
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


def output_dtypes(task: "Task", in_dims: list[tuple] | None) -> list[str] | None:
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
