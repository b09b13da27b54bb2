"""What LLM prompts may know, read from the lineage store and the task suite.

:class:`StoreContextProvider` implements :class:`mutators.llm.prompt.context.PromptContextProvider` for the
engine's driver (it reads the same store the driver writes, in the same process):

- :func:`task_info`: the reference's source with the module constants and same-module
  helpers it uses (``RMSNORM_EPS = 1e-06`` is part of the function), the task's description
  (layouts such as "A stored [K, M]", structure such as "A, B symmetric"), each tensor of
  ``evo_launch``'s ``in`` / ``out`` with its dims, dtype and structure (outputs found by
  running the reference on meta tensors), shapes, tolerance and the speed-of-light bound;
- :meth:`StoreContextProvider.parent_facts`: the parent's measured times per benchmark
  shape against torch (and % of speed of light), ptxas resources per kernel (registers,
  shared memory, spills, stack; wgmma serialisation), and the profile through the readable
  :func:`evaluators.profile.format_profile` (kernel names demangled to
  ``evo_seed::matvec_kernel<4>``), but only under the profile rule below;
- :meth:`StoreContextProvider.failure`: the failed stage, its status and its text; for a
  compile error the whole (head + tail trimmed) log, because the candidate's own frames of
  a template-instantiation chain come last and the ``errors`` excerpt cuts them off; for a
  policy rejection every violation with its line, source line and rule (the policy's
  ``violations`` artifact: its ``reason`` names only the first);

The profile rule lives here: profile numbers are shown only for parents whose lineage depth
(generations since the seed or genesis) is at least ``feedback_after``, so structure is
settled before prompts start tuning to counters (the delayed-profiling finding of the
CuTeGen paper).
"""

from __future__ import annotations

import dis
import functools
import inspect
import logging
import re
import types
from importlib import resources
from typing import Any, Callable

from mutators.llm.prompt.card import CardFacts, example_kernel, render_card
from mutators.llm.prompt.context import ParentFacts, ShapeTiming, TaskInfo

__all__ = ["StoreContextProvider", "task_info", "reference_text", "tensors_text", "short_kernel_name",
           "ptxas_text", "card_facts", "reference_card", "genesis_example", "EXAMPLE_SEEDS"]

log = logging.getLogger(__name__)

_CONST_TYPES = (int, float, str, bool, tuple)


def _abi_text() -> str:
    return resources.files("evaluators.abi").joinpath("evo_abi.h").read_text()


def card_facts() -> CardFacts:
    """The facts of the CuTe reference card, read where they live: the CUTLASS version of
    the headers a build uses (:func:`evaluators.compile.toolchain.cutlass_version`), the
    policy's include allowlist and rules (:mod:`evaluators.policy`), the ABI header."""
    from evaluators.compile.toolchain import CutlassNotFound, cutlass_version
    from evaluators.policy import ALLOWED_INCLUDE_PATTERNS, POLICY_RULES

    try:
        version = cutlass_version()
    except CutlassNotFound:
        version = "(version unknown: the nvidia-cutlass wheel is not installed where prompts are rendered)"
    return CardFacts(version, tuple(ALLOWED_INCLUDE_PATTERNS), tuple((r.name, r.reason) for r in POLICY_RULES),
                     _abi_text())


@functools.lru_cache(maxsize=1)
def reference_card() -> str:
    """The CuTe reference card of this installation (:func:`mutators.llm.prompt.card.render_card`)."""
    return render_card(card_facts())


#: The seeds a genesis prompt shows as its example, first choice first: a task whose own seed
#: comes from the first one's template gets the second (an example is not the answer).
EXAMPLE_SEEDS = ("kb04_matvec", "kb19_relu")


def genesis_example(task: Any) -> str:
    """The example kernel of ``task``'s genesis prompt (:data:`EXAMPLE_SEEDS`)."""
    from evo.tasks.seeds import UnknownSeedError, seed_source, seed_spec

    try:
        own = seed_spec(task.seed or task.name).template
    except UnknownSeedError:
        own = None
    name = next(n for n in EXAMPLE_SEEDS if seed_spec(n).template != own)
    return example_kernel(seed_source(name), _abi_text())


def _names(code: types.CodeType) -> set[str]:
    """Global names the code reads (``LOAD_GLOBAL``; attribute names such as ``F.gelu``'s
    ``gelu`` are not globals), nested functions and comprehensions included."""
    out = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return {n for n in out if isinstance(n, str)}


def reference_text(fn: Callable[..., Any], max_helpers: int = 6) -> str:
    """The source of ``fn`` with the module constants and same-module helper functions it
    uses (transitively, up to ``max_helpers``), constants first."""
    try:
        main = inspect.getsource(fn)
    except (OSError, TypeError):  # e.g. a builtin torch op used directly as the reference
        return f"# reference: {getattr(fn, '__qualname__', repr(fn))}"
    module = getattr(fn, "__module__", None)
    g = getattr(fn, "__globals__", {}) or {}
    consts: dict[str, Any] = {}
    helpers: list[str] = []
    seen = {getattr(fn, "__name__", "")}
    todo = [fn]
    while todo:
        f = todo.pop(0)
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        for n in sorted(_names(code)):
            if n in seen or n.startswith("__") or n not in g:
                continue
            v = g[n]
            if isinstance(v, _CONST_TYPES) and not isinstance(v, type) and len(repr(v)) <= 200:
                seen.add(n)
                consts[n] = v
            elif isinstance(v, types.FunctionType) and v.__module__ == module and len(helpers) < max_helpers:
                seen.add(n)
                try:
                    helpers.append(inspect.getsource(v).rstrip())
                except (OSError, TypeError):
                    continue
                todo.append(v)
    parts = []
    if consts:
        parts.append("# module-level constants the reference uses\n" + "\n".join(f"{k} = {v!r}" for k, v in consts.items()))
    parts += helpers
    parts.append(main.rstrip())
    return "\n\n".join(parts)


def _dim_names(values_a: tuple[int, ...], values_b: tuple[int, ...], shape_a: dict, shape_b: dict) -> list[str]:
    out = []
    for va, vb in zip(values_a, values_b):
        names = [k for k in shape_a if shape_a[k] == va and shape_b.get(k) == vb]
        out.append(names[0] if names else (str(va) if va == vb else "?"))
    return out


def tensors_text(task: Any) -> str:
    """One line per input and output of ``evo_launch``: name, dims, dtype, structure ("" if unknown)."""
    from evo.tasks.registry import format_shape

    mi = task.make_inputs
    specs = getattr(mi, "specs", None)
    if specs is None or not hasattr(mi, "sizes"):
        return ""
    try:
        names = list(inspect.signature(task.reference).parameters)
    except (TypeError, ValueError):
        names = []
    bench = dict(task.shapes[0])
    lines = []
    for i, spec in enumerate(specs):
        dims = ", ".join(str(d) for d in spec.dims)
        size = spec.size(bench)
        nm = names[i] if i < len(names) else f"in{i}"
        struct = "" if spec.structure == "dense" else f", {spec.structure}"
        lines.append(f"  - in[{i}] `{nm}`: {task.dtype} [{dims}] (at {format_shape(bench)}: "
                     f"{list(size)}{struct}), contiguous row-major")
    lines += _outputs(task, specs) or ["  - outputs: as the reference returns them, contiguous row-major"]
    if task.scalars:
        lines.append(f"  - scalars: {list(task.scalars)} (evo_launch's `scalars` array)")
    return "\n".join(lines)


def _outputs(task: Any, specs: Any) -> list[str]:
    try:
        import torch

        from evo.tasks.inputs import torch_dtype

        dt = torch_dtype(task.dtype)

        def run(shape: dict) -> list:
            metas = [torch.empty(s.size(shape), dtype=dt, device="meta") for s in specs]
            out = task.reference(*metas)
            return list(out) if isinstance(out, (tuple, list)) else [out]

        bench = dict(task.shapes[0])
        other = dict(task.shapes[-1]) if len(task.shapes) > 1 else bench
        outs_a, outs_b = run(bench), run(other)
    except Exception as e:  # a reference meta tensors cannot run: say less, not wrong
        log.debug("outputs of %s not derived on meta tensors: %s", task.name, e)
        return []
    lines = []
    for j, (a, b) in enumerate(zip(outs_a, outs_b)):
        dims = _dim_names(tuple(a.shape), tuple(b.shape), bench, other)
        dtype = str(a.dtype).replace("torch.", "")
        lines.append(f"  - out[{j}]: {dtype} [{', '.join(dims)}] (at the first shape: {list(a.shape)}), "
                     "contiguous row-major, allocated by the harness")
    return lines


def task_info(task_name: str, gpu_name: str | None = None, task_registry=None) -> TaskInfo:
    """Prompt facts of a task (see module docstring), looked up in ``task_registry`` (None:
    the built-in tasks)."""
    from evo.tasks import gpus as G
    from evo.tasks.registry import BUILTIN_TASKS, format_shape

    task = (BUILTIN_TASKS if task_registry is None else task_registry).get(task_name)
    shapes = "\n".join(
        f"  - {format_shape(s)}{' (benchmarked)' if i < task.bench_shapes else ' (checked)'}"
        for i, s in enumerate(task.shapes)
    )
    tol = task.tolerance
    tol_text = (f"max |out - ref| <= {tol.atol:g}{' x rms(ref)' if tol.atol_relative else ''} + {tol.rtol:g} * |ref| "
                f"elementwise and ||out - ref|| / ||ref|| <= {tol.rel_l2:g}; inputs drawn from "
                f"{', '.join(task.distributions)}")
    sol = ""
    try:
        spec = G.get_gpu(gpu_name) if gpu_name else (G.detect_gpu() or G.get_gpu("H200"))
        shape = task.shapes[0]
        # the bound the harness rejects against (datasheet bandwidth: a pure-read kernel may beat a copy)
        sol_ms = G.speed_of_light_ms(task, shape, spec, bandwidth_gbs=spec.datasheet_bandwidth_gbs)
        sol = (f"{sol_ms:.4f} ms on {spec.name} at {format_shape(shape)} ({task.flops(shape) / 1e9:.1f} GFLOP, "
               f"{task.bytes(shape) / 1e6:.1f} MB compulsory traffic at {spec.datasheet_bandwidth_gbs:g} GB/s); "
               "a faster measurement is rejected as invalid")
    except KeyError as e:
        log.debug("no speed-of-light text for %s: %s", task_name, e)
    try:
        tensors = tensors_text(task)
    except Exception as e:  # a user task whose inputs do not describe themselves
        log.debug("no tensor list for %s: %s", task_name, e)
        tensors = ""
    return TaskInfo(reference_src=reference_text(task.reference), abi_text=_abi_text(), shapes_text=shapes,
                    dtype=task.dtype, tolerance_text=tol_text, sol_text=sol, description=task.description or "",
                    tensors_text=tensors, card=reference_card(), example_kernel=genesis_example(task))


def short_kernel_name(name: str) -> str:
    """A readable kernel name from an Itanium-mangled one (``_ZN8evo_seed13matvec_kernelILi4EEEv...``
    -> ``evo_seed::matvec_kernel<4>``); other names trimmed to 100 characters."""
    if not name.startswith("_Z"):
        return name[:100]
    s, i = name[2:], 0
    if s.startswith("N"):
        i = 1
    parts: list[str] = []
    while i < len(s) and s[i].isdigit():
        j = i
        while j < len(s) and s[j].isdigit():
            j += 1
        n = int(s[i:j])
        parts.append(s[j:j + n])
        i = j + n
    if not parts:
        return name[:100]
    out = "::".join(parts)
    if s[i:i + 1] == "I":
        depth, k = 0, i  # I...E template lists and L...E literals nest (names inside are skipped)
        while k < len(s):
            if s[k] in "IL":
                depth += 1
            elif s[k] == "E":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        region = s[i:k + 1]
        args = re.findall(r"L[a-z](n?\d+)E", region)
        out += "<" + ", ".join(a.replace("n", "-") for a in args) + ">" if args else "<...>"
    return out


def ptxas_text(metrics: dict[str, Any], artifacts: dict[str, str] | None = None) -> str:
    """One line per kernel of a compile stage's ptxas report ("" when there is none)."""
    kernels = metrics.get("kernels") or {}
    if not isinstance(kernels, dict) or not kernels:
        return ""
    lines = []
    for name, r in kernels.items():
        if not isinstance(r, dict):
            continue
        lines.append(f"- {short_kernel_name(str(name))}: {r.get('registers', 0)} registers/thread, "
                     f"{r.get('smem_bytes', 0)} B static shared memory, {r.get('spill_stores', 0)} B spill stores / "
                     f"{r.get('spill_loads', 0)} B spill loads, {r.get('stack_frame', 0)} B stack")
    if metrics.get("wgmma_serialized"):
        why = (artifacts or {}).get("wgmma_serialization", "").strip().splitlines()
        lines.append("- wgmma.mma_async instructions are SERIALIZED (the tensor-core pipeline is lost)"
                     + (f": {why[0][:200]}" if why else ""))
    return "\n".join(lines)


class StoreContextProvider:
    """PromptContextProvider over a run in the store (see module docstring); the tasks are
    looked up in ``task_registry`` (the search's; None: the built-in tasks)."""

    def __init__(self, store, run_id: str, *, feedback_after: int = 3, gpu_name: str | None = None,
                 task_registry=None) -> None:
        self.store = store
        self.run_id = run_id
        self.feedback_after = feedback_after
        self.gpu_name = gpu_name
        self.task_registry = task_registry
        self._task_info: dict[str, TaskInfo] = {}

    def task_info(self, task: str) -> TaskInfo:
        if task not in self._task_info:
            self._task_info[task] = task_info(task, self.gpu_name, self.task_registry)
        return self._task_info[task]

    def _chain(self, candidate_id: str) -> list:
        """First-parent chain, the candidate first."""
        chain, cur = [], self.store.get_candidate(candidate_id)
        while True:
            chain.append(cur)
            if not cur.parents or len(chain) > 10_000:
                return chain
            cur = self.store.get_candidate(cur.parents[0])

    def history(self, candidate_id: str) -> list[tuple[int, float | None]]:
        out = []
        for c in reversed(self._chain(candidate_id)):
            ev = self.store.get_evaluation(c.id, self.run_id)
            out.append((c.generation, ev.fitness if ev is not None and ev.correct else None))
        return out

    def inspirations(self, task: str, island: int, n: int) -> list[tuple[str, float, dict[str, str]]]:
        """Up to ``n`` ``(source, fitness, params)`` of the best members of other islands."""
        if n <= 0:
            return []
        out, seen_src = [], set()
        for cand, fit in self.store.top_k(self.run_id, task=task, k=4 * n + 4):
            if cand.island == island or cand.source in seen_src:
                continue
            seen_src.add(cand.source)
            out.append((cand.source, fit, cand.params_dict))
            if len(out) == n:
                break
        return out

    def _profile_allowed(self, candidate_id: str) -> bool:
        from evo.engine.survivors import profile_visible

        return profile_visible(len(self._chain(candidate_id)) - 1, self.feedback_after)

    def profile(self, candidate_id: str) -> dict[str, Any] | None:
        if not self._profile_allowed(candidate_id):
            return None
        return self.store.get_profile(candidate_id)

    def parent_facts(self, candidate_id: str) -> ParentFacts | None:
        from evaluators.profile import format_profile
        from evo.tasks.registry import format_shape

        ev = self.store.get_evaluation(candidate_id, self.run_id)
        if ev is None:
            return None
        timings = []
        timing = ev.stage("timing")
        for row in (timing.metrics.get("shapes") or []) if timing is not None else []:
            try:
                timings.append(ShapeTiming(format_shape(row["shape"]), float(row["median_ms"]),
                                           float(row["ref_median_ms"]),
                                           None if row.get("pct_sol") is None else float(row["pct_sol"])))
            except (KeyError, TypeError, ValueError):
                continue
        comp = ev.stage("compile")
        ptxas = ptxas_text(comp.metrics, comp.artifacts) if comp is not None else ""
        prof_text = ""
        prof = self.profile(candidate_id)
        if prof:
            m = dict(prof)
            if isinstance(m.get("kernel"), str):
                m["kernel"] = short_kernel_name(m["kernel"])
            prof_text = format_profile(m)
        return ParentFacts(tuple(timings), ptxas, prof_text)

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None:
        ev = self.store.get_evaluation(candidate_id, self.run_id)
        st = ev.failed_stage if ev is not None else None
        if st is None:
            return None
        if st.stage == "compile":
            text = st.artifacts.get("log") or st.artifacts.get("errors") or st.reason
        elif st.stage == "policy":  # every violation with its line and source (the reason names only the first)
            text = st.artifacts.get("violations") or st.reason
        else:
            text = st.artifacts.get("errors") or st.reason
        return st.stage, st.status.value, text
