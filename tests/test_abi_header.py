"""The kernel ABI has one source, ``evaluators/abi/evo_abi.h``; Python states it once.

Contract: :mod:`evaluators.abi`'s tables (``EVO_TENSOR_FIELDS``, ``EVO_DTYPES``, ``MAX_DIMS``,
``ABI_VERSION``, ``LAUNCH_ARGS`` / ``WORKSPACE_ARGS`` and their result types) say exactly
what the header declares, member for member, and every exported ``op.py`` carries that same
struct and dtype table (it is rendered from those tables, not written by hand). These tests
parse the header, so a change to it that the Python side does not follow fails here, naming
the difference.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from _inspect_run import TASK, build_run
from standalone import ENGINE_IMPORT_BLOCKER as BLOCKER  # tests/ is on sys.path

from evaluators import abi

HEADER = (Path(__file__).resolve().parents[1] / "evaluators" / "abi" / "evo_abi.h").read_text()

#: C enumerator suffix -> torch dtype name (the test's own statement of the correspondence).
TORCH_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
               "I32": "int32", "I64": "int64", "U8": "uint8", "BOOL": "bool"}
#: C parameter / member type -> the ctypes name evaluators.abi uses for it.
C_TO_CTYPES = {"void*": "c_void_p", "int32_t": "c_int32", "int64_t": "c_int64", "int": "c_int",
               "EvoTensor*": "EvoTensor*", "double*": "c_double*", "cudaStream_t": "c_void_p"}


def _define(name: str) -> int:
    m = re.search(rf"^#define {name} (\d+)$", HEADER, re.M)
    assert m, f"evo_abi.h no longer defines {name}"
    return int(m.group(1))


def _block(start: str) -> str:
    m = re.search(re.escape(start) + r"\s*\{(.*?)\};", HEADER, re.S)
    assert m, f"evo_abi.h has no `{start} {{ ... }};`"
    return re.sub(r"//[^\n]*", "", m.group(1))


def _prototype(fn: str) -> tuple[str, list[str]]:
    """(result type, parameter types) of ``EVO_EXPORT <ret> fn(...);``, const dropped."""
    m = re.search(rf"EVO_EXPORT\s+(\w+)\s+{fn}\((.*?)\);", HEADER, re.S)
    assert m, f"evo_abi.h does not declare {fn}"
    params = []
    for p in m.group(2).split(","):
        p = " ".join(p.replace("const ", "").split())
        ctype_, _name = p.rsplit(" ", 1)
        params.append(ctype_.replace(" *", "*"))
    return m.group(1), params


def test_version_and_max_dims():
    assert _define("EVO_ABI_VERSION") == abi.ABI_VERSION
    assert _define("EVO_MAX_DIMS") == abi.MAX_DIMS


def test_dtype_codes_are_the_headers_enum():
    enum = {m.group(1): int(m.group(2)) for m in re.finditer(r"EVO_(\w+) = (\d+)", _block("enum EvoDType : int32_t"))}
    unknown = sorted(set(enum) - set(TORCH_NAMES))
    assert not unknown, f"new EvoDType enumerator(s) {unknown}: add them to evaluators.abi.EVO_DTYPES and here"
    assert {TORCH_NAMES[k]: v for k, v in enum.items()} == abi.EVO_DTYPES


def test_struct_members_are_the_headers_in_order():
    members = []
    for decl in filter(None, (d.strip() for d in _block("struct EvoTensor").split(";"))):
        m = re.fullmatch(r"(\w+\*?)\s+(\w+)(?:\[(\w+)\])?", " ".join(decl.split()).replace(" *", "*"))
        assert m, f"unparsed member declaration {decl!r}"
        ctype_, name, length = m.groups()
        if length is not None:
            length = int(length) if length.isdigit() else _define(length)
        members.append((name, C_TO_CTYPES[ctype_], length))
    assert tuple(members) == abi.EVO_TENSOR_FIELDS
    # the ctypes struct is built from that table; its layout is the C one on this platform
    assert [(n, getattr(abi.EvoTensor, n).size) for n, *_ in abi.EVO_TENSOR_FIELDS] == [
        ("data", 8), ("dtype", 4), ("ndim", 4), ("shape", 8 * abi.MAX_DIMS), ("strides", 8 * abi.MAX_DIMS)]
    assert ctypes.sizeof(abi.EvoTensor) == 16 + 2 * 8 * abi.MAX_DIMS


def test_entry_point_signatures_are_the_headers():
    ret, params = _prototype("evo_launch")
    assert (C_TO_CTYPES[ret], [C_TO_CTYPES[p] for p in params]) == (abi.LAUNCH_RESTYPE, list(abi.LAUNCH_ARGS))
    ret, params = _prototype("evo_workspace_bytes")
    assert (C_TO_CTYPES[ret], [C_TO_CTYPES[p] for p in params]) == (abi.WORKSPACE_RESTYPE, list(abi.WORKSPACE_ARGS))
    # op.py.tmpl binds evo_workspace_bytes as fn.argtypes[:-1]
    assert abi.WORKSPACE_ARGS == abi.LAUNCH_ARGS[:-1]
    assert [abi.ctype(t) for t in abi.LAUNCH_ARGS][:2] == [ctypes.POINTER(abi.EvoTensor), ctypes.c_int]


def test_exported_op_carries_the_same_struct_and_dtype_table(tmp_path):
    """An exported op.py, imported in a fresh Python with only torch, has evaluators.abi's
    struct (names, sizes, offsets) and dtype codes."""
    from evo.results.export import export
    from evo.store import Store

    built = build_run(tmp_path / "evo.db", tmp_path / "cache")
    with Store.open_reader(built.db) as store:
        res = export(store, built.run_id, tmp_path / "out", build=False)
    op_py = res.exported[0].directory / "op.py"
    code = BLOCKER + textwrap.dedent(f"""
        import ctypes, importlib.util, json
        spec = importlib.util.spec_from_file_location("op", {str(op_py)!r})
        op = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(op)
        T = op.EvoTensor
        print(json.dumps({{
            "fields": [[n, getattr(T, n).offset, getattr(T, n).size] for n, _ in T._fields_],
            "size": ctypes.sizeof(T), "max_dims": op._MAX_DIMS,
            "dtypes": {{str(k).removeprefix("torch."): v for k, v in op._DTYPE_CODES.items()}},
        }}))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    T = abi.EvoTensor
    assert got["fields"] == [[n, getattr(T, n).offset, getattr(T, n).size] for n, *_ in abi.EVO_TENSOR_FIELDS]
    assert got["size"] == ctypes.sizeof(T) and got["max_dims"] == abi.MAX_DIMS
    assert got["dtypes"] == abi.EVO_DTYPES
    assert TASK in str(op_py)

