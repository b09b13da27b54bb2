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


_PROBE = r"""
import json, sys
from evaluators.pipeline import torch_cuda_build
print(json.dumps({"cuda": torch_cuda_build(), "imported": "torch" in sys.modules}))
"""


def _fake_torch(root: Path, version_py: str, init_raises: bool = True) -> Path:
    pkg = root / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the fake torch was imported (test)')\n" if init_raises
                                     else "from . import version\n")
    (pkg / "version.py").write_text(version_py)
    return root


def _probe(path: Path) -> dict:
    env = {**__import__("os").environ, "PYTHONPATH": f"{path}:{ROOT}"}
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_gpu_probe_reads_whether_torch_is_a_cuda_build_without_importing_it(tmp_path):
    cuda = _fake_torch(tmp_path / "cuda", "from typing import Optional\ncuda: Optional[str] = '13.0'\n")
    cpu = _fake_torch(tmp_path / "cpu", "from typing import Optional\n__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    plain = _fake_torch(tmp_path / "plain", "cuda = '12.8'\n")
    assert _probe(cuda) == {"cuda": True, "imported": False}
    assert _probe(cpu) == {"cuda": False, "imported": False}
    assert _probe(plain) == {"cuda": True, "imported": False}


def test_a_version_file_it_cannot_read_as_a_literal_falls_back_to_importing_torch(tmp_path):
    computed = _fake_torch(tmp_path / "computed", "cuda = '.'.join(['13', '0'])\n", init_raises=False)
    assert _probe(computed) == {"cuda": True, "imported": True}
    broken = _fake_torch(tmp_path / "broken", "cuda = compute()\n")   # and torch itself fails to import
    assert _probe(broken) == {"cuda": False, "imported": False}


def test_a_stand_in_reads_attributes_from_the_module_each_time(monkeypatch):
    import torch

    from evo.tasks.lazy_torch import torch as lazy

    assert lazy.relu is torch.relu
    monkeypatch.setattr(torch, "relu", torch.sigmoid)   # set on the module after the first read
    assert lazy.relu is torch.sigmoid
