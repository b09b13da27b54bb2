"""evo export's generated files come from template files (``evo/results/export/templates/*.tmpl``).

Contract of :func:`evo.results.export.render.render_template`: ``${name}`` with a lower-case name
is a field, every other ``$`` (bash's ``$VAR`` / ``${VAR:-x}``) is left alone; the fields given
must be exactly the template's, else :class:`~evo.results.export.errors.ExportTemplateError`
names the missing and the unused ones; values are inserted verbatim, once. The templates ship
as package data.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

import evo.results.export.render as X

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ("op.py", "test_op.py", "reference.py", "tensor_inputs.py", "build.sh")


def _with_template(monkeypatch, tmp_path, name: str, text: str) -> None:
    (tmp_path / f"{name}.tmpl").write_text(text)
    monkeypatch.setattr(X, "TEMPLATES_DIR", tmp_path)
    X._template.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_cache():
    X._template.cache_clear()
    yield
    X._template.cache_clear()


def test_fields_are_braced_lower_case_and_everything_else_stays(monkeypatch, tmp_path):
    _with_template(monkeypatch, tmp_path, "t", 'A="${NVCC:-}" $HOME ${1:-${arch}} f"{x}" ${x_2}\n')
    assert X.template_fields("t") == {"arch", "x_2"}
    out = X.render_template("t", arch="sm_90a", x_2="${arch} {y}")
    assert out == 'A="${NVCC:-}" $HOME ${1:-sm_90a} f"{x}" ${arch} {y}\n'  # values are not re-scanned


def test_missing_and_unused_fields_are_named(monkeypatch, tmp_path):
    _with_template(monkeypatch, tmp_path, "t", "${a} ${b}\n")
    with pytest.raises(X.ExportTemplateError, match=r"missing field\(s\) b, unused field\(s\) c"):
        X.render_template("t", a=1, c=2)


def test_a_missing_template_says_the_install_is_incomplete(monkeypatch, tmp_path):
    monkeypatch.setattr(X, "TEMPLATES_DIR", tmp_path)
    with pytest.raises(X.ExportTemplateError, match="package data evo/results/export/templates"):
        X.render_template("op.py")


def test_build_script_renders_the_arch_and_quoted_flags_and_is_valid_bash(tmp_path):
    text = X.build_script("sm_100a", ["-lineinfo", "-DX=a b"])
    assert 'ARCH="${1:-sm_100a}"' in text and "-fPIC -lineinfo '-DX=a b' -I\"$HERE\"" in text
    assert '"$(dirname "${BASH_SOURCE[0]}")"' in text and "${" + "arch}" not in text
    script = tmp_path / "build.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_wrap_items_breaks_before_the_item_that_would_pass_the_width():
    assert X._wrap_items("[", ["aa", "bb", "cc"], "]", column=4, width=14) == "[aa, bb,\n     cc]"
    assert X._wrap_items("{", ["a"], "}", column=0, width=2) == "{a}"  # one item never breaks


def test_op_template_gets_the_abi_from_evaluators_abi():
    from evaluators import abi

    f = X.abi_fields()
    assert set(f) <= X.template_fields("op.py")
    assert f["max_dims"] == str(abi.MAX_DIMS) and f["abi_version"] == str(abi.ABI_VERSION)
    for name, ct, n in abi.EVO_TENSOR_FIELDS:
        assert f'("{name}", ctypes.{ct}{" * _MAX_DIMS" if n else ""}),' in f["evo_tensor_fields"]
    ns: dict = {}
    exec("import torch\nD = " + f["dtype_codes"], ns)
    assert {str(k).removeprefix("torch."): v for k, v in ns["D"].items()} == abi.EVO_DTYPES


def test_templates_are_shipped_as_package_data():
    assert sorted(p.name for p in X.TEMPLATES_DIR.glob("*.tmpl")) == sorted(f"{n}.tmpl" for n in TEMPLATES)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "templates/*.tmpl" in data.get("evo.results.export", []), (
        'pyproject.toml [tool.setuptools.package-data] "evo.results.export" must list "templates/*.tmpl"')
