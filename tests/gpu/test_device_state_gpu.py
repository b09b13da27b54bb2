"""The harness resets GPU state a candidate leaves for the timed calls (issue 30 item 3):
the persisting-L2 carve-out and the harness stream's access-policy window, and raised
device limits (evaluators/child/device_state.py). Candidate: tests/fixtures/sandbox/persisting_l2.cu
(a correct ReLU that sets all of them on every call)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.isolation import HarnessJob, run_isolated
from evo.core.records import Candidate, Operator, Status

pytestmark = pytest.mark.gpu

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sandbox"
TASK = "kb19_relu"
SETTINGS = HarnessSettings(trials=5, warmup=2, reps=10, flush_mb=256, timeout_s=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, bytes]:
    from evaluators.compile import compile_candidate
    from evo.tasks.seeds import seed_params, seed_source

    cs = CompileSettings(cache_dir=str(tmp_path_factory.mktemp("cc")))
    out = {}
    for name, src, params in (("persisting", (FIX / "persisting_l2.cu").read_text(), {}),
                              ("seed", seed_source(TASK), seed_params(TASK))):
        o = compile_candidate(Candidate.create(TASK, src, params, operator=Operator.USER), cs)
        assert o.ok, o.result.reason + o.result.artifacts.get("log", "")[:1500]
        out[name] = o.so_bytes
    return out


def test_timed_calls_start_without_the_candidates_l2_state(built):
    rep = run_isolated(HarnessJob(task=TASK, candidate_id="persisting", so_bytes=built["persisting"],
                                  shapes=(1, 2)), SETTINGS)
    c, t = rep.stage("correctness"), rep.stage("timing")
    print("device_resets:", t.metrics.get("device_resets"), t.metrics.get("device_reset_failures"))
    assert c.status is Status.OK, c.reason
    assert t.status is Status.OK, t.reason
    resets = t.metrics["device_resets"]
    # set on every call, cleared before every timed rep (and before each shape's warm-up)
    assert resets.get("persisting_l2_cache_size", 0) >= SETTINGS.reps, resets
    assert resets.get("access_policy_window", 0) >= SETTINGS.reps, resets
    seed = run_isolated(HarnessJob(task=TASK, candidate_id="seed", so_bytes=built["seed"], shapes=(1, 2)),
                        SETTINGS)
    assert seed.stage("timing").status is Status.OK
    assert seed.stage("timing").metrics["device_resets"] == {}, "nothing to reset for an honest kernel"


_DIRECT = textwrap.dedent(r'''
    import ctypes, json, sys
    import torch
    from evaluators.child import abi
    from evaluators.child.device_state import DeviceGuard
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda"); y = torch.empty_like(x)
    torch.cuda.synchronize()
    g = DeviceGuard(int(stream.cuda_stream))
    before = g.limits()
    k = abi.load_kernel(sys.argv[1])
    with torch.cuda.stream(stream):
        assert k.launch((x,), (y,), (), int(stream.cuda_stream)) == 0
    torch.cuda.synchronize()
    raised, window = g.limits(), g.window_bytes()
    g.restore()
    print(json.dumps({"before": before, "raised": raised, "window": window, "after": g.limits(),
                      "window_after": g.window_bytes(), "ok": bool(torch.equal(y, torch.relu(x)))}))
''')


def test_restore_puts_the_drivers_values_back(built, tmp_path):
    so = tmp_path / "k.so"
    so.write_bytes(built["persisting"])
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", _DIRECT, str(so)], capture_output=True, text=True, timeout=300,
                       cwd=str(root))
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout.strip().splitlines()[-1])
    print(d)
    assert d["ok"]
    assert d["raised"]["persisting_l2_cache_size"] > 0 and d["window"] > 0, "the candidate did set them"
    assert d["after"] == {**d["before"], "persisting_l2_cache_size": 0} and d["window_after"] == 0


@pytest.mark.xfail(strict=False, reason="measured on an H200 on 2026-12-03: the timing process reset the L2 carve-out "
                   "(11 times) and the access-policy window (10 times) but counted no raised stack / printf-fifo "
                   "limit to restore; not yet explained (is the fixture's cudaDeviceSetLimit refused there?)")
def test_raised_device_limits_are_restored_before_timed_calls(built):
    rep = run_isolated(HarnessJob(task=TASK, candidate_id="persisting", so_bytes=built["persisting"],
                                  shapes=(1, 2)), SETTINGS)
    resets = rep.stage("timing").metrics["device_resets"]
    assert resets.get("stack_size", 0) >= 1 and resets.get("printf_fifo_size", 0) >= 1, resets
