"""The profiled program: ``python -m evaluators.child.profile JOBDIR`` (run under ncu).

Spawned by :func:`evaluators.profile.profile_candidate` inside ``ncu``; it calls a built,
already-correct candidate on one benchmark shape so ncu can capture exactly its kernels:

1. read ``JOBDIR/job.json`` (task, task files, shape, seed, warm-up count, range name);
2. build the task's inputs on the GPU (first distribution, fixed seed) and size the outputs
   by running the reference once (these torch kernels run *outside* the NVTX range);
3. ``ctypes``-load ``JOBDIR/kernel.so`` (:mod:`evaluators.child.abi`), call it ``warmup`` times,
   synchronise;
4. call it once between ``torch.cuda.nvtx.range_push(<range>)`` and ``range_pop()``, on
   the same thread (ncu's NVTX filter matches ranges of the launching thread), synchronise;
5. write ``result.json`` (``ok``, ``gpu``, ``seconds`` or ``error``) and exit.

Exit codes: 0 with ``ok: true``; 0 with ``ok: false`` when the candidate failed (bad
return code, CUDA error): the parent reports ``crash``; 2 for a usage error. A CUDA fault
may also kill the process, which the parent sees as a missing result.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _write(jobdir: Path, data: dict[str, Any]) -> None:
    tmp = jobdir / "result.json.tmp"
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, jobdir / "result.json")


def _load_task(name: str, files: list[str]) -> Any:
    from evaluators.child.harness import _load_task as load  # one rule for every child

    return load(name, files)


def run(jobdir: Path) -> dict[str, Any]:
    """Do the job; returns the result dict (raises only for setup failures)."""
    import torch

    from evaluators.child import abi

    t0 = time.monotonic()
    job = json.loads((jobdir / "job.json").read_text())
    if not torch.cuda.is_available():
        raise RuntimeError("the profile child sees no CUDA device")
    task = _load_task(job["task"], list(job.get("task_files") or []))
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    shape = {str(k): int(v) for k, v in job["shape"].items()}
    gen = torch.Generator(device="cuda").manual_seed(int(job.get("seed", 0)))
    inputs = task.make_inputs(shape, gen, task.distributions[0], "cuda")
    with torch.no_grad():
        ref = task.reference(*inputs)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    outputs = [torch.empty_like(r) for r in refs]
    del ref, refs
    kernel = abi.load_kernel(jobdir / job.get("so", "kernel.so"))
    scalars = tuple(float(s) for s in task.scalars)
    stream = torch.cuda.current_stream()
    handle = int(stream.cuda_stream)
    torch.cuda.synchronize()

    def call(workspace: Any = abi.AUTO) -> str | None:
        rc = kernel.launch(inputs, outputs, scalars, handle, workspace)
        if rc != 0:
            return f"evo_launch returned {kernel.error_name(rc)} ({rc})"
        err = kernel.last_error()
        if err:
            return f"cudaGetLastError after evo_launch: {kernel.error_name(err)} ({err})"
        return None

    for _ in range(int(job.get("warmup", 1))):
        bad = call()
        if bad:
            return {"ok": False, "error": bad}
    # the workspace fill is a kernel too: it runs before the profiled range, not inside it
    ws = kernel.make_workspace(inputs, outputs, scalars)
    torch.cuda.synchronize()
    name = str(job.get("nvtx_range", "evo_candidate"))
    torch.cuda.nvtx.range_push(name)
    try:
        bad = call(ws)
    finally:
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    if bad:
        return {"ok": False, "error": bad}
    return {"ok": True, "gpu": torch.cuda.get_device_name(0), "shape": shape,
            "seconds": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m evaluators.child.profile JOBDIR", file=sys.stderr)
        return 2
    jobdir = Path(argv[0])
    try:
        result = run(jobdir)
    except Exception as e:  # noqa: BLE001 - reported to the parent as data
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    _write(jobdir, result)
    sys.stdout.flush()
    sys.stderr.flush()
    if not result.get("ok"):
        # Skip interpreter teardown: after a CUDA fault, freeing device memory can hang.
        os._exit(0)
    return 0


if __name__ == "__main__":  # pragma: no cover - entry point
    sys.exit(main())
