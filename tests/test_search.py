"""`run_search` end to end from a config: real policy and real nvcc compiles on Ray CPU
workers, a simulated GPU stage (a declared, not physical, GPU), the store, progress events,
champion confirmation, then `--resume` of the finished run."""

from __future__ import annotations

import shutil

import pytest

ray = pytest.importorskip("ray")
import ray.cloudpickle as cloudpickle  # noqa: E402

from evo.config import load_config  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from evo.engine.search import run_search  # noqa: E402
from evo.store import Store  # noqa: E402
from fakes import stages as fake  # noqa: E402

cloudpickle.register_pickle_by_value(fake)

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None and not __import__("os").path.exists(
    "/usr/local/cuda/bin/nvcc"), reason="nvcc not installed")


@pytest.mark.slow
def test_run_search_from_config_with_real_compiles(tmp_path):
    from evaluators.compile import compile_candidate

    cfg_path = tmp_path / "s.toml"
    cfg_path.write_text(f"""
[run]
name = "wired"
db = "{tmp_path / 'evo.db'}"
[tasks]
include = ["kb19_relu"]
[search]
islands_per_task = 1
max_evaluations = 3
in_flight = 2
[compile]
cache_dir = "{tmp_path / 'cache'}"
[ray]
num_gpus = 1
num_cpus = 2
""")
    cfg = load_config(cfg_path)
    stages = Stages(compile_candidate, fake.fake_evaluate, evaluate_concurrent=False)
    if ray.is_initialized():
        ray.shutdown()
    summary = run_search(cfg, progress=False, stages=stages)
    assert summary.evaluations == 3 and summary.correct == 3
    with Store.open_reader(cfg.run.db) as store:
        run = store.get_run(summary.run_id)
        assert run["status"] == "finished"
        cands = store.candidates(summary.run_id)
        assert cands[0].operator == "seed" and all(c.operator in ("seed", "knobs", "crossover") for c in cands)
        for c in cands:
            ev = store.get_evaluation(c.id, summary.run_id)
            comp = ev.stage("compile")
            assert comp.passed and comp.metrics, "a real nvcc compile with its ptxas report"
        kinds = {e["kind"] for e in store.events(summary.run_id)}
        assert {"start", "finish"} <= kinds
        start = next(e for e in store.events(summary.run_id) if e["kind"] == "start")
        assert "sandbox" in start["payload"]
        assert store.champions(summary.run_id), "the best kernel was re-timed and stored as champion"
    # Resume a finished run with a larger budget: nothing is evaluated again.
    more = load_config(cfg_path, {"search.max_evaluations": 5})
    again = run_search(more, resume=summary.run_id, progress=False, stages=stages)
    assert again.run_id == summary.run_id and again.evaluations == 5
    with Store.open_reader(cfg.run.db) as store:
        assert len(store.evaluated_ids(summary.run_id)) == 5
