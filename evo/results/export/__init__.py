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

The generated files are templates in ``templates/*.tmpl`` (package data), rendered by
:func:`~evo.results.export.render.render_template`; op.py's copy of the ABI struct, dtype
codes and entry-point signatures is rendered from :mod:`evaluators.abi` (see
:func:`~evo.results.export.render.abi_fields`), itself checked against ``evo_abi.h`` by
``tests/test_abi_header.py``.

Which candidate: a task's confirmed champion (``Store.champions`` with
``confirmation.confirmed``), else its best correct candidate (``Store.top_k``); a task with no
correct candidate is skipped with a reason, never exported. An explicit id must be correct.

Errors: :class:`~evo.store.UnknownIdError` (no run and no candidate matches; names near
matches of both), :class:`~evo.results.export.errors.ExportError` (the candidate is not
correct, the output is not writable, an explicit ``--task`` the run lacks).

Modules: :mod:`.choose` (which candidate), :mod:`.source` (baked kernel source, copied Python
functions), :mod:`.task_io` (reference.py and the op's signature), :mod:`.render` (templates
and the ABI's fields), :mod:`.manifest` (manifest.json's facts), :mod:`.exporter` (the
export), :mod:`.errors`.
"""

from evo.results.export.choose import Choice, choose_champions, resolve_target
from evo.results.export.errors import ExportError, ExportTemplateError, NotStandaloneError
from evo.results.export.exporter import TEST_MAX_BYTES, ExportedTask, ExportResult, export
from evo.results.export.manifest import MANIFEST_VERSION
from evo.results.export.render import TEMPLATES_DIR, abi_fields, build_script, render_template, template_fields
from evo.results.export.source import bake_params, op_identifier, standalone_source

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
