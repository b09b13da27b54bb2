"""Fault-injecting fake stages for the fault tests and the soak benchmark (real Ray, fake work).

Faults are chosen per candidate, deterministically:

- by the candidate's ``notes`` (tests inject such candidates next to the seed):
  ``fault:compile-die-once`` / ``fault:compile-die-always`` (the compile worker process
  exits), ``fault:gpu-die-once`` / ``fault:gpu-die-always`` (the GPU evaluator actor's
  process exits mid-evaluation), ``fault:gpu-hang-once`` (the first evaluation announces
  itself in ``$EVO_FAULT_DIR/started-<id>`` with the actor id and blocks, so a test can
  ``ray.kill`` the actor mid-evaluation);
- or at a rate (``$EVO_FAULT_RATE``, e.g. 0.05, for the soak) by a hash of the candidate id:
  compile worker death (once), GPU actor death (once, 50 ms into the evaluation; at most ``$EVO_FAULT_GPU_DEATHS``
  per actor, default 3, because the runtime gives GPU actors ``max_restarts=4``), a
  simulated ``incorrect`` result, a simulated harness ``crash`` result.

With ``$EVO_FAULT_ENSURE`` set (the soak sets it), the first candidate to reach the compile
stage and the first to reach the GPU stage die there once as well, whatever their hash says: a
run of any length then meets both deaths, which the hash alone leaves to chance (the candidates
a run proposes follow the order Ray returns results in).

"Once" is remembered with marker files in ``$EVO_FAULT_DIR`` (shared by every worker on the
machine); every attempt is appended to ``$EVO_FAULT_DIR/attempts.log`` as ``stage id``.
Latencies: ``$EVO_FAULT_COMPILE_S`` / ``$EVO_FAULT_GPU_S`` seconds (default 0.02).
Set the variables before ``ray.init`` so the workers inherit them.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from evaluators.base import CompileSettings, HarnessSettings
from evo.core.records import Candidate, Evaluation, StageResult, Status

#: 8 tunables x 8 values (16.7 M points): a long search never exhausts the space.
SOAK_SOURCE = "// synthetic kernel for the soak benchmark\n#include \"evo_abi.h\"\n" + "".join(
    f"// @tunable {n} = {v[0]} in {{{', '.join(str(x) for x in v)}}}\n"
    for n, v in (("TILE_M", (16, 32, 48, 64, 96, 128, 192, 256)), ("TILE_N", (16, 32, 48, 64, 96, 128, 192, 256)),
                 ("TILE_K", (8, 16, 24, 32, 40, 48, 56, 64)), ("STAGES", (1, 2, 3, 4, 5, 6, 7, 8)),
                 ("VEC", (1, 2, 3, 4, 5, 6, 7, 8)), ("WARPS", (1, 2, 3, 4, 5, 6, 7, 8)),
                 ("UNROLL", (1, 2, 3, 4, 5, 6, 7, 8)), ("SWIZZLE", (0, 1, 2, 3, 4, 5, 6, 7)))
) + """extern "C" int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) { return 0; }
"""
SOAK_SEED = {"TILE_M": "16", "TILE_N": "16", "TILE_K": "8", "STAGES": "1", "VEC": "1", "WARPS": "1",
             "UNROLL": "1", "SWIZZLE": "0"}


#: How long a dying worker works before it dies (a death mid-task, not at its first instruction).
_MID = 0.05


def _dir() -> Path | None:
    d = os.environ.get("EVO_FAULT_DIR")
    return Path(d) if d else None


def _note(stage: str, cid: str) -> None:
    d = _dir()
    if d:
        with open(d / "attempts.log", "a") as f:
            f.write(f"{stage} {cid}\n")


def _first_time(tag: str, cid: str) -> bool:
    """True exactly once per (tag, candidate) across all processes (O_EXCL marker file)."""
    d = _dir()
    if d is None:
        return False
    try:
        fd = os.open(d / f"{tag}-{cid}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def rate_fault(cid: str) -> str:
    """The rate-based fault of a candidate id ('' for none)."""
    rate = float(os.environ.get("EVO_FAULT_RATE", "0") or 0)
    if rate <= 0:
        return ""
    h = int.from_bytes(hashlib.sha256(cid.encode()).digest()[:8], "big")
    if (h % 1_000_000) / 1_000_000 >= rate:
        return ""
    return ("compile-die-once", "gpu-die-once", "incorrect", "crash")[(h // 1_000_000) % 4]


def _ensured(stage: str, cid: str) -> bool:
    """With ``$EVO_FAULT_ENSURE``: whether ``cid`` is the first candidate to reach ``stage``
    (claimed with an O_EXCL marker holding its id, across all processes)."""
    d = _dir()
    if d is None or not os.environ.get("EVO_FAULT_ENSURE"):
        return False
    claim = d / f"ensured-{stage}"
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return claim.read_text() == cid
    try:
        os.write(fd, cid.encode())
    finally:
        os.close(fd)
    return True


def _fault(c: Candidate) -> str:
    if c.notes.startswith("fault:"):
        return c.notes[len("fault:"):].split()[0]
    return rate_fault(c.id)


def _score(params: dict[str, str]) -> float:
    return 1.0 + sum(int(v) for v in params.values() if v.isdigit()) / 1000.0


def fault_compile(candidate: Candidate, settings: CompileSettings):
    from evaluators.compile import CompileOutcome

    _note("compile", candidate.id)
    f = _fault(candidate)
    once = f == "compile-die-once" or _ensured("compile", candidate.id)
    if f == "compile-die-always" or (once and _first_time("compile", candidate.id)):
        time.sleep(_MID)
        os._exit(17)  # the worker process dies, as on OOM or a segfaulting compiler
    time.sleep(float(os.environ.get("EVO_FAULT_COMPILE_S", "0.02")))
    res = StageResult("compile", Status.OK, seconds=0.0)
    return CompileOutcome(result=res, so_bytes=b"\x7fELF-fake-" + candidate.id.encode(), key=candidate.id)


def _gpu_death_allowed() -> bool:
    import ray

    cap = int(os.environ.get("EVO_FAULT_GPU_DEATHS", "3"))
    d = _dir()
    if d is None:
        return False
    actor = ray.get_runtime_context().get_actor_id() or "none"
    p = d / f"gpu-deaths-{actor}"
    n = int(p.read_text()) if p.exists() else 0
    if n >= cap:
        return False
    p.write_text(str(n + 1))
    return True


def fault_evaluate(candidate: Candidate, so_bytes: bytes, settings: HarnessSettings) -> Evaluation:
    import ray

    _note("gpu", candidate.id)
    assert so_bytes.endswith(candidate.id.encode()), "GPU stage got another candidate's binary"
    f = _fault(candidate)
    once = f == "gpu-die-once" or _ensured("gpu", candidate.id)
    if f == "gpu-die-always" or (once and _gpu_death_allowed() and _first_time("gpu", candidate.id)):
        time.sleep(_MID)  # mid-evaluation, as a real death would be: the previous reply is out
        os._exit(18)
    if f == "gpu-hang-once" and _first_time("gpu", candidate.id):
        d = _dir()
        assert d is not None
        (d / f"started-{candidate.id}").write_text(ray.get_runtime_context().get_actor_id())
        time.sleep(120)  # killed from outside long before this ends
    time.sleep(float(os.environ.get("EVO_FAULT_GPU_S", "0.02")))
    if f == "incorrect":
        st = StageResult("correctness", Status.INCORRECT, reason="shape 0 trial 1: max abs err 3.2 (simulated)")
        return Evaluation(candidate.id, (st,), None, gpu="fake")
    if f == "crash":
        st = StageResult("correctness", Status.CRASH, reason="process killed by SIGSEGV (simulated)")
        return Evaluation(candidate.id, (st,), None, gpu="fake")
    fit = _score(candidate.params_dict)
    stages = (StageResult("correctness", Status.OK), StageResult("timing", Status.OK, metrics={"speedup": fit}))
    return Evaluation(candidate.id, stages, fit, gpu="fake")
