"""GPU-side adversarial corpus: kernel exploits and host attacks through the real harness.

Two halves, both with the static policy bypassed (the point is the layer behind it):

- kernel exploits of shared/EVALUATION.md not covered by tests/gpu/test_harness_gpu.py
  (tests/fixtures/bad/: precision downgrade bf16/tf32 on an fp32 GEMM, reading the
  reference's output, a side thread, two timing tricks): each must fail with the stage and
  status its header names;
- the host attacks of tests/fixtures/attacks/ in the real harness process (torch + CUDA,
  sandboxed like every runner): each must end with its header's ``runtime-expect``.

Every observation is printed as a Markdown row and, when ``EVO_ADVERSARIAL_TABLE`` names a
file, appended there for benchmarks/RELIABILITY.md:

    EVO_ADVERSARIAL_TABLE=/tmp/adv.md python -m pytest -q -m gpu tests/gpu/test_adversarial_gpu.py -s
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from pathlib import Path

import pytest

from evaluators import sandbox as sb
from evaluators.base import CompileSettings, HarnessSettings
from evaluators.harness_job import HarnessJob, HarnessReport
from evaluators.pipeline import judge_job
from evo.core.records import Candidate, Operator, Status
from fakes.listener import TcpListener  # noqa: E402

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parents[1]
BAD = TESTS / "fixtures" / "bad"
ATTACKS = TESTS / "fixtures" / "attacks"
SMALL = (1, 2)  # check shapes of kb19_relu and kb01_square (index 0 is the benchmark shape)
FAST = HarnessSettings(trials=5, warmup=2, reps=10, flush_mb=256, timeout_s=180)
KEY = "sk-attack-test-0123456789abcdefghij"
PORT = 47613
VICTIM_DB = Path("/tmp/evo-attack-victim.db")

KERNEL_EXPLOITS = {
    # name: (task, mode, shapes, bench, expected correctness, expected timing)
    "precision_bf16": ("kb01_square", "check", SMALL, None, {Status.INCORRECT}, None),
    "precision_tf32": ("kb01_square", "check", SMALL, None, {Status.INCORRECT}, None),
    "reads_reference": ("kb19_relu", "check", SMALL, None, {Status.INCORRECT, Status.CRASH}, None),
    "side_thread": ("kb19_relu", "check", SMALL, None, {Status.INCORRECT, Status.CRASH}, None),
    "timing_skip_if_written": ("kb19_relu", "check+time", SMALL, (0,), {Status.OK},
                               {Status.INVALID, Status.INCORRECT}),
    "timing_clock_gap": ("kb19_relu", "check+time", SMALL, (0,), {Status.OK}, {Status.INVALID, Status.INCORRECT}),
}


def _row(attack: str, expected: str, observed: str) -> None:
    line = f"| {attack} | {expected} | {observed} |"
    print(line)
    out = os.environ.get("EVO_ADVERSARIAL_TABLE")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def _header(path: Path) -> dict[str, str]:
    out = {}
    lines = path.read_text().splitlines()
    # the first comment block (bom_paste must start with its directive, after the BOM)
    for line in lines[next((i for i, ln in enumerate(lines) if ln.startswith("//")), 0):]:
        if not line.startswith("//"):
            break
        body = line[2:].strip()
        if ":" in body and body.split(":", 1)[0].replace("-", "").isalpha() and body[0].islower():
            k, v = body.split(":", 1)
            out[k.strip()] = v.strip()
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, object]:
    from evaluators.compile import compile_candidate

    cs = CompileSettings(cache_dir=str(tmp_path_factory.mktemp("cc")))
    paths = [BAD / f"{n}.cu" for n in KERNEL_EXPLOITS] + sorted(ATTACKS.glob("*.cu"))

    def build(p: Path):
        return p.stem, compile_candidate(Candidate.create("kb19_relu", p.read_text(), {}, operator=Operator.USER), cs)

    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(build, paths))


def _run(so: bytes, name: str, task: str, mode: str, shapes, bench, settings=FAST, sandbox=None) -> HarnessReport:
    rep = judge_job(HarnessJob(task=task, candidate_id=name, so_bytes=so, mode=mode, shapes=shapes,
                                  bench_shapes=bench), settings, sandbox=sandbox)
    for s in rep.stages:
        print(f"[{name}] {s.stage}: {s.status.value} {s.reason[:300]}")
    return rep


@pytest.mark.parametrize("name", list(KERNEL_EXPLOITS))
def test_kernel_exploit_is_caught(built, name):
    task, mode, shapes, bench, want_c, want_t = KERNEL_EXPLOITS[name]
    out = built[name]
    assert out.ok, f"{name} must compile: {out.result.reason}"
    rep = _run(out.so_bytes, name, task, mode, shapes, bench)
    c, t = rep.stage("correctness"), rep.stage("timing")
    observed = f"correctness {c.status.value}, timing {t.status.value}" + (
        f" (fitness {rep.fitness:.2f})" if rep.fitness else "") + f": {(t.reason if want_t else c.reason)[:120]}"
    expected = " or ".join(sorted(s.value for s in want_c)) + (
        "; timing " + " or ".join(sorted(s.value for s in want_t)) if want_t else "")
    _row(name, expected, observed)
    assert c.status in want_c, c.reason
    if want_t is None:
        assert rep.fitness is None
    elif t.status is Status.OK:
        # the harness re-poisoned or re-checked and the kernel did the work: fine, at an honest speed
        assert rep.fitness is not None and rep.fitness < 1.5, f"a fake speedup got through: {rep.fitness}"
    else:
        assert t.status in want_t and rep.fitness is None, t.reason




HOST_ATTACKS = sorted(p.stem for p in ATTACKS.glob("*.cu"))


@pytest.mark.parametrize("name", HOST_ATTACKS)
def test_host_attack_through_the_judge_and_runner(built, name, monkeypatch):
    h = _header(ATTACKS / f"{name}.cu")
    expect = h["runtime-expect"]
    if os.geteuid() == 0 and "runtime-expect-root" in h:
        expect = h["runtime-expect-root"]
    out = built[name]
    if expect == "compile_error":
        observed = f"compile {out.result.status.value}: {out.result.reason[:100]}"
        _row(name, "compile_error or timeout", observed)
        assert out.result.status in (Status.COMPILE_ERROR, Status.TIMEOUT)
        return
    assert out.ok, out.result.reason
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    VICTIM_DB.write_bytes(b"SQLite format 3\x00")
    listener = TcpListener(PORT)
    variants = [(False, expect)]
    if "runtime-expect-files-open" in h:   # Landlock file rules off: the documented switch
        variants.append((True, h["runtime-expect-files-open"]))
    try:
        for files_open, want in variants:
            settings = HarnessSettings(trials=5, warmup=2, reps=10, timeout_s=45 if want == "timeout" else 180)
            rep = _run(out.so_bytes, name, "kb19_relu", "check", SMALL, None, settings=settings,
                       sandbox=sb.SandboxSettings(landlock_fs=not files_open, landlock_reads=not files_open))
            c = rep.stage("correctness")
            label = name + (" (files open)" if files_open else "")
            _row(label, f"{want} ({h.get('runtime-layer', '')[:80]})",
                 f"{c.status.value}: {c.reason[:100]} [sandbox: {rep.env.get('sandbox', '?')}]")
            assert c.status.value == want, c.reason
        if name in ("system_shell", "socket_connect"):
            assert listener.accepted == 0
    finally:
        listener.close()
        VICTIM_DB.unlink(missing_ok=True)
