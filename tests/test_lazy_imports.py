"""``import evo.core.records`` (done by the isolated GPU child, the mutators and the island actors)
loads neither the lineage store nor sqlite-utils, numpy or torch: ``evo/__init__`` is lazy.
Each check runs in a fresh interpreter, since this test process has imported everything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import evo

REPO_ROOT = Path(evo.__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.parametrize("module", ["sqlite_utils", "evo.store", "sqlite3", "numpy", "torch", "ray"])
def test_import_evo_records_loads_no_store_and_nothing_heavy(module):
    res = _run(f"import evo.core.records, sys; assert {module!r} not in sys.modules, sorted(sys.modules)")
    assert res.returncode == 0, f"import evo.core.records loaded {module}: {res.stderr[-2000:]}"


def test_the_top_level_names_still_resolve_lazily():
    res = _run(
        "import sys, evo\n"
        "assert 'evo.store' not in sys.modules\n"
        "from evo import Candidate, Store, StoreError, SCHEMA_VERSION\n"
        "import evo.store, evo.core.records\n"
        "assert Store is evo.store.Store and Candidate is evo.core.records.Candidate\n"
        "assert set(evo.__all__) <= set(dir(evo))\n"
        "from evo import engine  # a subpackage, not a lazy name\n"
        "try:\n"
        "    evo.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_in_process_runtime_and_the_engine_import_no_ray():
    """The engine's tests drive it through evo.engine.local_runtime without starting (or
    importing) Ray: neither module, nor the GPU evaluator and island classes it hosts, load it."""
    res = _run("import sys, evo.engine.local_runtime, evo.engine.engine, evaluators.actor, populations.actor\n"
               "assert 'ray' not in sys.modules, [m for m in sys.modules if m.startswith('ray')][:5]")
    assert res.returncode == 0, res.stderr[-2000:]
