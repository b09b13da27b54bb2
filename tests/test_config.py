"""Tests for evo.config: schema, defaults, shipped configs and every kind of mistake.

Most tests run against a small fake built-in task registry (installed by the ``registry``
fixture) so they do not depend on the task suite's contents; ``test_shipped_configs_real_registry``
checks the shipped configs against the real registry.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import evo.tasks.registry
from evaluators.base import CompileSettings, HarnessSettings
from evo.config import (
    Config,
    ConfigError,
    demo_config_path,
    load_config,
    load_tasks,
    parse_config,
    parse_override,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo.toml"
EXAMPLES = sorted((REPO / "configs" / "examples").glob("*.toml"))
#: Examples the fake registry can check: one that defines tasks in Python files (tasks.files)
#: is checked against the real registry only (test_shipped_configs_real_registry).
FAKE_EXAMPLES = [p for p in EXAMPLES if "files" not in tomllib.loads(p.read_text()).get("tasks", {})]
MINIMAL = {"tasks": {"include": ["kb19_relu"]}}


class FakeRegistry:
    """Stands in for evo.tasks.BUILTIN_TASKS (an immutable TaskRegistry): a few built-in
    names, two families, and ``with_files``, which returns a new registry with one task (family
    ``user``) per line ``task <name>`` of each file; every file it reads is appended to the
    shared ``loaded`` list."""

    def __init__(self, names=None, user=(), loaded=None):
        self._names = names or ("kb19_relu", "kb23_softmax", "gelu_bf16", "gemm_bf16_irregular", "kb01_square",
                                "gemm_bf16")
        self._user = tuple(user)
        self.loaded: list[Path] = [] if loaded is None else loaded

    def names(self):
        return list(self._names + self._user)

    def families(self):
        return ["kernelbench-l1", "modern"] + (["user"] if self._user else [])

    def with_files(self, paths):
        user = list(self._user)
        for path in paths:
            self.loaded.append(Path(path))
            text = Path(path).read_text()
            if "raise" in text:
                raise SyntaxError("invalid syntax (line 1)")
            user += [line.split()[1] for line in text.splitlines() if line.startswith("task ")]
        return FakeRegistry(self._names, user, self.loaded)


@pytest.fixture
def registry(monkeypatch):
    fake = FakeRegistry()
    monkeypatch.setattr(evo.tasks.registry, "BUILTIN_TASKS", fake)
    return fake


def write(tmp_path: Path, text: str, name: str = "x.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(data, overrides=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="configs/x.toml", overrides=overrides)
    return info.value


def one_line(err: ConfigError) -> str:
    assert len(err.problems) == 1, str(err)
    return str(err)


# ---------------------------------------------------------------------------- good configs


def test_defaults_match_documented_values(registry):
    cfg = parse_config(MINIMAL)
    assert cfg.run.name == "search" and cfg.run.seed == 0 and cfg.run.gpu == "auto"
    assert cfg.run.db == Path.cwd() / "runs/evo.db"
    assert cfg.tasks.include == ("kb19_relu",) and cfg.tasks.files == ()
    s = cfg.search
    assert (s.islands_per_task, s.population_size, s.max_evaluations) == (2, 16, 200)
    assert (s.max_wall_minutes, s.in_flight, s.migration_every, s.migration_count) == (10, 0, 40, 2)
    assert s.selection_lambda == 1.0 and s.archive is True
    assert (cfg.mutator.kind, cfg.mutator.crossover_rate, cfg.mutator.perturb_max) == ("knobs", 0.3, 2)
    assert (cfg.mutator.sweep_rate, cfg.mutator.sweep_threshold) == (0.5, 0.03)
    c = cfg.compile
    assert (c.arch, c.timeout_s, c.memory_mb) == ("sm_90a", 300, 8192)
    assert c.cache_dir == Path.cwd() / ".evo/cache"
    e = cfg.evaluator
    assert (e.trials, e.warmup, e.reps, e.flush_mb, e.timeout_s) == (5, 10, 50, 256, 300)
    assert (cfg.ray.address, cfg.ray.num_gpus, cfg.ray.num_cpus) == ("", "auto", "auto")
    assert cfg.source_path is None


def test_config_is_frozen(registry):
    cfg = parse_config(MINIMAL)
    with pytest.raises(ValidationError):
        cfg.search.max_evaluations = 3
    with pytest.raises(ValidationError):
        cfg.run = cfg.run


def test_settings_helpers(registry):
    cfg = parse_config(
        {
            **MINIMAL,
            "compile": {"arch": "sm_100a", "timeout_s": 60, "memory_mb": 1024, "cache_dir": "/tmp/c"},
            "evaluator": {"trials": 7, "warmup": 3, "reps": 20, "flush_mb": 128, "timeout_s": 90.5},
        }
    )
    cs = cfg.compile_settings()
    assert isinstance(cs, CompileSettings)
    assert cs == CompileSettings(arch="sm_100a", timeout_s=60.0, memory_mb=1024, cache_dir="/tmp/c")
    hs = cfg.harness_settings()
    assert isinstance(hs, HarnessSettings)
    assert hs == HarnessSettings(trials=7, warmup=3, reps=20, flush_mb=128, timeout_s=90.5)
    assert isinstance(hs.timeout_s, float) and isinstance(cs.timeout_s, float)


def test_hash_and_to_dict(registry):
    a = parse_config(MINIMAL)
    b = parse_config({"tasks": {"include": ["kb19_relu"]}, "search": {"max_evaluations": 200}})
    c = parse_config({"tasks": {"include": ["kb19_relu"]}, "search": {"max_evaluations": 201}})
    assert a.hash() == b.hash() != c.hash()
    assert len(a.hash()) == 64 and int(a.hash(), 16) >= 0
    d = a.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON types only
    assert d["tasks"]["include"] == ["kb19_relu"] and isinstance(d["run"]["db"], str)
    assert sorted(d) == ["compile", "evaluator", "llm", "mutator", "profile", "ray", "run", "search", "tasks", "tuning"]
    # the dict round-trips into an equal config
    assert parse_config(d).hash() == a.hash()


def test_relative_paths_resolve_against_cwd(registry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytasks.py").write_text("task my_op\n")
    cfg = parse_config(
        {
            "run": {"db": "out/run.db"},
            "compile": {"cache_dir": "~/cache"},
            "tasks": {"include": ["my_op"], "files": ["mytasks.py"]},
        }
    )
    assert cfg.run.db == tmp_path / "out/run.db"
    assert cfg.compile.cache_dir == Path.home() / "cache"
    assert cfg.tasks.files == (tmp_path / "mytasks.py",)


def test_validation_runs_no_task_file_and_load_tasks_loads_them_into_a_registry_of_its_own(registry, tmp_path):
    """Validating a config only checks that its task files exist; :func:`load_tasks` (the
    search's start) loads them into a new registry and checks the include entries that no
    built-in task matched. The built-in registry is left as it was."""
    f = write(tmp_path, "task my_fused_op\n", "user_tasks.py")
    data = {"tasks": {"files": [str(f)], "include": ["my_fused_op", "family:modern", "family:user"]}}
    cfg = parse_config(data)
    assert cfg.tasks.include == ("my_fused_op", "family:modern", "family:user")
    assert registry.loaded == []  # nothing ran
    tasks = load_tasks(cfg)
    assert registry.loaded == [f] and "my_fused_op" in tasks.names() and "user" in tasks.families()
    assert "my_fused_op" not in registry.names() and evo.tasks.registry.BUILTIN_TASKS is registry
    assert load_tasks(parse_config(MINIMAL)) is registry  # no files: the built-ins themselves


def test_load_tasks_names_the_include_entry_no_file_defines(registry, tmp_path):
    """An entry deferred at validation (the config has task files) gets the same line as an
    entry validation rejects: the file, the key, the value and the names allowed."""
    f = write(tmp_path, "task my_fused_op\n", "user_tasks.py")
    cfg = parse_config({"tasks": {"files": [str(f)], "include": ["kb19_relu", "my_fused_po", "family:usr"]}},
                       source="configs/x.toml")
    with pytest.raises(ConfigError) as info:
        load_tasks(cfg)
    err = info.value
    assert [k for k, _ in err.problems] == ["tasks.include[1]", "tasks.include[2]"]
    lines = str(err).splitlines()
    assert lines[0].startswith('configs/x.toml: tasks.include[1] = "my_fused_po": unknown task (did you mean '
                               '"my_fused_op"?); use a task name or "family:<name>" (families: kernelbench-l1, '
                               'modern, user;')
    assert lines[1].strip().startswith("known tasks: ") and "my_fused_op" in lines[1]
    assert lines[2] == ('configs/x.toml: tasks.include[2] = "family:usr": unknown task family (did you mean '
                        '"family:user"?); known families: "family:kernelbench-l1", "family:modern", "family:user"')
    with pytest.raises(ConfigError, match=r'tasks.include\[0\] = "my_fused_po": unknown task'):
        parse_config({"tasks": {"include": ["my_fused_po"]}})  # no files: rejected at validation


def test_load_config_sets_source_path_and_overrides(registry, tmp_path):
    path = write(tmp_path, '[tasks]\ninclude = ["kb19_relu"]\n[search]\nmax_evaluations = 50\n')
    cfg = load_config(path, overrides={"search.max_evaluations": 10, "run.seed": 7, "run.name": None})
    assert cfg.source_path == path
    assert cfg.search.max_evaluations == 10 and cfg.run.seed == 7 and cfg.run.name == "search"
    assert load_config(str(path)).search.max_evaluations == 50
    # overrides may create sections and replace lists; Path values are accepted
    cfg = load_config(path, overrides={"tasks.include": ("kb23_softmax",), "compile.cache_dir": tmp_path})
    assert cfg.tasks.include == ("kb23_softmax",) and cfg.compile.cache_dir == tmp_path


def test_ray_and_gpu_values(registry):
    cfg = parse_config({**MINIMAL, "ray": {"address": "auto", "num_gpus": 0, "num_cpus": 4}, "run": {"gpu": "h200"}})
    assert (cfg.ray.address, cfg.ray.num_gpus, cfg.ray.num_cpus) == ("auto", 0, 4)
    assert cfg.run.gpu == "H200"  # canonical spelling


def test_int_accepted_where_float_expected(registry):
    cfg = parse_config({**MINIMAL, "search": {"max_wall_minutes": 9, "selection_lambda": 2}})
    assert cfg.search.max_wall_minutes == 9.0 and isinstance(cfg.search.max_wall_minutes, float)


def test_parse_override():
    assert parse_override("search.max_evaluations=10") == ("search.max_evaluations", 10)
    assert parse_override("search.archive = false") == ("search.archive", False)
    assert parse_override('tasks.include=["a", "family:modern"]') == ("tasks.include", ["a", "family:modern"])
    assert parse_override("run.name=nightly") == ("run.name", "nightly")
    assert parse_override('run.name="1"') == ("run.name", "1")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("search.max_evaluations")


# ---------------------------------------------------------------------------- shipped configs


def _schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        if not field.is_required() and field.default is None:
            continue  # optional sections ([llm]) are documented in their own docs
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _schema_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def _toml_keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in data.items():
        keys |= _toml_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return keys


def test_demo_config_lists_and_comments_every_key(registry):
    assert demo_config_path() == DEMO
    with DEMO.open("rb") as f:
        data = tomllib.load(f)
    assert _toml_keys(data) == _schema_keys(Config)
    lines = DEMO.read_text().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.lstrip().startswith("#"):
            assert lines[i - 1].lstrip().startswith("#"), f"demo.toml line {i + 1} has no comment: {line}"


def test_demo_config_values(registry):
    cfg = load_config(DEMO)
    assert cfg.tasks.include == ("kb23_softmax", "gelu_bf16", "gemm_bf16_irregular", "kb19_relu")
    assert cfg.search.islands_per_task == 2
    assert cfg.search.max_evaluations == 48 and cfg.search.max_wall_minutes == 8
    assert cfg.mutator.kind == "knobs" and cfg.compile.arch == "sm_90a"


@pytest.mark.parametrize("path", FAKE_EXAMPLES, ids=lambda p: p.name)
def test_examples_load(registry, path):
    cfg = load_config(path)
    assert cfg.source_path == path


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"kernelbench.toml", "modern.toml"}


def test_docs_mention_every_key():
    doc = (REPO / "docs" / "config.md").read_text()
    for key in _schema_keys(Config):
        section, name = key.split(".")
        assert f"[{section}]" in doc and f"`{name}`" in doc, key


def test_shipped_configs_real_registry():
    """The shipped configs name tasks that the real task suite (plus their task files) has."""
    for path in [DEMO, *EXAMPLES]:
        cfg = load_config(path)
        assert load_tasks(cfg).select(cfg.tasks.include)


# ---------------------------------------------------------------------------- file-level errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: file not found"
    assert isinstance(info.value, ValueError)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_toml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, '[search]\nislands_per_task = 2\nmax_evaluations = = 3\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: TOML syntax error at line 3, column ")
    assert "\n" not in msg and info.value.__cause__ is None


def test_toml_syntax_error_at_end(tmp_path):
    path = write(tmp_path, "[tasks]\ninclude = [\n")
    with pytest.raises(ConfigError, match="TOML syntax error"):
        load_config(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "x.toml"
    path.write_bytes(b"[run]\nname = \"\xff\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


# ---------------------------------------------------------------------------- schema errors


def test_unknown_nested_key_with_suggestion(registry, tmp_path):
    path = write(tmp_path, '[tasks]\ninclude = ["kb19_relu"]\n[search]\nisands = 3\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: unknown key 'search.isands' (did you mean 'search.islands_per_task'?; allowed: ")
    assert "population_size" in msg and "\n" not in msg
    assert info.value.problems[0][0] == "search.isands"


def test_unknown_key_without_close_match_lists_allowed(registry):
    msg = one_line(error_of({**MINIMAL, "evaluator": {"zzz": 1}}))
    assert "unknown key 'evaluator.zzz' (allowed: trials, warmup, reps, flush_mb, timeout_s, reference, call_timeout_s)" in msg


def test_unknown_section_with_suggestion(registry):
    msg = one_line(error_of({**MINIMAL, "serch": {"islands_per_task": 2}}))
    assert msg == (
        "configs/x.toml: unknown section [serch] (did you mean [search]?; "
        "allowed: run, tasks, search, mutator, compile, evaluator, ray, profile, tuning, llm)"
    )


def test_top_level_key_outside_section(registry):
    msg = one_line(error_of({**MINIMAL, "seed": 3}))
    assert "unknown top-level key 'seed' (did you mean 'run.seed'?; keys belong in a section" in msg


LLM_MODEL = {"name": "local", "base_url": "http://127.0.0.1:8000/v1", "model": "m"}


def test_llm_section_validates(registry):
    cfg = parse_config({**MINIMAL, "mutator": {"kind": "llm"}, "llm": {"models": [LLM_MODEL]}},
                       source="configs/x.toml")
    assert cfg.llm.models[0].name == "local" and cfg.llm.budget_usd == 20.0
    msg = one_line(error_of({**MINIMAL, "llm": {"models": [{**LLM_MODEL, "modle": "x"}]}}))
    assert "unknown key 'llm.models[0].modle'" in msg or "llm.models.0.modle" in msg, msg
    msg = one_line(error_of({**MINIMAL, "llm": {"models": [{**LLM_MODEL, "temperature": 5}]}}))
    assert "temperature" in msg and "5" in msg
    msg = one_line(error_of({**MINIMAL, "llm": {"models": [LLM_MODEL, LLM_MODEL]}}))
    assert "duplicate name" in msg
    msg = one_line(error_of({**MINIMAL, "mutator": {"kind": "llm"}}))
    assert "needs an [llm] section" in msg


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"run": {"seed": "3"}}, 'run.seed = "3": must be an integer'),
        ({"search": {"archive": 1}}, "search.archive = 1: must be true or false"),
        ({"search": {"max_evaluations": 10.0}}, "search.max_evaluations = 10.0: must be an integer"),
        ({"search": {"max_wall_minutes": "ten"}}, 'search.max_wall_minutes = "ten": must be a number'),
        ({"search": {"selection_lambda": True}}, "search.selection_lambda = true: must be a number"),
        ({"run": {"name": 5}}, "run.name = 5: must be a string"),
        ({"run": {"db": 5}}, "run.db = 5: must be a path string"),
        ({"search": 3}, "search = 3: must be a table (a [search] section)"),
        ({"ray": {"num_gpus": "all"}}, 'ray.num_gpus = "all": must be an integer >= 0 or "auto"'),
        ({"ray": {"num_cpus": 0}}, 'ray.num_cpus = 0: must be an integer >= 1 or "auto"'),
        ({"ray": {"num_gpus": True}}, 'ray.num_gpus = true: must be an integer >= 0 or "auto"'),
    ],
)
def test_wrong_type(registry, data, expected):
    msg = one_line(error_of({**MINIMAL, **data}))
    assert msg == f"configs/x.toml: {expected}"


def test_include_must_be_a_list(registry):
    msg = one_line(error_of({"tasks": {"include": "kb19_relu"}}))
    assert msg == 'configs/x.toml: tasks.include = "kb19_relu": must be a list'


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"search": {"islands_per_task": -1}}, "search.islands_per_task = -1: must be between 1 and 64"),
        ({"search": {"islands_per_task": 65}}, "search.islands_per_task = 65: must be between 1 and 64"),
        ({"search": {"population_size": 1}}, "search.population_size = 1: must be between 2 and 1024"),
        ({"search": {"max_evaluations": 0}}, "search.max_evaluations = 0: must be >= 1"),
        ({"search": {"max_wall_minutes": 0}}, "search.max_wall_minutes = 0: must be > 0"),
        ({"search": {"max_wall_minutes": float("inf")}}, "search.max_wall_minutes = inf: must be a finite number"),
        ({"search": {"in_flight": -1}}, "search.in_flight = -1: must be >= 0"),
        ({"search": {"selection_lambda": 0.0}}, "search.selection_lambda = 0.0: must be > 0"),
        ({"mutator": {"crossover_rate": 1.5}}, "mutator.crossover_rate = 1.5: must be between 0 and 1"),
        ({"mutator": {"perturb_max": 0}}, "mutator.perturb_max = 0: must be >= 1"),
        ({"mutator": {"sweep_rate": 1.5}}, "mutator.sweep_rate = 1.5: must be between 0 and 1"),
        ({"mutator": {"sweep_rate": -0.1}}, "mutator.sweep_rate = -0.1: must be between 0 and 1"),
        ({"mutator": {"sweep_threshold": 0}}, "mutator.sweep_threshold = 0: must be > 0"),
        ({"compile": {"memory_mb": 256}}, "compile.memory_mb = 256: must be between 512 and 1048576"),
        ({"compile": {"memory_mb": 10**13}},
         "compile.memory_mb = 10000000000000: must be between 512 and 1048576"),
        ({"compile": {"timeout_s": -1}}, "compile.timeout_s = -1: must be > 0"),
        ({"profile": {"top_k": 0}}, "profile.top_k = 0: must be >= 1"),
        ({"profile": {"timeout_s": 0}}, "profile.timeout_s = 0: must be > 0"),
        ({"tuning": {"trials_per_survivor": 0}}, "tuning.trials_per_survivor = 0: must be >= 1"),
        ({"tuning": {"max_concurrent": 0}}, "tuning.max_concurrent = 0: must be >= 1"),
        ({"evaluator": {"trials": 4}}, "evaluator.trials = 4: must be >= 5"),
        ({"evaluator": {"reps": 9}}, "evaluator.reps = 9: must be >= 10"),
        ({"evaluator": {"flush_mb": 32}}, "evaluator.flush_mb = 32: must be >= 64"),
        ({"evaluator": {"warmup": 0}}, "evaluator.warmup = 0: must be >= 1"),
        ({"run": {"seed": -1}}, "run.seed = -1: must be >= 0"),
        ({"run": {"name": ""}}, 'run.name = "": must not be empty'),
        (
            {"search": {"migration_count": 20, "population_size": 8}},
            "search.migration_count = 20: must be <= search.population_size (8)",
        ),
    ],
)
def test_out_of_range(registry, data, expected):
    msg = one_line(error_of({**MINIMAL, **data}))
    assert msg == f"configs/x.toml: {expected}"


def test_bad_enum_values(registry):
    msg = one_line(error_of({**MINIMAL, "mutator": {"kind": "knob"}}))
    assert msg == 'configs/x.toml: mutator.kind = "knob": did you mean "knobs"? allowed: "knobs" or "llm"'
    msg = one_line(error_of({**MINIMAL, "mutator": {"kind": "gpt"}}))
    assert msg == 'configs/x.toml: mutator.kind = "gpt": allowed: "knobs" or "llm"'
    msg = one_line(error_of({**MINIMAL, "run": {"gpu": "MI300X"}}))
    assert msg.startswith('configs/x.toml: run.gpu = "MI300X": unknown GPU; allowed: "auto", ')
    assert '"H100"' in msg and '"H200"' in msg
    msg = one_line(error_of({**MINIMAL, "compile": {"arch": "sm90a"}}))
    assert msg.startswith('configs/x.toml: compile.arch = "sm90a": must match ') and "sm_90a" in msg


def test_unknown_task_name(registry):
    err = error_of({"tasks": {"include": ["kb19_relu", "kb23_sofmax"]}})
    assert err.problems[0][0] == "tasks.include[1]"
    first, second = str(err).splitlines()
    assert first.startswith('configs/x.toml: tasks.include[1] = "kb23_sofmax": unknown task (did you mean "kb23_softmax"?)')
    assert "family:<name>" in first and "kernelbench-l1, modern" in first
    assert second.strip().startswith("known tasks: ") and "gelu_bf16" in second


def test_unknown_family(registry):
    msg = one_line(error_of({"tasks": {"include": ["family:kernelbench"]}}))
    assert msg == (
        'configs/x.toml: tasks.include[0] = "family:kernelbench": unknown task family '
        '(did you mean "family:kernelbench-l1"?); known families: "family:kernelbench-l1", "family:modern"'
    )


def test_include_empty_duplicated_or_missing(registry):
    assert one_line(error_of({"tasks": {"include": []}})) == "configs/x.toml: tasks.include = []: must not be empty"
    msg = one_line(error_of({"tasks": {"include": ["kb19_relu", "kb19_relu"]}}))
    assert msg == 'configs/x.toml: tasks.include = ["kb19_relu", "kb19_relu"]: "kb19_relu" is listed twice'
    msg = one_line(error_of({"run": {"seed": 1}}))
    assert msg.startswith("configs/x.toml: required section [tasks] is missing (tasks.include: a non-empty list")
    msg = one_line(error_of({"tasks": {"files": []}}))
    assert msg.startswith("configs/x.toml: required key 'tasks.include' is missing")


def test_task_file_problems(registry, tmp_path):
    msg = one_line(error_of({"tasks": {"include": ["kb19_relu"], "files": ["does/not/exist.py"]}}))
    assert msg.startswith('configs/x.toml: tasks.files[0] = "does/not/exist.py": file not found (looked for ')
    msg = one_line(error_of({"tasks": {"include": ["kb19_relu"], "files": [str(tmp_path)]}}))
    assert msg.endswith(": is not a file")
    bad = write(tmp_path, "raise\n", "bad.py")
    cfg = parse_config({"tasks": {"include": ["kb19_relu", "my_op"], "files": [str(bad)]}}, source="configs/x.toml")
    with pytest.raises(ConfigError) as info:  # found when the search loads it, not at validation
        load_tasks(cfg)
    assert str(info.value) == (f'configs/x.toml: tasks.files[0] = "{bad}": could not load task file: SyntaxError: '
                               'invalid syntax (line 1)')  # alone: the include entries are not checked


def test_several_problems_one_line_each_no_pydantic_dump(registry, tmp_path):
    path = write(
        tmp_path,
        '[run]\nseed = -4\n[tasks]\ninclude = ["kb19_relu"]\n[search]\npopulation_size = 0\nbogus = 1\n'
        '[evaluator]\ntrials = 2\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    lines = str(err).splitlines()
    assert len(lines) == len(err.problems) == 4
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert {k for k, _ in err.problems} == {"run.seed", "search.population_size", "search.bogus", "evaluator.trials"}
    text = str(err).lower()
    assert "pydantic" not in text and "validation error" not in text and "input should" not in text
    assert err.__cause__ is None and err.__suppress_context__


# ---------------------------------------------------------------------------- override errors


def test_bad_override_value(registry, tmp_path):
    path = write(tmp_path, '[tasks]\ninclude = ["kb19_relu"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={"search.max_evaluations": -3})
    assert str(info.value) == f"{path}: search.max_evaluations = -3 (set by override): must be >= 1"


def test_unknown_override_key(registry, tmp_path):
    path = write(tmp_path, '[tasks]\ninclude = ["kb19_relu"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={"search.max_evals": 10})
    assert str(info.value).startswith(
        f"{path}: unknown key 'search.max_evals' (set by override; did you mean 'search.max_evaluations'?; allowed: "
    )


def test_malformed_override_keys(registry):
    msg = one_line(error_of(MINIMAL, overrides={"run.seed.x": 3}))
    assert msg == "configs/x.toml: override 'run.seed.x': 'run.seed' is a value, not a [section]"
    msg = one_line(error_of(MINIMAL, overrides={"search..x": 3}))
    assert "not a dotted key" in msg
    msg = one_line(error_of(MINIMAL, overrides={"": 3}))
    assert "not a dotted key" in msg


def test_override_of_unknown_task(registry):
    msg = str(error_of(MINIMAL, overrides={"tasks.include": ["nope_task"]}))
    assert 'tasks.include[0] = "nope_task" (set by override): unknown task' in msg


def test_errors_do_not_mutate_input(registry):
    data = {"tasks": {"include": ["kb19_relu"]}}
    parse_config(data, overrides={"search.max_evaluations": 5})
    assert data == {"tasks": {"include": ["kb19_relu"]}}


def test_settings_records_are_frozen_dataclasses(registry):
    cfg = parse_config(MINIMAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.compile_settings().arch = "sm_80"


def test_config_pickles_for_ray(registry, tmp_path):
    import pickle

    path = write(tmp_path, '[tasks]\ninclude = ["kb19_relu"]\n')
    cfg = load_config(path)
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.hash() == cfg.hash() and back.source_path == path


def test_task_files_are_relative_to_the_config_file_from_any_directory(registry, tmp_path, monkeypatch):
    """Input files a config names are found next to the config, whatever the working
    directory; output locations stay relative to the working directory."""
    conf_dir = tmp_path / "project" / "configs"
    conf_dir.mkdir(parents=True)
    write(conf_dir, "task my_op\n", "mytasks.py")
    cfg_file = conf_dir / "search.toml"
    cfg_file.write_text('[run]\ndb = "out/run.db"\n[tasks]\nfiles = ["mytasks.py"]\ninclude = ["my_op"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(cfg_file)
    assert cfg.tasks.files == ((conf_dir / "mytasks.py").resolve(),)
    assert cfg.run.db == elsewhere / "out/run.db"
    assert cfg.harness_settings().task_files == (str((conf_dir / "mytasks.py").resolve()),)


def test_a_cwd_relative_task_file_gets_a_hint_not_a_list_of_every_task(registry, tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    write(tmp_path, "task my_op\n", "mytasks.py")
    cfg_file = tmp_path / "configs" / "search.toml"
    cfg_file.write_text('[tasks]\nfiles = ["mytasks.py"]\ninclude = ["my_op", "my_other"]\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_config(cfg_file)
    lines = str(e.value).splitlines()
    assert len(lines) == 1, lines  # the include entries are not reported as unknown tasks
    assert "file not found" in lines[0] and "relative to the config file's directory" in lines[0]
    assert "exists relative to the working directory" in lines[0] and "'../mytasks.py'" in lines[0]


# ---------------------------------------------------------------------------- settings records


def test_defaults_are_the_records_defaults(registry, tmp_path, monkeypatch):
    """Each section's default is its record's default: a config that sets nothing gives the
    records a component builds with no arguments (paths aside, made absolute)."""
    from evaluators.profile import ProfileSettings
    from evo.engine.engine_settings import EngineSettings
    from evo.tuning.tuning_settings import TuningSettings

    monkeypatch.chdir(tmp_path)
    cfg = parse_config(MINIMAL)
    assert cfg.compile_settings() == CompileSettings(cache_dir=str(tmp_path / ".evo/cache"))
    assert cfg.harness_settings() == HarnessSettings()
    assert cfg.profile_settings() == ProfileSettings(cache_dir=str(tmp_path / ".evo/profiles"))
    assert cfg.tuning_settings() == TuningSettings()
    assert cfg.engine_settings() == EngineSettings()
    assert ProfileSettings().enabled is False and TuningSettings().enabled is False  # the config's values won


def test_every_key_reaches_its_record(registry):
    cfg = parse_config({
        **MINIMAL,
        "search": {"islands_per_task": 3, "population_size": 9, "max_evaluations": 7, "max_wall_minutes": 2.5,
                   "in_flight": 5, "migration_every": 11, "migration_count": 1, "selection_lambda": 0.5,
                   "archive": False},
        "compile": {"arch": "sm_100a", "timeout_s": 61, "memory_mb": 1024, "cache_dir": "/tmp/cc"},
        "evaluator": {"trials": 6, "warmup": 2, "reps": 11, "flush_mb": 65, "timeout_s": 31,
                      "reference": "compile", "call_timeout_s": 4},
        "profile": {"enabled": True, "top_k": 4, "feedback_after": 0, "timeout_s": 9},
        "tuning": {"enabled": True, "trials_per_survivor": 3, "top_k": 5, "max_concurrent": 1},
        "run": {"seed": 42},
    })
    e = cfg.engine_settings()
    assert (e.islands_per_task, e.population_size, e.max_evaluations, e.max_wall_seconds) == (3, 9, 7, 150.0)
    assert (e.in_flight, e.migration_every, e.migration_count, e.selection_lambda, e.archive) == (5, 11, 1, 0.5, False)
    assert e.profile == cfg.profile_settings() and e.tuning == cfg.tuning_settings()
    c = cfg.compile_settings()
    assert (c.arch, c.timeout_s, c.memory_mb, c.cache_dir) == ("sm_100a", 61.0, 1024, "/tmp/cc")
    h = cfg.harness_settings()
    assert (h.trials, h.warmup, h.reps, h.flush_mb, h.timeout_s, h.reference, h.call_timeout_s) == (
        6, 2, 11, 65, 31.0, "compile", 4.0)
    p = cfg.profile_settings()
    assert (p.enabled, p.top_k, p.feedback_after, p.timeout_s, p.cache_dir) == (True, 4, 0, 9.0, "/tmp/profiles")
    t = cfg.tuning_settings()
    assert (t.enabled, t.trials_per_survivor, t.top_k, t.max_concurrent, t.seed) == (True, 3, 5, 1, 42)
    # profiling and tuning off: the engine gets no record for them
    off = parse_config(MINIMAL).engine_settings()
    assert off.profile is None and off.tuning is None


@pytest.mark.parametrize("section, key", [
    ("compile", "nvcc"), ("compile", "extra_flags"), ("evaluator", "task_files"), ("evaluator", "timeout_check_s"),
    ("evaluator", "timeout_note"), ("evaluator", "check_only"), ("profile", "ncu"), ("profile", "cache_dir"),
    ("tuning", "seed"), ("search", "max_wall_seconds"), ("search", "tuning_storage"),
])
def test_fields_set_by_code_are_not_config_keys(registry, section, key):
    msg = one_line(error_of({**MINIMAL, section: {key: 1}}))
    assert f"unknown key '{section}.{key}'" in msg


def test_removed_key_says_what_to_do(registry):
    msg = one_line(error_of({**MINIMAL, "compile": {"workers": 0}}))
    assert msg == ("configs/x.toml: 'compile.workers' = 0 was removed (no code could honour it): compiles run as "
                   "Ray tasks, one per CPU that Ray has; set [ray] num_cpus to run fewer, and delete this line")
    msg = one_line(error_of(MINIMAL, overrides={"compile.workers": 4}))
    assert msg.startswith("configs/x.toml: 'compile.workers' = 4 (set by override) was removed")


@pytest.mark.parametrize("key,value,says", [
    ("isolation", "harness", "every verdict now comes from the judge"),
    ("isolation", "judge", "every verdict now comes from the judge"),
    ("warm_children", 2, "the judge stays warm"),
    ("check_concurrency", 2, "the judge checks one candidate at a time"),
    ("fresh_timing_process", False, "the judge times every candidate"),
])
def test_the_old_harness_keys_are_removed_with_one_line_naming_key_value_and_fix(registry, key, value, says):
    msg = one_line(error_of({**MINIMAL, "evaluator": {key: value}}))
    shown = f'"{value}"' if isinstance(value, str) else str(value).lower()
    assert msg.startswith(f"configs/x.toml: 'evaluator.{key}' = {shown} was removed"), msg
    assert says in msg and msg.endswith("delete this line") and "\n" not in msg


def test_section_model_takes_keys_defaults_and_bounds_from_the_record():
    """The generator's contract, on a record of its own: key names and order, defaults
    (scaled), bounds, patterns and path keys come from the ``config_key`` declarations."""
    from evo.config.fields import record, section_model
    from evo.core.settings import config_key

    @dataclasses.dataclass(frozen=True)
    class Rec:
        n: int = config_key(5, ge=3, le=9)
        wall_s: float = config_key(120.0, gt=0, name="wall_minutes", scale=60.0)
        tag: str = config_key("ab", pattern=r"^[a-z]+$")
        out: str = config_key("x/out", path=True)
        by_code: str = "code"

    model = section_model(Rec, "RecConfig", "doc")
    assert list(model.model_fields) == ["n", "wall_minutes", "tag", "out"]
    sec = model()
    assert (sec.n, sec.wall_minutes, sec.tag, sec.out) == (5, 2.0, "ab", Path.cwd() / "x/out")
    assert record(sec, Rec, by_code="set") == Rec(out=str(Path.cwd() / "x/out"), by_code="set")
    assert record(model(wall_minutes=1.5), Rec).wall_s == 90.0
    for bad in ({"n": 2}, {"n": 10}, {"wall_minutes": 0}, {"tag": "A"}, {"by_code": "x"}):
        with pytest.raises(ValidationError):
            model(**bad)


def test_one_class_per_record():
    """The engine's settings record (part of its constructor's API) is the one the config composes."""
    import evo.engine.engine
    import evo.engine.engine_settings

    assert evo.engine.engine.EngineSettings is evo.engine.engine_settings.EngineSettings


def test_records_travel_as_pickle_and_json(registry, tmp_path):
    import pickle

    (tmp_path / "t.py").write_text("task my_op\n")
    cfg = parse_config({"tasks": {"include": ["my_op"], "files": [str(tmp_path / "t.py")]}})
    for rec in (cfg.compile_settings(), cfg.harness_settings(), cfg.profile_settings(), cfg.tuning_settings(),
                cfg.engine_settings()):
        assert pickle.loads(pickle.dumps(rec)) == rec
    hs = cfg.harness_settings()  # plain values all through (a record that goes into JSON stays one)
    assert json.loads(json.dumps(dataclasses.asdict(hs)))["task_files"] == [str(tmp_path / "t.py")]


def test_the_settings_records_import_no_pydantic():
    """The GPU actor and the judge import evaluators.base (HarnessSettings): the records and
    their declarations stay standard-library only."""
    import subprocess
    import sys

    code = ("import sys, evaluators.judge.tasks, evaluators.base, evaluators.profile, evo.core.settings, "
            "evo.engine.engine_settings, evo.tuning.tuning_settings; assert 'pydantic' not in sys.modules, 'pydantic imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
