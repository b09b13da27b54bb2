"""The search's driver reads the task suite without importing torch.

``evo search`` begins a local Ray instance's start at the command's entry and loads the config
meanwhile (:mod:`evo.engine.early_ray`); torch's import (seconds, much of it with the GIL held)
delayed that start on a GPU machine as much as it overlapped it. The driver needs the tasks'
names, shapes, counts and seeds, none of which needs torch: the task modules name torch through
:mod:`evo.tasks.lazy_torch`, imported on first use (a reference run, an input draw, a check).
These tests run the driver's steps before the runtime in a fresh interpreter and look at what it
imported, and check that the stand-ins are torch once used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_DRIVER_STEPS = r"""
import json, sys
from evo.config import load_config, load_tasks
from evo.engine import search
from evo.engine.engine import Engine  # noqa: F401 - the loop the driver runs
from evaluators.actor import GpuEvaluator  # noqa: F401 - the GPU actor's class, made remote by the driver
cfg = load_config(sys.argv[1])
reg = load_tasks(cfg)
names = search._task_names(cfg, reg)
seeds = search.seeds_for(names, cfg.mutator.kind, reg)
tasks = [reg.get(n) for n in names]
facts = [(t.name, t.dtype, [dict(s) for s in t.shapes], t.bench_shapes, list(t.distributions)) for t in tasks]
print(json.dumps({"seeds": sorted(seeds), "tasks": len(facts),
                  "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


def test_the_driver_loads_the_demo_config_its_tasks_and_seeds_without_importing_torch():
    r = subprocess.run([sys.executable, "-c", _DRIVER_STEPS, str(ROOT / "configs" / "demo.toml")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["tasks"] == 4 and len(got["seeds"]) == 4
    assert got["torch"] == [], f"the driver's steps imported {got['torch'][:5]}"


def test_the_stand_ins_are_torch_once_used():
    import torch
    import torch.nn.functional as real_f

    from evo.tasks.inputs import DTYPES, torch_dtype
    from evo.tasks.lazy_torch import F, torch as lazy

    assert lazy.float32 is torch.float32 and lazy.relu is torch.relu and F.gelu is real_f.gelu
    x = lazy.linspace(-1.0, 1.0, 5)
    assert torch.equal(F.relu(x), torch.relu(x))
    for name, size in DTYPES.items():
        assert torch_dtype(name) is getattr(torch, name) and torch_dtype(name).itemsize == size
    try:
        torch_dtype("int4")
    except ValueError as e:
        assert "int4" in str(e) and "float32" in str(e)
    else:
        raise AssertionError("an unknown dtype name was accepted")
