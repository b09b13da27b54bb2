"""The layout of ``mutators/``: the package shows the base, the knobs mutator and the LLM
package (``mutators/llm/``: prompt, answer, client, replay), nothing else; the mutators import
of evo only its bottom (``evo.core``, ``evo.tasks``), never the engine, the CLI, the store or
the config above it, nor evaluators, populations or Ray; ``mutators/base.py`` and ``knobs.py``
do not import the LLM package; every non-Python file under ``mutators/`` ships as package data.

Imports are read from the source with ``ast`` (tests/test_layers.py's reader: every import,
function-level ones included), not from ``sys.modules``.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import evo
from tests.test_layers import imports_of, subpackage_of

ROOT = Path(__file__).resolve().parents[1]
#: what mutators/ holds directly (files and packages); a new mutator adds itself here
TOP = {"__init__.py", "base.py", "knobs.py", "llm"}
#: the sub-packages of mutators/llm/ and the modules directly in it
LLM_TOP = {"__init__.py", "mutator.py", "attempts.py", "repairs.py", "bandit.py",
           "prompt", "answer", "client", "replay"}
#: of evo, the mutators may import only the bottom
EVO_ALLOWED = {"core", "tasks"}
#: never imported by a mutator
FORBIDDEN = ("evaluators", "populations", "ray")


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name != "__pycache__"}


def layout_problems(root: Path) -> list[str]:
    """What is wrong with the tree of ``root/mutators`` (empty: nothing)."""
    problems = []
    top = _entries(root / "mutators")
    if top != TOP:
        problems.append(f"mutators/ holds {sorted(top)}, expected {sorted(TOP)} (LLM modules go in mutators/llm/)")
    llm = root / "mutators" / "llm"
    if llm.is_dir():
        inside = _entries(llm)
        if inside != LLM_TOP:
            problems.append(f"mutators/llm/ holds {sorted(inside)}, expected {sorted(LLM_TOP)}")
        problems += [f"{p.relative_to(root)} has no __init__.py" for p in llm.iterdir()
                     if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").is_file()]
    return problems


def import_problems(root: Path, lazy: dict[str, str]) -> list[str]:
    """Every import in ``root/mutators`` that goes above evo's bottom, to a forbidden package,
    or from the base / knobs into the LLM package."""
    problems = []
    for path in sorted((root / "mutators").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, module in imports_of(path, root):
            sub = subpackage_of(module, lazy)
            if module.split(".")[0] == "evo" and sub not in EVO_ALLOWED and module != "evo":
                problems.append(f"{rel}:{line} imports {module} (evo.{sub}: only evo.core / evo.tasks)")
            if module.split(".")[0] in FORBIDDEN:
                problems.append(f"{rel}:{line} imports {module}")
            if not rel.startswith("mutators/llm/") and rel != "mutators/__init__.py" \
                    and module.startswith("mutators.llm"):
                problems.append(f"{rel}:{line} imports {module} (the base and knobs stand without the LLM package)")
    return problems


def test_mutators_holds_base_knobs_and_llm():
    assert not layout_problems(ROOT), "\n".join(layout_problems(ROOT))


def test_the_mutators_import_only_evo_core_and_tasks_of_evo():
    lazy = dict(evo._LAZY)
    # the reader really reads: the LLM mutator imports evo.core.records
    assert "evo.core.records" in {m for _, m in imports_of(ROOT / "mutators/llm/mutator.py", ROOT)}
    problems = import_problems(ROOT, lazy)
    assert not problems, "\n".join(problems)


def test_every_data_file_under_mutators_ships_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [p for p in (ROOT / "mutators").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert any(p.suffix == ".md" for p in files), "no prompt template found under mutators/"
    missing = []
    for f in files:
        rel = f.relative_to(ROOT)
        shipped = False
        for pkg, globs in data.items():
            base = Path(*pkg.split("."))
            if base in rel.parents:
                shipped |= any(fnmatch.fnmatch(rel.relative_to(base).as_posix(), g) for g in globs)
        if not shipped:
            missing.append(str(rel))
    assert not missing, f"not in pyproject's package-data: {missing}"


def test_the_checks_can_fail(tmp_path):
    """A flat LLM module left in mutators/, an import of the engine from mutators/llm (even in
    a function), one of evo.config, one of evaluators, a lazy ``from evo import Store`` and the
    knobs mutator importing the LLM package are all reported."""
    files = {
        "mutators/__init__.py": "",
        "mutators/base.py": "from evo.core.records import Member\n",
        "mutators/knobs.py": "from mutators.llm.answer.patch import apply_blocks\n",
        "mutators/client.py": "",
        "mutators/llm/__init__.py": "",
        "mutators/llm/mutator.py": "def late():\n    from evo.engine.engine import Engine\n",
        "mutators/llm/attempts.py": "from evo import Store\n",
        "mutators/llm/repairs.py": "import evo.config.sections\n",
        "mutators/llm/bandit.py": "from evaluators.policy import check_policy\n",
        "mutators/llm/prompt/__init__.py": "from evo.tasks import registry\n",
        "mutators/llm/answer/__init__.py": "",
        "mutators/llm/client/__init__.py": "",
        "mutators/llm/replay/x.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    layout = "\n".join(layout_problems(tmp_path))
    assert "mutators/ holds" in layout and "'client.py'" in layout
    assert "mutators/llm/replay has no __init__.py" in layout
    imports = "\n".join(import_problems(tmp_path, {"Store": "evo.store"}))
    assert "mutators/llm/mutator.py:2 imports evo.engine.engine" in imports
    assert "mutators/llm/attempts.py:1 imports evo.Store (evo.store" in imports
    assert "mutators/llm/repairs.py:1 imports evo.config.sections" in imports
    assert "mutators/llm/bandit.py:1 imports evaluators.policy" in imports
    assert "mutators/knobs.py:1 imports mutators.llm.answer.patch" in imports
    assert "base.py" not in imports and "prompt/__init__.py" not in imports  # evo.core, evo.tasks: allowed


#: the flat modules that moved into mutators/llm/ (issue 42); no file names them any more
OLD_FLAT = ("llm", "attempts", "repairs", "bandit", "answer", "patch", "prompt_context", "prompt_fields",
            "prompt_text", "templates", "diagnostics", "client", "model_spec", "calls", "budget", "health",
            "http_errors", "cassette", "fake_server")


def test_no_file_names_an_old_flat_module():
    import re
    flat = "|".join(n for n in OLD_FLAT if n != "llm")  # mutators.llm is now the package
    dotted = re.compile(r"(?<![\w.])mutators\.(" + flat + r")\b"
                        r"|(?<![\w.])mutators\.llm\.(?!(" + "|".join(sorted(LLM_TOP)).replace(".py", "") + r")\b)\w")
    slashed = re.compile(r"(?<![\w/])mutators/(" + "|".join(OLD_FLAT) + r")\.py|(?<![\w/])mutators/prompts\b")
    found = []
    for folder in ("evo", "evaluators", "mutators", "populations", "tests", "benchmarks", "docs", "configs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".md", ".toml") or path == Path(__file__):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if dotted.search(line) or slashed.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    for name in ("README.md", "pyproject.toml"):
        found += [f"{name}: {ln}" for ln in (ROOT / name).read_text().splitlines() if dotted.search(ln) or slashed.search(ln)]
    assert not found, "old flat module paths (now under mutators/llm/):\n" + "\n".join(found[:20])
