"""The engine end to end on a real local Ray instance (fake stages): two of tests/test_engine.py's
checks, run on :class:`evo.engine.runtime.Runtime` instead of the in-process runtime.

Ray's resource accounting is real here: the local instance declares two GPUs, so two GPU
evaluator actors are placed; the stages sleep instead of running nvcc and CUDA. Marked
``ray``: ``-m 'not ray'`` leaves them out (every other engine test runs without Ray).
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
import ray.cloudpickle as cloudpickle  # noqa: E402

import test_engine as engine_checks  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)
from fakes import stages as fake  # noqa: E402

cloudpickle.register_pickle_by_value(fake)

pytestmark = pytest.mark.ray

_shutdown_runtimes = engine_checks._shutdown_runtimes  # the runtimes a test started, shut down after it


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_search_on_ray_records_everything_and_improves_on_the_seed(local_ray, tmp_path):
    engine_checks.check_search_records_everything(tmp_path, on="ray")


def test_resume_on_ray_after_sigkill_evaluates_nothing_twice(local_ray, tmp_path):
    engine_checks.check_resume_after_sigkill(tmp_path, on="ray")
