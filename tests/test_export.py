"""evo export: a champion -> standalone package (source, .so, torch op, reference, test, manifest).

One real nvcc compile (the synthetic run's kb19_relu champion, module-scoped); the other
exports use --no-build or a missing nvcc. The exported op.py is imported in a fresh Python
(`python -I`) with the engine's packages blocked from import.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _inspect_run import BAD_TASK, TASK, build_run
from standalone import ENGINE_IMPORT_BLOCKER  # tests/ is on sys.path
from typer.testing import CliRunner

from evaluators.base import CompileSettings
from evo.cli import app as evo_app
from evo.results.export import (
    ExportError,
    NotStandaloneError,
    bake_params,
    export,
    op_identifier,
    standalone_source,
)
from evo.store import Store, UnknownIdError


def _nvcc_missing() -> str | None:
    from evaluators.compile import (
        CutlassNotFound,
        NvccNotFound,
        cutlass_include_dir,
        find_nvcc,
    )

    try:
        find_nvcc(CompileSettings())
        cutlass_include_dir()
    except (NvccNotFound, CutlassNotFound) as e:
        return f"needs nvcc and the CUTLASS headers: {e}"
    return None


NO_NVCC = _nvcc_missing()

BLOCKER = ENGINE_IMPORT_BLOCKER


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    if NO_NVCC:
        pytest.skip(NO_NVCC)
    tmp = tmp_path_factory.mktemp("export")
    built = build_run(tmp / "evo.db", tmp / "cache")
    with Store.open_reader(built.db) as store:
        res = export(store, built.run_id, tmp / "out")  # compiles with the run's [compile] (cache in tmp)
    return built, res


def test_run_export_writes_the_package(exported):
    built, res = exported
    assert res.run_id == built.run_id
    assert [e.task for e in res.exported] == [TASK]
    e = res.exported[0]
    assert e.candidate_id == built.llm.id and e.selection == "confirmed champion" and e.fitness == pytest.approx(1.5)
    d = e.directory
    assert d == res.out_dir / TASK
    names = {p.name for p in d.iterdir()}
    assert {"kernel.cu", "evo_abi.h", "kernel_sm_90a.so", "build.sh", "op.py", "reference.py", "test_op.py",
            "manifest.json"} <= names
    # tunables baked in before the #ifndef defaults
    cu = (d / "kernel.cu").read_text()
    assert cu.index("#define BLOCK 512") < cu.index("#ifndef BLOCK")
    assert "evolved: comment-only change" in cu and built.llm.id in cu
    from evaluators.compile import abi_include_dir

    assert (d / "evo_abi.h").read_bytes() == (abi_include_dir() / "evo_abi.h").read_bytes()
    so = (d / "kernel_sm_90a.so").read_bytes()
    assert so[:4] == b"\x7fELF" and len(so) > 10_000 and e.so_path == d / "kernel_sm_90a.so"
    assert os.access(d / "build.sh", os.X_OK)
    # the skipped task says why
    assert BAD_TASK in res.skipped and "no correct candidate" in res.skipped[BAD_TASK]
    summary = json.loads((res.out_dir / "export.json").read_text())
    assert summary["skipped"][BAD_TASK] == res.skipped[BAD_TASK] and summary["exported"][0]["task"] == TASK


def test_manifest_fields(exported):
    built, res = exported
    d = res.exported[0].directory
    m = json.loads((d / "manifest.json").read_text())
    assert m["op"] == f"evo::{TASK}" and m["candidate_id"] == built.llm.id and m["run_id"] == built.run_id
    assert m["run_config_hash"] == "cfg-hash-123" and m["fitness"] == pytest.approx(1.5)
    assert [s["id"] for s in m["lineage"]["first_parent_chain"]] == [built.seed.id, built.knobs.id, built.llm.id]
    assert set(m["lineage"]["ancestors"]) == {built.seed.id, built.knobs.id}
    assert (m["gpu"], m["driver"], m["cuda"], m["torch"]) == ("NVIDIA H200", "570.86.15", "12.8", "2.11.0")
    assert m["cutlass"] and m["nvcc"] and m["arch"] == "sm_90a"
    assert m["confirmation"]["confirmed"] is True and m["params"]["BLOCK"] == "512"
    (shape,) = m["timings"]["shapes"]
    assert shape["median_ms"] == 2.2 and shape["shape"] == {"R": 4096, "C": 393216}
    assert "samples_ms" not in shape and m["timings"]["reps"] == 50
    assert m["compile"]["registers"] > 0 and m["so"] == "kernel_sm_90a.so"
    for name, sha in m["files"].items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == sha, name
    assert m["task_spec"]["inputs"] == [{"name": "x", "dims": ["R", "C"]}]


def _fresh_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-I", "-c", BLOCKER + textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_op_imports_in_a_fresh_python_without_the_engine(exported):
    _, res = exported
    d = res.exported[0].directory
    r = _fresh_python(f"""
        import importlib.util, sys, torch
        spec = importlib.util.spec_from_file_location("op", {str(d / 'op.py')!r})
        op = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(op)
        assert not [m for m in sys.modules if m.split('.')[0] in ('evo', 'evaluators')]
        try:
            op.{TASK}(torch.randn(3, 5))
        except op.UnsupportedInputError as e:
            print("CPU ERROR:", e)
        y = torch.ops.evo.{TASK}(torch.empty(3, 5, device="meta"))   # the fake impl
        print("META", tuple(y.shape), y.dtype)
        for bad in (torch.empty(3, 5, dtype=torch.float64, device="meta"), torch.empty(3, device="meta"),
                    torch.empty(5, 3, device="meta").t()):
            try:
                torch.ops.evo.{TASK}(bad)
            except op.UnsupportedInputError as e:
                print("REJECTED:", e)
    """, d)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"CPU ERROR: evo::{TASK} needs a CUDA tensor: input 0 (x) is on cpu" in out
    assert "META (3, 5) torch.float32" in out
    assert "has dtype torch.float64" in out and "must have 2 dims" in out and "not contiguous" in out


def test_exported_test_file_runs_standalone(exported):
    _, res = exported
    d = res.exported[0].directory
    r = _fresh_python("""
        import sys, pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "test_op.py"]))
    """, d)
    assert r.returncode == 0, r.stdout + r.stderr
    # without CUDA: the accuracy tests skip, the input-validation test passes
    assert "1 passed" in r.stdout and "skipped" in r.stdout


def test_reference_module_matches_the_task(exported):
    _, res = exported
    d = res.exported[0].directory
    import importlib.util

    spec = importlib.util.spec_from_file_location("exported_reference", d / "reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    import evo.tasks as T

    task = T.get_task(TASK)
    shape = task.shapes[1]
    for dist in task.distributions:
        a = task.make_inputs(shape, torch.Generator().manual_seed(3), dist, "cpu")
        b = ref.make_inputs(shape, torch.Generator().manual_seed(3), dist, "cpu")
        assert all(torch.equal(x, y) for x, y in zip(a, b)), dist
        want = task.reference(*[x.double() for x in a])
        got = ref.reference(*[x.double() for x in b])
        assert torch.equal(want, got)
    x = a[0]
    assert ref.check(torch.relu(x), torch.relu(x.double()))[0]
    ok, why = ref.check(torch.relu(x) + 1e-3, torch.relu(x.double()))
    assert not ok and "relative L2" in why
    ok, why = ref.check(torch.full_like(x, float("nan")), torch.relu(x.double()))
    assert not ok and "non-finite" in why


def test_build_script_is_valid_bash_and_checks_its_arch(exported):
    _, res = exported
    script = res.exported[0].directory / "build.sh"
    text = script.read_text()
    assert "-gencode=arch=compute_$V,code=sm_$V" in text and "cutlass_library" in text and "kernel_$ARCH.so" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    r = subprocess.run(["bash", str(script), "gfx90a"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def test_export_by_candidate_id_without_building(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        res = export(store, built.knobs.id[:10], tmp_path / "out", build=False)
        assert [e.candidate_id for e in res.exported] == [built.knobs.id] and res.skipped == {}
        e = res.exported[0]
        assert e.selection == "explicit id" and e.so_path is None and "build.sh" in e.so_note
        m = json.loads((e.directory / "manifest.json").read_text())
        assert m["so"] is None and "build.sh" in m["so_note"]
        assert "#define BLOCK 512" in (e.directory / "kernel.cu").read_text()
        # not-correct candidates are refused
        with pytest.raises(ExportError, match="not correct"):
            export(store, built.cross.id, tmp_path / "o2", build=False)


def test_export_without_nvcc_writes_everything_but_the_so(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        res = export(store, built.run_id, tmp_path / "out",
                     compile_settings=CompileSettings(nvcc="/nonexistent/bin/nvcc", cache_dir=str(tmp_path / "c")))
    e = res.exported[0]
    assert e.so_path is None and "nvcc" in e.so_note and "bash build.sh sm_90a" in e.so_note
    assert not list(e.directory.glob("*.so")) and (e.directory / "build.sh").is_file()
    assert (e.directory / "op.py").is_file()


def test_unknown_target_names_near_runs_and_candidates(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        with pytest.raises(UnknownIdError) as ei:
            export(store, built.seed.id[:6] + "zz", tmp_path / "o")
        msg = str(ei.value)
        assert "neither a run nor a candidate" in msg and built.seed.id[:16] in msg and built.run_id in msg
        with pytest.raises(ExportError, match="has no task 'nope'"):
            export(store, built.run_id, tmp_path / "o", tasks=["nope"], build=False)
        # nothing to export: says why per task and writes nothing (issue 34)
        with pytest.raises(ExportError, match=f"nothing to export.*no correct candidate for {BAD_TASK}"):
            export(store, built.run_id, tmp_path / "empty", tasks=[BAD_TASK], build=False)
        assert not (tmp_path / "empty").exists()


def test_cli_export(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    app = evo_app
    runner = CliRunner()
    res = runner.invoke(app, ["export", built.run_id, "--out", str(tmp_path / "o"), "--no-build",
                              "--db", str(built.db)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert TASK in flat and "confirmed champion" in flat and f"skipped {BAD_TASK}" in flat
    res = runner.invoke(app, ["export", built.run_id, "--out", str(tmp_path / "none"), "--no-build", "--json",
                              "--task", BAD_TASK, "--db", str(built.db)])
    assert res.exit_code == 2 and "nothing to export" in res.output and "no correct candidate" in res.output
    assert not (tmp_path / "none").exists()
    res = runner.invoke(app, ["export", "qqq", "--out", str(tmp_path / "o"), "--db", str(built.db)])
    assert res.exit_code == 2 and "neither a run nor a candidate" in res.output


def test_bake_params_and_identifiers():
    src = "#ifndef TILE\n#define TILE 64\n#endif\n"
    baked = bake_params(src, {"TILE": "128", "A": "1"}, header="hello\nworld")
    assert baked.startswith("// hello\n// world\n")
    assert baked.index("#define A 1") < baked.index("#define TILE 128") < baked.index("#ifndef TILE")
    assert bake_params(src, {}) == src
    assert op_identifier("kb19_relu") == "kb19_relu" and op_identifier("19-x.y") == "t_19_x_y"


_LIMIT = 2.5


def _helper(x):
    return x.clamp(max=_LIMIT)


def _uses_helper(x):
    return _helper(x) * 2


def _uses_store(x):
    return Store  # a non-exportable global


def test_standalone_source_copies_helpers_and_constants():
    import evo.tasks.modern as modern

    src, name = standalone_source(modern.rmsnorm)
    assert name == "rmsnorm" and "RMSNORM_EPS = 1e-06" in src and "import torch" in src
    ns: dict = {}
    exec(compile(src, "<export>", "exec"), ns)
    x, w = torch.randn(4, 16), torch.randn(16)
    assert torch.equal(ns["rmsnorm"](x, w), modern.rmsnorm(x, w))
    src, _ = standalone_source(_uses_helper)
    assert "_LIMIT = 2.5" in src and src.index("def _helper") < src.index("def _uses_helper")
    ns = {}
    exec(compile(src, "<export>", "exec"), ns)
    assert torch.equal(ns["_uses_helper"](torch.tensor([5.0])), torch.tensor([5.0]))
    with pytest.raises(NotStandaloneError, match="Store"):
        standalone_source(_uses_store)
    with pytest.raises(NotStandaloneError, match="plain module-level function"):
        standalone_source(lambda x: x)


def test_every_registered_task_has_a_standalone_reference_and_io_dims():
    """Each built-in task's reference.py executes on its own, and op.py gets input and
    output dims (so shape checks and output allocation need no engine code)."""
    import evo.tasks as T
    from evo.results.export.task_io import io_dims, reference_module

    for name in T.task_names():
        task = T.get_task(name)
        text, note = reference_module(task)
        assert note == "", (name, note)
        ns: dict = {}
        exec(compile(text, f"{name}/reference.py", "exec"), ns)
        assert callable(ns["reference"]) and callable(ns["make_inputs"]) and callable(ns["check"])
        ins, outs, n = io_dims(task)
        assert ins is not None and outs is not None and n == len(ins), name


def test_manifest_says_which_checks_the_kernel_passed(tmp_path):
    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        res = export(store, built.run_id, tmp_path / "out", build=False)
    m = json.loads((res.exported[0].directory / "manifest.json").read_text())
    assert m["checks"]["policy"] == "ok (re-checked at export)"
    assert (m["checks"]["compile"], m["checks"]["correctness"], m["checks"]["timing"]) == ("ok", "ok", "ok")
    assert m["checks"]["champion_confirmation"]["confirmed"] is True


def test_a_kernel_that_fails_todays_policy_is_not_exported(tmp_path):
    """A run evaluated under an older, looser policy: its correct champion calls system().
    Export re-checks the source (the .so would run unsandboxed in the user's process)."""
    from evo.core.records import Candidate, Evaluation, StageResult, Status
    from evo.tasks.seeds import seed_params, seed_source

    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    src = seed_source(TASK).replace("namespace evo_seed {",
                                    "#include <cstdlib>\nstatic int pwn = std::system(\"id\");\nnamespace evo_seed {", 1)
    bad = Candidate.create(TASK, src, seed_params(TASK), parents=(built.llm.id,), operator="llm:old", generation=3)
    ok = [StageResult(s, Status.OK) for s in ("policy", "compile", "correctness", "timing")]
    with Store(built.db) as store:
        store.add_candidate(built.run_id, bad)
        store.add_evaluation(built.run_id, Evaluation(bad.id, tuple(ok), 9.0, gpu="NVIDIA H200", env={}))
        store.set_champion(built.run_id, TASK, bad.id, 9.0, {"confirmed": True})
    with Store.open_reader(built.db) as store:
        with pytest.raises(ExportError, match="fails today's source policy"):
            export(store, bad.id, tmp_path / "out", build=False)
        assert not (tmp_path / "out" / TASK).exists()
