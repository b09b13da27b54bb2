"""The LLM keys stay in the driver: a local Ray instance started by ``Runtime.start`` has
none of them in any of its processes (GCS, raylet, workers, the GPU actor that is every
harness child's parent), and the driver, which keeps them, is not readable through /proc.

Real Ray (fake stages, fake GPU resource). The secrets are random per run, so scanning
every process of the machine for them cannot match another test's.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import sys

import pytest

ray = pytest.importorskip("ray")
import ray.cloudpickle as cloudpickle  # noqa: E402

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.engine.runtime import Runtime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from fakes import stages as fake  # noqa: E402

cloudpickle.register_pickle_by_value(fake)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _environ(pid: int | str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _own_and_parent_environ() -> dict:  # defined here: shipped to the workers by value
    """Runs in a Ray worker: what it and its parent (the raylet) hold."""
    return {"pid": os.getpid(), "self": _environ("self"), "ppid": os.getppid(), "parent": _environ(os.getppid())}


class _Probe:
    def look(self) -> dict:
        return _own_and_parent_environ()


@pytest.fixture()
def secrets_env(monkeypatch):
    vals = {
        "OPENAI_API_KEY": "sk-" + secrets.token_hex(20),            # secret-looking name
        "MY_LLM_VALUE": "v-" + secrets.token_hex(20),               # a key_env passed to Runtime
        "SITE_THING": "t-" + secrets.token_hex(20),                 # named in EVO_SECRET_ENV
    }
    for k, v in vals.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EVO_SECRET_ENV", "SITE_THING")
    monkeypatch.setenv("INNOCENT_COPY", "copied:" + vals["OPENAI_API_KEY"])  # carries a value
    monkeypatch.setenv("EVO_KEEP_ME", "plain-setting")
    if ray.is_initialized():
        ray.shutdown()
    yield vals
    if ray.is_initialized():
        ray.shutdown()


def test_no_ray_process_holds_the_drivers_secrets(secrets_env):
    rt = Runtime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                 harness_settings=HarnessSettings(), num_cpus=2, num_gpus=1,
                 secret_env=("MY_LLM_VALUE",)).start()
    try:
        assert rt.started_ray
        # the driver keeps them (the LLM client reads its key later)
        for k, v in secrets_env.items():
            assert os.environ[k] == v
        assert os.environ["INNOCENT_COPY"].startswith("copied:")
        actor = ray.remote(_Probe).remote()   # the handle keeps the actor's process alive
        looks = [ray.get(actor.look.remote()),
                 ray.get(ray.remote(_own_and_parent_environ).remote())]
        # the GPU actor itself: the parent of every harness child
        gpu_pid = ray.get(rt.gpu_actors[0].__ray_call__.remote(lambda self: os.getpid()))
        assert gpu_pid != os.getpid()
        for look in looks:
            assert look["self"] is not None and b"EVO_KEEP_ME=plain-setting" in look["self"], \
                "ordinary settings still reach the workers"
            for where in ("self", "parent"):
                blob = look[where] or b""
                for v in secrets_env.values():
                    assert v.encode() not in blob, f"{where} of worker {look['pid']} holds a secret"
        holders = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                blob = _environ(d)
                if blob and any(v.encode() in blob for v in secrets_env.values()):
                    holders.append(d)
        assert holders == [], f"processes other than the driver hold a secret: {holders}"
        ray_pids = {look["pid"] for look in looks} | {look["ppid"] for look in looks} | {gpu_pid}
        assert all(_environ(p) is not None for p in ray_pids) or os.geteuid() != 0, \
            "the scan above could read the Ray processes"
        libc = ctypes.CDLL(None)
        assert libc.prctl(3, 0, 0, 0, 0) == 0, "the driver that holds the keys is not dumpable"
    finally:
        rt.shutdown()
