"""A search's start-up: the seeds compile on the driver's threads while a local Ray instance
starts (evo.engine.search.precompile_seeds), each seed once, from the source and parameters the
engine submits (so the engine's compile finds the same cache entry), and nothing without a
cache; a local runtime starts on a thread of its own while the driver prepares the rest, and
`evo search` probes the GPU while its config loads; the `start` event records how old the
process was at each step (evo.engine.startup)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from typer.testing import CliRunner

import evaluators.compile as compile_mod
from evaluators.base import CompileSettings
from evo.engine.search import precompile_seeds, warm_order
from evo.engine.startup import STEPS, StartupClock, StartupRecord


def test_each_seed_is_built_once_into_the_cache_and_none_without_one(monkeypatch, tmp_path):
    built: list[tuple[str, str, dict, str]] = []
    lock = threading.Lock()

    def fake_compile(cand, settings):
        with lock:
            built.append((cand.task, cand.source, dict(cand.params), settings.cache_dir))
        if cand.task == "broken":
            raise RuntimeError("nvcc exploded (test)")   # logged, never raised into the search

    monkeypatch.setattr(compile_mod, "compile_candidate", fake_compile)
    seeds = {"a": ("__global__ void a() {}", {"VEC": "4"}), "broken": ("x", {})}
    settings = CompileSettings(cache_dir=str(tmp_path / "cc"))
    threads = precompile_seeds(seeds, settings)
    assert sorted(threads) == ["a", "broken"]
    for t in threads.values():
        t.join(10)
    assert sorted(built) == [("a", "__global__ void a() {}", {"VEC": "4"}, str(tmp_path / "cc")),
                             ("broken", "x", {}, str(tmp_path / "cc"))]
    built.clear()
    assert precompile_seeds(seeds, dataclasses.replace(settings, cache_dir="")) == {} and built == []


class _Build:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def is_alive(self) -> bool:
        return self.alive


def test_the_judge_prepares_first_the_tasks_whose_seeds_are_built():
    names = ["kb23_softmax", "gelu_bf16", "gemm_bf16_irregular", "kb19_relu"]
    builds = {"kb23_softmax": _Build(True), "gelu_bf16": _Build(False), "gemm_bf16_irregular": _Build(True),
              "kb19_relu": _Build(False)}
    assert warm_order(names, builds) == ("gelu_bf16", "kb19_relu", "kb23_softmax", "gemm_bf16_irregular")
    assert warm_order(names, {}) == tuple(names)   # no seed compiles in this process: the config's order
    assert warm_order(names, {"kb19_relu": _Build(True)}) == tuple(names)   # still compiling
    assert warm_order(names, {"kb19_relu": _Build(False)})[0] == "kb19_relu"


def test_the_start_record_gives_the_process_age():
    """The `start` event's ``startup`` ages: seconds since the search's process started (what
    its imports, task files and store took before Ray)."""
    import subprocess
    import sys

    code = ("import time; time.sleep(0.4); from evo.engine.startup import process_age_s; "
            "print(process_age_s())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.4 <= age < 30.0


def test_the_clock_marks_known_steps_in_order_and_its_record_round_trips():
    clock = StartupClock("cli")
    for step in ("config", "tasks", "gpu"):
        clock.mark(step)
    with pytest.raises(ValueError, match="'confg'.*known: cli, config"):
        clock.mark("confg")
    rec = clock.record(1.5, ray_overlapped=True)
    assert [s for s, _ in rec.age_at] == ["cli", "config", "tasks", "gpu"]
    ages = [a for _, a in rec.age_at]
    assert all(a is not None for a in ages) and ages == sorted(ages)
    assert StartupRecord.from_json(rec.to_json()) == rec
    assert rec.to_json()["process_age_s"] is None  # Ray's start was not marked


# ---- run_search with a stand-in for the Ray runtime (the in-process one; no Ray starts) ----

class _Seen:
    """What the stand-in runtime saw: the threads it started and shut down on."""

    def __init__(self) -> None:
        self.start_thread: threading.Thread | None = None
        self.shutdown_with_owner_alive: bool | None = None
        self.sandbox_probed = threading.Event()


def _fake_runtime(monkeypatch, seen: _Seen, fail: Exception | None = None):
    """``evo.engine.runtime.Runtime`` replaced by the in-process runtime (one fake GPU), whose
    start waits until the driver probed the sandbox: it can only pass when the start runs
    beside the driver's own preparation, not before it."""
    import evaluators.sandbox as sandbox
    import evo.engine.runtime as runtime_mod
    from evo.engine.local_runtime import LocalRuntime

    real_describe = sandbox.describe

    def describe():
        seen.sandbox_probed.set()
        return real_describe()

    class StandIn(LocalRuntime):
        def __init__(self, *, stages, compile_settings, harness_settings, address=None, num_cpus=None,
                     num_gpus=None, secret_env=()):
            super().__init__(stages=stages, compile_settings=compile_settings, harness_settings=harness_settings,
                             num_gpus=1, num_cpus=2)

        def start(self):
            seen.start_thread = threading.current_thread()
            assert seen.sandbox_probed.wait(10), "the runtime's start did not overlap the driver's preparation"
            if fail is not None:
                raise fail
            return super().start()

        def shutdown(self):
            seen.shutdown_with_owner_alive = seen.start_thread.is_alive()
            super().shutdown()

    monkeypatch.setattr(sandbox, "describe", describe)
    monkeypatch.setattr(runtime_mod, "Runtime", StandIn)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _config(tmp_path):
    from evo.config import load_config

    path = tmp_path / "s.toml"
    path.write_text(f"""
[run]
name = "startup"
db = "{tmp_path / 'evo.db'}"
[tasks]
include = ["kb19_relu"]
[search]
islands_per_task = 1
max_evaluations = 2
in_flight = 1
""")
    return load_config(path)


def _stages():
    from evo.engine.seams import Stages
    from fakes import stages as fake

    return Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False)


def test_a_local_runtime_starts_beside_the_driver_and_the_start_records_each_step(monkeypatch, tmp_path):
    from evo.engine.search import run_search
    from evo.store import Store

    seen = _Seen()
    _fake_runtime(monkeypatch, seen)
    cfg = _config(tmp_path)
    summary = run_search(cfg, progress=False, stages=_stages())
    assert summary.evaluations == 2
    assert seen.start_thread is not threading.main_thread() and seen.start_thread.name == "evo-ray-start"
    assert seen.shutdown_with_owner_alive, "the thread that started the runtime outlived it"
    seen.start_thread.join(10)
    assert not seen.start_thread.is_alive(), "released once the runtime was shut down"
    with Store.open_reader(cfg.run.db) as store:
        (start,) = [e for e in store.events(summary.run_id) if e["kind"] == "start"]
    startup = start["payload"]["startup"]
    assert list(startup["age_at"]) == ["search", "seeds", "store", "ray_start", "prepared", "ray_ready"]
    ages = list(startup["age_at"].values())
    assert all(isinstance(a, float) for a in ages) and ages == sorted(ages), startup
    assert startup["process_age_s"] == startup["age_at"]["ray_start"]
    assert startup["ray_overlapped"] is True and 0 <= startup["runtime_s"] <= ages[-1] - ages[3] + 0.01
    assert StartupRecord.from_json(startup).to_json() == startup


def test_a_failed_local_start_is_one_error_and_leaves_no_running_run(monkeypatch, tmp_path):
    from evo.engine.runtime import RuntimeError_
    from evo.engine.search import SearchError, run_search

    seen = _Seen()
    _fake_runtime(monkeypatch, seen, fail=RuntimeError_("the Ray cluster has no GPU resources (test)"))
    cfg = _config(tmp_path)
    with pytest.raises(SearchError, match=r"^the Ray cluster has no GPU resources \(test\)$"):
        run_search(cfg, progress=False, stages=_stages())
    assert seen.start_thread is not threading.main_thread()
    _assert_released_and_failed(seen, cfg, "no GPU resources (test)")


def _assert_released_and_failed(seen: _Seen, cfg, reason: str) -> None:
    """The thread that started the runtime ended, and the run is recorded failed with ``reason``."""
    from evo.store import Store

    seen.start_thread.join(10)
    assert not seen.start_thread.is_alive()
    with Store.open_reader(cfg.run.db) as store:
        (run,) = store.list_runs()
    assert run["recorded_status"] == "failed" and reason in run["reason"], run


def test_a_driver_failure_while_the_runtime_starts_shuts_it_down(monkeypatch, tmp_path):
    """The driver fails after the start began (here: its sandbox probe): the started runtime
    is shut down, by the driver, before its thread is let go; the run fails."""
    from evo.engine import search

    seen = _Seen()
    _fake_runtime(monkeypatch, seen)

    def broken_probe():
        seen.sandbox_probed.set()
        raise OSError("sandbox probe failed (test)")

    import evaluators.sandbox as sandbox

    monkeypatch.setattr(sandbox, "describe", broken_probe)
    cfg = _config(tmp_path)
    with pytest.raises(OSError, match="sandbox probe failed"):
        search.run_search(cfg, progress=False, stages=_stages())
    assert seen.shutdown_with_owner_alive is True
    _assert_released_and_failed(seen, cfg, "sandbox probe failed")


def test_the_cli_probes_the_gpu_while_the_config_loads_and_passes_its_marks_on(monkeypatch, tmp_path):
    import evaluators.pipeline as pipeline
    import evo.config as config
    from evo.cli import app
    from evo.engine import early_ray, search
    from evo.engine.bookkeeping import SearchSummary

    probing = threading.Event()

    def gpu_available():
        probing.set()
        return True

    real_load = config.load_config

    def load_config(*a, **kw):
        assert probing.wait(10), "the GPU probe did not run while the config loaded"
        return real_load(*a, **kw)

    got = {}

    def run_search(cfg, **kw):
        got.update(kw)
        return SearchSummary("r-test", 0, 0, "test", {}, 0, 0, 0, 0)

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(early_ray, "nvidia_smi_on_path", lambda: False)  # no early Ray start (tests/test_early_ray.py)
    monkeypatch.setattr(pipeline, "gpu_available", gpu_available)
    monkeypatch.setattr(config, "load_config", load_config)
    monkeypatch.setattr(search, "run_search", run_search)
    res = CliRunner().invoke(app, ["search", "configs/demo.toml", "--db", str(tmp_path / "x.db"), "--no-progress"])
    assert res.exit_code == 0, res.output
    rec = got["startup"].record(None, ray_overlapped=False)
    assert [s for s, _ in rec.age_at] == ["cli", "config", "tasks", "gpu"]
    ages = [a for _, a in rec.age_at]
    assert ages == sorted(ages) and set(s for s, _ in rec.age_at) <= set(STEPS)


def test_the_runner_is_prebuilt_on_a_thread_and_a_failed_build_is_only_logged():
    from evo.engine.search import prebuild_runner

    calls: list[str] = []
    t = prebuild_runner(lambda: calls.append("built"))
    t.join(10)
    assert calls == ["built"] and not t.is_alive()

    def broken() -> None:
        raise RuntimeError("nvcc missing (test)")

    escaped: list = []
    hook, threading.excepthook = threading.excepthook, escaped.append
    try:
        t = prebuild_runner(broken)
        t.join(10)
    finally:
        threading.excepthook = hook
    assert not t.is_alive() and escaped == []   # logged only; the judge reports it when it builds
