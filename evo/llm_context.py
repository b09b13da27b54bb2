"""What LLM prompts may know, read from the lineage store and the task suite.

:class:`StoreContextProvider` implements :class:`mutators.llm.PromptContextProvider` for the
engine's driver (it reads the same store the driver writes, in the same process). The
profile rule lives here: profile numbers are shown only for parents whose lineage depth
(generations since the seed or genesis) is at least ``feedback_after``, so structure is
settled before prompts start tuning to counters (the delayed-profiling finding of the
CuTeGen paper).
"""

from __future__ import annotations

import inspect
import logging
from importlib import resources
from typing import Any

from mutators.llm import TaskInfo

__all__ = ["StoreContextProvider", "task_info"]

log = logging.getLogger(__name__)


def _abi_text() -> str:
    return resources.files("evo.tasks").joinpath("kernels/evo_abi.h").read_text()


def task_info(task_name: str, gpu_name: str | None = None) -> TaskInfo:
    """Prompt facts of a task: reference source, ABI header, shapes, dtype, tolerance, SOL."""
    from evo.tasks import get_task
    from evo.tasks import gpus as G
    from evo.tasks.registry import format_shape

    task = get_task(task_name)
    try:
        ref_src = inspect.getsource(task.reference)
    except (OSError, TypeError):  # e.g. a builtin torch op used directly as the reference
        ref_src = f"# reference: {getattr(task.reference, '__qualname__', repr(task.reference))}"
    shapes = "\n".join(
        f"- {format_shape(s)}{' (benchmarked)' if i < task.bench_shapes else ' (checked)'}"
        for i, s in enumerate(task.shapes)
    )
    tol = task.tolerance
    tol_text = (f"max |out - ref| <= {tol.atol:g} + {tol.rtol:g} * |ref| elementwise and "
                f"||out - ref|| / ||ref|| <= {tol.rel_l2:g}; inputs {', '.join(task.distributions)}")
    if task.scalars:
        tol_text += f"; scalars passed to evo_launch: {list(task.scalars)}"
    sol = ""
    try:
        spec = G.get_gpu(gpu_name) if gpu_name else (G.detect_gpu() or G.get_gpu("H200"))
        shape = task.shapes[0]
        sol = (f"speed of light on {spec.name} at {format_shape(shape)}: "
               f"{G.speed_of_light_ms(task, shape, spec):.4f} ms "
               f"({task.flops(shape) / 1e9:.1f} GFLOP, {task.bytes(shape) / 1e6:.1f} MB compulsory traffic)")
    except KeyError as e:
        log.debug("no speed-of-light text for %s: %s", task_name, e)
    return TaskInfo(reference_src=ref_src, abi_text=_abi_text(), shapes_text=shapes, dtype=task.dtype,
                    tolerance_text=tol_text, sol_text=sol)


class StoreContextProvider:
    """PromptContextProvider over a run in the store (see module docstring)."""

    def __init__(self, store, run_id: str, *, feedback_after: int = 3, gpu_name: str | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.feedback_after = feedback_after
        self.gpu_name = gpu_name
        self._task_info: dict[str, TaskInfo] = {}

    def task_info(self, task: str) -> TaskInfo:
        if task not in self._task_info:
            self._task_info[task] = task_info(task, self.gpu_name)
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

    def inspirations(self, task: str, island: int, n: int) -> list[tuple[str, float]]:
        if n <= 0:
            return []
        out, seen_src = [], set()
        for cand, fit in self.store.top_k(self.run_id, task=task, k=4 * n + 4):
            if cand.island == island or cand.source in seen_src:
                continue
            seen_src.add(cand.source)
            out.append((cand.source, fit))
            if len(out) == n:
                break
        return out

    def profile(self, candidate_id: str) -> dict[str, Any] | None:
        from evo.triggers import profile_visible

        if not profile_visible(len(self._chain(candidate_id)) - 1, self.feedback_after):
            return None
        return self.store.get_profile(candidate_id)

    def failure(self, candidate_id: str) -> tuple[str, str, str] | None:
        ev = self.store.get_evaluation(candidate_id, self.run_id)
        st = ev.failed_stage if ev is not None else None
        if st is None:
            return None
        text = st.artifacts.get("errors") or st.reason
        return st.stage, st.status.value, text
