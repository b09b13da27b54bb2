"""Delayed profiling: ncu CSV parsing (recorded real output), roofline classes, descriptors,
and the profiling trigger rules (profile_candidate through the judge: tests/test_judge_profile.py).

``tests/fixtures/ncu/*.csv`` are real ``ncu --csv --page raw --print-units base`` outputs
recorded on an H200 (see tests/fixtures/ncu/README.md for how they were made): a ReLU
(memory-bound) on two shapes and the bf16 wgmma GEMM seed (compute-bound).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluators import profile as P
from evo.core.records import Candidate, Member, Operator, Status
from evo.engine.survivors import DEFAULT_FEEDBACK_AFTER, profile_key_of, profile_visible, should_profile

FIX = Path(__file__).parent / "fixtures" / "ncu"
RELU_SMALL = FIX / "kb19_relu_shape1.csv"
RELU_BIG = FIX / "kb19_relu_shape0.csv"
GEMM = FIX / "gemm_bf16_shape1.csv"


#: Metrics added to DEFAULT_METRICS after the recording (so absent from the CSVs); the test
#: below checks that the H200's own `ncu --query-metrics` (recorded alongside) lists them.
ADDED_AFTER_RECORDING = {
    "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
}


def _summary(path: Path) -> dict:
    rows = P.parse_ncu_csv(path.read_text())
    assert len(rows) == 1, "one candidate call, one kernel"
    return P.summarize(rows)


# ---------------------------------------------------------------------- parsing real output


@pytest.mark.parametrize("path", [RELU_SMALL, RELU_BIG, GEMM], ids=lambda p: p.stem)
def test_recorded_csv_parses_every_default_metric(path):
    rows = P.parse_ncu_csv(path.read_text())
    row = rows[0]
    assert row.kernel and "at::" not in row.kernel, "the NVTX filter captured the candidate, not torch"
    s = P.summarize(rows)
    assert set(s["missing"]) <= ADDED_AFTER_RECORDING, f"metrics absent from the recording: {s['missing']}"
    assert s["duration_ns"] > 0 and s["main_kernel_duration_ns"] == s["duration_ns"]
    for k in ("sm_throughput_pct", "dram_throughput_pct", "memory_throughput_pct", "achieved_occupancy_pct",
              "theoretical_occupancy_pct", "l2_hit_rate_pct", "tensor_pipe_pct"):
        assert 0.0 <= s[k] <= 100.5, (k, s[k])
    assert s["achieved_occupancy_pct"] <= s["theoretical_occupancy_pct"] + 1.0
    assert s["registers_per_thread"] >= 1 and s["block_size"] >= 32 and s["grid_size"] >= 1
    assert s["smem_per_block_bytes"] == (s["smem_static_per_block"] or 0) + (s["smem_dynamic_per_block"] or 0)
    assert 1 <= len(s["top_stalls"]) <= 3
    assert all(r != "selected" for r, _, _ in s["top_stalls"])
    values = [v for _, v, _ in s["top_stalls"]]
    assert values == sorted(values, reverse=True)
    json.dumps(s)  # stored as JSON


def test_metric_names_exist_on_the_h200():
    listed = {ln.split()[0].split(".")[-1] for ln in (FIX / "query_metrics.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith(("-", "Device", "Metric"))}
    for m in ADDED_AFTER_RECORDING:
        assert m.rsplit(".", 1)[0] in listed, m
    header = next(ln for ln in GEMM.read_text().splitlines() if ln.startswith('"ID"'))
    for m in set(P.DEFAULT_METRICS) - ADDED_AFTER_RECORDING:
        assert f'"{m}"' in header, f"{m} was requested in the recording but ncu did not report it"


def test_relu_is_memory_bound_and_gemm_compute_bound_from_real_profiles():
    big = _summary(RELU_BIG)
    assert big["bound"] == "memory-bound" and big["dram_throughput_pct"] > 60
    assert big["tensor_pipe_pct"] == pytest.approx(0.0, abs=0.5)
    gemm = _summary(GEMM)
    assert gemm["bound"] == "compute-bound"
    assert gemm["tensor_pipe_pct"] > 40, "the wgmma pipe is busy in a Hopper GEMM"
    assert gemm["smem_per_block_bytes"] > 48 * 1024, "a multi-stage TMA pipeline uses dynamic smem"
    assert P.profile_descriptor(big)[0] == ("bound", "memory")
    assert P.profile_descriptor(gemm)[0] == ("bound", "compute")
    text = P.format_profile(gemm)
    assert "tensor pipe" in text and "registers/thread" in text and "top warp stalls" in text


def test_units_are_converted_to_base_units():
    hdr = '"ID","Kernel Name","gpu__time_duration.sum","launch__shared_mem_per_block_dynamic","sm__throughput.avg.pct_of_peak_sustained_elapsed"'
    text = "\n".join([
        "==PROF== Connected to process 1",
        hdr,
        '"","","usecond","Kbyte","%"',
        '"0","k(int)","1,234.5","2","12.5"',
        '"1","k2","n/a","0","7"',
        "==PROF== Disconnected from process 1",
    ])
    rows = P.parse_ncu_csv(text)
    assert [r.id for r in rows] == [0, 1]
    assert rows[0].number("gpu__time_duration.sum") == pytest.approx(1234.5e3)
    assert rows[0].number("launch__shared_mem_per_block_dynamic") == 2000.0
    assert rows[1].number("gpu__time_duration.sum") is None
    s = P.summarize(rows, ["gpu__time_duration.sum", "sm__bogus.sum"])
    assert s["kernels"] == 2 and s["kernel"] == "k(int)" and s["duration_ns"] == pytest.approx(1234.5e3)
    assert s["missing"] == ["sm__bogus.sum"]
    assert s["bound"] == "latency-bound"


def test_header_only_and_garbage():
    assert P.parse_ncu_csv('"ID","Kernel Name"\n"",""\n') == []
    with pytest.raises(ValueError, match="no ncu CSV header"):
        P.parse_ncu_csv("==PROF== No kernels were profiled.\n")
    with pytest.raises(ValueError, match="no kernel rows"):
        P.summarize([])


# ---------------------------------------------------------------------- roofline + descriptor


@pytest.mark.parametrize("m, want", [
    ({"dram_throughput_pct": 85, "sm_throughput_pct": 30}, "memory-bound"),
    ({"memory_throughput_pct": 75, "sm_throughput_pct": 20}, "memory-bound"),
    ({"dram_throughput_pct": 20, "sm_throughput_pct": 70}, "compute-bound"),
    ({"dram_throughput_pct": 20, "sm_throughput_pct": 30, "tensor_pipe_pct": 80}, "compute-bound"),
    ({"dram_throughput_pct": 20, "sm_throughput_pct": 30, "tensor_pipe_pct": 5}, "latency-bound"),
    ({"dram_throughput_pct": 59.9, "sm_throughput_pct": 59.9}, "latency-bound"),
])
def test_classify_roofline(m, want):
    assert P.classify_roofline(m) == want


def test_classify_falls_back_to_arithmetic_intensity():
    from evo.tasks import get_task
    from evo.tasks.gpus import H200

    gemm, relu = get_task("gemm_bf16"), get_task("kb19_relu")
    assert P.classify_roofline({}, gemm, gemm.shapes[0], H200) == "compute-bound"
    assert P.classify_roofline({}, relu, relu.shapes[0], H200) == "memory-bound"
    with pytest.raises(ValueError, match="cannot classify"):
        P.classify_roofline({})


def test_descriptor_merges_into_archive_descriptor():
    from populations.archive import merge_descriptor

    d = P.profile_descriptor({"dram_throughput_pct": 90, "sm_throughput_pct": 10, "achieved_occupancy_pct": 30})
    assert d == (("bound", "memory"), ("occupancy", "mid"))
    assert P.profile_descriptor({"achieved_occupancy_pct": 10}) == (("occupancy", "low"),)
    assert P.profile_descriptor({}) == ()
    merged = merge_descriptor((("tile", "128"),), dict(d))
    assert dict(merged) == {"tile": "128", "bound": "memory", "occupancy": "mid"}


# ---------------------------------------------------------------------- trigger rules


def _member(fitness=2.0, params=None):
    c = Candidate.create("t", "src", params or {"A": "1"}, operator=Operator.KNOBS)
    return Member(candidate=c, fitness=fitness, status=Status.OK if fitness else Status.INCORRECT)


def test_should_profile_rules():
    s = P.ProfileSettings(enabled=True, top_k=2)  # enabled: off by default, as in [profile]
    m, a, b = _member(), _member(params={"A": "2"}), _member(params={"A": "3"})
    assert should_profile(m, [m.id, a.id], s, shape="M=1", gpu="H200")
    assert should_profile(m, [a.id, m.id, b.id], s)
    assert not should_profile(m, [a.id, b.id, m.id], s), "outside top_k=2"
    assert should_profile(m, [a.id, b.id, m.id], P.ProfileSettings(enabled=True, top_k=3))
    assert not should_profile(_member(fitness=None), [m.id], s), "incorrect candidates are never profiled"
    assert not should_profile(m, [m.id], P.ProfileSettings(top_k=3)), "off by default"
    done = {profile_key_of(m, "M=1", "H200")}
    assert not should_profile(m, [m.id], s, done=done, shape="M=1", gpu="H200"), "never twice"
    assert should_profile(m, [m.id], s, done=done, shape="M=2", gpu="H200"), "another shape"
    assert should_profile(m, [m.id], s, done=done, shape="M=1", gpu="H100"), "another GPU"


def test_profile_visible_only_late_in_the_lineage():
    assert DEFAULT_FEEDBACK_AFTER == P.ProfileSettings().feedback_after == 3
    assert [profile_visible(d) for d in range(5)] == [False, False, False, True, True]
    assert profile_visible(0, 0)
    assert not profile_visible(100, -1), "negative = never"


def test_settings_validate():
    """The fields set by code are checked when a record is built; the config keys (top_k,
    timeout_s) are checked once, when the config is loaded (tests/test_config.py)."""
    with pytest.raises(ValueError, match="launch_count"):
        P.ProfileSettings(launch_count=0)
    with pytest.raises(ValueError, match="metrics"):
        P.ProfileSettings(metrics=())


# ---------------------------------------------------------------------- running, with a stand-in ncu

def test_profile_key_and_cache(tmp_path):
    k1 = P.profile_key("ab" * 32, {"M": 1}, "H200")
    assert k1 == P.profile_key("ab" * 32, {"M": 1}, "H200")
    assert len({k1, P.profile_key("ab" * 32, {"M": 2}, "H200"), P.profile_key("ab" * 32, {"M": 1}, "H100"),
                P.profile_key("cd" * 32, {"M": 1}, "H200")}) == 4
    c = P.ProfileCache(tmp_path)
    assert c.get(k1) is None
    c.put(k1, {"duration_ns": 1.0})
    assert c.get(k1) == {"duration_ns": 1.0}
    (tmp_path / k1[:2] / f"{k1}.json").write_text("{broken")
    assert c.get(k1) is None
