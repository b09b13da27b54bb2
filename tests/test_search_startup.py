"""A search's start-up: the seeds compile on the driver's threads while a local Ray instance
starts (evo.engine.search.precompile_seeds), each seed once, from the source and parameters the
engine submits (so the engine's compile finds the same cache entry), and nothing without a
cache; the `start` event records how old the process was when Ray started."""

from __future__ import annotations

import dataclasses
import threading

import evaluators.compile as compile_mod
from evaluators.base import CompileSettings
from evo.engine.search import precompile_seeds


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
    for t in threads:
        t.join(10)
    assert sorted(built) == [("a", "__global__ void a() {}", {"VEC": "4"}, str(tmp_path / "cc")),
                             ("broken", "x", {}, str(tmp_path / "cc"))]
    built.clear()
    assert precompile_seeds(seeds, dataclasses.replace(settings, cache_dir="")) == [] and built == []


def test_the_start_record_gives_the_process_age():
    """The `start` event's ``startup.process_age_s``: seconds since the search's process
    started (what its imports, task files and store took before Ray)."""
    import subprocess
    import sys

    code = ("import time; time.sleep(0.4); from evo.engine.search import _process_age_s; "
            "print(_process_age_s())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.4 <= age < 30.0
