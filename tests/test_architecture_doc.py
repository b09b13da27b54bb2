"""docs/architecture.md names only what exists: every path, module and dotted name it cites in
backticks, and every entry of its tree, is checked against the code (a renamed module or
method makes the page fail here, not mislead a reader).

What counts as a citation (in backticks): a path (``evo/engine/engine.py``, ``evaluators/judge/``)
relative to the repository root; a dotted name starting with one of the project's packages
(``evo.engine.seams.Stages``), imported and looked up attribute by attribute; a dotted name
starting with a class (``Dispatch.take``, ``Stages.compile_fn``), the class found by name in
the project's source; a bare CamelCase name (``Proposer``), defined somewhere in the project.
The tree (the first code block) is read by indentation: each entry's first name is a file or
folder under its parent's folder.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("evo", "evaluators", "mutators", "populations")
DIRS = PACKAGES + ("tests", "configs", "benchmarks", "docs", "shared")

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_CAMEL = re.compile(r"^[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*$")  # a class-like name: StoreReader, GpuFaults
#: bare names the page cites from other libraries
OTHER_LIBRARIES = {"CliRunner"}
_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")


def _text_outside_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def citations(text: str) -> list[str]:
    """The backticked spans of the page's prose (code blocks aside), call parentheses dropped."""
    spans = re.findall(r"`([^`\n]+)`", _text_outside_code_blocks(text))
    return [re.sub(r"\(.*\)$", "", s.strip()) for s in spans]


@lru_cache(maxsize=1)
def defined_names() -> dict[str, list[str]]:
    """Every top-level class, function and assignment name of the project -> its modules."""
    out: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                names = []
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [node.name]
                elif isinstance(node, ast.Assign):
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names = [node.target.id]
                for n in names:
                    out.setdefault(n, []).append(module)
    return out


def _has(obj: object, attr: str) -> bool:
    if hasattr(obj, attr):
        return True
    if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
        return True
    return attr in getattr(obj, "__annotations__", {})


def resolve(name: str) -> bool:
    """Whether ``name`` (dotted) names something that exists (see the module docstring)."""
    parts = name.split(".")
    if parts[0] in PACKAGES:
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                if not _has(obj, attr):
                    return False
                obj = getattr(obj, attr, None)
            return True
        return False
    for module in defined_names().get(parts[0], []):
        obj = getattr(importlib.import_module(module), parts[0], None)
        for attr in parts[1:]:
            if obj is None or not _has(obj, attr):
                break
            obj = getattr(obj, attr, None)
        else:
            return True
    return False


def tree_entries(text: str) -> list[str]:
    """The paths the page's tree (its first code block) lists, from their indentation."""
    block = re.search(r"^```\n(.*?)^```", text, flags=re.S | re.M).group(1)
    stack: list[tuple[int, str]] = []  # (indent, folder)
    paths = []
    for line in block.splitlines():
        m = re.match(r"^( *)([\w.-]+/?)(,|\s|$)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        if indent >= 24:  # a continuation of the description column
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s[1].rstrip("/") for s in stack] + [name])
        paths.append(path)
        if name.endswith("/"):
            stack.append((indent, name))
    return paths


def test_every_citation_exists():
    text = DOC.read_text(encoding="utf-8")
    cited = citations(text)
    paths = [c for c in cited if "/" in c and _PATH.match(c) and c.split("/")[0] in DIRS]
    names = [c for c in cited if _DOTTED.match(c) and not c.endswith((".py", ".md", ".toml", ".h", ".cpp"))]
    names = [c for c in names if c.split(".")[0] in PACKAGES or c.split(".")[0] in defined_names()]
    bare = [c for c in cited if _CAMEL.match(c) and c not in OTHER_LIBRARIES]
    assert len(paths) >= 10 and len(names) >= 20 and len(bare) >= 10, (len(paths), len(names), len(bare))
    missing = [p for p in paths if not (ROOT / p).exists()]
    missing += [n for n in names if not resolve(n)]
    missing += [b for b in bare if b not in defined_names()]
    assert not missing, f"docs/architecture.md cites what does not exist: {missing}"


def test_every_tree_entry_exists():
    entries = tree_entries(DOC.read_text(encoding="utf-8"))
    assert len(entries) >= 60 and "evo/engine/dispatch.py" in entries, entries[:20]
    missing = [e for e in entries if not (ROOT / e).exists()]
    assert not missing, f"the tree in docs/architecture.md lists what does not exist: {missing}"


@pytest.mark.parametrize("name,exists", [
    ("evo.engine.seams.Stages", True), ("Stages.compile_fn", True), ("Dispatch.take", True),
    ("Engine._dispatch_gpus", False), ("evo.engine.nothing.Here", False), ("IslandSet.nope", False),
])
def test_the_resolver_can_fail(name, exists):
    assert resolve(name) is exists
