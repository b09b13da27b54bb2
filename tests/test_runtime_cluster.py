"""Joining an existing cluster: a CPU-only head node and a node with GPU resources.

Compile tasks need CPUs only; GPU evaluations must land on the GPU node. Uses
ray.cluster_utils.Cluster (real raylets on this machine) and the fake stages.
"""

from __future__ import annotations

import random

import pytest

ray = pytest.importorskip("ray")
import ray.cloudpickle as cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.engine.engine import Engine, EngineSettings  # noqa: E402
from evo.core.records import StageResult, Status  # noqa: E402
from evo.engine.runtime import Runtime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from evo.store import Store  # noqa: E402
from fakes import stages as fake  # noqa: E402
from mutators.knobs import KnobsMutator  # noqa: E402

cloudpickle.register_pickle_by_value(fake)


@pytest.fixture()
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    gpu_node = c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    yield c, gpu_node
    ray.shutdown()
    c.shutdown()


def test_work_is_placed_by_resources(cluster, tmp_path):
    c, gpu_node = cluster
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("cluster", {}, seed=0, config_hash="x")
    rt = Runtime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                 harness_settings=HarnessSettings(), address=c.address).start()
    assert rt.n_gpus == 1 and not rt.started_ray
    eng = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id, tasks=["synthetic_a"],
                 seeds={"synthetic_a": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})},
                 settings=EngineSettings(islands_per_task=1, max_evaluations=12, confirm_champions=False),
                 rng=random.Random(0), policy=lambda s: StageResult("policy", Status.OK))
    summary = eng.run()
    rt.shutdown()
    assert summary.evaluations == 12
    gpu_nodes, compile_nodes = set(), set()
    for cand in store.candidates(run_id):
        ev = store.get_evaluation(cand.id, run_id)
        comp = ev.stage("compile")
        compile_nodes.add(comp.metrics.get("node"))
        if ev.stage("correctness") is not None:
            gpu_nodes.add(ev.env["node"])
    assert gpu_nodes == {gpu_node.node_id}, "GPU evaluations ran only on the node with GPU resources"
    assert compile_nodes and None not in compile_nodes
    store.close()
