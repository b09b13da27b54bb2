"""Compile stage: ptxas parsing, error extraction, the cache, and process handling.

Two kinds of tests. Fast ones run a stand-in compiler (tests/fixtures/compile/fake_nvcc.py,
a real subprocess steered by comments in the source) to exercise timeouts, group kills, the
memory limit, concurrency and the cache in milliseconds. Real ones run nvcc (skipped with a
clear reason when it is absent; CI has it) and keep to four nvcc invocations, two of which
stop within a second: one tiny CuTe kernel (then a cache hit), one compile error, one
timeout and one memory-limit failure.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evaluators.base import CompileSettings
from evaluators.compile import (
    CompileOutcome,
    CompileStage,
    CutlassNotFound,
    NvccNotFound,
    abi_include_dir,
    build_command,
    build_flags,
    cache_key,
    compile_candidate,
    compile_to_file,
    cutlass_include_dir,
    cutlass_version,
    extract_errors,
    find_nvcc,
    gencode_flags,
    nvcc_version,
    parse_ptxas,
    trim_log,
)
from evo.core.records import Candidate, Status

FIX = Path(__file__).resolve().parent / "fixtures" / "compile"
TINY = (FIX / "tiny_cute.cu").read_text()


# ---------------------------------------------------------------------------------------------
# ptxas report parser (recorded nvcc 13.0 output)


def test_parse_recorded_tiny_report():
    rep = parse_ptxas((FIX / "ptxas_report.txt").read_text())
    assert [k.name for k in rep.kernels] == ["_Z16tiny_copy_kernelPKfPfl"]
    k = rep.kernels[0]
    assert (k.registers, k.barriers, k.smem_bytes, k.stack_frame, k.spill_stores, k.spill_loads) == (8, 0, 0, 0, 0, 0)
    m = rep.metrics()
    assert m["wgmma_serialized"] is False and m["registers"] == 8
    assert rep.wgmma_serialized == () and rep.advisories == ()


def test_parse_recorded_report_with_spills_smem_and_wgmma_serialization():
    rep = parse_ptxas((FIX / "ptxas_wgmma_serialized.txt").read_text())
    ks = {k.name: k for k in rep.kernels}
    assert set(ks) == {"_Z12wgmma_kernelPfmmi", "_Z12spill_kernelPfPKfi", "_Z11smem_kernelPf"}
    sp = ks["_Z12spill_kernelPfPKfi"]
    assert (sp.registers, sp.stack_frame, sp.spill_stores, sp.spill_loads) == (32, 1008, 1084, 1336)
    sm = ks["_Z11smem_kernelPf"]
    assert (sm.registers, sm.barriers, sm.smem_bytes) == (12, 1, 4096)
    assert ks["_Z12wgmma_kernelPfmmi"].registers == 30
    assert rep.wgmma_serialized == (
        ("_Z12wgmma_kernelPfmmi", "insufficient register resources for the wgmma pipeline"),
    )
    assert any("(C7517)" in a for a in rep.advisories) and any("(C7511)" in a for a in rep.advisories)
    m = rep.metrics()
    assert m["wgmma_serialized"] is True
    assert m["spill_stores"] == 1084 and m["spill_loads"] == 1336 and m["smem_bytes"] == 4096
    assert m["registers"] == 32 and m["stack_frame"] == 1008
    assert m["kernels"]["_Z11smem_kernelPf"]["smem_bytes"] == 4096


def test_parse_other_serialization_causes_and_older_formats():
    # Wording as ptxas prints it for another cause (C7515), and the older "Used" line layout.
    log = (
        "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
        "due to non wgmma instructions defining accumulator registers of a wgmma between start and end of "
        "the pipeline stage in the function '_Z3gemv'\n"
        "ptxas info    : Compiling entry function '_Z3gemv' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z3gemv\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 168 registers, 16 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]\n"
    )
    rep = parse_ptxas(log)
    assert rep.wgmma_serialized[0][0] == "_Z3gemv"
    assert rep.wgmma_serialized[0][1].startswith("non wgmma instructions defining accumulator registers")
    k = rep.kernels[0]
    assert (k.registers, k.smem_bytes, k.cmem_bytes, k.stack_frame, k.spill_stores) == (168, 16, 408, 8, 4)


def test_parse_tolerates_noise():
    assert parse_ptxas("").kernels == ()
    rep = parse_ptxas("random\nptxas info    : Used 3 registers\nnvcc warning : something\n")
    assert rep.kernels == ()  # a resource line before any entry function is ignored


# ---------------------------------------------------------------------------------------------
# Error text for repair prompts


def test_extract_errors_keeps_context_and_limits():
    blocks = []
    for i in range(100):
        blocks.append(f'candidate.cu({i + 1}): error: identifier "x{i}" is undefined\n    y = x{i};\n        ^\n')
    blocks.append("\n100 errors detected in the compilation of \"candidate.cu\".\n")
    text = extract_errors("".join(blocks))
    assert text.startswith('candidate.cu(1): error: identifier "x0" is undefined\n    y = x0;\n        ^')
    assert len(text.encode()) <= 4096
    assert sum("error" in ln for ln in text.splitlines()) <= 40
    short = extract_errors("".join(blocks[:3]))
    assert short.count("error:") == 3 and "y = x2;" in short


def test_extract_errors_falls_back_to_log_tail():
    assert "Killed" in extract_errors("compiling...\nKilled\n")


def test_trim_log_bounds():
    log = "\n".join(f"line {i} " + "x" * 100 for i in range(2000))
    out = trim_log(log)
    assert len(out.encode()) <= 16 * 1024 + 100
    assert out.startswith("line 0 ") and out.rstrip().endswith("x") and "omitted" in out
    assert trim_log("short") == "short"


# ---------------------------------------------------------------------------------------------
# Toolchain discovery and flags


def test_cutlass_headers_and_version():
    inc = cutlass_include_dir()
    assert (inc / "cute" / "tensor.hpp").is_file()
    assert re.fullmatch(r"\d+\.\d+\.\d+", cutlass_version())
    assert (abi_include_dir() / "evo_abi.h").is_file()


def test_missing_cutlass_wheel_names_the_fix(monkeypatch):
    cutlass_include_dir.cache_clear()
    monkeypatch.setitem(sys.modules, "cutlass_library", None)
    try:
        with pytest.raises(CutlassNotFound, match="pip install nvidia-cutlass"):
            cutlass_include_dir()
    finally:
        monkeypatch.undo()
        cutlass_include_dir.cache_clear()
    assert cutlass_include_dir().is_dir()


def test_gencode_flags():
    assert gencode_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert gencode_flags("sm_100a") == ["-gencode=arch=compute_100a,code=sm_100a"]
    assert gencode_flags("sm_80") == ["-gencode=arch=compute_80,code=sm_80"]
    with pytest.raises(ValueError, match="sm_90a"):
        gencode_flags("hopper")


def test_build_command_matches_the_contract():
    s = CompileSettings(extra_flags=("-DEXTRA=1",))
    cmd = build_command("nvcc", "candidate.cu", "candidate.so", s, (("BLOCK", "128"), ("STAGES", "3")))
    for flag in ("-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
                 "-shared", "-fPIC", "-lineinfo", "-DEXTRA=1"):
        assert flag in cmd
    assert cmd[cmd.index("-Xptxas") + 1] == "-v"
    assert "--use_fast_math" not in cmd and "-use_fast_math" not in cmd
    assert f"-I{abi_include_dir()}" in cmd and f"-I{cutlass_include_dir()}" in cmd
    assert cmd.index("-DBLOCK=128") < cmd.index("-DSTAGES=3") < cmd.index("candidate.cu")
    assert cmd[-2:] == ["-o", "candidate.so"]
    assert not any(str(abi_include_dir()) in f for f in build_flags(s))  # keys stay path-free


def test_cache_key_covers_every_input():
    s = CompileSettings()
    base = cache_key("src", {"A": 1, "B": 2}, s, "13.0.88", "4.2.0", "g++ 12")
    assert base == cache_key("src", {"B": 2, "A": 1}, s, "13.0.88", "4.2.0", "g++ 12")
    assert base == cache_key("src", (("A", "1"), ("B", "2")), s, "13.0.88", "4.2.0", "g++ 12")
    variants = [
        cache_key("src2", {"A": 1, "B": 2}, s, "13.0.88", "4.2.0", "g++ 12"),
        cache_key("src", {"A": 1, "B": 3}, s, "13.0.88", "4.2.0", "g++ 12"),
        cache_key("src", {"A": 1, "B": 2}, CompileSettings(arch="sm_100a"), "13.0.88", "4.2.0", "g++ 12"),
        cache_key("src", {"A": 1, "B": 2}, CompileSettings(extra_flags=("-G",)), "13.0.88", "4.2.0", "g++ 12"),
        cache_key("src", {"A": 1, "B": 2}, s, "12.8.93", "4.2.0", "g++ 12"),
        cache_key("src", {"A": 1, "B": 2}, s, "13.0.88", "3.9.2", "g++ 12"),
        cache_key("src", {"A": 1, "B": 2}, s, "13.0.88", "4.2.0", "g++ 13"),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # the cache directory, timeouts and the memory limit do not change what gets built (a build
    # a limit stops is never cached)
    assert base == cache_key("src", {"A": 1, "B": 2}, CompileSettings(cache_dir="/x", timeout_s=1, memory_mb=300),
                             "13.0.88", "4.2.0", "g++ 12")


def test_cache_key_covers_environment_that_changes_the_build(monkeypatch):
    for k in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CPATH", "CPLUS_INCLUDE_PATH", "EVO_SANDBOX_READS",
              "EVO_SANDBOX_READABLE", "EVO_SANDBOX_LANDLOCK", "EVO_SANDBOX"):
        monkeypatch.delenv(k, raising=False)
    s = CompileSettings()
    base = cache_key("src", {}, s, "13.0.88", "4.2.0", "g++ 12")
    keys = set()
    for k, v in (("NVCC_APPEND_FLAGS", "-DFAST=1"), ("NVCC_PREPEND_FLAGS", "-G"), ("CPATH", "/opt/inc")):
        monkeypatch.setenv(k, v)
        keys.add(cache_key("src", {}, s, "13.0.88", "4.2.0", "g++ 12"))
        monkeypatch.delenv(k)
    assert len(keys) == 3 and base not in keys
    assert cache_key("src", {}, s, "13.0.88", "4.2.0", "g++ 12") == base
    # what nvcc may read decides whether an #include outside the include path builds
    monkeypatch.setenv("EVO_SANDBOX_READS", "0")
    unrestricted = cache_key("src", {}, s, "13.0.88", "4.2.0", "g++ 12")
    monkeypatch.setenv("EVO_SANDBOX_READS", "1")
    monkeypatch.setenv("EVO_SANDBOX_READABLE", "/opt/more")
    assert len({base, unrestricted, cache_key("src", {}, s, "13.0.88", "4.2.0", "g++ 12")}) == 3


@pytest.mark.parametrize("field,value,allowed", [
    ("memory_mb", 10**13, "0 (no limit) or an integer from 256 to 1048576"),
    ("memory_mb", 64, "from 256"),
    ("memory_mb", -1, "from 256"),
    ("memory_mb", True, "an integer"),
    ("timeout_s", 0.0, "> 0"),
    ("timeout_s", float("inf"), "<= 86400"),
    ("timeout_s", float("nan"), "> 0"),
])
def test_numeric_settings_are_bounded(field, value, allowed, tmp_path):
    from evaluators.compile import CompileSettingsError, check_settings

    settings = CompileSettings(cache_dir=str(tmp_path), **{field: value})
    with pytest.raises(CompileSettingsError, match=f"compile.{field} = ") as ei:
        check_settings(settings)
    assert allowed in str(ei.value) and "[compile]" in ei.value.fix
    with pytest.raises(CompileSettingsError):
        compile_candidate(Candidate.create("t", "int x;"), settings)
    assert not list(tmp_path.rglob("*.json")), "nothing was cached"
    check_settings(CompileSettings(memory_mb=0))  # 0 = no limit


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_find_nvcc_order_and_errors(tmp_path, monkeypatch):
    with pytest.raises(NvccNotFound, match="compile.nvcc"):
        find_nvcc(CompileSettings(nvcc=str(tmp_path / "missing" / "nvcc")))
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    fake = _write_exe(home / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 77.1, V77.1.5'\n")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert find_nvcc(CompileSettings()) == str(fake)  # $CUDA_HOME wins over /usr/local/cuda and PATH
    assert nvcc_version(str(fake)) == "77.1.5"
    explicit = _write_exe(tmp_path / "my-nvcc", "#!/bin/sh\n")
    assert find_nvcc(CompileSettings(nvcc=str(explicit))) == str(explicit)
    not_nvcc = _write_exe(tmp_path / "not-nvcc", "#!/bin/sh\necho hello\n")
    with pytest.raises(NvccNotFound, match="release line"):
        nvcc_version(str(not_nvcc))


def test_find_nvcc_reports_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        assert find_nvcc(CompileSettings()) == "/usr/local/cuda/bin/nvcc"
    else:
        with pytest.raises(NvccNotFound, match="CUDA_HOME"):
            find_nvcc(CompileSettings())


# ---------------------------------------------------------------------------------------------
# Process handling and cache, with the stand-in compiler


@pytest.fixture
def fake(tmp_path, monkeypatch) -> CompileSettings:
    # The stand-in runs this Python and its script from the tests, and counts builds in
    # tmp_path: outside what nvcc may read and write under Landlock, so allowed explicitly.
    monkeypatch.setenv("EVO_SANDBOX_READABLE", os.pathsep.join((str(FIX), sys.prefix, sys.base_prefix)))
    monkeypatch.setenv("EVO_SANDBOX_WRITABLE", str(tmp_path))
    wrapper = _write_exe(tmp_path / "nvcc", f'#!/bin/sh\nexec "{sys.executable}" "{FIX / "fake_nvcc.py"}" "$@"\n')
    return CompileSettings(nvcc=str(wrapper), cache_dir=str(tmp_path / "cache"), timeout_s=30, memory_mb=4096)


def _fake_source(tmp_path: Path, *directives: str, body: str = "") -> tuple[str, Path]:
    count = tmp_path / "builds.txt"
    lines = [f"// FAKE-NVCC: count={count}", *[f"// FAKE-NVCC: {d}" for d in directives], body or "int x;"]
    return "\n".join(lines) + "\n", count


def _builds(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_fake_build_then_cache_hit(fake, tmp_path):
    src, count = _fake_source(tmp_path)
    cand = Candidate.create("t", src, {"BLOCK": 128})
    first = compile_candidate(cand, fake)
    assert isinstance(first, CompileOutcome)
    assert first.ok and not first.cached and first.result.stage == "compile"
    assert first.so_bytes.startswith(b"\x7fELF-fake") and b"-DBLOCK=128" in first.so_bytes
    assert first.result.metrics["registers"] == 16 and first.result.metrics["smem_bytes"] == 1024
    assert first.result.metrics["so_size"] == len(first.so_bytes)
    assert "Used 16 registers" in first.result.artifacts["ptxas"]
    second = compile_candidate(cand, fake)
    assert second.cached and second.so_bytes == first.so_bytes and second.key == first.key
    assert second.result.metrics == first.result.metrics
    assert _builds(count) == 1
    other = compile_candidate(Candidate.create("t", src, {"BLOCK": 256}), fake)
    assert other.ok and other.key != first.key and _builds(count) == 2
    # the store's files: .so + .json per key
    files = sorted(p.suffix for p in Path(fake.cache_dir).rglob(f"{first.key}.*"))
    assert files == [".json", ".lock", ".so"]


def test_corrupt_cache_entry_is_rebuilt(fake, tmp_path):
    src, count = _fake_source(tmp_path)
    cand = Candidate.create("t", src)
    first = compile_candidate(cand, fake)
    so_path = next(Path(fake.cache_dir).rglob(f"{first.key}.so"))
    so_path.write_bytes(b"truncated")
    again = compile_candidate(cand, fake)
    assert again.ok and not again.cached and again.so_bytes == first.so_bytes and _builds(count) == 2


def test_fake_compile_error_is_trimmed_and_cached(fake, tmp_path):
    src, count = _fake_source(tmp_path, "fail")
    out = compile_candidate(Candidate.create("t", src), fake)
    r = out.result
    assert r.status is Status.COMPILE_ERROR and out.so_bytes is None
    assert r.reason.startswith("nvcc failed (exit 1): candidate.cu(2): error:")
    assert 'candidate.cu(2): error: identifier "oops" is undefined' in r.artifacts["errors"]
    assert "// FAKE-NVCC: fail" in r.artifacts["errors"]  # the offending source line comes along
    assert "evo-nvcc-" not in r.artifacts["log"] and "evo-nvcc-" not in r.artifacts["errors"]
    again = compile_candidate(Candidate.create("t", src), fake)
    assert again.cached and again.result.status is Status.COMPILE_ERROR and _builds(count) == 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except FileNotFoundError:
        return False


def test_fake_timeout_kills_the_whole_group_and_is_not_cached(fake, tmp_path):
    src, count = _fake_source(tmp_path, "sleep=60", "child_sleep=60")
    settings = CompileSettings(nvcc=fake.nvcc, cache_dir=fake.cache_dir, timeout_s=1.0)
    t0 = time.perf_counter()
    out = compile_candidate(Candidate.create("t", src), settings)
    assert time.perf_counter() - t0 < 10
    assert out.result.status is Status.TIMEOUT
    assert out.result.reason == "nvcc timed out after 1s (compile.timeout_s)"
    m = re.search(r"child pid (\d+)", out.result.artifacts["log"])
    assert m, out.result.artifacts["log"]
    deadline = time.time() + 5
    while _alive(int(m.group(1))) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(int(m.group(1))), "the compiler's child survived the group kill"
    again = compile_candidate(Candidate.create("t", src), settings)
    # Ran the compiler again (a timeout is never cached) and timed out again. The build
    # counter is not asserted: under load the fake compiler may be killed before it counts.
    assert not again.cached and again.result.status is Status.TIMEOUT


def test_fake_memory_limit(fake, tmp_path):
    src, count = _fake_source(tmp_path, "alloc_mb=768")
    settings = CompileSettings(nvcc=fake.nvcc, cache_dir=fake.cache_dir, memory_mb=512)
    out = compile_candidate(Candidate.create("t", src), settings)
    r = out.result
    assert r.status is Status.COMPILE_ERROR
    assert "out of memory" in r.reason and "compile.memory_mb = 512 MB" in r.reason
    assert r.metrics["resource_failure"] is True
    # a resource failure is not cached: with more memory the same candidate builds
    roomy = CompileSettings(nvcc=fake.nvcc, cache_dir=fake.cache_dir, memory_mb=4096)
    assert compile_candidate(Candidate.create("t", src), roomy).ok


def _cached_entries(settings: CompileSettings) -> list[Path]:
    return list(Path(settings.cache_dir).rglob("*.json"))


def test_an_absurd_limit_that_slips_past_validation_is_our_failure_not_cached(fake, tmp_path, monkeypatch):
    """The issue's case: a memory_mb whose byte count overflows setrlimit. The wrapper tags its
    own failure; it used to be cached as the candidate's compile error."""
    from evaluators import compile as comp
    from evaluators.compile import stage

    monkeypatch.setattr(stage, "check_settings", lambda s: None)
    src, count = _fake_source(tmp_path)
    huge = CompileSettings(nvcc=fake.nvcc, cache_dir=fake.cache_dir, memory_mb=2**60)
    with pytest.raises(comp.CompileInfrastructureError, match="limit wrapper failed before nvcc ran") as ei:
        compile_candidate(Candidate.create("t", src), huge)
    assert "compile.memory_mb" in ei.value.fix
    assert _builds(count) == 0 and not _cached_entries(huge)


def test_nvcc_that_cannot_be_started_is_our_failure_not_cached(tmp_path, monkeypatch):
    from evaluators.compile import stage

    broken = _write_exe(tmp_path / "nvcc", "#!/nonexistent/interpreter\n")
    monkeypatch.setattr(stage, "nvcc_version", lambda nvcc: "99.0.1")  # the version query would fail first
    settings = CompileSettings(nvcc=str(broken), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(NvccNotFound, match="could not run nvcc"):
        compile_candidate(Candidate.create("t", "int x;"), settings)
    assert not _cached_entries(settings)


def test_a_full_temp_disk_is_our_failure_and_nvcc_is_not_run(fake, tmp_path, monkeypatch):
    from evaluators import compile as comp
    from evaluators.compile import infrastructure

    monkeypatch.setattr(infrastructure, "DISK_MIN_FREE_MB", 1 << 40)   # more than any disk has free
    src, count = _fake_source(tmp_path)
    with pytest.raises(comp.CompileInfrastructureError, match="compile temp directory .* MB free") as ei:
        compile_candidate(Candidate.create("t", src), fake)
    assert "TMPDIR" in ei.value.fix
    assert _builds(count) == 0 and not _cached_entries(fake)


def test_out_of_disk_while_the_disk_has_room_is_the_candidates_but_not_cached(fake, tmp_path):
    src, count = _fake_source(tmp_path, "enospc")
    r = compile_candidate(Candidate.create("t", src), fake).result
    assert r.status is Status.COMPILE_ERROR and "disk space" in r.reason and r.metrics["resource_failure"]
    assert not compile_candidate(Candidate.create("t", src), fake).cached and _builds(count) == 2


def test_a_broken_toolchain_is_our_failure_not_the_candidates(fake, tmp_path, monkeypatch):
    """Every build fails before reading the source (a loader error): the canary fails too,
    so the candidate is not charged and nothing is cached."""
    from evaluators import compile as comp
    from evaluators.compile import infrastructure

    monkeypatch.setenv("FAKE_NVCC_BROKEN", "1")
    infrastructure._canary_ok.clear()
    with pytest.raises(comp.CompileInfrastructureError, match="cannot build even a trivial kernel") as ei:
        compile_candidate(Candidate.create("t", "int x;"), fake)
    assert "error while loading shared libraries" in str(ei.value) and "compile.memory_mb" in ei.value.fix
    assert not _cached_entries(fake)


def test_failures_cached_under_older_rules_are_rebuilt(fake, tmp_path):
    import json as _json

    src, count = _fake_source(tmp_path, "fail")
    cand = Candidate.create("t", src)
    first = compile_candidate(cand, fake)
    assert first.result.status is Status.COMPILE_ERROR and _builds(count) == 1
    (entry,) = _cached_entries(fake)
    meta = _json.loads(entry.read_text())
    assert meta["verdict_rules"] >= 2
    del meta["verdict_rules"]                  # as written before the rules changed
    entry.write_text(_json.dumps(meta))
    again = compile_candidate(cand, fake)
    assert not again.cached and _builds(count) == 2
    assert compile_candidate(cand, fake).cached, "re-cached under the current rules"


def test_bad_params_are_rejected_before_nvcc(fake, tmp_path):
    src, count = _fake_source(tmp_path)
    out = compile_candidate(Candidate.create("t", src, {"BLOCK": '1);system("id"'}), fake)
    assert out.result.status is Status.REJECTED and "param-syntax" in out.result.reason
    assert _builds(count) == 0


def _compile_in_child(args):
    source, settings = args
    out = compile_candidate(Candidate.create("t", source), settings)
    return out.ok, out.cached, out.key, out.so_bytes


def test_concurrent_compiles_of_one_key_build_once(fake, tmp_path):
    src, count = _fake_source(tmp_path, "sleep=1")
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(3, mp_context=ctx) as pool:
        results = list(pool.map(_compile_in_child, [(src, fake)] * 3))
    assert all(ok for ok, *_ in results)
    assert len({key for _, _, key, _ in results}) == 1 and len({so for *_, so in results}) == 1
    assert sorted(cached for _, cached, _, _ in results) == [False, True, True]
    assert _builds(count) == 1
    assert not list(Path(fake.cache_dir).rglob("*.tmp"))


def test_compile_to_file(fake, tmp_path):
    src, _ = _fake_source(tmp_path)
    out_path = tmp_path / "out" / "k.so"
    out = compile_to_file(src, {"BLOCK": 64}, fake, out_path)
    assert out.ok and out_path.read_bytes() == out.so_bytes
    bad, _ = _fake_source(tmp_path, "fail")
    failed_path = tmp_path / "out" / "bad.so"
    assert not compile_to_file(bad, None, fake, failed_path).ok and not failed_path.exists()


def test_compile_stage_is_a_stage(fake, tmp_path):
    stage = CompileStage(fake)
    assert stage.name == "compile"
    assert pickle.loads(pickle.dumps(stage)) == stage
    src, _ = _fake_source(tmp_path)
    cand = Candidate.create("t", src)
    assert stage.run(cand).passed and stage.build(cand).cached


# ---------------------------------------------------------------------------------------------
# Real nvcc (four invocations in all)


def _real_nvcc() -> str:
    try:
        return find_nvcc(CompileSettings())
    except NvccNotFound as exc:
        pytest.skip(f"real-compile tests need nvcc: {exc}")


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> CompileSettings:
    nvcc = _real_nvcc()
    return CompileSettings(nvcc=nvcc, cache_dir=str(tmp_path_factory.mktemp("nvcc-cache")), timeout_s=300)


def _exports_evo_launch(so: bytes, tmp: Path) -> bool:
    path = tmp / "candidate.so"
    path.write_bytes(so)
    try:
        return hasattr(ctypes.CDLL(str(path)), "evo_launch")
    except OSError:
        nm = shutil.which("nm")
        if nm is None:
            pytest.skip("cannot inspect the .so: ctypes cannot load it and nm is missing")
        out = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
        return bool(re.search(r"\bT evo_launch$", out, re.M))


def test_real_tiny_cute_kernel(real, tmp_path):
    cand = Candidate.create("t", TINY, {"BLOCK": 256})
    out = compile_candidate(cand, real)
    assert out.ok, out.result.artifacts.get("errors")
    m = out.result.metrics
    (name,) = [k for k in m["kernels"] if "tiny_copy_kernel" in k]
    assert 0 < m["kernels"][name]["registers"] <= 64 and m["spill_stores"] == 0
    assert m["wgmma_serialized"] is False and m["nvcc_seconds"] > 0
    assert out.so_bytes[:4] == b"\x7fELF"
    assert _exports_evo_launch(out.so_bytes, tmp_path)
    t0 = time.perf_counter()
    hit = compile_candidate(cand, real)
    assert hit.cached and hit.so_bytes == out.so_bytes and time.perf_counter() - t0 < 2.0


def test_real_compile_error(real):
    src = (FIX / "compile_error.cu").read_text()
    line = next(i for i, ln in enumerate(src.splitlines(), 1) if "<-- ERROR" in ln)
    out = compile_candidate(Candidate.create("t", src), real)
    r = out.result
    assert r.status is Status.COMPILE_ERROR
    assert f"candidate.cu({line}): error" in r.reason and "undeclared_scale_factor" in r.reason
    errors = r.artifacts["errors"]
    assert errors.startswith(f"candidate.cu({line}): error")
    assert "x[i] * undeclared_scale_factor" in errors  # nvcc's echo of the offending line
    assert len(errors.encode()) <= 4096 and "evo-nvcc-" not in errors


def test_real_timeout(real):
    quick = CompileSettings(nvcc=real.nvcc, cache_dir=real.cache_dir, timeout_s=0.5)
    t0 = time.perf_counter()
    out = compile_candidate(Candidate.create("t", TINY, {"BLOCK": 128}), quick)
    assert time.perf_counter() - t0 < 10
    assert out.result.status is Status.TIMEOUT and out.result.reason == "nvcc timed out after 0.5s (compile.timeout_s)"
    assert out.so_bytes is None


def test_real_memory_limit(real):
    """256 MB (the lowest allowed) stops the CuTe kernel; the canary (a trivial kernel) still
    builds under it, so the failure is the candidate's (measured with nvcc 13.0: CuTe needs
    ~1 GB), and it is not cached."""
    from evaluators.compile import infrastructure

    infrastructure._canary_ok.clear()
    tight = CompileSettings(nvcc=real.nvcc, cache_dir=real.cache_dir, memory_mb=256)
    out = compile_candidate(Candidate.create("t", TINY, {"BLOCK": 64}), tight)
    assert out.result.status is Status.COMPILE_ERROR
    assert "memory" in out.result.reason and out.result.metrics["resource_failure"] is True
    assert not compile_candidate(Candidate.create("t", TINY, {"BLOCK": 64}), tight).cached


def test_real_include_of_a_host_file_cannot_reach_the_log(real, tmp_path, monkeypatch):
    """nvcc runs under Landlock (nvcc_landlock): an #include outside the include path, the
    toolchain and the work directory fails to open, so the file's content never reaches the
    compile log, the lineage DB or a repair prompt. Control: reads unrestricted, the same
    source puts the file's line into the log."""
    from evaluators.sandbox.landlock import _landlock_abi

    if _landlock_abi() < 1:
        pytest.skip("no Landlock in this kernel")
    secret = tmp_path / "notes.txt"
    secret.write_text("SECRET-LINE-4f1c9 is not C++\n")
    src = f'#include "evo_abi.h"\n#include "{secret}"\nint x;\n'
    out = compile_candidate(Candidate.create("t", src), real)
    r = out.result
    text = r.reason + r.artifacts.get("log", "") + r.artifacts.get("errors", "")
    assert r.status is Status.COMPILE_ERROR and "SECRET-LINE" not in text, text[:2000]
    assert "cannot open source file" in text or "Permission denied" in text, text[:2000]
    assert not out.cached
    # without the read rules (a kernel without Landlock, or EVO_SANDBOX_READS=0) nvcc does read
    # the file and quotes it; the second layer, withhold_foreign, keeps it out of the artifacts
    monkeypatch.setenv("EVO_SANDBOX_READS", "0")
    leaky = CompileSettings(nvcc=real.nvcc, cache_dir=str(tmp_path / "c2"), timeout_s=300)
    r = compile_candidate(Candidate.create("t", src), leaky).result
    text = r.reason + r.artifacts.get("log", "") + r.artifacts.get("errors", "")
    assert r.status is Status.COMPILE_ERROR and "SECRET-LINE" not in text, text[:2000]
    assert f"{secret}: [diagnostic withheld" in text


# nvcc 13.0's own output for the include above with reads unrestricted (recorded), and gcc's
# form of the same (the host pass), each followed by a diagnostic in the candidate itself
_LEAKY_LOG = """/tmp/notes_leak.txt(1): error: this declaration has no storage class or type specifier
  SECRET-LINE-4f1c9 is not C++
  ^

/tmp/notes_leak.txt(1): error: identifier "root" is undefined
  root:x:0:0:root:/root:/bin/bash
  ^

/tmp/notes_leak.txt:2:1: error: 'root' does not name a type
    2 | root:x:0:0:root:/root:/bin/bash
      | ^~~~
In file included from candidate.cu:2:
/usr/include/stdio.h(10): error: a system header's own diagnostic stays
  extern int printf(const char*, ...);
candidate.cu(3): error: identifier "y" is undefined
  int x = y;
          ^
"""


def test_diagnostics_in_files_outside_the_include_path_are_withheld():
    from evaluators.compile import withhold_foreign

    out = withhold_foreign(_LEAKY_LOG, ["/usr/include", "/usr/local/cuda-13.0"])
    assert "SECRET-LINE" not in out and "root" not in out.replace("/root", ""), out
    assert out.count("/tmp/notes_leak.txt: [diagnostic withheld: the file is outside the include path]") == 3
    assert "/usr/include/stdio.h(10): error: a system header's own diagnostic stays" in out
    assert "extern int printf" in out, "quoted lines of files inside the include path stay"
    assert 'candidate.cu(3): error: identifier "y" is undefined' in out and "int x = y;" in out
    assert "In file included from candidate.cu:2:" in out
