"""benchmarks/lab/probe.py: spec parsing and source resolution (the GPU part runs on the device)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _probe():
    spec = importlib.util.spec_from_file_location("probe", ROOT / "benchmarks" / "lab" / "probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_entries_get_defaults_and_missing_fields_are_named(tmp_path):
    probe = _probe()
    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"task": "kb19_relu", "source": "seed"}]))
    (e,) = probe._load(f)
    assert e["mode"] == "check+time" and e["params"] == {} and e["label"].startswith("kb19_relu")
    f.write_text(json.dumps([{"task": "kb19_relu"}]))
    with pytest.raises(SystemExit, match="entry 0 lacks 'source'"):
        probe._load(f)
    f.write_text(json.dumps({"task": "kb19_relu"}))
    with pytest.raises(SystemExit, match="JSON list"):
        probe._load(f)


def test_sources_seed_render_and_path_resolve_to_kernel_text():
    from evo.tasks.gemm_seeds import F32_FFMA_SEEDS
    from evo.tasks.seeds import render, seed_source

    probe = _probe()
    assert probe._source("kb19_relu", "seed") == seed_source("kb19_relu")
    assert probe._source("kb01_square", "render:evo.tasks.gemm_seeds:F32_FFMA_SEEDS") == render(
        F32_FFMA_SEEDS["kb01_square"])
    assert "evo_launch" in probe._source("kb01_square", "evo/tasks/kernels/gemm_f32_3xtf32.cu")


PROBES = ROOT / "benchmarks" / "lab" / "probes"


def test_the_probe_specs_are_where_the_parametrisation_looks():
    """An empty glob would make the next test vanish instead of fail (e.g. after a move)."""
    assert len(list(PROBES.glob("*.json"))) >= 40, PROBES


@pytest.mark.parametrize("spec", sorted(PROBES.glob("*.json")), ids=lambda p: p.name)
def test_committed_probe_specs_resolve(spec):
    """Every committed sweep names real tasks, resolvable sources and declared tunables (or a
    diagnostic define the source defaults with ``#ifndef NAME``, e.g. the bf16 template's
    ``EPI_FAST = 0``, which reproduces an old code path for an A/B and is no search knob)."""
    import re

    from evo.tasks import get_task
    from evo.core.tunables import parse_tunables

    probe = _probe()
    for e in probe._load(spec):
        get_task(e["task"])
        src = probe._source(e["task"], e["source"])
        declared = {t.name for t in parse_tunables(src)} | set(re.findall(r"^#ifndef (\w+)$", src, re.M))
        assert set(e["params"]) <= declared, (e["label"], set(e["params"]) - declared)
        assert e["mode"] in ("check+time", "time-only", "check")


def test_table_is_on_disk_after_each_variant_so_a_cut_run_keeps_its_rows(tmp_path, monkeypatch):
    """A device call's time limit can kill the probe mid-spec: the rows finished so far must
    already be in probe.md (here the second variant's evaluation dies)."""
    import evaluators.pipeline as pipeline
    from evaluators.harness_job import HarnessReport
    from evo.core.records import StageResult, Status

    probe = _probe()
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps([{"label": "first", "task": "kb19_relu", "source": "seed", "mode": "check"},
                                {"label": "second", "task": "kb19_relu", "source": "seed", "mode": "check"}]))

    class Built:   # a compile outcome that passed (the probe reads these two fields)
        class result:
            passed = True
        so_bytes = b"\x7fELF"

    monkeypatch.setattr(probe, "_compile_all", lambda cands, jobs: [Built() for _ in cands])
    calls = []

    def fake_run(job, settings, *, sandbox=None):
        calls.append(job.mode)
        if len(calls) == 2:
            raise KeyboardInterrupt("the device call's limit")
        return HarnessReport(stages=(StageResult("correctness", Status.OK),
                                     StageResult("timing", Status.SKIPPED)))

    monkeypatch.setattr(pipeline, "judge_job", fake_run)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        probe.main([str(spec), "--out", str(out), "--jobs", "1"])
    text = (out / "probe.md").read_text()
    assert "| first | kb19_relu |" in text and "ok (check" in text
    assert "| second |" not in text and "1 variant(s) not finished yet" in text
