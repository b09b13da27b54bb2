"""The layers of ``evo``: its sub-packages import each other without a circle, and the bottom
(``evo.core``, the shared vocabulary, and ``evo.tasks``) imports nothing above it.

The graph is read from the source with ``ast``, not from ``sys.modules``: every ``import`` and
``from ... import`` anywhere in a module counts (module level, inside functions, under
``TYPE_CHECKING``), since a function-level import is still a dependency, only a later one;
so does ``importlib.import_module("evo....")`` with a literal name. ``from evo import NAME`` of
a lazy top-level name (``evo._LAZY``) counts as an import of the module that defines it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import evo

ROOT = Path(__file__).resolve().parents[1]
#: evo's sub-packages; every module of evo lives in one of them (evo/__init__.py aside)
SUBPACKAGES = ("core", "tasks", "store", "config", "results", "tuning", "engine", "cli")
#: the bottom: what each may import of evo (the rest of evo is above it)
BOTTOM = {"core": {"core"}, "tasks": {"core", "tasks"}}
#: never imported by the bottom: Ray, and the packages that import the bottom themselves
FORBIDDEN_AT_BOTTOM = ("ray", "evaluators", "mutators", "populations")

#: an import site: (importing file relative to the root, line, the imported module)
Site = tuple[str, int, str]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved; ``from M import N``
    gives ``M.N`` too (N may be a submodule)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            found.append((node.lineno, node.args[0].value))
    return found


def subpackage_of(module: str, lazy: dict[str, str]) -> str | None:
    """The evo sub-package ``module`` belongs to, None outside evo's sub-packages."""
    parts = module.split(".")
    if parts[0] != "evo" or len(parts) < 2:
        return None
    if parts[1] not in SUBPACKAGES and parts[1] in lazy:  # from evo import Candidate
        return subpackage_of(lazy[parts[1]], lazy)
    return parts[1] if parts[1] in SUBPACKAGES else None


def import_graph(root: Path, lazy: dict[str, str]) -> tuple[dict[str, dict[str, list[Site]]], list[Site]]:
    """{importer sub-package: {imported sub-package: [sites]}} over the tree at ``root`` (its
    ``evo/``), and every import site of the bottom's modules (for the checks beyond evo)."""
    graph: dict[str, dict[str, list[Site]]] = defaultdict(lambda: defaultdict(list))
    bottom_sites: list[Site] = []
    for path in sorted((root / "evo").rglob("*.py")):
        src = subpackage_of(_module_name(path, root), lazy)
        rel = str(path.relative_to(root))
        for line, module in imports_of(path, root):
            if src in BOTTOM:
                bottom_sites.append((rel, line, module))
            dst = subpackage_of(module, lazy)
            if src and dst and dst != src and (rel, line) not in {s[:2] for s in graph[src][dst]}:
                graph[src][dst].append((rel, line, module))  # one site per line (from M import N gives two)
    return graph, bottom_sites


def find_cycle(graph: dict[str, dict[str, list[Site]]]) -> list[str] | None:
    """One circle of the graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, list[Site]]]) -> str:
    lines = [" -> ".join(f"evo.{p}" for p in cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines += [f"  evo.{a} -> evo.{b}: {f}:{n} imports {m}" for f, n, m in graph[a][b][:5]]
    return "\n".join(lines)


def _graph():
    return import_graph(ROOT, dict(evo._LAZY))


def test_every_module_of_evo_is_in_a_subpackage():
    loose = [p.name for p in (ROOT / "evo").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules directly in evo/ (put each in one of {SUBPACKAGES}): {loose}"
    dirs = {p.name for p in (ROOT / "evo").iterdir() if (p / "__init__.py").is_file()}
    assert dirs == set(SUBPACKAGES), f"evo's sub-packages changed: {sorted(dirs)} (update SUBPACKAGES)"


def test_the_subpackages_import_each_other_without_a_circle():
    graph, _ = _graph()
    # the graph is really read (a parser that found nothing would pass the check below)
    assert {"engine", "store", "results", "tasks", "core"} <= set(graph["cli"]), dict(graph["cli"])
    cycle = find_cycle(graph)
    assert cycle is None, "import circle between evo's sub-packages:\n" + _describe(cycle, graph)


def test_the_bottom_imports_nothing_above_it():
    graph, bottom_sites = _graph()
    for pkg, allowed in BOTTOM.items():
        above = {dst: sites for dst, sites in graph.get(pkg, {}).items() if dst not in allowed}
        assert not above, f"evo.{pkg} may import only {sorted(allowed)} of evo; it imports " + "; ".join(
            f"evo.{dst} ({', '.join(f'{f}:{n}' for f, n, _ in sites[:5])})" for dst, sites in sorted(above.items()))
    assert bottom_sites, "no import found in evo.core / evo.tasks: the parser is broken"
    bad = [f"{f}:{n} imports {m}" for f, n, m in bottom_sites if m.split(".")[0] in FORBIDDEN_AT_BOTTOM]
    assert not bad, f"evo.core / evo.tasks import one of {FORBIDDEN_AT_BOTTOM}:\n" + "\n".join(bad)


def test_a_circle_is_found(tmp_path):
    """The check above can fail: a function-level import that closes a circle (core -> engine
    -> core) in a small tree is reported with its import sites."""
    files = {
        "evo/__init__.py": "",
        "evo/core/__init__.py": "",
        "evo/core/records.py": "def late():\n    from evo.engine.engine import Engine\n",
        "evo/engine/__init__.py": "",
        "evo/engine/engine.py": "from ..core import records\nfrom evo import Candidate\n",
        "evo/tasks/__init__.py": "import importlib\nimportlib.import_module('evo.store.writer')\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph, bottom_sites = import_graph(tmp_path, {"Candidate": "evo.core.records"})
    assert set(graph["engine"]) == {"core"} and len(graph["engine"]["core"]) == 2  # relative + lazy name
    assert set(graph["tasks"]) == {"store"}  # importlib.import_module
    cycle = find_cycle(graph)
    assert cycle in (["core", "engine", "core"], ["engine", "core", "engine"])
    assert "evo/core/records.py:2 imports evo.engine.engine" in _describe(cycle, graph)
    assert ("evo/core/records.py", 2, "evo.engine.engine") in bottom_sites
    del graph["core"]
    assert find_cycle(graph) is None


def test_the_cli_leaves_tuning_to_evo_tuning_and_no_transitional_name_is_left():
    """``evo tune`` is parsing and printing only (its session is evo.tuning.session), and the
    names kept for callers of the former layout are gone: each module exports what it defines."""
    import evo.engine.bookkeeping
    import evo.engine.islands
    import evo.tuning.tuning
    from evo.engine.engine import Engine

    kernels = {m for _, m in imports_of(ROOT / "evo" / "cli" / "kernels.py", ROOT)}
    assert {"evo.tuning.session.find_target", "evo.tuning.session.prepare"} <= kernels
    assert not {"evo.tuning.tuning.TuningStudy", "evo.tuning.tuning.tune_once",
                "evo.tuning.tuning.make_local_evaluate"} & kernels, "evo tune orchestrates in the CLI"
    assert "TuningSettings" not in evo.tuning.tuning.__all__
    assert "EngineSettings" not in evo.engine.bookkeeping.__all__
    assert not hasattr(Engine, "island_meta") and not hasattr(evo.engine.islands.IslandHandle, "__getitem__")
    runtime = (ROOT / "evo" / "engine" / "runtime.py").read_text()
    assert '"Stages"' not in runtime, "evo.engine.runtime re-exports Stages (import it from evo.engine.seams)"
