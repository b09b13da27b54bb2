"""A search config with an LLM mutator over kb19_relu, for dry-run tests against the fake
endpoint: one ``[[llm.models]]`` table per mapping in ``models`` (its keys and values as
written, strings quoted, numbers bare)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def write_llm_config(tmp_path: Path, models: Sequence[Mapping[str, Any]]) -> Path:
    def value(v: Any) -> str:
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else f'"{v}"'

    tables = "".join("\n[[llm.models]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in m.items()) for m in models)
    path = tmp_path / "llm.toml"
    path.write_text(f'''
[run]
db = "{tmp_path / 'evo.db'}"

[tasks]
include = ["kb19_relu"]

[mutator]
kind = "llm"
{tables}''')
    return path
