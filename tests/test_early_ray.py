"""``evo search`` begins a local Ray instance's start at entry, before the config is loaded
(evo.engine.early_ray): when it does (a pure decision), what it reads of the raw TOML
(evo.engine.local_ray.read_raw_ray), and how the instance is handed to the runtime or shut
down on its owning thread. No Ray starts here: a fake starter stands in for ``ray.init``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evo.engine import early_ray as early_mod
from evo.engine.early_ray import EarlyRay, early_start_decision, serves
from evo.engine.local_ray import LocalRaySettings, RawRay, read_raw_ray

REPO = Path(__file__).resolve().parents[1]
LOCAL = RawRay("", LocalRaySettings())


# ---- the decision ----

@pytest.mark.parametrize("dry_run, address, env_address, raw, nvidia_smi, start, why", [
    (False, None, None, LOCAL, True, True, "a local instance"),
    (False, None, "", LOCAL, True, True, "a local instance"),
    (True, None, None, LOCAL, True, False, "dry run"),
    (False, "10.0.0.5:6379", None, LOCAL, True, False, "--address"),
    (False, None, "auto", LOCAL, True, False, "RAY_ADDRESS"),
    (False, None, None, RawRay("auto", LocalRaySettings()), True, False, "ray.address"),
    (False, None, None, LOCAL, False, False, "nvidia-smi"),
    (False, None, None, None, True, False, "not understood"),
    (True, "x:1", "y:2", None, False, False, "dry run"),
])
def test_the_decision_starts_early_only_for_a_local_instance_on_a_gpu_machine(dry_run, address, env_address, raw,
                                                                            nvidia_smi, start, why):
    d = early_start_decision(dry_run=dry_run, address=address, env_address=env_address, raw=raw,
                             nvidia_smi=nvidia_smi)
    assert (d.start, why in d.why) == (start, True), d


@pytest.mark.parametrize("wanted, withheld, environ, problem", [
    (LocalRaySettings(), (), {}, None),
    (LocalRaySettings(num_cpus=4), (), {}, "num_cpus=4"),
    (LocalRaySettings(num_gpus=1), (), {}, "num_gpus=1"),
    (LocalRaySettings(secret_env=("MY_LLM",)), (), {}, None),                       # unset: nothing to keep out
    (LocalRaySettings(secret_env=("MY_LLM",)), ("MY_LLM",), {"MY_LLM": "k"}, None),  # set, and withheld
    (LocalRaySettings(secret_env=("MY_LLM",)), ("OTHER",), {"MY_LLM": "k"}, "MY_LLM"),
])
def test_an_instance_serves_the_same_counts_and_no_secret_of_the_config(wanted, withheld, environ, problem):
    why = serves(LocalRaySettings(), withheld, wanted, environ)
    assert (why is None) if problem is None else (problem in why), why


# ---- the raw TOML ----

def _toml(tmp_path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, expected", [
    ("", LOCAL),
    ("[run]\nname = 'x'\n", LOCAL),
    ("[ray]\naddress = 'auto'\n", RawRay("auto", LocalRaySettings())),
    ("[ray]\nnum_cpus = 8\nnum_gpus = 0\n", RawRay("", LocalRaySettings(num_cpus=8, num_gpus=0))),
    ("[ray]\nnum_cpus = 'auto'\nnum_gpus = 2\n", RawRay("", LocalRaySettings(num_gpus=2))),
    ("[llm]\n[[llm.models]]\nname = 'a'\nkey_env = 'MY_LLM'\n[[llm.models]]\nname = 'b'\n",
     RawRay("", LocalRaySettings(secret_env=("MY_LLM",)))),
    ("[ray\n", None),                                   # not TOML
    ("ray = 3\n", None),
    ("[ray]\nnum_cpus = '4'\n", None),                  # the config refuses a string
    ("[ray]\nnum_cpus = 0\n", None),                    # below its minimum
    ("[ray]\nnum_gpus = true\n", None),
    ("[ray]\naddress = 5\n", None),
    ("[llm]\nmodels = 'x'\n", None),
    ("[llm]\n[[llm.models]]\nkey_env = 7\n", None),
])
def test_the_raw_read_takes_only_what_it_understands(tmp_path, text, expected):
    got = read_raw_ray(_toml(tmp_path, text))
    assert got == expected


def test_the_raw_read_of_a_missing_or_binary_file_is_none(tmp_path):
    assert read_raw_ray(tmp_path / "none.toml") is None
    p = tmp_path / "b.toml"
    p.write_bytes(b"\xff\xfe[ray]")
    assert read_raw_ray(p) is None


def test_the_raw_read_agrees_with_the_validated_configs_of_the_repository():
    from evo.config import ConfigError, load_config

    checked = 0
    for path in sorted((REPO / "configs").rglob("*.toml")):
        try:
            cfg = load_config(path)
        except ConfigError:
            continue
        raw = read_raw_ray(path)
        assert raw is not None and raw.address == cfg.ray.address, path
        assert serves(raw.settings, raw.settings.secret_env, LocalRaySettings.of_config(cfg),
                      {k: "set" for k in LocalRaySettings.of_config(cfg).secret_env}) is None, path
        checked += 1
    assert checked >= 2


# ---- the hand-over, with a fake starter ----

class FakeRay:
    """Stands in for ``ray.init`` / ``ray.shutdown``: records which thread did what; the start
    waits for ``go`` (set by default) and fails with ``fail``."""

    def __init__(self, withheld=(), fail: Exception | None = None) -> None:
        self.withheld, self.fail = tuple(withheld), fail
        self.go = threading.Event()
        self.go.set()
        self.running = False
        self.log: list[tuple[str, str]] = []

    def start(self, settings):
        self.log.append(("start", threading.current_thread().name))
        assert self.go.wait(10)
        if self.fail is not None:
            raise self.fail
        self.running = True
        return self.withheld

    def stop(self):
        self.log.append(("stop" if self.running else "stop (nothing)", threading.current_thread().name))
        self.running = False


def test_a_matching_instance_is_handed_over_and_closed_on_its_own_thread():
    ray = FakeRay()
    early = EarlyRay(LocalRaySettings(num_gpus=1), starter=ray)
    seconds = early.hand_over(LocalRaySettings(num_gpus=1), environ={})
    assert seconds is not None and seconds >= 0 and ray.running and not early.closed
    early.close()
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")] and not ray.running
    assert not early._call.alive and early.closed
    early.close()  # idempotent
    assert early.hand_over(LocalRaySettings(num_gpus=1), environ={}) is None


@pytest.mark.parametrize("wanted, withheld, environ", [
    (LocalRaySettings(num_cpus=2), (), {}),                                  # other counts
    (LocalRaySettings(secret_env=("MY_LLM",)), (), {"MY_LLM": "sk-test"}),   # a secret reached the instance
])
def test_an_instance_that_cannot_serve_is_shut_down_before_the_caller_starts_its_own(wanted, withheld, environ):
    ray = FakeRay(withheld)
    early = EarlyRay(LocalRaySettings(), starter=ray)
    assert early.hand_over(wanted, environ=environ) is None
    assert early.closed and not early._call.alive and not ray.running
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")]


def test_a_failed_start_is_not_handed_over_and_its_error_is_left_to_the_callers_own_start():
    ray = FakeRay(fail=OSError("raylet did not come up (test)"))
    early = EarlyRay(LocalRaySettings(), starter=ray)
    assert early.hand_over(LocalRaySettings(), environ={}) is None
    assert early.closed and not early._call.alive
    assert ray.log == [("start", "evo-ray-start"), ("stop (nothing)", "evo-ray-start")]


def test_close_during_the_start_shuts_down_once_the_start_ended():
    ray = FakeRay()
    ray.go.clear()
    early = EarlyRay(LocalRaySettings(), starter=ray)
    closer = threading.Thread(target=early.close)
    closer.start()
    assert not early._call.join(0.05)   # the start is still under way: nothing stopped yet
    assert ("stop", "evo-ray-start") not in ray.log
    ray.go.set()
    closer.join(10)
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")] and not early._call.alive


# ---- run_search takes the instance over, or shuts it down and starts its own ----

def _runtime(monkeypatch, ray: FakeRay, seen: dict, fail: Exception | None = None):
    """``evo.engine.runtime.Runtime`` replaced by the in-process runtime (one fake GPU) that
    records how it was built and, like the real one, shuts down an instance it took over."""
    import evo.engine.runtime as runtime_mod
    from evo.engine.local_runtime import LocalRuntime

    class StandIn(LocalRuntime):
        def __init__(self, *, stages, compile_settings, harness_settings, address=None, num_cpus=None,
                     num_gpus=None, secret_env=(), started_ray=False):
            super().__init__(stages=stages, compile_settings=compile_settings, harness_settings=harness_settings,
                             num_gpus=1, num_cpus=2)
            self.started_ray = started_ray

        def start(self):
            seen.setdefault("starts", []).append((self.started_ray, ray.running, threading.current_thread().name))
            if fail is not None:
                raise fail
            if not self.started_ray:   # a start of its own: Ray comes up here
                ray.running = True
                self.started_ray = True
            return super().start()

        def shutdown(self):
            super().shutdown()
            if self.started_ray:
                ray.log.append(("runtime shutdown", threading.current_thread().name))
                ray.running = False

    monkeypatch.setattr(runtime_mod, "Runtime", StandIn)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


SEEDLESS_TASK = """
import torch
from evo.tasks import InputSpec, Task, TensorInputs, FP32_ELEMENTWISE

def flops(shape):
    return float(shape["N"])


def nbytes(shape):
    return 8.0 * shape["N"]


TASKS = [Task(name="seedless_relu", family="user", dtype="float32", description="relu",
              reference=torch.relu, make_inputs=TensorInputs((InputSpec(("N",)),), "float32"),
              shapes=({"N": 4096},), tolerance=FP32_ELEMENTWISE, flops=flops, bytes=nbytes, seed="")]
"""


def _config(tmp_path, ray_section: str = "", include: str = "kb19_relu", files: tuple = ()):
    from evo.config import load_config

    path = tmp_path / "s.toml"
    path.write_text(f"""
[run]
name = "early"
db = "{tmp_path / 'evo.db'}"
[tasks]
include = ["{include}"]
files = {[str(f) for f in files]!r}
[search]
islands_per_task = 1
max_evaluations = 2
in_flight = 1
{ray_section}
""")
    return load_config(path)


def _stages():
    from evo.engine.seams import Stages
    from fakes import stages as fake

    return Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False)


def _start_event(cfg, run_id):
    from evo.store import Store

    with Store.open_reader(cfg.run.db) as store:
        (start,) = [e for e in store.events(run_id) if e["kind"] == "start"]
    return start["payload"]["startup"]


def test_run_search_takes_over_a_matching_early_instance(monkeypatch, tmp_path):
    from evo.engine.search import run_search
    from evo.engine.startup import StartupClock

    ray, seen = FakeRay(), {}
    _runtime(monkeypatch, ray, seen)
    cfg = _config(tmp_path)
    clock = StartupClock("cli")
    early = EarlyRay(LocalRaySettings(), starter=ray)
    clock.mark("ray_start")
    summary = run_search(cfg, progress=False, stages=_stages(), startup=clock, early_ray=early)
    assert summary.evaluations == 2
    assert seen["starts"] == [(True, True, "MainThread")]   # only the workers, on the instance already up
    assert ray.log == [("start", "evo-ray-start"), ("runtime shutdown", "MainThread"),
                       ("stop (nothing)", "evo-ray-start")]
    assert early.closed and not early._call.alive
    startup = _start_event(cfg, summary.run_id)
    assert list(startup["age_at"]) == ["cli", "ray_start", "seeds", "store", "prepared", "ray_ready"]
    assert startup["ray_early"] is True and startup["ray_overlapped"] is True


def test_run_search_shuts_a_mismatched_early_instance_down_and_starts_its_own(monkeypatch, tmp_path):
    from evo.engine.search import run_search
    from evo.engine.startup import StartupClock

    ray, seen = FakeRay(), {}
    _runtime(monkeypatch, ray, seen)
    cfg = _config(tmp_path, "[ray]\nnum_cpus = 2")
    clock = StartupClock("cli")
    early = EarlyRay(LocalRaySettings(), starter=ray)   # begun before the config said num_cpus = 2
    clock.mark("ray_start")
    summary = run_search(cfg, progress=False, stages=_stages(), startup=clock, early_ray=early)
    assert summary.evaluations == 2
    # the early instance was gone before the search's own start began (on a thread of its own)
    assert ray.log[:2] == [("start", "evo-ray-start"), ("stop", "evo-ray-start")]
    assert seen["starts"] == [(False, False, "evo-ray-start")]
    startup = _start_event(cfg, summary.run_id)
    assert startup["ray_early"] is False and list(startup["age_at"])[-2:] == ["ray_start", "ray_ready"]


@pytest.mark.parametrize("where", ["runtime", "seeds"])
def test_a_search_that_fails_after_the_early_start_shuts_the_instance_down(monkeypatch, tmp_path, where):
    from evo.engine.runtime import RuntimeError_
    from evo.engine.search import SearchError, run_search

    ray, seen = FakeRay(), {}
    _runtime(monkeypatch, ray, seen, fail=RuntimeError_("the Ray cluster has no GPU resources (test)"))
    if where == "runtime":
        cfg, match = _config(tmp_path), r"^the Ray cluster has no GPU resources \(test\)$"
    else:  # a task without a seed, refused before any run exists
        task = tmp_path / "t.py"
        task.write_text(SEEDLESS_TASK)
        cfg, match = _config(tmp_path, include="seedless_relu", files=(task,)), "has no seed"
    early = EarlyRay(LocalRaySettings(), starter=ray)
    with pytest.raises(SearchError, match=match):
        run_search(cfg, progress=False, stages=_stages(), early_ray=early)
    assert early.closed and not early._call.alive and not ray.running
    assert ray.log[0] == ("start", "evo-ray-start") and ray.log[-1][1] == "evo-ray-start"


def test_the_llm_keys_are_checked_only_once_the_early_start_gave_the_environment_back(monkeypatch, tmp_path):
    """While the instance starts, the secrets are out of the process's environment: a key read
    then would be missing. The start here ends only once someone waits for it or reads a key."""
    import evo.engine.llm_check as llm_check
    from evo.engine.search import SearchError, run_search

    ray, seen = FakeRay(), {}
    ray.go.clear()
    _runtime(monkeypatch, ray, seen)
    real_wait = EarlyRay.wait

    def wait(self):
        ray.go.set()
        real_wait(self)

    checked: list[bool] = []

    def missing_keys(cfg):
        checked.append(early._call.done())
        ray.go.set()
        return ["stop here (test)"]

    monkeypatch.setattr(EarlyRay, "wait", wait)
    monkeypatch.setattr(llm_check, "missing_keys", missing_keys)
    cfg = _config(tmp_path, '[mutator]\nkind = "llm"\n[llm]\n[[llm.models]]\nname = "m"\n'
                            'base_url = "http://127.0.0.1:9/v1"\nmodel = "m"\nkey_env = "MY_LLM"\n')
    early = EarlyRay(LocalRaySettings(secret_env=("MY_LLM",)), starter=ray)
    with pytest.raises(SearchError, match="stop here"):
        run_search(cfg, progress=False, stages=_stages(), early_ray=early)
    assert checked == [True] and early.closed and not ray.running


# ---- the CLI: no early start where it cannot pay off; every way out closes it ----

@pytest.fixture
def cli_ray(monkeypatch):
    """The CLI's early start with the fake starter, on a machine that "has" nvidia-smi, and
    no SIGTERM handler installed into the test process."""
    rays: list[FakeRay] = []

    def starter():
        rays.append(FakeRay())
        return rays[-1]

    monkeypatch.setattr(early_mod, "_RayStarter", starter)
    monkeypatch.setattr(early_mod, "exit_on_sigterm", lambda: None)
    monkeypatch.setattr(early_mod, "nvidia_smi_on_path", lambda: True)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return rays


def _invoke(*args):
    from evo.cli import app

    return CliRunner().invoke(app, ["search", *map(str, args), "--no-progress"])


def test_the_cli_begins_no_early_start_for_a_config_it_cannot_read_and_reports_the_config_error(cli_ray, tmp_path):
    res = _invoke(_toml(tmp_path, "[ray\n"))
    assert res.exit_code == 2 and "error:" in res.output and "c.toml" in res.output, res.output
    assert cli_ray == []


def test_the_cli_begins_no_early_start_without_nvidia_smi(cli_ray, monkeypatch, tmp_path):
    monkeypatch.setattr(early_mod, "nvidia_smi_on_path", lambda: False)
    res = _invoke(_toml(tmp_path, "[search]\nislands_per_task = 0\n"))
    assert res.exit_code == 2 and "islands_per_task" in res.output, res.output
    assert cli_ray == []


def test_an_invalid_config_shuts_the_early_instance_down_and_reports_only_its_error(cli_ray, tmp_path):
    res = _invoke(_toml(tmp_path, "[search]\nislands_per_task = 0\n"))
    assert res.exit_code == 2 and "islands_per_task" in res.output, res.output
    assert "Ray" not in res.output and "Traceback" not in res.output
    (ray,) = cli_ray
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")] and not ray.running


def test_no_gpu_after_an_early_start_shuts_it_down_with_the_one_line_error(cli_ray, monkeypatch, tmp_path):
    import evaluators.pipeline as pipeline

    monkeypatch.setattr(pipeline, "gpu_available", lambda: False)
    res = _invoke("configs/demo.toml", "--db", tmp_path / "x.db")
    assert res.exit_code == 2 and "no CUDA GPU found" in res.output, res.output
    (ray,) = cli_ray
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")] and not ray.running


def test_ctrl_c_while_the_config_loads_shuts_the_early_instance_down(cli_ray, monkeypatch):
    import evo.config as config

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(config, "load_config", interrupted)
    res = _invoke("configs/demo.toml")
    assert res.exit_code != 0
    (ray,) = cli_ray
    assert ray.log == [("start", "evo-ray-start"), ("stop", "evo-ray-start")] and not ray.running


def test_the_cli_hands_its_early_instance_and_its_mark_to_run_search(cli_ray, monkeypatch, tmp_path):
    import evaluators.pipeline as pipeline
    from evo.engine import search
    from evo.engine.bookkeeping import SearchSummary

    got = {}

    def run_search(cfg, **kw):
        got.update(kw)
        return SearchSummary("r-test", 0, 0, "test", {}, 0, 0, 0, 0)

    monkeypatch.setattr(pipeline, "gpu_available", lambda: True)
    monkeypatch.setattr(search, "run_search", run_search)
    res = _invoke("configs/demo.toml", "--db", tmp_path / "x.db", "--resume", "r-old")
    assert res.exit_code == 0, res.output
    assert isinstance(got["early_ray"], EarlyRay) and got["early_ray"].settings == LocalRaySettings()
    assert [s for s, _ in got["startup"].record(None, False).age_at][:2] == ["cli", "ray_start"]
    assert got["early_ray"].closed   # the CLI closes what run_search did not (here: a stand-in)


def test_a_dry_run_or_a_named_cluster_begins_no_early_start(cli_ray, monkeypatch, tmp_path):
    from evo.engine.early_ray import begin_early_ray

    demo = REPO / "configs" / "demo.toml"
    assert begin_early_ray(demo, dry_run=True, address=None) is None
    assert begin_early_ray(demo, dry_run=False, address="10.0.0.5:6379") is None
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert begin_early_ray(demo, dry_run=False, address=None) is None
    assert cli_ray == []
