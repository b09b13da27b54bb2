"""Shared test setup.

* tests/fakes is importable from every test folder (tests/gpu too), whichever file pytest is
  asked to run first.
* Parallel runs: pyproject's ``addopts`` run the suite on pytest-xdist workers (``-n auto
  --dist loadgroup``). ``-n auto`` means one worker more than the CPUs this process may use,
  at most 8, and none (in-process, as ``-n 0``) on one CPU or when output must stream live
  (``-s``, ``log_cli``); ``PYTEST_XDIST_AUTO_NUM_WORKERS=N`` overrides. The extra worker is
  there because a fifth of the suite's test time is spent waiting, not computing (Ray start-up
  and shut-down, searches whose compiles run in Ray's own worker processes, child processes
  killed at their timeout): with one worker per CPU those waits leave a CPU idle, with one
  more the CPUs stay busy with the nvcc builds. Tests are handed out one by one,
  except that every test using a module-scoped fixture of its own module runs on one worker
  with the module's other users of it (a Ray instance or an nvcc build made once, not once per
  worker), and every ``gpu`` test runs on one worker (one at a time on the GPU: the timing
  checks measure a quiet device). xdist shows such a test's id with its group appended
  (``tests/test_engine.py::test_x@test_engine``); rerun it by the id without the ``@...``.
  Grouping needs pytest < 9.2 (pytest-dev/pytest-xdist#1386; the ``test`` extra pins it), and
  a warning says so when it did not take effect.
* Order of hand-out: xdist hands out the groups first (most tests first), then the single tests
  in collection order, which this file sorts so that the ``slow`` ones (nvcc builds of a
  CUTLASS kernel, tens of seconds each) come before the rest (stable otherwise). The run then
  ends on the many short tests, both workers busy to the end, instead of one worker building
  the last kernels of the alphabet while the other waits. Mark a test ``slow`` when it takes
  more than a few seconds; tests that share one build of the cache (tests/toolchain.py) and
  would otherwise run side by side, one worker waiting on the other's lock, share an
  ``xdist_group``.
* Each pytest process gets its own Ray temp dir (``RAY_TMPDIR``, removed at its end): a Ray
  instance started by a test on one worker never sees another worker's (``ray.init()`` with no
  address joins the cluster recorded in ``<RAY_TMPDIR>/ray/ray_current_cluster``, which
  ``ray.cluster_utils.Cluster`` writes), nor one of a concurrent pytest run on the same machine.
  Ray picks free ports itself (GCS, raylet, workers).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

#: Most xdist workers ``-n auto`` starts: each imports torch and may run an nvcc build of a
#: CUTLASS kernel (up to a few GB) or a Ray instance at the same time.
MAX_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Workers for ``-n auto`` (see the module docstring); ``None`` leaves it to xdist."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None                      # xdist's own hook reads it
    if config.getoption("capture", "fd") == "no" or config.getini("log_cli"):
        return 0                         # workers' output would only show at the end
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:               # not Linux
        cpus = os.cpu_count() or 1
    return 0 if cpus < 2 else min(cpus + 1, MAX_WORKERS)


def _module_fixture_group(item: pytest.Item) -> str | None:
    """The module's name (``test_engine``) when ``item`` uses a fixture of module scope (or
    wider) that its module itself defines; ``None`` otherwise."""
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::")[0]
    for defs in (info.name2fixturedefs.values() if info else ()):
        for fd in defs:
            if fd.scope != "function" and fd.baseid == module:
                return Path(module).stem
    return None


@pytest.hookimpl(wrapper=True)  # the marks go on before xdist's worker hook reads them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    groups = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue                     # the test file chose its group itself
        group = "gpu" if item.get_closest_marker("gpu") is not None else _module_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    # slow tests first (see the module docstring); sorted() is stable, so the order among the
    # slow ones and among the rest stays the collection's, the same on every worker
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)
    result = yield
    # xdist's worker hook marks a grouped test by appending "@<group>" to its node id; pytest
    # 9.2 ignores that (pytest-dev/pytest-xdist#1386) and the groups silently fall apart.
    if getattr(config.option, "loadgroup", False):
        lost = [i for i in items if i.nodeid in groups]
        if lost:
            warnings.warn(pytest.PytestWarning(
                f"--dist loadgroup did not group {len(lost)} tests (pytest {pytest.__version__} with this "
                "pytest-xdist, pytest-dev/pytest-xdist#1386): module fixtures run once per worker and gpu "
                "tests side by side; fix: pip install -e '.[test]' (it pins pytest<9.2)"))
    return result


_RAY_TMP: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    # The base is the caller's RAY_TMPDIR (or /tmp), remembered for the workers, which inherit
    # the controller's RAY_TMPDIR: kept short, as Ray's unix socket paths (at most 107 bytes)
    # live three folders below it.
    base = os.environ.setdefault("EVO_TEST_RAY_TMPDIR_BASE", os.environ.get("RAY_TMPDIR") or "/tmp")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = tempfile.mkdtemp(prefix=f"evo-ray-{worker}-", dir=base)
    _RAY_TMP.append(path)
    os.environ["RAY_TMPDIR"] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    while _RAY_TMP:
        shutil.rmtree(_RAY_TMP.pop(), ignore_errors=True)
