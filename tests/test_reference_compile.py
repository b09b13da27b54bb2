"""The torch.compile reference beside the eager one (issue 37), on the CPU.

Contract (evaluators.judge.reference, evaluators.judge.summary.summarize): the compiled
reference is compiled by its warm-up, before any timed call, and never recompiled by the
timed calls; a compile failure is reported as such and never replaced by eager; fitness is
against the configured basis and both speedups are kept when both were timed.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from evaluators.base import HarnessSettings  # noqa: E402
from evaluators.judge.reference import (  # noqa: E402
    COMPILE_MODE,
    ReferenceCompileError,
    references_for,
    warm_up,
)
from evaluators.judge.summary import ShapeSamples, summarize  # noqa: E402
from evo.core.records import Status  # noqa: E402


def _task(fn=None):
    return SimpleNamespace(name="toy", reference=fn or (lambda x: torch.nn.functional.silu(x) * 2.0))


def _samples(cand, ref, comp=None):
    return ShapeSamples({"N": 1}, (cand,) * 5, (ref,) * 5, (0.0,) * 5, 1, None, (0.0,) * 5,
                        (comp,) * 5 if comp is not None else ())


def test_summarize_keeps_both_speedups_and_uses_the_basis():
    samples = [_samples(1.0, 4.0, 2.0), _samples(1.0, 9.0, 3.0)]
    eager = summarize(samples, "eager")
    assert eager.status is Status.OK
    assert eager.metrics["reference"] == "eager"
    assert math.isclose(eager.metrics["fitness"], 6.0)  # geomean(4, 9)
    assert math.isclose(eager.metrics["fitness_compile"], math.sqrt(6.0))  # geomean(2, 3)
    assert eager.metrics["compile_mode"] == COMPILE_MODE
    row = eager.metrics["shapes"][0]
    assert row["speedup"] == 4.0 and row["compile_speedup"] == 2.0 and row["compile_ref_median_ms"] == 2.0

    comp = summarize(samples, "compile")
    assert comp.metrics["reference"] == "compile"
    assert math.isclose(comp.metrics["fitness"], math.sqrt(6.0))
    assert math.isclose(comp.metrics["fitness_eager"], 6.0)


def test_eager_only_timing_has_no_compile_figures():
    res = summarize([_samples(1.0, 2.0)])
    assert res.metrics["fitness"] == 2.0 and res.metrics["reference"] == "eager"
    assert "fitness_compile" not in res.metrics and "compile_speedup" not in res.metrics["shapes"][0]


def test_compile_basis_needs_compiled_samples_on_every_shape():
    with pytest.raises(ValueError, match="compiled reference"):
        summarize([_samples(1.0, 2.0, 1.5), _samples(1.0, 2.0)], "compile")


def test_reconfirm_is_judged_against_the_basis():
    # 12x against eager but 2x against compile: only the eager basis asks for re-confirmation
    samples = [_samples(1.0, 12.0, 2.0)]
    assert summarize(samples, "eager").metrics["needs_reconfirm"] is True
    assert summarize(samples, "compile").metrics["needs_reconfirm"] is False


def test_references_for_the_basis():
    assert [r.kind for r in references_for(_task())] == ["eager"]
    compiled = []

    def fake_compile(fn, *, mode, dynamic):
        compiled.append((mode, dynamic))
        return fn

    assert [r.kind for r in references_for(_task(), basis="compile", compile_fn=fake_compile)] == ["eager", "compile"]
    assert [r.kind for r in references_for(_task(), time_compiled=True, compile_fn=fake_compile)] == ["eager", "compile"]
    assert compiled == [(COMPILE_MODE, False)] * 2
    with pytest.raises(ValueError, match="eager, compile"):
        references_for(_task(), basis="inductor")


def test_the_warm_up_compiles_and_the_timed_calls_do_not_recompile():
    """A dynamo backend that counts compilations: the warm-up compiles once per shape, the
    calls after it (what the timing loop makes, rotated input copies) compile nothing."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    refs = references_for(_task(), basis="compile",
                          compile_fn=lambda fn, *, mode, dynamic: torch.compile(fn, backend=counter, dynamic=dynamic))
    copies = [(torch.randn(64, 32),) for _ in range(3)]
    warm_up("toy", refs, copies, calls=4)
    assert counter.frame_count == 1
    assert refs[1].compile_s > 0 and refs[0].compile_s == 0
    for i in range(20):  # the timed loop
        refs[1].fn(*copies[i % 3])
    assert counter.frame_count == 1, "a timed call recompiled the reference"
    torch.testing.assert_close(refs[1].fn(copies[0][0]), refs[0].fn(copies[0][0]))


def test_real_inductor_on_the_cpu_compiles_during_the_warm_up():
    """The default compile path (torch.compile, COMPILE_MODE) on the CPU backend: the first
    warm-up call carries the compile time, later calls are orders of magnitude faster."""
    import time

    torch._dynamo.reset()
    refs = references_for(_task(), basis="compile")
    x = (torch.randn(256, 256),)
    warm_up("toy", refs, [x], calls=2)
    t0 = time.perf_counter()
    for _ in range(10):
        out = refs[1].fn(*x)
    per_call = (time.perf_counter() - t0) / 10
    assert refs[1].compile_s > 20 * per_call, (refs[1].compile_s, per_call)
    torch.testing.assert_close(out, refs[0].fn(*x))


def test_a_reference_that_does_not_compile_is_reported_not_replaced():
    def broken_compile(fn, *, mode, dynamic):
        def run(*a):
            raise RuntimeError("InductorError: LoweringException: no lowering for aten.weird\nmore")
        return run

    refs = references_for(_task(), basis="compile", compile_fn=broken_compile)
    with pytest.raises(ReferenceCompileError) as e:
        warm_up("toy", refs, [(torch.randn(4),)], calls=1)
    msg = str(e.value)
    assert "task 'toy'" in msg and COMPILE_MODE in msg and "LoweringException" in msg and "more" not in msg

    def eager_bug(x):
        raise ZeroDivisionError("the task itself is broken")

    with pytest.raises(ZeroDivisionError):
        warm_up("toy", references_for(_task(eager_bug)), [(torch.randn(4),)], calls=1)


def test_the_basis_is_a_validated_evaluator_key():
    from evo.config import ConfigError, parse_config

    assert HarnessSettings().reference == "eager"
    cfg = parse_config({"tasks": {"include": ["kb19_relu"]}, "evaluator": {"reference": "compile"}}, source="x.toml")
    assert cfg.harness_settings().reference == "compile"
    with pytest.raises(ConfigError) as e:
        parse_config({"tasks": {"include": ["kb19_relu"]}, "evaluator": {"reference": "compiled"}}, source="x.toml")
    assert "evaluator.reference" in str(e.value) and "compile" in str(e.value)


def test_a_reference_compile_failure_is_our_error_with_a_fix():
    from evaluators.harness_job import HARNESS_FIXES

    assert "reference = \"eager\"" in HARNESS_FIXES["reference"]
