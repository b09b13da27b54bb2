"""The in-flight bound from measured rates (evo.engine.inflight) and the GPU-activity sampler's
'not measured' (evaluators.activity), on CPU."""

from __future__ import annotations

from evaluators.activity import ActivitySampler, nvml_reader
from evo.engine.bookkeeping import Progress
from evo.engine.inflight import DRAIN_S, RateMeter, Rates, inflight_bound
from evo.engine.progress import render


def test_unmeasured_bound_fills_every_slot_and_worker():
    assert inflight_bound(None, workers=15, n_gpus=1, gpu_slots=3) == 18


def test_compile_limited_bound_follows_littles_law():
    # H200 demo numbers: 15 workers, 16.2 s compiles (0.93 a second), a GPU result every 2 s
    r = Rates(compile_s=16.2, gpu_s=2.8, gpu_per_s=0.5)
    assert inflight_bound(r, workers=15, n_gpus=1, gpu_slots=3) == 10 + 3   # ceil(0.5 x 19.0) + slots
    r = Rates(compile_s=16.2, gpu_s=2.8, gpu_per_s=2.0)   # a fast GPU: the compile pool limits
    assert inflight_bound(r, workers=15, n_gpus=1, gpu_slots=3) == 18 + 3   # ceil(0.926 x 19.0) + slots


def test_bound_grows_with_compile_latency_and_stays_drainable():
    fast = inflight_bound(Rates(2.0, 3.0, 1.0), workers=15, n_gpus=1, gpu_slots=3)
    slow = inflight_bound(Rates(40.0, 3.0, 1.0), workers=15, n_gpus=1, gpu_slots=3)
    assert slow > fast
    huge = inflight_bound(Rates(1000.0, 3.0, 100.0), workers=1000, n_gpus=1, gpu_slots=3)
    assert huge <= max(4, int(min(1000 / 1000.0, 100.0) * DRAIN_S))
    assert inflight_bound(Rates(1.0, 1.0, 0.001), workers=1, n_gpus=2, gpu_slots=3) == 7   # the floor


def test_rate_meter_needs_samples_then_measures():
    m = RateMeter(min_samples=2)
    m.compiled(10.0)
    m.gpu_done(0.0, 2.0)
    assert m.rates(1) is None
    m.compiled(20.0)
    m.gpu_done(1.0, 4.0)
    r = m.rates(1)
    assert r.compile_s == 15.0 and r.gpu_s == 2.5 and abs(r.gpu_per_s - 0.5) < 1e-9


def test_a_starved_gpu_is_bounded_by_what_it_can_do_not_by_what_it_did():
    """Two evaluations of 1 s each over a 10 s window (the GPU waited 8 s for compiles): the
    bound must read 1 evaluation a second, not 0.2, or it keeps too few in flight to feed it."""
    m = RateMeter(min_samples=2)
    for t in (0.0, 9.0):
        m.compiled(12.0)
        m.gpu_done(t, t + 1.0, busy_s=1.0)
    r = m.rates(1)
    assert r.gpu_per_s == 1.0
    starved = RateMeter(min_samples=2)
    for t in (0.0, 9.0):
        starved.compiled(12.0)
        starved.gpu_done(t, t + 1.0)
    assert starved.rates(1).gpu_per_s == 0.2   # without busy seconds: the throughput seen
    fed = inflight_bound(r, workers=15, n_gpus=1, gpu_slots=2)
    assert fed > inflight_bound(starved.rates(1), workers=15, n_gpus=1, gpu_slots=2)
    assert fed == 13 + 2   # ceil(1/s x (12 s compile + 1 s on the GPU)) + the slots


def test_activity_not_measured_without_nvml(monkeypatch):
    s = ActivitySampler(None)
    assert not s.measured and s.mean() is None
    assert nvml_reader("not-a-device") is None   # no such device (and on this CPU machine, no NVML)


def test_activity_mean_of_samples():
    vals = iter([0.2, None, 0.6])
    s = ActivitySampler(lambda: next(vals), period_s=3600)
    for _ in range(3):
        s.sample()
    s.stop()
    assert s.mean() == (0.4, 2)


def test_progress_line_names_slot_occupancy_and_activity():
    p = Progress(started=0.0)
    p.gpu_ran(1.0, 3.0, 1.5, None, 0)
    text = " ".join(str(c) for col in render("r1", p).renderables[0].columns for c in col._cells)
    assert "slot occupancy" in text and "GPU activity not measured" in text
    assert p.as_event()["gpu_activity"] is None
    p.gpu_ran(3.0, 4.0, 0.5, (0.37, 12), 0)
    assert p.gpu_activity == 0.37 and p.gpu_stage_s == 2.0


def test_build_seconds_of_a_cache_hit_is_its_stored_build_time():
    from evo.engine.inflight import build_seconds

    assert build_seconds(12.5, {"nvcc_seconds": 9.0}, cached=False) == 12.5   # built now: its own seconds
    assert build_seconds(0.01, {"nvcc_seconds": 31.2}, cached=True) == 31.2   # a hit: what its build cost
    assert build_seconds(0.01, {}, cached=True) is None                        # a hit that stored none
    assert build_seconds(0.01, {"nvcc_seconds": "x"}, cached=True) is None
